"""KV cache int8/int4: round-trip error bounds, byte layout, and attention on quantized KV.

Attention over a quantized cache must equal attention over the same cache dequantized to float
(the quantization is the only error), and stay close to attention over the original values.
"""

from __future__ import annotations

import pytest
import torch

from hotloop.kernels import kv_quant, reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def stored_scale(rows: torch.Tensor, policy: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    n = kv_quant.packed_bytes(head_dim, policy)
    return rows[..., n:].contiguous().view(dtype).float()[..., :1]


@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_within_half_a_step(policy: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    d = 64
    x = (torch.randn(50, 3, d) * torch.linspace(0.01, 30, 50)[:, None, None] + 5).to(dtype)
    rows = kv_quant.quantize(x, policy, dtype)
    assert rows.dtype == torch.uint8
    assert rows.shape == (50, 3, kv_quant.row_bytes(d, policy, x.element_size()))
    back = kv_quant.dequantize(rows, policy, d, dtype)
    xf = x.float()
    step = stored_scale(rows, policy, d, dtype)
    err = (back - xf).abs()
    assert (err <= step / 2 * (1 + 1e-4) + 1e-6 * xf.abs()).all(), (err / step).max()
    # and the step is close to the ideal range / qmax (the stored scale is rounded up only)
    ideal = (xf.amax(-1, keepdim=True) - xf.amin(-1, keepdim=True)) / (255 if policy == 8 else 15)
    assert (step >= ideal * (1 - 1e-6)).all() and (step <= ideal * 1.02 + 1e-6).all()


@pytest.mark.parametrize("policy", [8, 4])
def test_constant_and_zero_rows_are_exact(policy: int) -> None:
    x = torch.zeros(2, 1, 16)
    x[1] = 3.25
    back = kv_quant.dequantize(kv_quant.quantize(x, policy, torch.float32), policy, 16, torch.float32)
    assert torch.equal(back, x)


def test_int4_packs_two_per_byte_low_nibble_first() -> None:
    x = torch.tensor([[[0.0, 15.0, 1.0, 14.0, 2.0, 13.0, 3.0, 12.0]]])
    rows = kv_quant.quantize(x, 4, torch.float32)
    assert rows[0, 0, :4].tolist() == [0xF0, 0xE1, 0xD2, 0xC3]
    assert rows.shape[-1] == 4 + 8  # 8 values in 4 bytes, then a float32 scale and zero


def test_row_bytes_and_block_ratio() -> None:
    # fp16, head_dim 128: int8 is 128 + 4 bytes against 256, int4 64 + 4
    assert kv_quant.row_bytes(128, 0, 2) == 256
    assert kv_quant.row_bytes(128, 8, 2) == 132
    assert kv_quant.row_bytes(128, 4, 2) == 68
    assert 256 / 132 > 1.9 and 256 / 68 > 3.7
    with pytest.raises(ValueError, match="multiple of 8"):
        kv_quant.check_head_dim(12, 4)


def make_paged(policy: int, dtype: torch.dtype, seq_lens: list[int], kv: int = 2, d: int = 32, bs: int = 4):
    torch.manual_seed(1)
    num_blocks = sum(-(-n // bs) for n in seq_lens) + 2
    itemsize = torch.empty((), dtype=dtype).element_size()
    row = kv_quant.row_bytes(d, policy, itemsize)
    cdt = torch.uint8 if policy else dtype
    k_cache = torch.zeros(num_blocks, bs, kv, row if policy else d, dtype=cdt)
    v_cache = torch.zeros_like(k_cache)
    perm = torch.randperm(num_blocks).tolist()  # scattered blocks
    tables, slots, ks, vs = [], [], [], []
    for n in seq_lens:
        blocks = [perm.pop() for _ in range(-(-n // bs))]
        tables.append(blocks)
        slots += [blocks[p // bs] * bs + p % bs for p in range(n)]
        ks.append(torch.randn(n, kv, d).to(dtype))
        vs.append(torch.randn(n, kv, d).to(dtype))
    k, v = torch.cat(ks), torch.cat(vs)
    reference.write_kv_cache(k, v, k_cache, v_cache, torch.tensor(slots))
    width = max(map(len, tables))
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return k_cache, v_cache, bt, k, v


@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_attention_on_quantized_equals_attention_on_dequantized(
    policy: int, dtype: torch.dtype, window: int | None
) -> None:
    seq_lens = [9, 1, 13, 6, 4]
    query_lens = [9, 1, 1, 3, 1]  # a prefill, decodes, and a chunked prefill over a paged prefix
    heads, d = 6, 32
    kq, vq, bt, k, v = make_paged(policy, dtype, seq_lens, d=d)
    q = torch.randn(sum(query_lens), heads, d).to(dtype)
    scale = d**-0.5
    got = reference.paged_attention(q, kq, vq, bt, query_lens, seq_lens, scale, window)
    kf = kv_quant.dequantize_cache(kq, d, dtype)
    vf = kv_quant.dequantize_cache(vq, d, dtype)
    want = reference.paged_attention(q.float(), kf, vf, bt, query_lens, seq_lens, scale, window)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: only the output rounding differs
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
    # and close to attention on the unquantized values
    k0, v0, bt0, _, _ = make_paged(0, dtype, seq_lens, d=d)
    exact = reference.paged_attention(q, k0, v0, bt0, query_lens, seq_lens, scale, window).float()
    err = (got.float() - exact).abs().max().item()
    assert err < (0.05 if policy == 8 else 0.5), err


def test_cache_policy_is_read_from_the_tensor() -> None:
    k8 = torch.zeros(1, 4, 2, kv_quant.row_bytes(32, 8, 2), dtype=torch.uint8)
    k4 = torch.zeros(1, 4, 2, kv_quant.row_bytes(32, 4, 2), dtype=torch.uint8)
    assert kv_quant.cache_policy(k8, 32, torch.float16) == 8
    assert kv_quant.cache_policy(k4, 32, torch.float16) == 4
    assert kv_quant.cache_policy(torch.zeros(1, 4, 2, 32), 32, torch.float32) == 0
    with pytest.raises(ValueError, match="fits neither"):
        kv_quant.cache_policy(k8, 32, torch.float32)


@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_layout_bytes(policy: int, dtype: torch.dtype) -> None:
    """The bytes sit where kv_quant's docstring says: in block b, token o and head h have their
    codes at ``(o * KV + h) * packed`` and their (scale, zero) at ``BS * KV * packed + (o * KV + h)
    * 2 * itemsize``, also for a cache that is every other block of a larger pool."""
    torch.manual_seed(3)
    nb, bs, kv, d = 5, 4, 3, 16
    itemsize = torch.empty((), dtype=dtype).element_size()
    row, n = kv_quant.row_bytes(d, policy, itemsize), kv_quant.packed_bytes(d, policy)
    pool = torch.zeros(nb, 2, bs, kv, row, dtype=torch.uint8)
    cache = pool[:, 1]
    slots = torch.tensor([0, 7, 13, 19, 6])
    k = torch.randn(len(slots), kv, d).to(dtype)
    kv_quant.write_kv_cache(k, k, cache, cache, slots)
    rows = kv_quant.quantize(k, policy, dtype)  # [T, KV, row]: codes, then scale and zero
    for t, slot in enumerate(slots.tolist()):
        b, o = divmod(slot, bs)
        block = pool[b, 1].reshape(-1)
        for h in range(kv):
            r = o * kv + h
            assert torch.equal(block[r * n : (r + 1) * n], rows[t, h, :n])
            p = bs * kv * n + r * 2 * itemsize
            assert torch.equal(block[p : p + 2 * itemsize], rows[t, h, n:])
    assert not pool[:, 0].any()  # the pool's other blocks untouched
    # and the round trip through the views
    back = kv_quant.to_rows(cache, d, dtype).view(nb * bs, kv, row)[slots]
    assert torch.equal(back, rows)
    assert torch.equal(kv_quant.from_rows(kv_quant.to_rows(cache, d, dtype), d, dtype), cache)
