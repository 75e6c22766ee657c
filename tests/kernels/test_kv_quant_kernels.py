"""Triton kernels on the int8 / int4 KV cache (``--quant-policy 8|4``) against the torch reference.

The quantizing write (fused with rotary, and without it) must give ``kv_quant.quantize``'s bytes.
Decode and prefill attention reading the ``uint8`` cache must match ``reference.paged_attention``
over the same cache dequantized to float32: the codes, scales and zeros are exact, so the only
difference is the kernels' own rounding, and the float kernels' tolerances apply.

GPU: head dims 64/128/256, GQA ratios 1/4/8, block sizes 16 and 64, contexts over many blocks,
sliding windows, split-KV on and off, both policies. CPU: the same code through Triton's
interpreter at tiny sizes (float32 and float16; the interpreter's bf16 dot is not usable, and it
rounds float32 -> bf16 by truncation, so rotated bf16 rows are checked on the GPU only).
"""

from __future__ import annotations

import random

import pytest
import torch
from kernel_checks import TOL, interpret, rel_err

from hotloop.kernels import kv_quant, ops, reference
from hotloop.layers.attention import AttentionMetadata, PagedAttention


def _tol(dtype: torch.dtype, device: str) -> float:
    """The float kernels' tolerance; the interpreter's float32 dot has no tf32 rounding."""
    return 1e-5 if (dtype == torch.float32 and device == "cpu") else TOL[dtype]


def _rows(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Random head rows with their own offset and spread, so zero and scale both matter."""
    spread = torch.rand(*shape[:-1], 1, generator=g) * 2 + 0.1
    offset = torch.randn(*shape[:-1], 1, generator=g)
    return torch.randn(*shape, generator=g) * spread + offset


# -- quantizing write ----------------------------------------------------------------------------
def _check_rows(
    got: torch.Tensor, want: torch.Tensor, d: int, dtype: torch.dtype, policy: int, exact: bool
) -> None:
    """``exact``: identical bytes. Otherwise (a rotated k on the GPU, where the fp32 rotation could
    round differently from torch's) identical scale / zero and codes within one step, on at most
    0.1% of the values: a different rounding of a tie, never a different quantization."""
    if exact:
        assert torch.equal(got, want), (got.int() - want.int()).abs().max()
        return
    got, want = kv_quant.to_rows(got, d, dtype), kv_quant.to_rows(want, d, dtype)
    n = kv_quant.packed_bytes(d, policy)
    assert torch.equal(got[..., n:], want[..., n:]), "scale / zero differ"
    g, w = got[..., :n].int(), want[..., :n].int()
    if policy == 4:
        g, w = torch.stack([g & 15, g >> 4], -1), torch.stack([w & 15, w >> 4], -1)
    diff = (g - w).abs()
    assert diff.max() <= 1 and diff.float().mean() <= 1e-3, (diff.max(), diff.float().mean())


def _write_case(
    t: int,
    h: int,
    kv: int,
    d: int,
    half: int,
    dtype: torch.dtype,
    policy: int,
    device: str,
    sliced: bool = False,
) -> None:
    from hotloop.kernels.rotary_kv_write import rotary_kv_write, write_kv_cache

    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    qkv = _rows((t, h + 2 * kv, d), g).to(dtype).to(device)
    v_src = qkv[:, h + kv :]
    v_src[1, 0] = 3.25  # a constant row (scale 0) and an all-zero one
    v_src[2] = 0.0
    v_src[3, -1] *= 1000  # a wide one
    qmax = 255 if policy == 8 else 15
    ties = torch.arange(d, device=device) % qmax + 0.5  # scale 1, every value halfway: round half to even
    ties[:2] = torch.tensor([0.0, qmax])
    v_src[4, 0] = ties
    q, k, v = qkv[:, :h], qkv[:, h : h + kv], qkv[:, h + kv :]  # strided views of one projection
    nb, bs = t // 4 + 3, 4
    row = kv_quant.row_bytes(d, policy, qkv.element_size())
    shape = (nb, 2, bs, kv, row) if sliced else (nb, bs, kv, row)
    k_pool = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).to(device)
    v_pool = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).to(device)
    # sliced: each cache is every other block of a pool (block stride 2 blocks, storage offset 1 block)
    kc, vc = (k_pool[:, 1], v_pool[:, 1]) if sliced else (k_pool, v_pool)
    others = (k_pool[:, 0].clone(), v_pool[:, 0].clone()) if sliced else None
    slots = torch.randperm(nb * bs, generator=g)[:t].to(device)
    slots[0] = -1  # a padding row writes nothing
    kc_ref, vc_ref = kc.clone(), vc.clone()
    if half:
        ang = torch.rand(t, half, generator=g).to(device) * 100
        cos, sin = ang.cos(), ang.sin()
        q_ref = q.clone()
        k_src = k.clone()
        reference.rotary_kv_write(q_ref, k.clone(), v.clone(), cos, sin, kc_ref, vc_ref, slots)
        # rotate_k: k rotated in place (rows with a slot; padding rows keep their values) and the
        # same bytes in the caches as without it
        kc2, vc2, k2 = kc.clone(), vc.clone(), k.clone()
        rotary_kv_write(q.clone(), k2, v, cos, sin, kc2, vc2, slots, rotate_k=True)
        rotary_kv_write(q, k, v, cos, sin, kc, vc, slots)
        assert torch.equal(q, q_ref) if device == "cpu" else rel_err(q, q_ref) <= TOL[dtype] / 4 + 1e-6
        assert torch.equal(kc2, kc) and torch.equal(vc2, vc) and torch.equal(k, k_src)
        kf = k_src.float()  # rotated in float32 and rounded once, as the reference's rotary_kv_write
        c, s_ = cos[:, None, :], sin[:, None, :]
        k1, k2_ = kf[..., :half], kf[..., half : 2 * half]
        k_rot = torch.cat([k1 * c - k2_ * s_, k2_ * c + k1 * s_, kf[..., 2 * half :]], -1).to(dtype)
        live = slots >= 0
        assert torch.equal(k2[~live], k_src[~live])
        if device == "cpu":
            assert torch.equal(k2[live], k_rot[live])
        else:
            assert rel_err(k2[live], k_rot[live]) <= TOL[dtype] / 4 + 1e-6
    else:
        keep = slots >= 0
        reference.write_kv_cache(k[keep], v[keep], kc_ref, vc_ref, slots[keep])
        write_kv_cache(k, v, kc, vc, slots)
    if others is not None:  # the blocks between the cache's were not touched
        assert torch.equal(k_pool[:, 0], others[0]) and torch.equal(v_pool[:, 0], others[1])
    if device == "cpu":
        _check_rows(vc, vc_ref, d, dtype, policy, exact=True)
        _check_rows(kc, kc_ref, d, dtype, policy, exact=not half)
        return
    # On the GPU torch's own CUDA ops (the reference) may round the scale or a tie differently from
    # the kernel: require the kernel's round trip to be as good as the reference's, within one step.
    keep = slots >= 0
    for cache, ref, src in ((vc, vc_ref, v), (kc, kc_ref, None)):
        rows, rows_ref = kv_quant.to_rows(cache, d, dtype), kv_quant.to_rows(ref, d, dtype)
        flat, flat_ref = rows.view(-1, kv, row)[slots[keep]], rows_ref.view(-1, kv, row)[slots[keep]]
        got = kv_quant.dequantize(flat, policy, d, dtype)
        want = kv_quant.dequantize(flat_ref, policy, d, dtype)
        n = kv_quant.packed_bytes(d, policy)
        step = flat_ref[..., n:].contiguous().view(dtype).float()[..., :1].abs()  # the reference's scale
        if src is not None:
            x = src[keep].float()
            err, err_ref = (got - x).abs().amax(-1, keepdim=True), (want - x).abs().amax(-1, keepdim=True)
            assert bool((err <= err_ref + step * 1.01 + 1e-6).all()), (err - err_ref).max()
        assert bool(((got - want).abs() <= step * 1.01 + 1e-6 + 1e-2 * want.abs()).all()), (
            (got - want).abs().max()
        )


@pytest.mark.gpu
@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "h,kv,d,half", [(32, 8, 128, 64), (28, 4, 128, 64), (16, 16, 64, 32), (8, 2, 256, 32), (8, 1, 256, 128)]
)
@pytest.mark.parametrize("head_programs", [True, False])
def test_quant_write_gpu(
    h: int, kv: int, d: int, half: int, dtype: torch.dtype, policy: int, head_programs: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from hotloop.kernels import rotary_kv_write

    # head_programs False: every KV head's row in one program (a long prompt's launch)
    monkeypatch.setattr(rotary_kv_write, "HEAD_PROGRAMS_BELOW", 1 << 30 if head_programs else 1)
    _write_case(300, h, kv, d, half, dtype, policy, "cuda")
    _write_case(300, h, kv, d, 0, dtype, policy, "cuda")


@interpret
@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_programs", [True, False])
def test_quant_write_interpreted(
    dtype: torch.dtype, policy: int, head_programs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hotloop.kernels import rotary_kv_write

    monkeypatch.setattr(rotary_kv_write, "HEAD_PROGRAMS_BELOW", 1 << 30 if head_programs else 1)
    _write_case(9, 4, 2, 16, 0, dtype, policy, "cpu")
    if dtype != torch.bfloat16:  # the interpreter truncates float32 -> bf16
        _write_case(9, 4, 2, 16, 8, dtype, policy, "cpu")
        _write_case(9, 3, 1, 24, 4, dtype, policy, "cpu")  # partial rotary, head_dim not a power of 2
        _write_case(9, 4, 3, 16, 8, dtype, policy, "cpu", sliced=True)  # caches inside a larger pool


def test_write_rejects_a_cache_of_the_wrong_row() -> None:
    pytest.importorskip("triton")
    from hotloop.kernels.rotary_kv_write import write_kv_cache

    k = torch.zeros(2, 2, 32, dtype=torch.float16)
    bad = torch.zeros(4, 4, 2, 33, dtype=torch.uint8)
    with pytest.raises(ValueError, match="fits neither"):
        write_kv_cache(k, k, bad, bad, torch.zeros(2, dtype=torch.int64))


# -- attention on the quantized cache --------------------------------------------------------------
def _quant_pool(
    lens: list[int],
    kv: int,
    d: int,
    bs: int,
    dtype: torch.dtype,
    policy: int,
    device: str,
    seed: int,
    sliced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A quantized K/V pool with shuffled blocks per sequence, its float32 dequantization, and
    block_tables ``[B, W]``. ``sliced``: the caches are every other block of a larger pool (block
    stride two blocks, non-zero storage offset), whose other blocks hold garbage."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    nb = sum(need) + 3
    kq = kv_quant.from_rows(kv_quant.quantize(_rows((nb, bs, kv, d), g).to(dtype), policy, dtype), d, dtype)
    vq = kv_quant.from_rows(kv_quant.quantize(_rows((nb, bs, kv, d), g).to(dtype), policy, dtype), d, dtype)
    kq, vq = kq.to(device), vq.to(device)
    if sliced:

        def place(c: torch.Tensor) -> torch.Tensor:
            pool = torch.randint(0, 256, (nb, 2, *c.shape[1:]), generator=g, dtype=torch.uint8).to(device)
            pool[:, 1] = c
            return pool[:, 1]

        kq, vq = place(kq), place(vq)
    kf = kv_quant.dequantize_cache(kq, d, dtype)
    vf = kv_quant.dequantize_cache(vq, d, dtype)
    perm = torch.randperm(nb, generator=g).tolist()
    tables = torch.zeros(len(lens), max(need) + 1, dtype=torch.int32)
    at = 0
    for i, n in enumerate(need):
        tables[i, :n] = torch.tensor(perm[at : at + n], dtype=torch.int32)
        at += n
    return kq, vq, kf, vf, tables.to(device)


def _decode_case(
    lens: list[int],
    h: int,
    kv: int,
    d: int,
    bs: int,
    dtype: torch.dtype,
    policy: int,
    device: str,
    window: int | None,
    splits: int | None,
    sliced: bool = False,
    config: tuple[int, ...] | None = None,
) -> None:
    from hotloop.kernels.paged_decode_attention import paged_decode_attention

    seed = random.randrange(1 << 30)
    kq, vq, kf, vf, tables = _quant_pool(lens, kv, d, bs, dtype, policy, device, seed, sliced)
    q = torch.randn(len(lens), h, d, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(device)
    scale = d**-0.5
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    paged_decode_attention(q, kq, vq, tables, seq, scale, window, splits, out=out, config=config)
    ref = reference.paged_attention(q.float(), kf, vf, tables, [1] * len(lens), lens, scale, window)
    live = seq > 0  # padding rows (seq_len 0) come out as zeros; the reference gives NaN there
    assert rel_err(out[live], ref[live]) < _tol(dtype, device)
    assert (out[~live] == 0).all()


def _prefill_case(
    qlens: list[int],
    ctx: list[int],
    h: int,
    kv: int,
    d: int,
    bs: int,
    dtype: torch.dtype,
    policy: int,
    device: str,
    window: int | None,
    sliced: bool = False,
    fresh: bool = False,
    cached_prefix: bool = True,
) -> None:
    """``fresh``: this step's keys and values come as ``k_new`` / ``v_new``, rows that differ from
    what the cache holds at the new positions, so reading the wrong copy fails; ``cached_prefix``
    False: the kernel without its cache loop (every row a prompt without a prefix)."""
    from hotloop.kernels.paged_prefill_attention import paged_prefill_attention

    seed = random.randrange(1 << 30)
    lens = [c + n for c, n in zip(ctx, qlens, strict=True)]
    kq, vq, kf, vf, tables = _quant_pool(lens, kv, d, bs, dtype, policy, device, seed, sliced)
    gq = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(qlens), h, d, generator=gq).to(dtype).to(device)
    kn = vn = None
    if fresh:
        kn = _rows((sum(qlens), kv, d), gq).to(dtype).to(device)
        vn = _rows((sum(qlens), kv, d), gq).to(dtype).to(device)
    starts = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    scale = d**-0.5
    out = torch.full_like(q, float("nan"))
    if not cached_prefix:  # the promise the launcher's caller makes
        assert fresh and all(n > 1 and c == 0 for n, c in zip(qlens, ctx, strict=True))
    paged_prefill_attention(
        q, kq, vq, tables, seq, starts, max(qlens), scale, window, out=out, k_new=kn, v_new=vn,
        cached_prefix=cached_prefix,
    )  # fmt: skip
    ref = reference.paged_attention(q.float(), kf, vf, tables, qlens, lens, scale, window, kn, vn)
    assert rel_err(out, ref) < _tol(dtype, device)
    # per sequence too: one row reading a wrong key hides in a norm over the whole batch
    for b in range(len(qlens)):
        a, e = int(starts[b]), int(starts[b + 1])
        if e > a:
            assert rel_err(out[a:e], ref[a:e]) < _tol(dtype, device), (b, qlens[b], ctx[b])
    if fresh and any(n > 1 for n in qlens):  # the fresh rows matter: the cache's copy gives another answer
        other = reference.paged_attention(q.float(), kf, vf, tables, qlens, lens, scale, window)
        assert rel_err(other, ref) > 10 * _tol(dtype, device)


GQA = [(8, 8), (16, 4), (32, 4)]  # (heads, kv heads): ratios 1, 4, 8

# bf16 over the whole grid; fp16 at the common head dim (each combination compiles its own kernel)
GRID = [
    pytest.param(d, h, kv, bs, dtype, policy, id=f"q{policy}-d{d}-h{h}-kv{kv}-bs{bs}-{str(dtype)[6:]}")
    for policy in (8, 4)
    for d in (64, 128, 256)
    for h, kv in GQA
    for bs in (16, 64)
    for dtype in (torch.bfloat16, torch.float16)
    if dtype == torch.bfloat16 or (d == 128 and bs == 16)
]


@pytest.mark.gpu
@pytest.mark.parametrize("d,h,kv,bs,dtype,policy", GRID)
def test_quant_decode_gpu(d: int, h: int, kv: int, bs: int, dtype: torch.dtype, policy: int) -> None:
    lens = [0, 1, 17, 300, 1031, 64 * 40 + 5]
    for splits in (1, None, 7):
        _decode_case(lens, h, kv, d, bs, dtype, policy, "cuda", None, splits)
    _decode_case(lens, h, kv, d, bs, dtype, policy, "cuda", 200, None)


@pytest.mark.gpu
@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("d,h,kv,bs", [(128, 32, 8, 64), (64, 16, 4, 16), (256, 8, 1, 64), (80, 8, 2, 16)])
@pytest.mark.parametrize("config", [None, (32, 4, 2), (64, 4, 1, 96)])
def test_quant_decode_even_odd_split_gpu(
    d: int,
    h: int,
    kv: int,
    bs: int,
    policy: int,
    config: tuple[int, ...] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hotloop.kernels import kv_quant_triton

    monkeypatch.setattr(kv_quant_triton, "SPLIT_EO", True)
    lens = [0, 1, 17, 300, 1031, 64 * 40 + 5]
    for splits in (1, None):
        _decode_case(lens, h, kv, d, bs, torch.bfloat16, policy, "cuda", None, splits, config=config)
    _decode_case(lens, h, kv, d, bs, torch.float16, policy, "cuda", 200, None, config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("diag_split", [False, True])
@pytest.mark.parametrize("d,h,kv,bs,dtype,policy", GRID)
def test_quant_prefill_gpu(
    d: int,
    h: int,
    kv: int,
    bs: int,
    dtype: torch.dtype,
    policy: int,
    diag_split: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hotloop.kernels import paged_prefill_attention as mod

    monkeypatch.setattr(mod, "DIAG_SPLIT", diag_split)
    # whole prompts, a chunk after a cached prefix, and decode rows in one mixed batch
    _prefill_case([700, 1, 130, 64, 1], [0, 900, 250, 0, 5], h, kv, d, bs, dtype, policy, "cuda", None)
    _prefill_case([300, 77], [0, 129], h, kv, d, bs, dtype, policy, "cuda", 100)
    _prefill_case([700, 77], [0, 500], h, kv, d, bs, dtype, policy, "cuda", 300)  # unmasked inside a window


@pytest.mark.gpu
@pytest.mark.parametrize("d,h,kv,bs,dtype,policy", GRID)
def test_quant_prefill_fresh_gpu(d: int, h: int, kv: int, bs: int, dtype: torch.dtype, policy: int) -> None:
    # this step's keys from k_new / v_new: whole prompts, chunks after a prefix, one-token rows
    _prefill_case([700, 1, 130, 64, 1], [0, 900, 250, 0, 5], h, kv, d, bs, dtype, policy, "cuda", None,
                  fresh=True)  # fmt: skip
    _prefill_case([300, 77], [0, 129], h, kv, d, bs, dtype, policy, "cuda", 100, fresh=True)
    _prefill_case([4096], [0], h, kv, d, bs, dtype, policy, "cuda", None, fresh=True)  # the 4k tiles
    _prefill_case(
        [4096, 70], [0, 0], h, kv, d, bs, dtype, policy, "cuda", None, fresh=True, cached_prefix=False
    )


@pytest.mark.gpu
@pytest.mark.parametrize("policy", [8, 4])
def test_quant_float32_gpu(policy: int) -> None:
    _decode_case([0, 5, 0, 700], 8, 2, 128, 16, torch.float32, policy, "cuda", None, None)
    _prefill_case([90, 1], [0, 300], 8, 2, 128, 16, torch.float32, policy, "cuda", None)
    _prefill_case([90, 1, 40], [0, 300, 70], 8, 2, 128, 16, torch.float32, policy, "cuda", None, fresh=True)


@interpret
@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("h,kv,d", [(2, 2, 16), (8, 2, 32)])
def test_quant_decode_interpreted(h: int, kv: int, d: int, policy: int) -> None:
    _decode_case([1, 0, 37, 70], h, kv, d, 16, torch.float32, policy, "cpu", None, 1)
    _decode_case([1, 37, 70], h, kv, d, 16, torch.float32, policy, "cpu", 20, 3)


@interpret
@pytest.mark.parametrize("policy", [8, 4])
def test_quant_decode_page_tiles_interpreted(policy: int) -> None:
    # block size 64: every tile lies in one page (one block-table entry per tile); contexts ending
    # mid-tile and mid-page, several pages, splits, and a window whose start is not tile-aligned
    _decode_case([1, 0, 37, 64, 65, 200], 8, 2, 32, 64, torch.float32, policy, "cpu", None, 1)
    _decode_case([1, 37, 130, 200], 8, 2, 32, 64, torch.float32, policy, "cpu", None, 4)
    _decode_case([1, 37, 130, 200], 8, 2, 32, 64, torch.float32, policy, "cpu", 45, 3)
    _decode_case([90, 200], 4, 2, 32, 64, torch.float16, policy, "cpu", 70, 2)
    # the defaults' tiles (int4: 128 tokens) span two pages; a 32-token tile lies in one
    _decode_case([37, 200], 8, 2, 32, 64, torch.float32, policy, "cpu", None, 2, config=(32, 4, 2))
    _decode_case([37, 200], 8, 2, 32, 64, torch.float32, policy, "cpu", None, 1, config=(64, 4, 1, 96))


@interpret
@pytest.mark.parametrize("policy", [8, 4])
def test_quant_attention_on_caches_inside_a_pool_interpreted(policy: int) -> None:
    # each cache is every other block of a larger pool: block stride and storage offset are honoured
    _decode_case([1, 37, 130], 8, 2, 32, 16, torch.float32, policy, "cpu", None, 2, sliced=True)
    _decode_case([1, 37, 130], 8, 2, 32, 64, torch.float32, policy, "cpu", None, 2, sliced=True)
    _prefill_case([9, 1], [0, 40], 8, 2, 32, 16, torch.float32, policy, "cpu", None, sliced=True)


@interpret
@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("h,kv,d", [(2, 2, 16), (8, 2, 32)])
def test_quant_prefill_interpreted(h: int, kv: int, d: int, policy: int) -> None:
    window = 20 if h == kv else None
    _prefill_case([40, 1, 17], [0, 30, 21], h, kv, d, 16, torch.float32, policy, "cpu", window)


@interpret
@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("window", [None, 150])
def test_quant_prefill_diagonal_split_interpreted(
    policy: int, window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quantized key tiles every query of a tile sees, unmasked (see test_attention_kernels.py)."""
    from hotloop.kernels import paged_prefill_attention as mod

    monkeypatch.setattr(mod, "DIAG_SPLIT", True)
    _prefill_case([70, 1, 20], [0, 90, 200], 4, 2, 32, 16, torch.float32, policy, "cpu", window)


@interpret
@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("diag_split", [False, True])
@pytest.mark.parametrize("window", [None, 30, 150])
def test_quant_prefill_fresh_interpreted(
    policy: int, diag_split: bool, window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt's own keys from k_new / v_new, its cached prefix from the cache: whole prompts, chunks
    after a prefix that ends mid-tile, one-token rows (cache only), several query tiles."""
    from hotloop.kernels import paged_prefill_attention as mod

    monkeypatch.setattr(mod, "DIAG_SPLIT", diag_split)
    _prefill_case(
        [70, 1, 20, 2], [0, 90, 37, 64], 4, 2, 32, 16, torch.float32, policy, "cpu", window, fresh=True
    )
    _prefill_case([33, 1], [0, 0], 8, 2, 32, 64, torch.float16, policy, "cpu", window, fresh=True)
    # no row reads the cache: the kernel without its cache loop gives the same
    _prefill_case([70, 2, 20], [0, 0, 0], 4, 2, 32, 16, torch.float32, policy, "cpu", window, fresh=True,
                  cached_prefix=False)  # fmt: skip


def test_prefill_rejects_cached_prefix_false_without_new_keys() -> None:
    pytest.importorskip("triton")
    from hotloop.kernels.paged_prefill_attention import paged_prefill_attention

    q = torch.zeros(2, 4, 16)
    cache = torch.zeros(2, 4, 2, 16)
    one = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.tensor([2], dtype=torch.int32)
    starts = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="cached_prefix=False needs k_new"):
        paged_prefill_attention(q, cache, cache, one, lens, starts, 2, 1.0, cached_prefix=False)
    with pytest.raises(ValueError, match="k_new and v_new are given together"):
        paged_prefill_attention(q, cache, cache, one, lens, starts, 2, 1.0, k_new=torch.zeros(2, 2, 16))
    with pytest.raises(ValueError, match=r"k_new must be \[T, KV, D\]"):
        bad = torch.zeros(2, 4, 16)
        paged_prefill_attention(q, cache, cache, one, lens, starts, 2, 1.0, k_new=bad, v_new=bad)


def test_any_cached_prefix() -> None:
    from hotloop.layers.attention import _any_cached_prefix

    assert not _any_cached_prefix([5, 2, 0], [5, 2, 0])  # prompts without a prefix (and a padding row)
    assert _any_cached_prefix([5, 2], [5, 9])  # a chunk after a cached prefix
    assert _any_cached_prefix([5, 1], [5, 1])  # a single-token row reads the cache


@interpret
@pytest.mark.parametrize("policy", [8, 4])
def test_quant_attention_float16_interpreted(policy: int) -> None:
    # two-byte scale / zero
    _decode_case([37, 5], 4, 2, 32, 16, torch.float16, policy, "cpu", None, 2)
    _prefill_case([20, 1], [0, 30], 4, 2, 32, 16, torch.float16, policy, "cpu", None)


@interpret
@pytest.mark.parametrize("policy", [8, 4])
def test_quant_decode_even_odd_split_interpreted(policy: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # HOTLOOP_KV_SPLIT_EO: q's even and odd head dims dot the codes of even and odd dims apart, and
    # the output halves are stored interleaved; one split and several, a window, a page-tile
    # config, head_dim not a power of two, and float32 (which ignores the bit)
    from hotloop.kernels import kv_quant_triton

    monkeypatch.setattr(kv_quant_triton, "SPLIT_EO", True)
    assert kv_quant_triton.code_mode_bits(False, True) & 4
    _decode_case([37, 5, 0], 4, 2, 32, 16, torch.float16, policy, "cpu", None, 1)
    _decode_case([37, 5, 130], 8, 2, 32, 16, torch.float16, policy, "cpu", 20, 3)
    _decode_case([37, 200], 8, 2, 32, 64, torch.float16, policy, "cpu", None, 2, config=(32, 4, 2))
    _decode_case([9, 40], 3, 1, 24, 16, torch.float16, policy, "cpu", None, 2)
    _decode_case([37, 5], 4, 2, 32, 16, torch.float32, policy, "cpu", None, 2)


@interpret
@pytest.mark.parametrize("policy", [8, 4])
def test_quant_decode_joined_codes_interpreted(policy: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # HOTLOOP_KV_SPLIT_EO=0: the codes are joined back into head-dim order before one dot
    from hotloop.kernels import kv_quant_triton

    monkeypatch.setattr(kv_quant_triton, "SPLIT_EO", False)
    assert not kv_quant_triton.code_mode_bits(False, True) & 4
    _decode_case([37, 5, 0], 4, 2, 32, 16, torch.float16, policy, "cpu", None, 1)
    _decode_case([37, 200], 8, 2, 32, 64, torch.float16, policy, "cpu", 20, 2, config=(32, 4, 2))


# -- dispatch: ops and the attention layer -----------------------------------------------------------
@interpret
@pytest.mark.parametrize("policy", [8, 4])
def test_ops_write_kv_cache_dispatch(policy: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(3)
    k, v = _rows((6, 2, 16), g), _rows((6, 2, 16), g)
    row = kv_quant.row_bytes(16, policy, 4)
    slots = torch.tensor([5, -1, 0, 9, 3, 2])
    caches = [torch.zeros(4, 4, 2, row, dtype=torch.uint8) for _ in range(4)]
    ops.write_kv_cache(k, v, caches[0], caches[1], slots)  # CPU: the reference
    monkeypatch.setattr(ops, "use_triton", lambda x: True)
    ops.write_kv_cache(k, v, caches[2], caches[3], slots)
    assert caches[0].any() and torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def _layer_step(
    layer: PagedAttention,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    ctx: list[int],
    qlens: list[int],
    tables: torch.Tensor,
    g: torch.Generator,
) -> torch.Tensor:
    """One step of ``layer`` for sequences with ``ctx`` cached tokens and ``qlens`` new ones."""
    T = sum(qlens)
    bs = kv_cache[0].shape[1]
    seq = [c + n for c, n in zip(ctx, qlens, strict=True)]
    slots = [int(tables[b, p // bs]) * bs + p % bs for b in range(len(qlens)) for p in range(ctx[b], seq[b])]
    starts = [0] + torch.tensor(qlens).cumsum(0).tolist()
    decode_only = all(n == 1 for n in qlens)
    nd = 0  # leading single-token rows: the decode kernel's in a mixed step, as gpu_inputs.py splits them
    while nd < len(qlens) and qlens[nd] == 1:
        nd += 1
    mixed = nd > 0 and not decode_only
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=tables,
        query_lens=qlens,
        seq_lens=seq,
        seq_lens_t=torch.tensor(seq, dtype=torch.int32),
        query_start_t=torch.tensor(starts, dtype=torch.int32),
        max_query_len=max(qlens),
        decode_only=decode_only,
        num_decodes=nd if mixed else 0,
        prefill_query_start_t=torch.tensor(starts[nd:], dtype=torch.int32) - nd if mixed else None,
    )
    hd, half = layer.head_dim, layer.head_dim // 4  # partial rotary
    # q, k and v are strided views of one projection output, as in the models
    qkv = _rows((T, (layer.num_heads + 2 * layer.num_kv_heads) * hd), g)
    q, k, v = qkv.split([layer.num_heads * hd, layer.num_kv_heads * hd, layer.num_kv_heads * hd], dim=-1)
    ang = torch.rand(T, half, generator=g) * 10
    return layer(q, k, v, kv_cache, meta, (ang.cos(), ang.sin()))


@interpret
@pytest.mark.parametrize("policy", [8, 4])
def test_attention_layer_runs_the_kernels_on_a_quantized_cache(
    policy: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    layer = PagedAttention(4, 2, 16, 0.25)
    row = kv_quant.row_bytes(16, policy, 4)
    tables = torch.tensor([[3, 0, 5], [1, 4, 2]], dtype=torch.int32)
    runs = {}
    for triton_on in (False, True):
        monkeypatch.setattr(ops, "use_triton", lambda x, on=triton_on: on)
        cache = (torch.zeros(6, 4, 2, row, dtype=torch.uint8), torch.zeros(6, 4, 2, row, dtype=torch.uint8))
        g = torch.Generator().manual_seed(5)
        outs = [
            _layer_step(layer, cache, [0, 0], [7, 3], tables, g),  # prefills
            _layer_step(layer, cache, [7, 3], [1, 4], tables, g),  # a decode and a chunk over a prefix
            _layer_step(layer, cache, [8, 7], [1, 1], tables, g),  # decode only
            _layer_step(layer, cache, [9, 8], [2, 3], tables, g),  # chunks over prefixes, no decode
        ]
        runs[triton_on] = (outs, cache)
    (ref_outs, ref_cache), (outs, cache) = runs[False], runs[True]
    assert torch.equal(cache[0], ref_cache[0]) and torch.equal(cache[1], ref_cache[1])
    for o, r in zip(outs, ref_outs, strict=True):
        assert rel_err(o, r) < 1e-5
