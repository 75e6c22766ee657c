"""``kernels/launch_math.py`` equals Triton's own helpers."""

from __future__ import annotations

import triton

from hotloop.kernels.launch_math import cdiv, next_power_of_2


def test_equal_to_triton() -> None:
    for n in range(0, 2100):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for b in (1, 2, 3, 16, 64, 128):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)
