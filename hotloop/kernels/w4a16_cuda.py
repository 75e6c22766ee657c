"""The CUDA C W4A16 one-row GEMV (``kernels/cuda/w4a16_gemv.cu``): its variants, limits, launch and
the choice of variant for the fused one-row layer.

One row of 16-bit ``x`` times an AutoAWQ int4 weight, for decode at batch 1. Each thread streams
its packed words straight into registers with 16-byte loads (the Triton GEMV goes through shared
memory) and does the Triton ``half2`` kernel's packed 16-bit arithmetic; the source's header says
how. A variant is ``(NL, R)``: ``NL`` lanes of 32 columns along N per 256-thread block and ``R``
rows of K per thread, so a block covers ``32 NL`` columns and ``(256 / NL) R`` rows, and K is split
into ``K / ((256 / NL) R)`` slices (the last block of a column tile to finish adds the slices, in a
fixed order).

Two users:

- ``w4a16_gemm``'s tuner times the plain variants that fit a shape beside its Triton launches
  (kind ``"cuda"``) and keeps the fastest;
- the one-row W4A16 decoder layer (``models/llama.py``) calls :func:`fused_gemv`, which also runs the
  layer's RMSNorm or SiLU-and-mul in front and its bias and residual adds behind (the unfused
  layer's roundings), so a layer is four launches plus attention instead of eight; its variant is
  timed once per shape and prologue (:func:`row_variant`, kept on disk like the other tunings).

They exist only where ``cuda_jit`` can compile them (nvcc found, ``HOTLOOP_CUDA_KERNELS`` not 0).
"""

from __future__ import annotations

import logging
from functools import partial

import torch

from hotloop.kernels import counters, cuda_jit, tuning_cache

logger = logging.getLogger(__name__)

SOURCE = "w4a16_gemv.cu"
THREADS = 256
# (NL, R) as compiled in w4a16_gemv.cu. H200, Llama-3-8B shapes, bf16 (benchmarks/awq_gemm.py,
# fifteenth session): (2, 16) or (4, 16) fastest for q/k/v and o, (4, 32) for gate/up and down.
# Variants that issued all of a thread's loads before its arithmetic were slower everywhere.
VARIANTS: tuple[tuple[int, int], ...] = ((2, 16), (4, 8), (4, 16), (4, 32))
DEFAULT_VARIANT = (4, 16)  # where a fused shape is first seen inside a CUDA-graph capture
PROLOGUES = {"none": 0, "norm": 1, "silu": 2}
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
TUNING_FAMILY = "w4a16_cuda_row"


def kernel_name(dtype: torch.dtype, nl: int, r: int, prologue: int = 0) -> str:
    return f"w4a16_gemv_{_DTYPES[dtype]}_nl{nl}_r{r}_p{prologue}"


def tile(nl: int, r: int) -> tuple[int, int]:
    """``(columns, rows)`` one block of variant ``(nl, r)`` covers."""
    return 32 * nl, (THREADS // nl) * r


def fits(m: int, n: int, k: int, group_size: int, dtype: torch.dtype, nl: int, r: int) -> str | None:
    """Why variant ``(nl, r)`` cannot run this product, or ``None`` when it can."""
    bn, kb = tile(nl, r)
    if (nl, r) not in VARIANTS:
        return f"no variant ({nl}, {r}); there are {VARIANTS}"
    if m != 1:
        return f"takes one row; got {m}"
    if dtype not in _DTYPES:
        return f"needs float16 or bfloat16 activations; got {dtype}"
    if n % bn:
        return f"N={n} is not a multiple of the block's {bn} columns"
    if k % kb:
        return f"K={k} is not a multiple of the block's {kb} rows"
    if group_size % r:
        return f"group_size={group_size} is not a multiple of its {r} rows per thread"
    if k // kb > counters.SLOTS or n // bn > counters.SLOTS:
        return "too many tiles"
    return None


def available(device: torch.device) -> bool:
    """Whether the CUDA kernels can be compiled here (nvcc found, not turned off); cheap: compiling
    and loading happen at the first launch."""
    return device.type == "cuda" and cuda_jit.enabled() and cuda_jit.find_nvcc() is not None


def _names() -> list[str]:
    return [kernel_name(dt, nl, r, p) for dt in _DTYPES for nl, r in VARIANTS for p in PROLOGUES.values()]


def _check_row(name: str, t: torch.Tensor | None, size: int, dtype: torch.dtype) -> None:
    if t is None:
        return
    if t.dtype != dtype or t.numel() != size or not t.is_contiguous() or t.data_ptr() % 16:
        raise ValueError(
            f"{name} must be {size} contiguous, 16-byte aligned {dtype} values; got {tuple(t.shape)} {t.dtype}"
        )


def gemv(
    x2: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    nl: int,
    r: int,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_input: bool = False,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``epilogue(prologue(x2) @ W)`` -> ``[1, N]`` in x's dtype with variant ``(nl, r)``.

    ``x2 [1, K]``, or ``[1, 2K]`` (``[gate | up]``) with ``silu_input``; prologue: ``norm_weight
    [K]`` for an RMSNorm (``eps``), ``silu_input`` for SiLU-and-mul, neither for none; epilogue:
    ``bias [N]`` and ``residual [1, N]`` added in that order. Every tensor contiguous, 16-byte aligned
    and (but the packed ones) in x's dtype. Raises ``ValueError`` where the variant does not fit and
    ``cuda_jit.CudaError`` where the kernels cannot be built."""
    if norm_weight is not None and silu_input:
        raise ValueError("one prologue per launch: norm_weight or silu_input, not both")
    k = qweight.shape[0]
    n = qweight.shape[1] * 8
    if x2.dim() != 2 or x2.shape != (1, 2 * k if silu_input else k):
        raise ValueError(f"x must be [1, {2 * k if silu_input else k}]; got {tuple(x2.shape)}")
    why = fits(x2.shape[0], n, k, group_size, x2.dtype, nl, r)
    if why is not None:
        raise ValueError(f"the CUDA W4A16 GEMV ({nl}, {r}) {why}")
    if scales.dtype != x2.dtype:
        raise ValueError(f"scales dtype {scales.dtype} must equal x dtype {x2.dtype}")
    for name, t in (("x", x2), ("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"{name} must be contiguous and 16-byte aligned")
    _check_row("norm_weight", norm_weight, k, x2.dtype)
    _check_row("bias", bias, n, x2.dtype)
    _check_row("residual", residual, n, x2.dtype)
    kernels = cuda_jit.load(SOURCE, x2.device, _names())
    if kernels is None:
        raise cuda_jit.CudaError("the CUDA W4A16 kernels are not available on this machine")
    bn, kb = tile(nl, r)
    split = k // kb
    tiles = n // bn
    if out is None:
        out = torch.empty(1, n, dtype=x2.dtype, device=x2.device)
    ws: torch.Tensor | None = None
    cnt: torch.Tensor | None = None
    if split > 1:
        ws = torch.empty(split, n, dtype=torch.float32, device=x2.device)
        cnt = counters.counters(x2.device, "w4a16_cuda", tiles)
        if cnt is None:
            raise ValueError("no split-K counters (first use inside a CUDA-graph capture)")
    prologue = PROLOGUES["norm" if norm_weight is not None else "silu" if silu_input else "none"]
    from hotloop.kernels.pdl import pdl

    kernels[kernel_name(x2.dtype, nl, r, prologue)](
        (tiles, split),
        THREADS,
        (
            x2,
            qweight,
            qzeros,
            scales,
            ws,
            out,
            cnt,
            n,
            k,
            group_size,
            norm_weight,
            float(eps),
            bias,
            residual,
        ),
        pdl=pdl(x2.device),
    )
    return out


_row_choice: dict[tuple, tuple[int, int]] = {}
_row_disk: dict[str, dict] | None = None


def _row_disk_key(device: torch.device, dtype: torch.dtype, n: int, k: int, group: int, prologue: str) -> str:
    name = torch.cuda.get_device_name(device)
    return f"{tuning_cache.environment_key(name)}|{dtype}|n{n}|k{k}|g{group}|{prologue}|v{VARIANTS}"


def row_variant(
    x2: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    **fused: torch.Tensor | float | bool | None,
) -> tuple[int, int] | None:
    """The fastest variant for this fused call's shape and prologue (timed once per process and
    kept on disk), ``DEFAULT_VARIANT`` where first seen inside a CUDA-graph capture, ``None`` where
    none fits."""
    global _row_disk
    k, n = qweight.shape[0], qweight.shape[1] * 8
    prologue = (
        "norm" if fused.get("norm_weight") is not None else "silu" if fused.get("silu_input") else "none"
    )
    index = x2.device.index if x2.device.index is not None else torch.cuda.current_device()
    key = (index, x2.dtype, n, k, group_size, prologue)
    if key in _row_choice:
        return _row_choice[key]
    fitting = [v for v in VARIANTS if fits(1, n, k, group_size, x2.dtype, *v) is None]
    if not fitting:
        return None
    if torch.cuda.is_current_stream_capturing():
        return DEFAULT_VARIANT if DEFAULT_VARIANT in fitting else fitting[0]
    if _row_disk is None:
        _row_disk = tuning_cache.load(TUNING_FAMILY)
    disk_key = _row_disk_key(x2.device, x2.dtype, n, k, group_size, prologue)
    stored = _row_disk.get(disk_key)
    if stored is not None and tuple(stored.get("variant", ())) in fitting:
        best = tuple(stored["variant"])
    else:
        from hotloop.kernels.w4a16_gemm import graph_time_us

        times = {}
        for v in fitting:
            call = partial(gemv, x2, qweight, qzeros, scales, group_size, *v, **fused)  # type: ignore[arg-type]
            times[v] = graph_time_us(call, x2.device)
        best = min(times, key=lambda v: times[v])
        logger.info(
            "W4A16 one-row %s %dx%d: %s",
            prologue,
            k,
            n,
            "  ".join(f"{v}: {t:.1f} us" for v, t in sorted(times.items(), key=lambda vt: vt[1])),
        )
        tuning_cache.store(TUNING_FAMILY, disk_key, {"variant": list(best)})
        _row_disk[disk_key] = {"variant": list(best)}
    _row_choice[key] = (best[0], best[1])
    return _row_choice[key]


def fused_gemv(
    x2: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_input: bool = False,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`gemv` with the variant :func:`row_variant` picks (``ValueError`` where none fits)."""
    fused = {
        "norm_weight": norm_weight,
        "eps": eps,
        "silu_input": silu_input,
        "bias": bias,
        "residual": residual,
    }
    variant = row_variant(x2, qweight, qzeros, scales, group_size, **fused)
    if variant is None:
        raise ValueError(f"no CUDA W4A16 GEMV variant fits K={qweight.shape[0]}, N={qweight.shape[1] * 8}")
    return gemv(x2, qweight, qzeros, scales, group_size, *variant, **fused)  # type: ignore[arg-type]
