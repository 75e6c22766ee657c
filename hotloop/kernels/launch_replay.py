"""Replaying a call's Triton launches with other tensors: the attention between piecewise graphs.

A prefill or mixed step runs every layer's attention eagerly between piecewise CUDA graphs
(``executor/piecewise_graph.py``): in every layer the same launches (rotary + KV write, decode,
merge, prefill) with the same arguments but the layer's KV cache. Through ``kernel[grid](...)`` each
launch costs Triton's Python (binding and specializing the arguments, the cache-key lookup) on top
of the launchers' checks: 14.7 ms of host time for a 32-layer mixed step on the H200's host, more
than the GPU's 9.5 ms for 16 decodes and a 256-token chunk (``benchmarks/profile_step.py``).

``record(tensors)`` runs a call as usual and notes every launch of a kernel marked ``recordable``:
the compiled kernel and the exact arguments its launcher got. ``LaunchPlan.replay(tensors)`` issues
the same launches again, in order, with each recorded tensor of ``tensors`` replaced by the new one
at the same position: one launcher call per kernel, no Triton or launcher Python.

The contract (the caller's to keep):
- the call's GPU work is launches of recordable kernels only (or of CUDA C kernels whose launchers
  report themselves with ``note_launch``); torch operations inside it may
  allocate (a scratch tensor is then shared by every replay, safe in stream order) or fill
  constants, nothing that depends on the swapped tensors (a launch of any other Triton kernel, or
  no recordable launch at all, makes the plan invalid; torch operations are not detected);
- the swappable tensors reach the kernels as tensors (not as raw pointers or descriptors);
- a replacement has the recorded tensor's dtype, shape and strides (``replay`` checks), so every
  argument the launchers derived from it (strides, sizes, the kernel variant) still holds;
- the launchers pass the swappable tensors themselves, not views of them (a launch argument that
  shares a swappable tensor's storage without being it makes the plan invalid);
- host values (grids, lengths) are those of the recorded call: a plan lives for one step.

Off (``available`` is False) under the Triton interpreter, with ``HOTLOOP_LAUNCH_REPLAY=0``, or when
this Triton's launcher does not take arguments the way ``_launch_args`` builds them: the first use
checks a probe kernel's replay against its direct launch and logs why it is off.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

__all__ = ["LaunchPlan", "available", "note_launch", "record", "recordable"]


class _Stack(threading.local):
    def __init__(self) -> None:
        self.plans: list[LaunchPlan] = []  # this thread's active recordings, the innermost last


_recording = _Stack()


@dataclass
class LaunchPlan:
    """The launches of one recorded call: ``(launcher, args)`` each, and per launch where the
    swappable tensors sit in its arguments."""

    tensors: tuple[torch.Tensor, ...]
    launches: list[tuple[Any, tuple[Any, ...]]] = field(default_factory=list)
    valid: bool = True  # False: something could not be recorded; run the call instead
    _swaps: list[list[tuple[int, int]]] = field(default_factory=list)  # per launch: (argument, tensor)

    @property
    def slots(self) -> list[tuple[int, int, int]]:
        """Where the swappable tensors sit: ``(launch, argument, tensor)`` indices."""
        return [(li, ai, ti) for li, swaps in enumerate(self._swaps) for ai, ti in swaps]

    def matches(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether ``tensors`` can stand in for the recorded ones (same dtype, shape, strides,
        device), and the plan is whole (valid, with at least one launch: a call that launched no
        recordable kernel did its work some other way, which a replay would drop)."""
        if not self.valid or not self.launches or len(tensors) != len(self.tensors):
            return False
        for new, old in zip(tensors, self.tensors, strict=True):
            if (
                new.dtype != old.dtype
                or new.shape != old.shape
                or new.stride() != old.stride()
                or new.device != old.device
            ):
                return False
        return True

    def replay(self, tensors: Sequence[torch.Tensor], check: bool = True) -> None:
        """Issue the recorded launches with ``tensors`` in place of the recorded ones (``check``
        False: the caller has just seen ``matches(tensors)`` hold)."""
        if check and not self.matches(tensors):
            raise ValueError(
                "LaunchPlan.replay: the tensors differ from the recorded ones (or the plan is invalid)"
            )
        for (launcher, args), swaps in zip(self.launches, self._swaps, strict=True):
            if swaps:
                a = list(args)
                for ai, ti in swaps:
                    a[ai] = tensors[ti]
                launcher(*a)
            else:
                launcher(*args)

    def _note(self, launcher: Any, args: tuple[Any, ...]) -> None:
        self.launches.append((launcher, args))
        swaps: list[tuple[int, int]] = []
        storages = {t.untyped_storage().data_ptr() for t in self.tensors}
        for ai, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            for ti, t in enumerate(self.tensors):
                if a is t:
                    swaps.append((ai, ti))
                    break
            else:
                # a view of a swappable tensor would keep pointing at the recorded one
                if a.untyped_storage().data_ptr() in storages:
                    self.valid = False
        self._swaps.append(swaps)


def _launch_args(
    fn: Any, kernel: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """The arguments ``JITFunction.run`` hands the compiled kernel's launcher for this launch:
    grid, stream, function, packed metadata, launch metadata and the launch hooks as now set
    (a replay reuses the metadata: the same kernel and stream), then every kernel parameter in
    declaration order, constexprs and defaults included."""
    params = fn.signature.parameters
    bound = fn.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in params})
    bound.apply_defaults()
    values = tuple(bound.arguments.values())
    g = tuple(grid) + (1, 1)
    driver = triton.runtime.driver.active
    stream = driver.get_current_stream(driver.get_current_device())
    from triton import knobs

    hooks = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    meta = kernel.launch_metadata(grid, stream, *values)  # None unless a hook is set
    return (g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, meta, *hooks, *values)


def recordable(fn: Any) -> Any:
    """Mark the ``@triton.jit`` kernel ``fn`` so that ``record`` sees its launches; returns ``fn``
    (unchanged under the interpreter, whose kernels are never recorded; marking twice is a no-op)."""
    if not isinstance(fn, triton.runtime.JITFunction) or getattr(fn, "_hotloop_recordable", False):
        return fn
    run = fn.run

    def recording_run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = run(*args, grid=grid, warmup=warmup, **kwargs)
        plans = _recording.plans
        if plans and not warmup:
            plan = plans[-1]
            try:
                if kernel is None or callable(grid):
                    raise ValueError("no compiled kernel, or a grid function")
                launch = _launch_args(fn, kernel, grid, args, kwargs)
            except Exception:  # the launch happened; only its recording failed
                plan.valid = False
            else:
                plan._note(kernel.run, launch)
        return kernel

    fn.run = recording_run
    fn._hotloop_recordable = True
    return fn


def note_launch(launcher: Any, args: tuple[Any, ...]) -> None:
    """Record a launch that does not go through Triton (a CUDA C kernel, ``cuda_jit``) into the
    active recording, if any: a replay calls ``launcher(*args)`` with the swappable tensors of
    ``args`` replaced. Callers call it after launching, with the arguments they launched with.
    Unlike a recorded Triton launch, which keeps the stream it was recorded on, ``launcher`` runs on
    the stream current at the replay (the piecewise graphs record and replay on one stream)."""
    plans = _recording.plans
    if plans:
        plans[-1]._note(launcher, args)


@contextmanager
def record(tensors: Sequence[torch.Tensor]) -> Iterator[LaunchPlan]:
    """Record the launches of the ``with`` body; ``tensors`` are the ones a replay may swap (found in
    the launches' arguments by identity: pass the very tensor objects the body passes on).

    A launch of a kernel that is not recordable while the body runs (on any thread) makes the plan
    invalid, as does a nested recording."""
    plan = LaunchPlan(tuple(tensors))
    plans = _recording.plans
    if plans:
        plans[-1].valid = False  # the outer plan would miss the inner body's launches
    jit_cls = triton.runtime.JITFunction
    class_run = jit_cls.run

    def foreign_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("warmup", False):
            plan.valid = False
        return class_run(self, *args, **kwargs)

    plans.append(plan)
    jit_cls.run = foreign_run  # recordable kernels call the method they were marked with
    try:
        yield plan
    finally:
        jit_cls.run = class_run
        plans.pop()


@triton.jit
def _probe_kernel(x_ptr, y_ptr, n, add, BLOCK: tl.constexpr, TWICE: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = x + add
    if TWICE:
        y = y + add
    tl.store(y_ptr + offs, y, mask=mask)


_probe_kernel = recordable(_probe_kernel)
_available: dict[int, bool] = {}


def _probe(device: torch.device) -> str:
    """Record a launch of the probe kernel, replay it onto other tensors, compare; "" when the replay
    matched, else why not."""
    n = 1000
    x0 = torch.arange(n, dtype=torch.float32, device=device)
    y0 = torch.empty_like(x0)
    x1 = torch.randn(n, device=device)
    y1 = torch.full_like(x1, float("nan"))
    with record((x0, y0)) as plan:
        _probe_kernel[(triton.cdiv(n, 256),)](x0, y0, n, 3.0, BLOCK=256, TWICE=True)
    if not plan.valid or len(plan.launches) != 1 or len(plan.slots) != 2:
        return f"recorded valid={plan.valid}, {len(plan.launches)} launches, {len(plan.slots)} slots"
    plan.replay((x1, y1))
    torch.cuda.synchronize(device)
    if not torch.equal(y0, x0 + 6.0):
        return "the recorded launch's output is wrong"
    if not torch.equal(y1, (x1 + 3.0) + 3.0):  # the kernel's roundings
        bad = int((y1 != (x1 + 3.0) + 3.0).sum())
        return f"the replay's output differs in {bad} of {n} values"
    return ""


def available(device: torch.device) -> bool:
    """Whether recorded launches can be replayed on ``device`` (decided once per device)."""
    if device.type != "cuda" or os.environ.get("HOTLOOP_LAUNCH_REPLAY", "1") == "0":
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _available:
        try:
            why = _probe(device)
        except Exception as e:  # this Triton's launcher takes its arguments otherwise
            why = f"the probe launch raised {type(e).__name__}: {e}"
        if why:
            logger.warning("launch replay off: %s", why)
        _available[index] = not why
    return _available[index]
