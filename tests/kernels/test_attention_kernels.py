"""Paged decode and prefill attention kernels against ``reference.paged_attention``.

GPU: head dims 64/128/256, GQA ratios 1/4/8, block sizes 16 and 64, contexts over many blocks,
sliding windows, split-KV on and off. CPU: the same code through Triton's interpreter at tiny sizes.
Every case draws fresh random inputs and scatters each sequence's blocks over the pool.
"""

from __future__ import annotations

import random

import pytest
import torch
from kernel_checks import TOL, interpret, rel_err

from hotloop.kernels import reference


def _pool(
    lens: list[int], kv: int, d: int, bs: int, dtype: torch.dtype, device: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K/V pool with shuffled, non-contiguous blocks per sequence; block_tables [B, W]."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    nb = sum(need) + 3
    k = torch.randn(nb, bs, kv, d, generator=g).to(dtype).to(device)
    v = torch.randn(nb, bs, kv, d, generator=g).to(dtype).to(device)
    perm = torch.randperm(nb, generator=g).tolist()
    width = max(need) + 1
    tables = torch.zeros(len(lens), width, dtype=torch.int32)
    at = 0
    for i, n in enumerate(need):
        tables[i, :n] = torch.tensor(perm[at : at + n], dtype=torch.int32)
        at += n
    return k, v, tables.to(device)


def _decode_case(
    lens: list[int],
    h: int,
    kv: int,
    d: int,
    bs: int,
    dtype: torch.dtype,
    device: str,
    window: int | None,
    splits: int | None,
    fuse_merge: bool | None = None,
    graph_plan: bool = False,
) -> None:
    from hotloop.kernels.paged_decode_attention import paged_decode_attention

    seed = random.randrange(1 << 30)
    k, v, tables = _pool(lens, kv, d, bs, dtype, device, seed)
    q = torch.randn(len(lens), h, d, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(device)
    scale = d**-0.5
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    paged_decode_attention(
        q, k, v, tables, seq, scale, window, splits, out=out, fuse_merge=fuse_merge, graph_plan=graph_plan
    )
    ref = reference.paged_attention(
        q.float(), k.float(), v.float(), tables, [1] * len(lens), lens, scale, window
    )
    live = seq > 0  # padding rows (seq_len 0) come out as zeros; the reference gives NaN there
    assert rel_err(out[live], ref[live]) < TOL[dtype]
    assert (out[~live] == 0).all()


def _prefill_case(
    qlens: list[int],
    ctx: list[int],
    h: int,
    kv: int,
    d: int,
    bs: int,
    dtype: torch.dtype,
    device: str,
    window: int | None,
) -> None:
    from hotloop.kernels.paged_prefill_attention import paged_prefill_attention

    seed = random.randrange(1 << 30)
    lens = [c + n for c, n in zip(ctx, qlens, strict=True)]
    k, v, tables = _pool(lens, kv, d, bs, dtype, device, seed)
    q = torch.randn(sum(qlens), h, d, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(device)
    starts = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    scale = d**-0.5
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(q, k, v, tables, seq, starts, max(qlens), scale, window, out=out)
    ref = reference.paged_attention(q.float(), k.float(), v.float(), tables, qlens, lens, scale, window)
    assert rel_err(out, ref) < TOL[dtype]


# -- GPU grid ----------------------------------------------------------------------------------
GQA = [(8, 8), (16, 4), (32, 4)]  # (heads, kv heads): ratios 1, 4, 8


# bf16 over the whole grid; fp16 at the common head dim (each combination compiles its own kernel)
GRID = [
    pytest.param(d, h, kv, bs, dtype, id=f"d{d}-h{h}-kv{kv}-bs{bs}-{str(dtype)[6:]}")
    for d in (64, 128, 256)
    for h, kv in GQA
    for bs in (16, 64)
    for dtype in (torch.bfloat16, torch.float16)
    if dtype == torch.bfloat16 or (d == 128 and bs == 16)
]


@pytest.mark.gpu
@pytest.mark.parametrize("d,h,kv,bs,dtype", GRID)
def test_decode_gpu(d: int, h: int, kv: int, bs: int, dtype: torch.dtype) -> None:
    lens = [1, 17, 300, 1031, 64 * 40 + 5]
    for splits in (1, None, 7):
        _decode_case(lens, h, kv, d, bs, dtype, "cuda", None, splits)
    _decode_case(lens, h, kv, d, bs, dtype, "cuda", 200, None)
    for splits in (2, 16):  # the last split merges, every launch leaving its counters at zero
        _decode_case(lens, h, kv, d, bs, dtype, "cuda", None, splits, fuse_merge=True)
    _decode_case(lens, h, kv, d, bs, dtype, "cuda", 200, 4, fuse_merge=True)
    from hotloop.kernels import counters

    torch.cuda.synchronize()
    assert int(counters.buffer(torch.device("cuda"), "decode_merge").abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("grid", ["heads", "seq"])
@pytest.mark.parametrize("d,h,kv,bs,dtype", [g for g in GRID if g.values[0] == 128])
def test_decode_grid_order_gpu(
    d: int, h: int, kv: int, bs: int, dtype: torch.dtype, grid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either ``HOTLOOP_DECODE_GRID`` order on the GPU ("heads", the default, and "seq"): one split,
    splits merged by a launch, fused merge."""
    monkeypatch.setenv("HOTLOOP_DECODE_GRID", grid)
    lens = [1, 17, 300, 1031, 64 * 40 + 5]
    for splits in (1, None, 7):
        _decode_case(lens, h, kv, d, bs, dtype, "cuda", None, splits)
    _decode_case(lens, h, kv, d, bs, dtype, "cuda", None, 4, fuse_merge=True)
    from hotloop.kernels import counters

    torch.cuda.synchronize()
    assert int(counters.buffer(torch.device("cuda"), "decode_merge").abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("diag_split", [False, True])
@pytest.mark.parametrize("d,h,kv,bs,dtype", GRID)
def test_prefill_gpu(
    d: int, h: int, kv: int, bs: int, dtype: torch.dtype, diag_split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hotloop.kernels import paged_prefill_attention as mod

    monkeypatch.setattr(mod, "DIAG_SPLIT", diag_split)
    # whole prompts, a chunk after a cached prefix, and decode rows in one mixed batch
    _prefill_case([700, 1, 130, 64, 1], [0, 900, 250, 0, 5], h, kv, d, bs, dtype, "cuda", None)
    _prefill_case([300, 77], [0, 129], h, kv, d, bs, dtype, "cuda", 100)
    _prefill_case([1100, 1], [0, 40], h, kv, d, bs, dtype, "cuda", None)  # the tiles from 1,024 tokens
    _prefill_case([700, 77], [0, 500], h, kv, d, bs, dtype, "cuda", 300)  # unmasked tiles inside a window


@pytest.mark.gpu
def test_prefill_one_variant_whatever_the_first_row_gpu() -> None:
    """A mixed step hands the prefill kernel ``seq_lens[num_decodes:]`` and ``block_tables[num_decodes:]``:
    views starting at any row. They must all run the kernel compiled for the first (no compile
    while serving), and each must be right."""
    from hotloop.kernels.paged_prefill_attention import _prefill_kernel, paged_prefill_attention

    h, kv, d, bs, dtype = 8, 2, 64, 16, torch.bfloat16
    decodes = [9, 33, 70]  # rows before the prefill rows, as a mixed step's decodes
    qlens, ctx = [37, 5], [0, 20]
    lens_all = decodes + [c + n for c, n in zip(ctx, qlens, strict=True)]
    k, v, tables_all = _pool(lens_all, kv, d, bs, dtype, "cuda", random.randrange(1 << 30))
    seq_all = torch.tensor(lens_all, dtype=torch.int32, device="cuda")
    q = torch.randn(sum(qlens), h, d, device="cuda").to(dtype)
    starts = torch.tensor([0, qlens[0], sum(qlens)], dtype=torch.int32, device="cuda")
    counts = []
    for first in range(4):  # prefill rows after 0-3 decode rows: every alignment of an int32 row
        tables = torch.cat([tables_all[:first], tables_all[3:]]) if first < 3 else tables_all
        seq = torch.cat([seq_all[:first], seq_all[3:]]) if first < 3 else seq_all
        lens = seq.tolist()[first:]
        out = paged_prefill_attention(q, k, v, tables[first:], seq[first:], starts, max(qlens), d**-0.5)
        ref = reference.paged_attention(q.float(), k.float(), v.float(), tables[first:], qlens, lens, d**-0.5)
        assert rel_err(out, ref) < TOL[dtype]
        counts.append(len(_prefill_kernel.device_caches[torch.cuda.current_device()][0]))
    assert counts[1:] == counts[:-1], f"compiled variants after each first row: {counts}"


@pytest.mark.gpu
@pytest.mark.parametrize("d,h,kv", [(128, 32, 8), (64, 9, 3)])
def test_decode_early_tile_gpu(d: int, h: int, kv: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """HOTLOOP_DECODE_EARLY (``EARLY``): the first tile requested before the PDL wait, the newest
    row after it. Right after the kernel that wrote each sequence's newest row (``write_kv_cache``,
    as a decode step's q/k/v projection writes it), the output matches the reference over the
    cache as written; each of three steps writes new values there, so a stale read would show."""
    from hotloop.kernels import paged_decode_attention as mod
    from hotloop.kernels.rotary_kv_write import write_kv_cache

    monkeypatch.setattr(mod, "EARLY", True)
    lens, bs, dtype = [0, 1, 17, 64, 65, 300, 64 * 40 + 5], 16, torch.bfloat16
    k, v, tables = _pool(lens, kv, d, bs, dtype, "cuda", random.randrange(1 << 30))
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    slots = torch.tensor(
        [int(tables[i, (n - 1) // bs]) * bs + (n - 1) % bs if n > 0 else -1 for i, n in enumerate(lens)],
        dtype=torch.int64,
        device="cuda",
    )
    q = torch.randn(len(lens), h, d, device="cuda").to(dtype)
    for step in range(3):
        for splits in (1, 4, 16):  # (one split: the plain kernel, EARLY is for launches with splits)
            new = (torch.randn(2, len(lens), kv, d, device="cuda") * (step + 2)).to(dtype)
            write_kv_cache(new[0], new[1], k, v, slots)
            out = mod.paged_decode_attention(q, k, v, tables, seq, d**-0.5, None, splits)
            ref = reference.paged_attention(
                q.float(), k.float(), v.float(), tables, [1] * len(lens), lens, d**-0.5, None
            )
            live = seq > 0
            assert rel_err(out[live], ref[live]) < TOL[dtype], (step, splits)
            assert (out[~live] == 0).all()


@pytest.mark.gpu
def test_decode_float32_and_padding_rows_gpu() -> None:
    _decode_case([0, 5, 0, 700], 8, 2, 128, 16, torch.float32, "cuda", None, None)


# -- CPU, through the interpreter ---------------------------------------------------------------
@interpret
@pytest.mark.parametrize("h,kv,d", [(2, 2, 16), (8, 2, 32)])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_interpreted(h: int, kv: int, d: int, splits: int) -> None:
    _decode_case([1, 0, 37, 70], h, kv, d, 16, torch.float32, "cpu", None, splits)
    _decode_case([1, 37, 70], h, kv, d, 16, torch.float32, "cpu", 20, splits)


@interpret
@pytest.mark.parametrize("splits", [2, 3])
def test_decode_early_tile_interpreted(splits: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``EARLY`` (launches with splits): the first tile attended before the loop (a split's only
    tile, its first of several, or an empty split), with and without the fused merge; a sliding
    window keeps the loop."""
    from hotloop.kernels import paged_decode_attention as mod

    monkeypatch.setattr(mod, "EARLY", True)
    _decode_case([1, 0, 37, 70, 130], 8, 2, 32, 16, torch.float32, "cpu", None, splits)
    _decode_case([1, 0, 37, 70, 130], 6, 3, 16, 16, torch.float32, "cpu", None, splits, fuse_merge=True)
    _decode_case([1, 37, 70], 8, 2, 32, 16, torch.float32, "cpu", 20, splits)


@interpret
@pytest.mark.parametrize("grid", ["heads", "seq"])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_grid_order_interpreted(splits: int, grid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Either ``HOTLOOP_DECODE_GRID`` order: "heads" (the default) launches (KV, B, splits), "seq"
    (B, KV, splits); the same attention, the partials and the fused merge's counters still indexed by
    sequence and KV head."""
    monkeypatch.setenv("HOTLOOP_DECODE_GRID", grid)
    _decode_case([1, 0, 37, 70], 8, 2, 32, 16, torch.float32, "cpu", None, splits)
    _decode_case([1, 37, 70], 6, 3, 16, 16, torch.float32, "cpu", 20, splits)
    if splits > 1:
        _decode_case([1, 0, 37, 70], 6, 3, 16, 16, torch.float32, "cpu", None, splits, fuse_merge=True)


def test_decode_grid_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from hotloop.kernels import paged_decode_attention as mod

    for raw, value in (("", "heads"), ("seq", "seq"), ("heads", "heads")):
        monkeypatch.setenv(mod.GRID_ENV, raw)
        assert mod.grid_order() == value
    monkeypatch.setenv(mod.GRID_ENV, "rows")
    with pytest.raises(ValueError, match="HOTLOOP_DECODE_GRID='rows' must be one of"):
        mod.grid_order()


def test_decode_early_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from hotloop.kernels import paged_decode_attention as mod

    for raw, value in (("", False), ("0", False), ("1", True)):
        monkeypatch.setenv("HOTLOOP_DECODE_EARLY", raw)
        assert mod._early_from_env() is value
    monkeypatch.setenv("HOTLOOP_DECODE_EARLY", "on")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        mod._early_from_env()


@interpret
@pytest.mark.parametrize("h,kv,d", [(2, 2, 16), (8, 2, 32), (6, 3, 16)])
@pytest.mark.parametrize("splits", [2, 3])
def test_decode_fused_merge_interpreted(h: int, kv: int, d: int, splits: int) -> None:
    """The last split to arrive merges (``fuse_merge``): the same output as the merge kernel."""
    _decode_case([1, 0, 37, 70], h, kv, d, 16, torch.float32, "cpu", None, splits, fuse_merge=True)
    _decode_case([1, 37, 70], h, kv, d, 16, torch.float32, "cpu", 20, splits, fuse_merge=True)


@interpret
def test_decode_planned_fused_merge_interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode graph's launch (``graph_plan``) takes ``decode_plan``'s split count and merge: here 8
    splits merged by the last to arrive (no merge launch; the counters end at zero), GQA groups of 4,
    padding rows."""
    from hotloop.kernels import counters
    from hotloop.kernels import paged_decode_attention as mod

    monkeypatch.setattr(mod, "decode_plan", lambda *a: (8, True))
    monkeypatch.setattr(mod, "_merge_kernel", _Never())
    _decode_case(
        [1, 0, 37, 70, 5, 64, 33, 2], 8, 2, 16, 16, torch.float32, "cpu", None, None, graph_plan=True
    )
    assert int(counters.buffer(torch.device("cpu"), "decode_merge").abs().sum()) == 0


@interpret
def test_decode_outside_graphs_ignores_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``graph_plan`` (eager and piecewise steps) the launch never consults ``decode_plan``:
    ``num_decode_splits`` and the merge launch, the variants the warm-up compiled."""
    from hotloop.kernels import paged_decode_attention as mod

    def no_plan(*a: object) -> tuple[int, bool]:
        raise AssertionError("decode_plan consulted outside a decode graph")

    monkeypatch.setattr(mod, "decode_plan", no_plan)
    monkeypatch.setattr(mod, "FUSE_MERGE", None)
    _decode_case([1, 0, 37, 70, 5, 64, 33, 2], 8, 2, 16, 16, torch.float32, "cpu", None, None)


@interpret
@pytest.mark.parametrize("h,kv,d", [(2, 2, 16), (8, 2, 32)])
@pytest.mark.parametrize("window", [None, 20])
def test_prefill_interpreted(h: int, kv: int, d: int, window: int | None) -> None:
    _prefill_case([40, 1, 17], [0, 30, 21], h, kv, d, 16, torch.float32, "cpu", window)


@interpret
@pytest.mark.parametrize("diag_split", [False, True])
@pytest.mark.parametrize("window", [None, 150, 20])
def test_prefill_diagonal_split_interpreted(
    diag_split: bool, window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Key tiles every query of a tile sees run unmasked (64-token tiles: a 70-token prompt's second
    query tile has one below its diagonal, a 20-token chunk after 200 cached tokens three, or with a
    150-token window one, [128, 192), between the masked window edge and the diagonal)."""
    from hotloop.kernels import paged_prefill_attention as mod

    monkeypatch.setattr(mod, "DIAG_SPLIT", diag_split)
    _prefill_case([70, 1, 20, 5], [0, 90, 200, 0], 4, 2, 16, 16, torch.float32, "cpu", window)


def test_launchers_reject_bad_shapes() -> None:
    pytest.importorskip("triton")
    from hotloop.kernels.paged_decode_attention import paged_decode_attention

    k = torch.zeros(4, 16, 2, 32)
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode_attention(
            torch.zeros(1, 4, 16),
            k,
            k,
            torch.zeros(1, 2, dtype=torch.int32),
            torch.ones(1, dtype=torch.int32),
            1.0,
        )
    with pytest.raises(ValueError, match="int32"):
        paged_decode_attention(
            torch.zeros(1, 4, 32),
            k,
            k,
            torch.zeros(1, 2, dtype=torch.int64),
            torch.ones(1, dtype=torch.int32),
            1.0,
        )


def test_launch_config_overrides_are_checked() -> None:
    from hotloop.kernels.paged_decode_attention import paged_decode_attention
    from hotloop.kernels.paged_prefill_attention import paged_prefill_attention

    q = torch.zeros(1, 2, 16)
    cache = torch.zeros(2, 16, 1, 16)
    tables = torch.zeros(1, 2, dtype=torch.int32)
    seq = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="BLOCK_N=24 must be a power of two"):
        paged_decode_attention(q, cache, cache, tables, seq, 1.0, config=(24, 4, 2))
    with pytest.raises(ValueError, match="num_warps=3"):
        paged_decode_attention(q, cache, cache, tables, seq, 1.0, config=(32, 3, 2))
    with pytest.raises(ValueError, match="maxnreg=100 must be a multiple of 8"):
        paged_decode_attention(q, cache, cache, tables, seq, 1.0, config=(32, 4, 2, 100))
    with pytest.raises(ValueError, match=r"\(BLOCK_N, num_warps, num_stages\[, maxnreg\]\)"):
        paged_decode_attention(q, cache, cache, tables, seq, 1.0, config=(32, 4, 2, 96, 1))
    with pytest.raises(ValueError, match=r"config must be \(BLOCK_M, BLOCK_N, num_warps, num_stages\)"):
        paged_prefill_attention(q, cache, cache, tables, seq, torch.tensor([0, 1], dtype=torch.int32), 1, 1.0,
                                config=(64, 4, 2))  # fmt: skip
    with pytest.raises(ValueError, match="num_stages=0"):
        paged_prefill_attention(q, cache, cache, tables, seq, torch.tensor([0, 1], dtype=torch.int32), 1, 1.0,
                                config=(64, 64, 4, 0))  # fmt: skip


def test_prefill_config_lengths_cover_every_configuration() -> None:
    """The warm-up compiles the prefill kernel at ``CONFIG_LENGTHS`` only: every longest-query length
    must get the configuration of one of those (a new threshold needs a new length there)."""
    from hotloop.kernels.paged_prefill_attention import CONFIG_LENGTHS, prefill_config

    for block_d in (16, 32, 64, 128, 256):
        for quant in (0, 4, 8):
            for diag in (False, True):
                warmed = {prefill_config(block_d, n, quant, diag) for n in CONFIG_LENGTHS}
                for n in range(1, 8193):
                    cfg = prefill_config(block_d, n, quant, diag)
                    assert cfg in warmed, f"block_d={block_d} quant={quant} diag={diag}: {n} tokens -> {cfg}"


def test_decode_split_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split counts chosen per batch (8 KV heads), as timed on the H200 (``num_decode_splits``):
    powers of two, at most 16; an int8 cache aims at twice the programs of a 16-bit one."""
    from hotloop.kernels import paged_decode_attention as mod
    from hotloop.kernels.paged_decode_attention import num_decode_splits

    monkeypatch.setattr(mod, "MAX_SPLITS", 16)  # the default, whatever HOTLOOP_DECODE_MAX_SPLITS says

    bf16 = {b: num_decode_splits(b, 8) for b in (1, 4, 16, 32, 64, 256)}
    int8 = {b: num_decode_splits(b, 8, 8) for b in (1, 4, 16, 32, 64, 256)}
    assert bf16 == {1: 16, 4: 8, 16: 2, 32: 2, 64: 1, 256: 1}
    assert int8 == {1: 16, 4: 16, 16: 4, 32: 2, 64: 1, 256: 1}
    assert num_decode_splits(16, 8, 4) == bf16[16]  # int4: not timed, the 16-bit choice


class _Never:
    """Stands in for a kernel that must not be launched: ``kernel[grid](...)`` fails the test."""

    def __getitem__(self, grid: object) -> object:
        raise AssertionError("a kernel that must not run was launched")


def test_decode_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode graphs (8 KV heads, head dim 128, 16-bit): batch 8-16 takes twice the splits with the
    merge fused (timed faster on the H200); elsewhere, for quantized or float32 caches and other head
    dims, the plain split count and a merge launch. HOTLOOP_DECODE_FUSED_MERGE=0 / 1 decides the
    merge instead."""
    from hotloop.kernels import paged_decode_attention as mod

    monkeypatch.setattr(mod, "MAX_SPLITS", 16)
    monkeypatch.setattr(mod, "FUSE_MERGE", None)
    plan = {b: mod.decode_plan(b, 8) for b in (1, 4, 8, 16, 24, 32, 256)}
    assert plan == {
        1: (16, False),
        4: (8, False),
        8: (8, True),
        16: (4, True),
        24: (2, False),
        32: (2, False),
        256: (1, False),
    }
    for args in ((16, 8, 8), (16, 8, 4), (16, 8, 0, 64), (16, 8, 0, 128, 4)):
        assert mod.decode_plan(*args) == (mod.num_decode_splits(16, 8, args[2]), False), args
    monkeypatch.setattr(mod, "MAX_SPLITS", 2)  # HOTLOOP_DECODE_MAX_SPLITS caps the doubling too
    assert mod.decode_plan(16, 8) == (2, False)
    monkeypatch.setattr(mod, "MAX_SPLITS", 16)
    for fused in (False, True):
        monkeypatch.setattr(mod, "FUSE_MERGE", fused)
        assert mod.decode_plan(16, 8) == (2, fused)
        assert mod.decode_plan(1, 8) == (16, fused)


@pytest.mark.parametrize(
    "raw,value", [("", None), ("1", True), ("on", True), ("0", False), ("false", False), ("maybe", "error")]
)
def test_fused_merge_env(monkeypatch: pytest.MonkeyPatch, raw: str, value: object) -> None:
    from hotloop.kernels import paged_decode_attention as mod

    monkeypatch.setenv("HOTLOOP_DECODE_FUSED_MERGE", raw)
    if value == "error":
        with pytest.raises(ValueError, match="HOTLOOP_DECODE_FUSED_MERGE='maybe' must be 1"):
            mod._fuse_merge_from_env()
    else:
        assert mod._fuse_merge_from_env() is value
