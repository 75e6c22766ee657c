"""The int4 layout against an independent implementation of AutoAWQ's documented packing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from awq_reference import dequantize, pack, rtn

from hotloop.kernels import reference
from hotloop.kernels.w4a16_layout import pack_int4, unpack_int4
from hotloop.lite.quantize import pseudo_quantize, quantize_weight


def test_one_word_by_hand() -> None:
    # columns 0..7 hold 1..8; nibble i holds column [0, 2, 4, 6, 1, 3, 5, 7][i]
    word = pack_int4(torch.arange(1, 9)[None, :])
    assert word.dtype == torch.int32
    assert int(word) & 0xFFFFFFFF == 0x86427531


@pytest.mark.parametrize("shape", [(1, 8), (5, 64), (17, 24)])
def test_pack_matches_reference_and_round_trips(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    values = torch.randint(0, 16, shape, generator=gen)
    packed = pack_int4(values)
    assert packed.shape == (shape[0], shape[1] // 8)
    np.testing.assert_array_equal(packed.numpy(), pack(values.numpy()))
    assert torch.equal(unpack_int4(packed), values.to(torch.uint8))


def test_pack_rejects_ragged_columns() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_int4(torch.zeros(2, 12, dtype=torch.int64))


def test_quantize_matches_reference_rtn_and_dequantizes() -> None:
    torch.manual_seed(0)
    w = torch.randn(24, 64) * 0.05
    w[3, 5] = 0.9  # an outlier widens its group's range
    qw = quantize_weight(w, group_size=32)
    q, z, s = rtn(w, 32)
    np.testing.assert_array_equal(qw.q.t().numpy(), q)
    np.testing.assert_array_equal(qw.zeros.t().numpy(), z)
    np.testing.assert_array_equal(qw.scales.t().numpy(), s)
    ref = dequantize(q, z, s, 32).t()
    torch.testing.assert_close(qw.dequantize(), ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(pseudo_quantize(w, 32), ref, rtol=0, atol=1e-6)
    # through the packed AutoAWQ tensors
    qweight, qzeros = pack_int4(qw.q.t().contiguous()), pack_int4(qw.zeros.t().contiguous())
    dense = reference.w4a16_dequantize(qweight, qzeros, qw.scales.t().float().contiguous(), 32)
    torch.testing.assert_close(dense, ref.t(), rtol=0, atol=1e-6)
    assert (dense.t() - w).abs().max() <= s.astype(np.float32).max() / 2 + 1e-6


def test_reference_matmul_checks_shapes() -> None:
    qweight = torch.zeros(64, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="qzeros shape"):
        reference.w4a16_dequantize(qweight, torch.zeros(3, 2, dtype=torch.int32), torch.zeros(2, 16), 32)
    with pytest.raises(ValueError, match="divide in_features"):
        reference.w4a16_dequantize(qweight, torch.zeros(1, 2, dtype=torch.int32), torch.zeros(1, 16), 48)
