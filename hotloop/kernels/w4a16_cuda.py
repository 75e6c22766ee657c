"""The CUDA C W4A16 one-row GEMV (``kernels/cuda/w4a16_gemv.cu``): its variants, limits and launch.

One row of 16-bit ``x`` times an AutoAWQ int4 weight, for decode at batch 1. Each thread streams
its packed words straight into registers with 16-byte loads (the Triton GEMV goes through shared
memory) and does the Triton ``half2`` kernel's packed 16-bit arithmetic; the source's header says
how. A variant is ``(NL, R, T)``: ``NL`` lanes of 32 columns along N per block of ``T`` threads and
``R`` rows of K per thread, so a block covers ``32 NL`` columns and ``(T / NL) R`` rows, and K is
split into ``K / ((T / NL) R)`` slices (the last block of a column tile to finish adds the slices, in
a fixed order). ``w4a16_gemm``'s tuner times the variants that fit a shape beside the Triton
launches (kind ``"cuda"``, ``num_warps`` = T / 32) and keeps the fastest; they exist only where
``cuda_jit`` can compile them.

By default the kernels request their first 8 rows of weights, the zero points and the scales before
they wait for the kernel before them (``pdl.py``), so those loads overlap its last blocks. They go
through ``ld.global``: ptxas (CUDA 13.0) places ``griddepcontrol.wait`` above any ``ld.global.nc``
before it, so through the read-only path the "early" loads were in fact issued after the wait (the
thirty-third session found it in the SASS). H200, Llama-3-8B W4A16 batch 1, alternating in one call
(thirty-fourth session, ``benchmarks/results/gpu_2026-12-06e``): 466.9 / 468.0 tokens/s with the
loads before the wait (``ld``, now the default) against 452.8 / 455.3 with the ``.nc`` form
(``HOTLOOP_W4A16_EARLY=1``, the default from the twenty-seventh session, when it measured 452.2 /
454.1 against 421.4 / 423.8 for kernels that wait first). ``HOTLOOP_W4A16_EARLY=0`` launches the
kernels that wait first. ``HOTLOOP_W4A16_EARLY=all`` requests every row of a thread's weights
before the wait in the 16-row variants (``_e16ld`` kernels: 128 registers against 96-100 with 8 rows
early, the same two 256-thread blocks per SM; the 32-row variants keep 8, since all 32 would take 255
registers and one block per SM); opt-in, not yet measured.
"""

from __future__ import annotations

import logging
import os

import torch

from hotloop.kernels import counters, cuda_jit
from hotloop.kernels.pdl import pdl
from hotloop.kernels.w4a16_one_row import DTYPE_TAGS as _DTYPES
from hotloop.kernels.w4a16_one_row import check_operands, launch_buffers
from hotloop.utils.env import switch

logger = logging.getLogger(__name__)

SOURCE = "w4a16_gemv.cu"
THREADS = 256  # the default block
EARLY_ROWS = 8  # rows of weights the early kernels request before their wait
EARLY_ENV = "HOTLOOP_W4A16_EARLY"
# (NL, R, threads) as compiled in w4a16_gemv.cu. H200, Llama-3-8B shapes, bf16, cold L2
# (benchmarks/awq_gemm.py, fifteenth session call2): (2, 16) or (4, 16) fastest for q/k/v and o,
# (4, 32) for gate/up and down (256 threads). Tried and dropped: 8 lanes (128 bytes of a row per
# block) and variants that issue all of a thread's loads before its arithmetic (more registers,
# fewer blocks per SM) were slower everywhere. 128-thread blocks (twice the blocks per SM for the
# same warps): fastest without the early loads for q/k/v and gate/up (9.25 against 9.6 us, 29.3
# against 29.7; twenty-seventh session call1); with them (4, 32, 256) and (4, 32, 128) lead.
VARIANTS: tuple[tuple[int, int, int], ...] = (
    (2, 16, 256),
    (4, 8, 256),
    (4, 16, 256),
    (4, 32, 256),
    (2, 16, 128),
    (4, 16, 128),
    (4, 32, 128),
)


EARLY_VALUES = ("0", "1", "ld", "all")
DEFAULT_EARLY = "ld"
_warned_values: set[str] = set()


def _early_value() -> str:
    """``HOTLOOP_W4A16_EARLY`` (``ld`` unless set); another value than 0, 1, ld or all is logged
    once and read as ld."""
    value = os.environ.get(EARLY_ENV, DEFAULT_EARLY)
    if value in EARLY_VALUES:
        return value
    if value not in _warned_values:
        _warned_values.add(value)
        logger.warning(
            "%s=%r: use one of %s; taking %s", EARLY_ENV, value, ", ".join(EARLY_VALUES), DEFAULT_EARLY
        )
    return DEFAULT_EARLY


def early_form() -> str:
    """The early-load form launches take: ``HOTLOOP_W4A16_EARLY``'s value (0, 1, ld or all), read
    as ``_early_value`` reads it. Part of the tuner's stored key for one row (``w4a16_gemm.disk_key``):
    each form's kernels may want other variants."""
    return _early_value()


def early() -> bool:
    """Whether launches take the early-load kernels (``HOTLOOP_W4A16_EARLY``, on unless ``0``; read
    at each launch: a CUDA graph keeps the kernel it captured)."""
    return _early_value() != "0"


def early_coherent() -> bool:
    """``HOTLOOP_W4A16_EARLY=ld`` (the default): the early loads through ``ld.global`` instead of
    ``ld.global.nc``. ptxas (CUDA 13.0) places the kernel's ``griddepcontrol.wait`` above every
    ``ld.global.nc`` before it, so the ``1`` form's "early" loads are issued after the wait (only
    their order changes: the zero points and scales first); with ``ld`` they start before it
    (+3% at W4A16 batch 1 on an H200, the module docstring)."""
    return _early_value() in ("ld", "all")


ALL_EARLY_MAX_ROWS = 16  # HOTLOOP_W4A16_EARLY=all: variants of at most this many rows load them all early


def early_rows(r: int) -> int:
    """How many of a thread's ``r`` rows of weights a launch requests before its wait:
    ``EARLY_ROWS`` (``HOTLOOP_W4A16_EARLY`` 1 or ld), all ``r`` where ``r <= ALL_EARLY_MAX_ROWS``
    (all; ``EARLY_ROWS`` above), or none (0)."""
    value = _early_value()
    if value == "0":
        return 0
    return r if value == "all" and r <= ALL_EARLY_MAX_ROWS else EARLY_ROWS


def kernel_name(
    dtype: torch.dtype,
    nl: int,
    r: int,
    threads: int = THREADS,
    early_rows: int = 0,
    coherent: bool = False,
    silu: bool = False,
) -> str:
    t = "" if threads == THREADS else f"_t{threads}"
    e = f"_e{early_rows}" + ("ld" if coherent else "") if early_rows else ""
    return f"w4a16_gemv_{_DTYPES[dtype]}_nl{nl}_r{r}{t}{e}" + ("_silu" if silu else "")


def tile(nl: int, r: int, threads: int = THREADS) -> tuple[int, int]:
    """``(columns, rows)`` one block of variant ``(nl, r, threads)`` covers."""
    return 32 * nl, (threads // nl) * r


def fits(
    m: int, n: int, k: int, group_size: int, dtype: torch.dtype, nl: int, r: int, threads: int = THREADS
) -> str | None:
    """Why variant ``(nl, r, threads)`` cannot run this product, or ``None`` when it can."""
    bn, kb = tile(nl, r, threads)
    if (nl, r, threads) not in VARIANTS:
        return f"no variant ({nl}, {r}, {threads}); there are {VARIANTS}"
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
    if n // bn > counters.SLOTS:
        return "too many column tiles"
    return None


def available(device: torch.device) -> bool:
    """Whether the CUDA kernels can be compiled here (a Hopper or newer GPU: the kernel waits with
    ``griddepcontrol``; nvcc found; not turned off); cheap: compiling and loading happen at the
    first launch."""
    if device.type != "cuda" or not cuda_jit.enabled() or cuda_jit.find_nvcc() is None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def _names() -> list[str]:
    return (
        [kernel_name(dt, *v) for dt in _DTYPES for v in VARIANTS]
        + [
            kernel_name(dt, *v, early_rows=EARLY_ROWS, coherent=c)
            for dt in _DTYPES
            for v in VARIANTS
            for c in (False, True)
        ]
        + [
            kernel_name(dt, *v, early_rows=v[1], coherent=True)
            for dt in _DTYPES
            for v in VARIANTS
            if EARLY_ROWS < v[1] <= ALL_EARLY_MAX_ROWS
        ]
        + [
            kernel_name(dt, *v, early_rows=EARLY_ROWS, coherent=True, silu=True)
            for dt in _DTYPES
            for v in VARIANTS
        ]
    )


def gemv(
    x2: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    nl: int,
    r: int,
    threads: int = THREADS,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x2 [1, K] @ W`` -> ``[1, N]`` in x's dtype with variant ``(nl, r, threads)``. Every tensor contiguous
    and 16-byte aligned (``w4a16_gemm._aligned``); scales in x's dtype. Raises ``ValueError`` where
    the variant does not fit and ``cuda_jit.CudaError`` where the kernels cannot be built."""
    k, n = check_operands(x2, qweight, qzeros, scales, group_size)
    name = kernel_name(x2.dtype, nl, r, threads, early_rows(r), early_coherent())
    return _launch(name, x2, x2.shape[0], k, n, qweight, qzeros, scales, group_size, nl, r, threads, out)


def _launch(
    name: str,
    x: torch.Tensor,
    m: int,
    k: int,
    n: int,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    nl: int,
    r: int,
    threads: int,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """Kernel ``name`` of variant ``(nl, r, threads)`` over ``x`` (checked operands of a ``[1, K] @
    [K, N]`` product): its fit, its buffers and the launch."""
    why = fits(m, n, k, group_size, x.dtype, nl, r, threads)
    if why is not None:
        raise ValueError(f"the CUDA W4A16 GEMV ({nl}, {r}, {threads}) {why}")
    kernels = cuda_jit.load(SOURCE, x.device, _names())
    if kernels is None:
        raise cuda_jit.CudaError("the CUDA W4A16 kernels are not available on this machine")
    bn, kb = tile(nl, r, threads)
    split = k // kb
    tiles = n // bn
    out, ws, cnt = launch_buffers(x, n, split, tiles, "w4a16_cuda", out)
    kernels[name](
        (tiles, split),
        threads,
        (x, qweight, qzeros, scales, ws, out, cnt, n, k, group_size),
        pdl=pdl(x.device),
    )
    return out


SILU_ENV = "HOTLOOP_W4A16_FUSED_SILU"


def silu_fusion() -> bool:
    """At batch 1 the down projection folds the SiLU-and-mul into its loads of x (``gemv_silu_mul``),
    one launch a layer fewer: the default (403.5 against 394.8-398.0 tokens/s at W4A16 batch 1 on an
    H100, BENCHMARKS "thirty-fifth session"; the same output as the two launches).
    ``HOTLOOP_W4A16_FUSED_SILU=0`` runs the two launches."""
    return switch(SILU_ENV, True, logger)


def gemv_silu_mul(
    gate_up: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    nl: int,
    r: int,
    threads: int = THREADS,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``silu(gate) * up @ W`` -> ``[1, N]`` for the gate/up projection's row ``gate_up [1, 2K]`` laid
    out [gate | up] (``kernels/silu_and_mul.py``'s input and roundings: the SiLU rounded to 16 bits,
    then the product), with variant ``(nl, r, threads)`` and the default early loads (``_e8ld_silu``,
    whatever ``HOTLOOP_W4A16_EARLY`` says): the same result as ``gemv(silu_and_mul(gate_up), ...)``
    without the separate launch. Raises ``ValueError`` naming a wrong operand or a variant that does
    not fit, ``cuda_jit.CudaError`` where the kernels cannot be built."""
    k = int(qweight.shape[0])
    if gate_up.dim() != 2 or tuple(gate_up.shape) != (1, 2 * k):
        raise ValueError(f"gate_up must be [1, {2 * k}] ([gate | up] for K={k}); got {tuple(gate_up.shape)}")
    if k % 8:
        raise ValueError(f"K={k} must be a multiple of 8 (the up half's 16-byte alignment)")
    if not gate_up.is_contiguous():
        raise ValueError("gate_up must be contiguous")
    k, n = check_operands(gate_up[:, :k], qweight, qzeros, scales, group_size)
    name = kernel_name(gate_up.dtype, nl, r, threads, EARLY_ROWS, True, silu=True)
    return _launch(name, gate_up, 1, k, n, qweight, qzeros, scales, group_size, nl, r, threads, out)
