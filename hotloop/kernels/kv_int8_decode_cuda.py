"""The CUDA C decode attention for an int8 KV cache (``kernels/cuda/kv_int8_decode.cu``): when it
applies, and its launch.

``paged_decode_attention`` sends an int8 cache here instead of its Triton kernel where ``why_not``
finds nothing against it: head dim 128, a GQA group of at most 8 query heads, fp16 / bf16
queries, no sliding window, the split merge in a second launch (the Triton ``_merge_kernel``
reads the partials this kernel writes, in the same layout), a Hopper-or-newer GPU with nvcc
(``cuda_jit``). ``HOTLOOP_KV_CUDA_DECODE=0`` keeps the Triton kernel everywhere, for comparisons.

Where the kernel cannot be built here (no nvcc, a failed compile or load) the launch falls back to
Triton; a driver error at launch, or a bad ``HOTLOOP_KV_CUDA_VARIANT``, is raised.

The kernel streams each (sequence, KV head, split)'s tiles of 64 tokens through a 3- or 4-deep
cp.async ring in shared memory and does the dots on the tensor cores; the source's header says how.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from hotloop.kernels import cuda_jit, launch_replay
from hotloop.kernels.pdl import pdl

SOURCE = "kv_int8_decode.cu"
THREADS = 128
TILE = 64  # tokens per tile (the .cu's TILE): a split covers whole tiles
STAGE_BYTES = 2 * 64 * 128 + 2 * 64 * 4  # a ring slot: 64 tokens' K codes, V codes, their pairs
HEAD_DIM = 128
MAX_GROUP = 8
ENV = "HOTLOOP_KV_CUDA_DECODE"
_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
# HOTLOOP_KV_CUDA_VARIANT picks the kernel: "rows" (O = P V with the query heads as the MMA's rows,
# a 4-tile ring: 164 registers, 3 blocks per SM), "vt" (O^T = V^T P^T: the heads as the MMA's
# columns, half the P V MMAs and output registers: 125 registers), "vt3" ("vt" with a 3-tile ring, so
# that 4 blocks fit an SM), and "vtw" / "vt3w" (vt / vt3 with a ring per warp: the .cu's WRING, no
# block barrier in the loop and every ring slot in flight while a warp waits). The default, "auto",
# takes "vtw" where the grid fits the SMs once (batch 1: a deeper ring per block) and "vt3w" otherwise
# (more blocks resident: the grid's waves). Measured on the H200 (benchmarks/results/gpu_2026-12-01d,
# heads grid): vt3w beat vt3 by 7% at batch 300 x 4.6k, 12% at 160 x 4.6k, 7% at 128 x 4k (vtw 9%),
# 1.5% at 16 x 4k, equal at batch 1; it runs at 80-83% of the bytes' floor at batch 128-300.
VARIANTS = {
    "rows": ("kv_int8_decode", 4),
    "vt": ("kv_int8_decode_vt", 4),
    "vt3": ("kv_int8_decode_vt3", 3),
    "vtw": ("kv_int8_decode_vtw", 4),
    "vt3w": ("kv_int8_decode_vt3w", 3),
}
VARIANT_ENV = "HOTLOOP_KV_CUDA_VARIANT"
AUTO = "auto"


def variant() -> str:
    """The variant HOTLOOP_KV_CUDA_VARIANT names, or "auto" (unset or empty); read at each launch:
    benchmarks flip it."""
    raw = os.environ.get(VARIANT_ENV, "") or AUTO
    if raw != AUTO and raw not in VARIANTS:
        raise ValueError(f"{VARIANT_ENV}={raw!r} must be one of {sorted(VARIANTS) + [AUTO]}")
    return raw


# HOTLOOP_KV_CUDA_GRID: the launch order of the (sequence, KV head, split) blocks. "heads" (the
# default: a sequence's KV heads next to each other, sharing the sectors of a token's scale / zero
# pairs and its 1 KB of codes) or "seq" (sequences fastest, the first order). Measured on the H200
# (benchmarks/results/gpu_2026-12-01d): vt3 with "heads" beat "seq" by 1-4% at batch 16-300 x 4k,
# equal at batch 1; the read probe gained 6-13% at batch 128-300.
GRID_ENV = "HOTLOOP_KV_CUDA_GRID"
GRIDS = ("seq", "heads")
MAX_GRID_Y = 65535


def grid_order() -> str:
    """The grid order HOTLOOP_KV_CUDA_GRID names ("heads" when unset or empty); read at each launch."""
    raw = os.environ.get(GRID_ENV, "") or "heads"
    if raw not in GRIDS:
        raise ValueError(f"{GRID_ENV}={raw!r} must be one of {list(GRIDS)}")
    return raw


def launch_grid(batch: int, kv: int, splits: int, order: str) -> tuple[tuple[int, int, int], int]:
    """The grid and the kernel's ``heads_fastest`` argument for ``order``; "heads" falls back to
    "seq" past the grid's y limit (65,535 sequences)."""
    if order == "heads" and batch <= MAX_GRID_Y:
        return (kv, batch, splits), 1
    return (batch, kv, splits), 0


def pick_variant(blocks: int, sms: int) -> str:
    """The "auto" choice for a grid of ``blocks`` on ``sms`` SMs: "vtw" where every block has an SM
    to itself, "vt3w" where blocks share SMs (both exist with the fused write too)."""
    return "vtw" if blocks <= sms else "vt3w"


# the kernels with the step's rotary embedding and int8 KV write fused in (the .cu's FUSED): O^T only
FUSED_VARIANTS = ("vt", "vt3", "vtw", "vt3w")
FUSED_ENV = "HOTLOOP_KV_CUDA_FUSED_WRITE"
# The kernels without the fused write also request their first tiles before they wait for the kernel
# before (the .cu's EARLY; the fused write always does). By default where the grid fits the SMs once
# (batch 1 and other small grids): on an H200 at batch 1 (Llama-3-8B, int8 KV,
# benchmarks/results/gpu_2026-12-01f) 250.10 / 250.16 / 250.07 tokens/s against 249.80 / 249.75 /
# 249.89 without, alternating on one host. Larger grids are not timed with it (only their first wave
# could start early). HOTLOOP_KV_CUDA_EARLY=1 turns it on for every grid, =0 off for every grid.
EARLY_ENV = "HOTLOOP_KV_CUDA_EARLY"


def early_enabled(blocks: int, sms: int) -> bool:
    """Whether a launch of ``blocks`` blocks on ``sms`` SMs takes the early prologue:
    ``HOTLOOP_KV_CUDA_EARLY`` (read at each launch) 1 for every grid, 0 for none, unset or empty
    where ``blocks <= sms``; anything else raises."""
    raw = os.environ.get(EARLY_ENV, "")
    if raw not in ("", "0", "1"):
        raise ValueError(f"{EARLY_ENV}={raw!r} must be 0 or 1 (or unset: grids that fit the SMs once)")
    return raw == "1" or (raw == "" and blocks <= sms)


FUSED_BYTES = 384  # the .cu's staging area after the ring
# the .cu's read probes (benchmarks/kv_attention_sweep.py adds them to VARIANTS for its "probe" rows;
# they copy the tiles and skip the arithmetic, so they write zeros: never a decode kernel)
PROBES = {
    "probe3": ("kv_int8_read_probe3", 3),
    "probe4": ("kv_int8_read_probe4", 4),
    "probe3w": ("kv_int8_read_probe3w", 3),
}
_KERNEL_NAMES = (
    tuple(f"{prefix}_{dt}" for prefix, _ in VARIANTS.values() for dt in _DTYPES.values())
    + tuple(f"{VARIANTS[v][0]}_fw_{dt}" for v in FUSED_VARIANTS for dt in _DTYPES.values())
    + tuple(f"{prefix}_{dt}" for prefix, _ in PROBES.values() for dt in _DTYPES.values())
)


@dataclass(frozen=True, slots=True)
class FusedWrite:
    """This step's rotary embedding and KV write, for the kernel to do (``HOTLOOP_KV_CUDA_FUSED_WRITE``):
    q comes unrotated, and ``k`` / ``v`` ``[B, KV, 128]`` (unrotated k) go into the int8 cache at
    ``slots [B]`` (int64; negative: not written) after k's rotation by ``cos`` / ``sin`` ``[B, 64]``
    (float32, full rotary), quantized as ``rotary_kv_write`` quantizes them. With ``rotated`` q and
    k arrive rotated (``dense_gemv_qkv_rope_staged``): the kernel only quantizes and writes (cos /
    sin are not read)."""

    k: torch.Tensor
    v: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    rotated: bool = False


def fused_write_enabled() -> bool:
    """``HOTLOOP_KV_CUDA_FUSED_WRITE=1`` (off by default: slower at batch 1 on the H200, 244.6 against
    248.4 tokens/s, benchmarks/results/gpu_2026-12-01d; with the staged q/k/v GEMV 244.21 against
    253.30, gpu_2026-12-01f: the GEMV's late launch trigger keeps this kernel from starting early)."""
    return os.environ.get(FUSED_ENV, "0") == "1"


def fused_why_not(q: torch.Tensor, k_cache: torch.Tensor, w: FusedWrite) -> str | None:
    """Why the kernel cannot take ``w`` with queries ``q [B, H, 128]`` over ``k_cache``
    ``[NB, BS, KV, row]``, or ``None``."""
    B, _H, D = q.shape
    kv = k_cache.shape[2]
    chosen = variant()
    if chosen != AUTO and chosen not in FUSED_VARIANTS:
        return f"{VARIANT_ENV}={chosen} (the fused write is in the {'/'.join(FUSED_VARIANTS)} kernels)"
    for label, t in (("k", w.k), ("v", w.v), ("cos", w.cos), ("sin", w.sin), ("slots", w.slots)):
        if t.device != q.device:
            return f"{label} is on {t.device}, q on {q.device}"
    for name, t in (("k", w.k), ("v", w.v)):
        if t.dim() != 3 or t.shape != (B, kv, D) or t.dtype != q.dtype:
            return f"{name} {tuple(t.shape)} {t.dtype}: must be [{B}, {kv}, {D}] in {q.dtype} (the cache's KV heads)"
        if t.stride(2) != 1 or t.stride(1) != D:
            return f"{name}'s heads must be contiguous rows of {D}"
    for name, t in (("cos", w.cos), ("sin", w.sin)):
        if t.shape != (B, D // 2) or t.dtype != torch.float32 or t.stride(1) != 1:
            return f"{name} {tuple(t.shape)} {t.dtype}: must be float32 [{B}, {D // 2}] (full rotary)"
    if w.cos.stride() != w.sin.stride():
        return "cos and sin have different strides"
    if w.slots.shape != (B,) or w.slots.dtype != torch.int64 or w.slots.stride(0) != 1:
        return f"slots {tuple(w.slots.shape)} {w.slots.dtype}: must be int64 [{B}], contiguous"
    return None


def kernel_names() -> list[str]:
    """Every kernel the source defines (each variant in each dtype)."""
    return list(_KERNEL_NAMES)


def enabled() -> bool:
    """``HOTLOOP_KV_CUDA_DECODE`` is not 0 (read at each call: benchmarks flip it between runs)."""
    return os.environ.get(ENV, "1") != "0"


def why_not(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    quant: int,
    group: int,
    window: int,
    fuse_merge: bool,
) -> str | None:
    """Why the CUDA kernel cannot take this launch, or ``None`` when it can. ``q`` ``[B, H, D]``,
    the caches as ``paged_decode_attention`` takes them."""
    if quant != 8:
        return f"an int{quant or 16} cache (the kernel reads int8)"
    if not enabled():
        return f"{ENV}=0"
    if q.dtype not in _DTYPES:
        return f"{q.dtype} queries (fp16 / bf16 only)"
    if q.shape[-1] != HEAD_DIM:
        return f"head_dim {q.shape[-1]} (128 only)"
    if group > MAX_GROUP:
        return f"a GQA group of {group} query heads (at most {MAX_GROUP})"
    if window:
        return "a sliding window"
    if fuse_merge:
        return "a merge fused into the launch"
    bs = k_cache.shape[1]
    if bs & (bs - 1):
        return f"a block size of {bs} tokens (a power of two only)"
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.data_ptr() % 16 or c.stride(0) % 16:
            return f"{name}'s blocks are not 16-byte aligned (cp.async copies 16 bytes)"
    if q.device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "not on a GPU"
    if not cuda_jit.enabled():
        return f"{cuda_jit.ENV}=0"
    return _machine_why_not(q.device.index if q.device.index is not None else torch.cuda.current_device())


def takes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    quant: int,
    group: int,
    window: int,
    fuse_merge: bool,
) -> bool:
    """Whether a launch with these arguments runs this kernel: ``why_not`` finds nothing and the
    kernels build and load here (``launch`` falls back to Triton where they do not; the build is
    cached, so asking compiles at most once per process and device)."""
    if why_not(q, k_cache, v_cache, quant, group, window, fuse_merge) is not None:
        return False
    return cuda_jit.load(SOURCE, q.device, _KERNEL_NAMES) is not None


_machine: dict[int, str | None] = {}
_sms: dict[int, int] = {}


def _sm_count(index: int) -> int:
    if index not in _sms:
        _sms[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _sms[index]


def _machine_why_not(index: int) -> str | None:
    """What this machine lacks for the kernel on GPU ``index`` (looked up once: the decode launcher
    asks at every launch)."""
    if index not in _machine:
        if cuda_jit.find_nvcc() is None:
            _machine[index] = "no nvcc"
        elif torch.cuda.get_device_capability(index)[0] < 9:
            _machine[index] = "a GPU older than Hopper (the kernel waits with griddepcontrol)"
        else:
            _machine[index] = None
    return _machine[index]


def choose(batch: int, kv: int, num_splits: int, device: torch.device) -> str:
    """The variant a launch of ``batch`` sequences x ``kv`` heads x ``num_splits`` runs: the one
    HOTLOOP_KV_CUDA_VARIANT names, else ``pick_variant``'s."""
    name = variant()
    if name == AUTO:
        name = pick_variant(batch * kv * num_splits, _sm_count(device.index or 0))
    return name


def launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    part: torch.Tensor | None,
    lse: torch.Tensor | None,
    scale_log2: float,
    num_splits: int,
    fused: FusedWrite | None = None,
    exclude_newest: bool = False,
) -> bool:
    """Launch the kernel on checked inputs (``paged_decode_attention`` checks them): with one split
    it writes ``out`` ``[B, H, D]``; with more, the float32 partials ``part`` ``[B, H, S, D]`` and
    their log2-sum-exp ``lse`` ``[B, H, S]`` for ``_merge_kernel``. With ``fused`` (checked by
    ``fused_why_not``) the kernel also writes this step's k / v (and, unless ``fused.rotated``,
    rotates q and k first). ``exclude_newest``: every split stops before position ``seq_lens[b] - 1``
    (this step's token, not yet in the cache: the split merge attends to it and writes it,
    ``decode_merge_write.py``); needs splits and no ``fused``. False (nothing launched) where the
    kernels cannot be built here."""
    assert not (exclude_newest and (fused is not None or num_splits < 2)), (
        "exclude_newest: splits, no fused write"
    )
    kv = k_cache.shape[2]
    name = choose(q.shape[0], kv, num_splits, q.device)
    prefix, stages = VARIANTS[name]
    if fused is not None:
        assert name in FUSED_VARIANTS, name
        prefix += "_fw"
    kernels = cuda_jit.load(SOURCE, q.device, _KERNEL_NAMES)
    if kernels is None:
        return False
    B, H, _D = q.shape
    _nb, bs, _kv, _row = k_cache.shape
    if num_splits > 1:
        assert part is not None and lse is not None
    grid, heads_fastest = launch_grid(B, kv, num_splits, grid_order())
    args = (
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part,
        lse,
        float(scale_log2),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        v_cache.stride(0),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        H // kv,
        kv,
        bs,
        num_splits,
        bs.bit_length() - 1,
        heads_fastest,
        *(
            (fused.k, fused.v, fused.k.stride(0), fused.v.stride(0), fused.cos, fused.sin, fused.cos.stride(0),
             fused.slots)
            if fused is not None
            else (None, None, 0, 0, None, None, 0, None)
        ),
        int(fused is not None and fused.rotated),
        # the .cu's `early` flags: bit 0 the early prologue, bit 1 the newest token excluded
        int(early_enabled(B * kv * num_splits, _sm_count(q.device.index or 0))) | (2 if exclude_newest else 0),
    )  # fmt: skip
    kernel = kernels[f"{prefix}_{_DTYPES[q.dtype]}"]
    shared = stages * STAGE_BYTES + (FUSED_BYTES if fused is not None else 0)
    use_pdl = pdl(q.device)

    def run(*a: object) -> None:
        kernel(grid, THREADS, a, shared_bytes=shared, pdl=use_pdl)  # type: ignore[arg-type]

    run(*args)
    launch_replay.note_launch(run, args)  # the piecewise graphs' attention replays it per layer
    return True
