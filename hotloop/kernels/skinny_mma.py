"""Dense 16-bit ``y = x @ W^T (+ b)`` for 2-16 rows: the CUDA C tensor-core kernel
(``kernels/cuda/skinny_mma.cu``), its variants, limits, launch, and the per-shape choice against
cuBLAS.

Status: no engine path calls it. On an H200 (2026-12-02, ``benchmarks/skinny_mma.py``,
``benchmarks/results/gpu_2026-12-02c/call4``) its best launch reached 45-70% of the weight-bytes floor
on the Llama-3-8B projections at M = 2-16, where cuBLAS reached 53-89%, and 63-81% on the LM head
against cuBLAS' 101-103%: slower at every shape (correct at every launch: bf16 rounding from float32).
So the layers keep ``F.linear``; the hooks were taken out after that run (the tuner had kept cuBLAS
everywhere anyway). Likely causes, not profiled: ptxas interleaves the loads with the MMAs (38-82
registers a thread, so few loads in flight per warp), and each load instruction touches 16 weight
rows 64 bytes at a time.

A decode step at batch 2-16 reads every weight once; cuBLAS reaches about half of that bandwidth
floor on an H200 at these M. This kernel streams the ``[N, K]`` weight (``nn.Linear``'s layout, no
copy) straight into ``mma.sync`` operands; the source's header says how. A variant is
``(MT, NT, U, WARPS)``: ``MT`` n8 tiles along M (1: M <= 8, 2: M <= 16), ``NT`` 16-row weight tiles
per warp, ``U`` 32-wide K steps of loads per loop trip, ``WARPS`` warps per block splitting the
block's K slice; ``split`` (the grid's y) splits K across blocks, the last block of a column tile
adding the float32 partials in split order (deterministic).

:func:`linear` is the entry point: on the first call per (device, dtype, M class, N, K, bias) outside
a CUDA-graph capture it times every variant and split that fits and ``F.linear`` (cold L2, GPU time)
and keeps the fastest (``None`` = cuBLAS), memoised in the process and on disk
(``kernels/tuning_cache.py``); it declines unless ``HOTLOOP_SKINNY_MMA=1``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from functools import partial

import torch
import torch.nn.functional as F

from hotloop.kernels import counters, cuda_jit, tuning_cache
from hotloop.kernels.pdl import pdl

logger = logging.getLogger(__name__)

SOURCE = "skinny_mma.cu"
ENV = "HOTLOOP_SKINNY_MMA"
MAX_M = 16
MIN_M = 2
COUNTER_FAMILY = "skinny_mma"
TUNING_FAMILY = "skinny_mma"
# (MT, NT, U, WARPS) as compiled in skinny_mma.cu
VARIANTS: tuple[tuple[int, int, int, int], ...] = tuple(
    (mt, nt, u, w) for mt in (1, 2) for (nt, u, w) in ((1, 4, 4), (2, 2, 4), (2, 4, 4), (1, 8, 4))
)
SPLITS = (1, 2, 4, 8, 16)
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}


@dataclass(frozen=True)
class Choice:
    """One launch: a variant and a K split."""

    mt: int
    nt: int
    u: int
    warps: int
    split: int


def enabled() -> bool:
    """Whether :func:`linear` may take this kernel (``HOTLOOP_SKINNY_MMA=1``; read at each call)."""
    return os.environ.get(ENV, "0") == "1"


def kernel_name(dtype: torch.dtype, mt: int, nt: int, u: int, warps: int) -> str:
    return f"skinny_mma_{_DTYPES[dtype]}_m{mt}_n{nt}_u{u}_w{warps}"


def fits(m: int, n: int, k: int, dtype: torch.dtype, c: Choice) -> str | None:
    """Why launch ``c`` cannot compute this product, or ``None`` when it can."""
    if (c.mt, c.nt, c.u, c.warps) not in VARIANTS:
        return f"no variant {(c.mt, c.nt, c.u, c.warps)}; there are {VARIANTS}"
    if dtype not in _DTYPES:
        return f"needs float16 or bfloat16; got {dtype}"
    if not 1 <= m <= 8 * c.mt:
        return f"takes 1-{8 * c.mt} rows with MT={c.mt}; got {m}"
    if n % (16 * c.nt):
        return f"N={n} is not a multiple of {16 * c.nt}"
    step = c.split * c.warps * 32 * c.u
    if k % step:
        return f"K={k} is not a multiple of split x warps x 32 x U = {step}"
    if c.split > 1 and n // (16 * c.nt) > counters.SLOTS:
        return "too many column tiles for the split counters"
    return None


def available(device: torch.device) -> bool:
    """Whether the kernels can be compiled here (Hopper or newer: they wait with ``griddepcontrol``;
    nvcc found; CUDA kernels not turned off)."""
    if device.type != "cuda" or not cuda_jit.enabled() or cuda_jit.find_nvcc() is None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def _names() -> list[str]:
    return [kernel_name(dt, *v) for dt in _DTYPES for v in VARIANTS]


def launch(
    x2: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    c: Choice,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x2 [M, K] @ weight [N, K]^T (+ bias)`` -> ``[M, N]`` with launch ``c``. Every tensor
    contiguous, 16-byte aligned, one dtype and device. Raises ``ValueError`` where ``c`` does not fit
    and ``cuda_jit.CudaError`` where the kernels cannot be built."""
    if x2.dim() != 2 or weight.dim() != 2 or x2.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x2.shape)} and weight {tuple(weight.shape)} do not multiply")
    m, k = x2.shape
    n = weight.shape[0]
    why = fits(m, n, k, x2.dtype, c)
    if why is not None:
        raise ValueError(f"skinny_mma {c}: {why}")
    tensors = [("x", x2), ("weight", weight)] + ([("bias", bias)] if bias is not None else [])
    for name, t in tensors:
        if t.dtype != x2.dtype or t.device != x2.device:
            raise ValueError(f"{name} must be {x2.dtype} on {x2.device}; got {t.dtype} on {t.device}")
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"{name} must be contiguous and 16-byte aligned")
    kernels = cuda_jit.load(SOURCE, x2.device, _names())
    if kernels is None:
        raise cuda_jit.CudaError("the skinny MMA kernels are not available on this machine")
    tiles = n // (16 * c.nt)
    if out is None:
        out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    ws: torch.Tensor | None = None
    cnt: torch.Tensor | None = None
    if c.split > 1:
        ws = torch.empty(c.split, m, n, dtype=torch.float32, device=x2.device)
        cnt = counters.counters(x2.device, COUNTER_FAMILY, tiles)
        if cnt is None:
            raise ValueError("no split-K counters (first use inside a CUDA-graph capture)")
    kernels[kernel_name(x2.dtype, c.mt, c.nt, c.u, c.warps)](
        (tiles, c.split), c.warps * 32, (x2, weight, bias, ws, out, cnt, m, n, k), pdl=pdl(x2.device)
    )
    return out


def candidates(m: int, n: int, k: int, dtype: torch.dtype) -> list[Choice]:
    """Every launch that fits, for the smallest MT that covers ``m``."""
    mt = 1 if m <= 8 else 2
    out = []
    for v in VARIANTS:
        if v[0] != mt:
            continue
        for s in SPLITS:
            c = Choice(*v, s)
            if fits(m, n, k, dtype, c) is None:
                out.append(c)
    return out


_chosen: dict[tuple, Choice | None] = {}
_available: dict[int | None, bool] = {}
_disk: dict[str, dict] | None = None


def _disk_key(key: tuple, device: torch.device) -> str:
    name = torch.cuda.get_device_name(device)
    return f"{tuning_cache.environment_key(name)}|" + "|".join(str(p) for p in key)


def _tune(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Choice | None:
    from hotloop.kernels.w4a16_gemm import graph_time_us

    m, k = x2.shape
    n = weight.shape[0]
    dev = x2.device
    times: dict[Choice | None, float] = {None: graph_time_us(lambda: F.linear(x2, weight, bias), dev)}
    for c in candidates(m, n, k, x2.dtype):
        try:
            times[c] = graph_time_us(partial(launch, x2, weight, bias, c), dev)
        except (ValueError, cuda_jit.CudaError) as e:
            logger.warning("skinny_mma %s at M=%d N=%d K=%d failed to run (%s); left out", c, m, n, k, e)
    best = min(times, key=lambda c: times[c])
    logger.info(
        "skinny_mma M=%d N=%d K=%d: %s %.1f us (cuBLAS %.1f us)",
        m, n, k, "cuBLAS" if best is None else best, times[best], times[None],
    )  # fmt: skip
    return best


def choose(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Choice | None:
    """The launch for this product (``None``: cuBLAS), tuned once per shape class (see above)."""
    global _disk
    m, k = x2.shape
    n = weight.shape[0]
    key = (str(x2.dtype), 1 if m <= 8 else 2, n, k, bias is not None, x2.device.index)
    if key in _chosen:
        return _chosen[key]
    dkey = _disk_key(key[:5], x2.device)
    if _disk is None:
        _disk = tuning_cache.load(TUNING_FAMILY)
    if dkey in _disk:
        d = _disk[dkey]
        best = None if not d else Choice(**d)
    elif torch.cuda.is_current_stream_capturing():
        return None  # not remembered: tuned at the next call outside a capture
    else:
        best = _tune(x2, weight, bias)
        tuning_cache.store(TUNING_FAMILY, dkey, {} if best is None else asdict(best))
        _disk[dkey] = {} if best is None else asdict(best)
    _chosen[key] = best
    return best


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """``F.linear(x, weight, bias)`` through this kernel where it is on, applies and was the faster
    at this shape; ``None`` otherwise (the caller runs ``F.linear``)."""
    if not enabled() or not x.is_cuda or x.dim() < 2:
        return None
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    if not MIN_M <= m <= MAX_M or x2.dtype not in _DTYPES or weight.dtype != x2.dtype:
        return None
    if not x2.is_contiguous() or x2.data_ptr() % 16 or not weight.is_contiguous() or weight.data_ptr() % 16:
        return None
    if bias is not None and (bias.dtype != x2.dtype or not bias.is_contiguous() or bias.data_ptr() % 16):
        return None
    ok = _available.get(x2.device.index)
    if ok is None:
        ok = _available[x2.device.index] = available(x2.device)
    if not ok:
        return None
    c = choose(x2, weight, bias)
    if c is None:
        return None
    return launch(x2, weight, bias, c).view(*x.shape[:-1], weight.shape[0])
