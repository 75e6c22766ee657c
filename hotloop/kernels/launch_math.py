"""Grid and tile arithmetic for the kernel launchers, in plain Python.

``triton.cdiv`` and ``triton.next_power_of_2`` are Triton ``ConstexprFunction`` objects: called from
Python each goes through Triton's JIT call machinery (several microseconds, measured with cProfile
on the launch path of a mixed step, where a layer's launchers made 11 such calls). These are the
same functions for the host side of a launch.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n``, as ``triton.next_power_of_2`` (which gives 0 for 0)."""
    if n <= 0:
        return 0
    return 1 << (n - 1).bit_length()
