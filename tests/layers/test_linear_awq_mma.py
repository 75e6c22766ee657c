"""The opt-in tensor-core path of AWQ layers (``HOTLOOP_W4A16_MMA=1``): a CUDA layer keeps the MMA
layout after loading and answers 1-8 rows with it, more rows with ``w4a16_gemm``; off by default."""

from __future__ import annotations

import pytest
import torch

from hotloop.kernels import reference, w4a16_mma
from hotloop.kernels.w4a16_layout import pack_int4
from hotloop.layers.linear import AWQLinearMethod, Linear


def _awq_layer(k: int, n: int, device: str) -> Linear:
    gen = torch.Generator().manual_seed(7)
    tensors = {
        "qweight": pack_int4(torch.randint(0, 16, (k, n), generator=gen)),
        "qzeros": pack_int4(torch.randint(0, 16, (k // 128, n), generator=gen)),
        "scales": (torch.rand(k // 128, n, generator=gen) * 0.02 + 0.001).to(torch.bfloat16),
    }
    layer = Linear(k, n, dtype=torch.bfloat16, quant_method=AWQLinearMethod(128)).to(device)
    for name, value in tensors.items():
        getattr(layer, name).data.copy_(value)
    return layer


def test_off_by_default_and_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(w4a16_mma.ENV, raising=False)
    assert not w4a16_mma.enabled()
    monkeypatch.setenv(w4a16_mma.ENV, "1")
    assert w4a16_mma.enabled()
    layer = _awq_layer(256, 128, "cpu")
    layer.quant_method.process_weights_after_loading(layer)  # CPU: dequantized, no MMA layout
    assert "qmma" not in layer._buffers and "weight" in layer._parameters


@pytest.mark.gpu
def test_gpu_mma_path_matches_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    if not w4a16_mma.available(torch.device("cuda")):
        pytest.skip("the CUDA kernels cannot be built here")
    monkeypatch.setenv(w4a16_mma.ENV, "1")
    k, n = 4096, 1024
    layer = _awq_layer(k, n, "cuda")
    layer.quant_method.process_weights_after_loading(layer)
    assert "qmma" in layer._buffers and layer.__dict__["mma_split"] in w4a16_mma.SPLITS
    q = (layer.qweight, layer.qzeros, layer.scales)
    for rows in (1, 3, 8, 9):  # 9 rows: w4a16_gemm
        x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
        want = reference.w4a16_matmul(x.float(), q[0], q[1], q[2].float(), 128)
        got = layer(x)
        err = float((got.float() - want).abs().max() / want.abs().max())
        assert err < 1e-2, (rows, err)
    monkeypatch.setenv(w4a16_mma.ENV, "0")
    plain = _awq_layer(k, n, "cuda")
    plain.quant_method.process_weights_after_loading(plain)
    assert "qmma" not in plain._buffers
