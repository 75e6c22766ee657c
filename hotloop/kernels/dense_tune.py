"""The cuBLASLt algorithm of each dense projection in the captured decode graphs, chosen by timing.

``F.linear`` runs cuBLAS' first heuristic choice, which for some decode shapes is not its fastest:
on an H100 (``benchmarks/cublaslt_sweep.py``) Llama-3-8B's down projection at 128-256 rows ran
51-60 us with it and 43-53 us with another algorithm the same heuristic offers. This module times
the offered algorithms against ``F.linear`` once per (GPU, dtype, M, N, K) and keeps the fastest.

Where it acts (``linear``): only for launches captured into a CUDA graph, and only for shapes timed
in the warm-up of that capture (``with decode_capture():`` around the capture, ``with tuning():``
around each warm-up, ``executor/cuda_graph.py``). Eager
launches keep ``F.linear``, so prefill and the serving mix's eager steps are unchanged and never
pay for a timing. A launch with a bias, in another dtype than fp16 / bf16, or on the CPU keeps
``F.linear`` too. An algorithm is kept only if it is at least ``MIN_GAIN`` faster than ``F.linear``
and its output on random inputs is within rounding of ``F.linear``'s; otherwise the shape keeps
``F.linear``. Choices are kept on disk (``kernels/tuning_cache.py``, family ``dense_cublaslt``).

Status: opt-in, ``HOTLOOP_DENSE_TUNE=1`` (off: every launch ``F.linear``). In the engine on an H100
(2026-12-06, BENCHMARKS "thirty-fifth session") the batch-256 decode step ran 19.7 / 19.7 ms with
it against 19.7 / 19.8 without (``run_gpu.py`` rows, two pairs): within noise, not the 0.23 ms the
sweep's down projection promised. The decode graphs' capture logged 2.6 s with it against 2.2 s
without (one run each, benchmarks/results/gpu_2026-12-06f/call4; the timings are kept on disk).
Not yet measured on an H200, where cuBLAS' own choice for the down projection differed (split-K
with a separate reduce).

State: per process, the choices per key; a flag set by ``tuning()``. The cuBLASLt workspace is one
per device (``kernels/cublaslt.py``), so captured graphs that use it must not run concurrently on two
streams; the engine replays its graphs on one stream.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from hotloop.kernels import cublaslt, tuning_cache
from hotloop.utils.env import switch

__all__ = ["ENV", "MIN_GAIN", "Choice", "choices", "decode_capture", "enabled", "linear", "summary", "tuning"]

logger = logging.getLogger(__name__)

ENV = "HOTLOOP_DENSE_TUNE"
MIN_GAIN = 0.03  # an algorithm must beat F.linear by 3% to replace it
TUNING_FAMILY = "dense_cublaslt"
_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Choice:
    """What timing chose for one shape: an algorithm (None: ``F.linear``) and both times."""

    algo: cublaslt.Algo | None
    flinear_us: float
    best_us: float


_choices: dict[tuple, Choice] = {}
_state = {"tuning": 0, "active": 0}  # tuning: a warm-up is running; active: the decode graphs' capture
_disk: dict[str, dict] | None = None


def enabled() -> bool:
    """``HOTLOOP_DENSE_TUNE=1`` turns it on; off by default (see the module docstring's status)."""
    return switch(ENV, False, logger)


def choices() -> dict[tuple, Choice]:
    """Every choice made in this process: ``(device index, dtype, M, N, K) -> Choice``."""
    return dict(_choices)


@contextlib.contextmanager
def _counted(flag: str) -> Iterator[None]:
    on = enabled()
    _state[flag] += on
    try:
        yield
    finally:
        _state[flag] -= on


def decode_capture() -> contextlib.AbstractContextManager[None]:
    """The decode graphs' capture (``executor/cuda_graph.py``): only within this block does ``linear``
    take a chosen algorithm (other captures, e.g. the piecewise graphs of prefill, keep ``F.linear``);
    a no-op unless ``enabled()``."""
    return _counted("active")


def tuning() -> contextlib.AbstractContextManager[None]:
    """Within this block, eager ``linear`` launches of a new shape are timed (the graph warm-up);
    a no-op unless ``enabled()``."""
    return _counted("tuning")


def _key(x2: torch.Tensor, weight: torch.Tensor) -> tuple:
    index = x2.device.index if x2.device.index is not None else torch.cuda.current_device()
    return (index, x2.dtype, x2.shape[0], weight.shape[0], x2.shape[1])


def _disk_key(key: tuple) -> str:
    index, dtype, m, n, k = key
    name = torch.cuda.get_device_name(index)
    return f"{tuning_cache.environment_key(name)}|cublasLt {cublaslt.version()}|{dtype}|m{m}|n{n}|k{k}"


def _from_disk(key: tuple) -> Choice | None:
    global _disk
    if _disk is None:
        _disk = tuning_cache.load(TUNING_FAMILY)
    d = _disk.get(_disk_key(key))
    if d is None:
        return None
    try:
        algo = (
            None
            if d.get("algo") is None
            else cublaslt.Algo(**{**d["algo"], "data": tuple(d["algo"]["data"])})
        )
        return Choice(algo, float(d["flinear_us"]), float(d["best_us"]))
    except (KeyError, TypeError, ValueError):
        return None


def _to_disk(key: tuple, c: Choice) -> None:
    from dataclasses import asdict

    value = {
        "algo": None if c.algo is None else asdict(c.algo),
        "flinear_us": c.flinear_us,
        "best_us": c.best_us,
    }
    tuning_cache.store(TUNING_FAMILY, _disk_key(key), value)
    if _disk is not None:
        _disk[_disk_key(key)] = value


def _close(y: torch.Tensor, ref: torch.Tensor) -> bool:
    """Within what another summation order may change: 1% of the output's range."""
    return (
        bool(torch.isfinite(y).all()) and float((y - ref).abs().max()) <= 1e-2 * float(ref.abs().max()) + 1e-3
    )


def _still_close(x2: torch.Tensor, weight: torch.Tensor, algo: cublaslt.Algo) -> bool:
    """One eager check of a choice read from disk against ``F.linear``."""
    gen = torch.Generator(device=x2.device).manual_seed(0)
    xr = torch.randn(x2.shape, device=x2.device, dtype=x2.dtype, generator=gen)
    try:
        return _close(cublaslt.matmul(xr, weight, algo).float(), F.linear(xr, weight).float())
    except (cublaslt.CublasLtError, ValueError):
        return False


def _tune(x2: torch.Tensor, weight: torch.Tensor) -> Choice:
    from hotloop.kernels.w4a16_gemm import graph_time_us  # cold-L2 graph timing, shared with the W4A16 tuner

    m, k = x2.shape
    gen = torch.Generator(device=x2.device).manual_seed(0)  # not the global RNG: sampling stays as seeded
    xr = torch.randn(m, k, device=x2.device, dtype=x2.dtype, generator=gen)
    ref = F.linear(xr, weight).float()
    base = graph_time_us(lambda: F.linear(x2, weight), x2.device)
    try:
        algos = cublaslt.heuristics(x2.device, x2.dtype, m, weight.shape[0], k)
    except cublaslt.CublasLtError as e:
        logger.warning(
            "cuBLASLt heuristics failed for %dx%dx%d (%s); keeping F.linear", m, weight.shape[0], k, e
        )
        return Choice(None, base, base)
    out = torch.empty(m, weight.shape[0], device=x2.device, dtype=x2.dtype)
    best: tuple[cublaslt.Algo | None, float] = (None, float("inf"))  # the fastest acceptable algorithm
    for cand in algos:
        try:
            if not _close(cublaslt.matmul(xr, weight, cand).float(), ref):
                continue
            us = graph_time_us(partial(cublaslt.matmul, x2, weight, cand, out=out), x2.device)
        except cublaslt.CublasLtError:
            torch.cuda.synchronize(x2.device)
            continue
        if us < best[1]:
            best = (cand, us)
    chosen, us = best
    if chosen is None or us > base * (1 - MIN_GAIN):
        return Choice(None, base, base)
    return Choice(chosen, base, us)


def summary() -> str | None:
    """One line on the choices made in this process (None before any): for the capture's log."""
    if not _choices:
        return None
    taken = [c for c in _choices.values() if c.algo is not None]
    saved = sum(c.flinear_us - c.best_us for c in taken)
    return (
        f"dense GEMMs: a timed cuBLASLt algorithm for {len(taken)} of {len(_choices)} shapes "
        f"({saved:.1f} us less per launch of each, summed)"
    )


def _choice(x2: torch.Tensor, weight: torch.Tensor) -> Choice | None:
    key = _key(x2, weight)
    c = _choices.get(key)
    if c is not None:
        return c
    if torch.cuda.is_current_stream_capturing() or not _state["tuning"]:
        return None  # time only in a graph warm-up, never inside a capture
    c = _from_disk(key)
    if c is not None and c.algo is not None and not _still_close(x2, weight, c.algo):
        c = None  # a stored choice this library no longer computes right: time again
    if c is None:
        c = _tune(x2, weight)
        _to_disk(key, c)
    _choices[key] = c
    if c.algo is not None:
        logger.debug(
            "dense GEMM %s: cuBLASLt %s, %.1f us against F.linear's %.1f",
            key[2:],
            c.algo.describe(),
            c.best_us,
            c.flinear_us,
        )
    return c


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, with the timed cuBLASLt algorithm where one was chosen for this
    shape and the launch is being captured into a CUDA graph (see the module docstring)."""
    if not _state["active"]:  # first: the common case (off, or outside the decode capture) costs nothing
        return F.linear(x, weight, bias)
    if (
        bias is not None
        or not x.is_cuda
        or x.dtype not in _DTYPES
        or weight.dtype != x.dtype
        or not (_state["tuning"] or torch.cuda.is_current_stream_capturing())
        or not x.is_contiguous()
        or not weight.is_contiguous()
        or x.numel() == 0
        or x.data_ptr() % cublaslt.ALIGNMENT
        or weight.data_ptr() % cublaslt.ALIGNMENT
    ):
        return F.linear(x, weight, bias)
    x2 = x.view(-1, x.shape[-1])
    c = _choice(x2, weight)
    if c is None or c.algo is None or not cublaslt.available(x.device):
        return F.linear(x, weight, bias)
    try:
        y = cublaslt.matmul(x2, weight, c.algo)
    except (cublaslt.CublasLtError, ValueError):  # a failed call launched nothing: safe inside a capture
        return F.linear(x, weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])
