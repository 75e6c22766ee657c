"""``LlamaMLP``: the down projection may fold the SiLU-and-mul in (W4A16 at one row, on by default),
and the MLP falls back to the two launches wherever it declines."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from hotloop.models.llama import LlamaMLP


class _Folding:
    """A quant method that wraps the real one and answers ``apply_silu_mul`` with ``answer``."""

    def __init__(self, inner: Any, answer: torch.Tensor | None) -> None:
        self.inner, self.answer, self.seen = inner, answer, []

    def apply(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.inner.apply(layer, x))

    def apply_silu_mul(self, layer: Any, gate_up: torch.Tensor) -> torch.Tensor | None:
        self.seen.append(gate_up.clone())
        return self.answer


def _mlp() -> LlamaMLP:
    torch.manual_seed(0)
    mlp = LlamaMLP(
        cast(Any, SimpleNamespace(hidden_size=8, intermediate_size=16, mlp_bias=False)), torch.float32
    )
    for p in mlp.parameters():
        p.data.normal_()
    return mlp


def test_the_folded_launch_is_used_where_it_answers() -> None:
    mlp = _mlp()
    x = torch.randn(1, 8)
    want_input = mlp.gate_up_proj(x)
    sentinel = torch.full((1, 8), 7.0)
    folding = _Folding(mlp.down_proj.quant_method, sentinel)
    mlp.down_proj.quant_method = folding
    assert mlp(x) is sentinel
    assert len(folding.seen) == 1 and torch.equal(folding.seen[0], want_input)  # the [gate | up] row


def test_the_two_launches_run_where_it_declines() -> None:
    mlp = _mlp()
    x = torch.randn(3, 8)
    want = mlp.down_proj(mlp.act_fn(mlp.gate_up_proj(x)))
    mlp.down_proj.quant_method = _Folding(mlp.down_proj.quant_method, None)
    assert torch.equal(mlp(x), want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_w4a16_mlp_folds_the_silu_at_one_row(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-3-8B's MLP shape with random int4 weights: with the folded SiLU (the default) one row
    takes the folded launch and gives the two launches' output; more rows keep the two launches."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from hotloop.kernels import w4a16_cuda
    from hotloop.kernels.w4a16_layout import pack_int4
    from hotloop.layers.linear import AWQLinearMethod, set_quant_method

    if not w4a16_cuda.available(torch.device("cuda")):
        pytest.skip("the CUDA W4A16 kernels cannot be built here")
    gen = torch.Generator().manual_seed(5)  # on the CPU: the tensors below are drawn there explicitly
    with torch.device("cuda"):
        mlp = LlamaMLP(
            cast(Any, SimpleNamespace(hidden_size=4096, intermediate_size=14336, mlp_bias=False)), dtype
        )
        for layer in (mlp.gate_up_proj, mlp.down_proj):
            set_quant_method(layer, AWQLinearMethod(128))
            k, n = layer.in_features, layer.out_features
            layer.qweight.data = pack_int4(torch.randint(0, 16, (k, n), generator=gen, device="cpu")).cuda()
            layer.qzeros.data = pack_int4(
                torch.randint(0, 16, (k // 128, n), generator=gen, device="cpu")
            ).cuda()
            layer.scales.data = (torch.rand(k // 128, n, generator=gen, device="cpu") * 0.02 + 0.001).to(
                "cuda", dtype
            )
            layer.quant_method.process_weights_after_loading(layer)
    x = (torch.randn(4, 4096, generator=gen) * 0.5).to("cuda", dtype)
    # the one-row launches pinned to the CUDA GEMV (4 lanes, 32 rows, 256 threads), not left to timing
    from hotloop.kernels import w4a16_gemm as g

    cuda_gemv = g.GemmConfig("cuda", 1, 128, 32, num_warps=8, num_stages=1)
    index = torch.cuda.current_device()
    tuned = {(index, dtype, 1, n, k, 128): cuda_gemv for k, n in ((4096, 28672), (14336, 4096))}
    monkeypatch.setattr(g, "_tuned", tuned)
    monkeypatch.setattr(g, "_plans", {})
    monkeypatch.setenv(w4a16_cuda.SILU_ENV, "0")
    two = mlp(x[:1])
    calls: list[int] = []
    folded = w4a16_cuda.gemv_silu_mul

    def spy(*a: Any, **kw: Any) -> torch.Tensor:
        y = folded(*a, **kw)
        calls.append(1)  # counted once it returned: a launch that raised falls back silently
        return y

    monkeypatch.setattr(w4a16_cuda, "gemv_silu_mul", spy)
    monkeypatch.setenv(w4a16_cuda.SILU_ENV, "1")
    one = mlp(x[:1])
    torch.cuda.synchronize()
    assert calls, "the folded launch did not run"
    # the kernel rounds as silu_and_mul does (ex2.approx, div.full, the SiLU then the product to 16
    # bits), so the two paths feed the GEMV the same x
    assert torch.equal(one, two), float((one.float() - two.float()).abs().max())
    calls.clear()
    many = mlp(x)
    assert not calls and many.shape == (4, 4096)


def test_awq_layers_decline_unless_they_can_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AWQLinearMethod.apply_silu_mul`` answers None (the caller runs the two launches) with the
    switch off, for a CPU layer (dequantized at load) and for a layer with a bias."""
    from hotloop.kernels import w4a16_cuda
    from hotloop.layers.linear import AWQLinearMethod, Linear, set_quant_method

    layer = Linear(256, 128)
    set_quant_method(layer, AWQLinearMethod(128))
    method = cast(AWQLinearMethod, layer.quant_method)
    gate_up = torch.zeros(1, 512)
    monkeypatch.setenv(w4a16_cuda.SILU_ENV, "0")
    assert method.apply_silu_mul(layer, gate_up) is None
    monkeypatch.setenv(w4a16_cuda.SILU_ENV, "1")
    assert method.apply_silu_mul(layer, gate_up) is None  # packed, but on the CPU
    layer.register_parameter("weight", torch.nn.Parameter(torch.zeros(128, 256), requires_grad=False))
    assert method.apply_silu_mul(layer, gate_up) is None  # dequantized at load
    biased = Linear(256, 128, bias=True)
    set_quant_method(biased, AWQLinearMethod(128))
    assert cast(AWQLinearMethod, biased.quant_method).apply_silu_mul(biased, gate_up) is None
