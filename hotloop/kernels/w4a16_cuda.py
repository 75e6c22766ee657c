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
- the one-row W4A16 decoder layer (``models/llama.py``) calls :func:`fused_gemv`, which also runs
  the layer's RMSNorm in front (its mean square from the sums of squares per column tile that the
  launch producing the row wrote, so no pass over the row) and its bias and residual adds, or the
  SiLU-and-mul of the gate/up projection, behind (the unfused layer's roundings): a layer is four
  launches plus attention instead of seven. Its variant is timed once per shape and form
  (:func:`row_variant`, kept on disk like the other tunings).

They exist only where ``cuda_jit`` can compile them (nvcc found, ``HOTLOOP_CUDA_KERNELS`` not 0).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

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
# (prologue, SiLU epilogue) compiled per variant: prologue 0 the row as given, 1 RMSNorm with a
# pass over the row, 2 RMSNorm from the sums of squares the producing launch wrote (``ss_in``)
FORMS: tuple[tuple[int, int], ...] = ((0, 0), (1, 0), (2, 0), (2, 1))
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
TUNING_FAMILY = "w4a16_cuda_row"


def kernel_name(dtype: torch.dtype, nl: int, r: int, prologue: int = 0, silu: int = 0) -> str:
    return f"w4a16_gemv_{_DTYPES[dtype]}_nl{nl}_r{r}_p{prologue}_s{silu}"


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
    return [kernel_name(dt, nl, r, p, si) for dt in _DTYPES for nl, r in VARIANTS for p, si in FORMS]


def _check_row(name: str, t: torch.Tensor | None, size: int, dtype: torch.dtype) -> None:
    if t is None:
        return
    if t.dtype != dtype or t.numel() != size or not t.is_contiguous() or t.data_ptr() % 16:
        raise ValueError(
            f"{name} must be {size} contiguous, 16-byte aligned {dtype} values; got {tuple(t.shape)} {t.dtype}"
        )


def launch(
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
    ss_in: torch.Tensor | None = None,
    silu_out: bool = False,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    want_ss: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``epilogue(prologue(x2) @ W)`` with variant ``(nl, r)`` -> ``(out, sums of squares or None)``.

    Prologue: with ``norm_weight [K]`` an RMSNorm (``eps``) of ``x2 [1, K]``, its mean square from
    ``ss_in`` (the ``want_ss`` output of the launch that wrote ``x2``) where given, else from a pass
    over the row. Epilogue: ``bias [N]`` and ``residual [1, N]`` added, in that order; or, with
    ``silu_out``, the weight is ``[gate | up]`` and the output ``[1, N / 2]`` is SiLU(gate) * up (no
    bias or residual then). ``want_ss``: also return the float32 sums of squares of the output per
    column tile. The unfused layer's roundings throughout (``kernels/reference.py``). Every tensor
    contiguous, 16-byte aligned, in x's dtype (``ss_in`` float32, a multiple of 4 values). Raises
    ``ValueError`` where the variant does not fit and ``cuda_jit.CudaError`` where the kernels cannot
    be built."""
    k = qweight.shape[0]
    n = qweight.shape[1] * 8
    if x2.dim() != 2 or x2.shape != (1, k):
        raise ValueError(f"x must be [1, {k}]; got {tuple(x2.shape)}")
    why = fits(1, n, k, group_size, x2.dtype, nl, r)
    if why is not None:
        raise ValueError(f"the CUDA W4A16 GEMV ({nl}, {r}) {why}")
    if scales.dtype != x2.dtype:
        raise ValueError(f"scales dtype {scales.dtype} must equal x dtype {x2.dtype}")
    for name, t in (("x", x2), ("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"{name} must be contiguous and 16-byte aligned")
    if ss_in is not None and norm_weight is None:
        raise ValueError("ss_in is the RMSNorm's: it needs norm_weight")
    if silu_out and (bias is not None or residual is not None):
        raise ValueError("silu_out takes no bias or residual")
    out_n = n // 2 if silu_out else n
    _check_row("norm_weight", norm_weight, k, x2.dtype)
    _check_row("bias", bias, n, x2.dtype)
    _check_row("residual", residual, out_n, x2.dtype)
    if ss_in is not None:
        _check_row("ss_in", ss_in, ss_in.numel(), torch.float32)
        if ss_in.numel() % 4:
            raise ValueError(f"ss_in must hold a multiple of 4 sums; got {ss_in.numel()}")
    kernels = cuda_jit.load(SOURCE, x2.device, _names())
    if kernels is None:
        raise cuda_jit.CudaError("the CUDA W4A16 kernels are not available on this machine")
    bn, kb = tile(nl, r)
    split = k // kb
    tiles = n // bn
    out = torch.empty(1, out_n, dtype=x2.dtype, device=x2.device)
    ss = torch.empty(tiles, dtype=torch.float32, device=x2.device) if want_ss else None
    ws: torch.Tensor | None = None
    cnt: torch.Tensor | None = None
    if split > 1:
        ws = torch.empty(split, n, dtype=torch.float32, device=x2.device)
        cnt = counters.counters(x2.device, "w4a16_cuda", tiles)
        if cnt is None:
            raise ValueError("no split-K counters (first use inside a CUDA-graph capture)")
    prologue = 0 if norm_weight is None else 2 if ss_in is not None else 1
    name = kernel_name(x2.dtype, nl, r, prologue, int(silu_out))
    if name not in kernels:
        raise ValueError(f"no compiled form (prologue {prologue}, silu {int(silu_out)}); there are {FORMS}")
    from hotloop.kernels.pdl import pdl

    args = (
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
    )
    kernels[name](
        (tiles, split),
        THREADS,
        (*args, ss_in, 0 if ss_in is None else ss_in.numel(), ss),
        pdl=pdl(x2.device),
    )
    return out, ss


def gemv(
    x2: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    nl: int,
    r: int,
    **fused: Any,
) -> torch.Tensor:
    """:func:`launch`'s output alone."""
    return launch(x2, qweight, qzeros, scales, group_size, nl, r, **fused)[0]


_row_choice: dict[tuple, tuple[int, int]] = {}
_row_disk: dict[str, dict] | None = None


def _form(fused: dict[str, Any]) -> str:
    prologue = 0 if fused.get("norm_weight") is None else 2 if fused.get("ss_in") is not None else 1
    return f"p{prologue}s{int(bool(fused.get('silu_out')))}r{int(fused.get('residual') is not None)}"


def row_variant(
    x2: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    **fused: Any,
) -> tuple[int, int] | None:
    """The fastest variant for this fused call's shape and form (timed once per process and kept
    on disk), ``DEFAULT_VARIANT`` where first seen inside a CUDA-graph capture, ``None`` where none
    fits."""
    global _row_disk
    k, n = qweight.shape[0], qweight.shape[1] * 8
    form = _form(fused)
    index = x2.device.index if x2.device.index is not None else torch.cuda.current_device()
    key = (index, x2.dtype, n, k, group_size, form)
    if key in _row_choice:
        return _row_choice[key]
    fitting = [v for v in VARIANTS if fits(1, n, k, group_size, x2.dtype, *v) is None]
    if not fitting:
        return None
    if torch.cuda.is_current_stream_capturing():
        return DEFAULT_VARIANT if DEFAULT_VARIANT in fitting else fitting[0]
    if _row_disk is None:
        _row_disk = tuning_cache.load(TUNING_FAMILY)
    name = torch.cuda.get_device_name(x2.device)
    disk_key = f"{tuning_cache.environment_key(name)}|{x2.dtype}|n{n}|k{k}|g{group_size}|{form}|v{VARIANTS}"
    stored = _row_disk.get(disk_key)
    if stored is not None and tuple(stored.get("variant", ())) in fitting:
        best = tuple(stored["variant"])
    else:
        from hotloop.kernels.w4a16_gemm import graph_time_us

        times = {}
        for v in fitting:
            times[v] = graph_time_us(
                partial(launch, x2, qweight, qzeros, scales, group_size, *v, **fused), x2.device
            )
        best = min(times, key=lambda v: times[v])
        logger.info(
            "W4A16 one-row %s %dx%d: %s",
            form,
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
    **fused: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`launch` with the variant :func:`row_variant` picks (``ValueError`` where none fits)."""
    variant = row_variant(x2, qweight, qzeros, scales, group_size, **fused)
    if variant is None:
        raise ValueError(f"no CUDA W4A16 GEMV variant fits K={qweight.shape[0]}, N={qweight.shape[1] * 8}")
    return launch(x2, qweight, qzeros, scales, group_size, *variant, **fused)
