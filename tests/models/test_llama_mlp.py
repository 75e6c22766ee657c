"""``LlamaMLP``: the down projection may fold the SiLU-and-mul in (W4A16 at one row), and the MLP
falls back to the two launches wherever it declines. The decoder layer's q/k/v and gate/up
projections may fold the residual add and RMSNorm before them in (``_add_norm_project``: W4A16 at one
row, opt-in)."""

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


def _awq_layer(k: int, n: int, dtype: torch.dtype, gen: torch.Generator) -> Any:
    from hotloop.kernels.w4a16_layout import pack_int4
    from hotloop.layers.linear import AWQLinearMethod, Linear, set_quant_method

    with torch.device("cuda"):
        layer = Linear(k, n, dtype=dtype)
    set_quant_method(layer, AWQLinearMethod(128))
    layer.qweight.data = pack_int4(torch.randint(0, 16, (k, n), generator=gen, device="cpu")).cuda()
    layer.qzeros.data = pack_int4(torch.randint(0, 16, (k // 128, n), generator=gen, device="cpu")).cuda()
    layer.scales.data = (torch.rand(k // 128, n, generator=gen, device="cpu") * 0.02 + 0.001).to(
        "cuda", dtype
    )
    layer.quant_method.process_weights_after_loading(layer)
    return layer


class _NormFolding:
    """A quant method that wraps the real one and answers ``apply_add_norm`` with ``answer``."""

    def __init__(self, inner: Any, answer: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        self.inner, self.answer, self.seen = inner, answer, []

    def apply(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.inner.apply(layer, x))

    def apply_add_norm(
        self, layer: Any, x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        self.seen.append((x.clone(), residual.clone(), w, eps))
        return self.answer


def test_decoder_layer_takes_the_folded_projections_at_one_row() -> None:
    """``pre_attention`` / ``post_attention`` with projections that fold (stubs answering fixed
    tensors): one row takes their answers (q, k, v split from it; the new residual; the MLP from
    the gate/up row), and gives them the layer's own h, residual and norm; two rows never ask."""
    from hotloop.layers.rotary import RopeConfig
    from hotloop.models.llama import DecoderArgs, LlamaDecoderLayer

    torch.manual_seed(0)
    args = DecoderArgs(64, 96, 1, 4, 2, 16, 100, 1e-5, RopeConfig())
    layer = LlamaDecoderLayer(args, 0, torch.float32)
    for m in layer.modules():
        for p in m.parameters(recurse=False):
            p.data.normal_(0, 0.1)
    qkv_ans = (torch.randn(1, (4 + 2 * 2) * 16), torch.randn(1, 64))
    gu_ans = (torch.randn(1, 2 * 96), torch.randn(1, 64))
    attn, mlp = layer.self_attn, layer.mlp
    qkv_stub = _NormFolding(attn.qkv_proj.quant_method, qkv_ans)
    gu_stub = _NormFolding(mlp.gate_up_proj.quant_method, gu_ans)
    attn.qkv_proj.quant_method = qkv_stub  # type: ignore[assignment]
    mlp.gate_up_proj.quant_method = gu_stub  # type: ignore[assignment]
    h, res = torch.randn(1, 64), torch.randn(1, 64)
    q, k, v, new_res = layer.pre_attention(h, res)
    want = attn.split_heads(qkv_ans[0])
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), want, strict=True))
    assert new_res is qkv_ans[1]
    (seen,) = qkv_stub.seen
    assert torch.equal(seen[0], h) and torch.equal(seen[1], res)
    assert seen[2] is layer.input_layernorm.weight and seen[3] == layer.input_layernorm.eps
    o = torch.randn(1, 4 * 16)
    out, res2 = layer.post_attention(o, new_res)
    assert res2 is gu_ans[1]
    assert torch.equal(out, mlp.forward_gate_up(gu_ans[0]))
    (seen,) = gu_stub.seen
    assert torch.equal(seen[0], attn.o_proj(o)) and torch.equal(seen[1], new_res)
    assert seen[2] is layer.post_attention_layernorm.weight
    qkv_stub.seen.clear()
    gu_stub.seen.clear()
    h2, res2r = torch.randn(2, 64), torch.randn(2, 64)
    q, k, v, r = layer.pre_attention(h2, res2r)  # two rows: the add + RMSNorm launch, then the projection
    normed, summed = layer.input_layernorm(h2, res2r)
    assert torch.equal(r, summed) and torch.equal(q, attn.project(normed)[0])
    layer.post_attention(torch.randn(2, 64), r)
    assert not qkv_stub.seen and not gu_stub.seen


def test_add_norm_projection_declines_where_it_cannot_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_add_norm_project`` answers None (the layer runs the add + RMSNorm launch, then the
    projection) for a dense layer, a norm other than ``RMSNorm``, more than one row, a CPU AWQ layer,
    and with the switch off."""
    from hotloop.kernels import w4a16_cuda
    from hotloop.layers.linear import AWQLinearMethod, Linear, set_quant_method
    from hotloop.layers.norm import RMSNorm
    from hotloop.models.llama import _add_norm_project

    monkeypatch.setenv(w4a16_cuda.NORM_ENV, "1")
    norm = RMSNorm(256, 1e-5)
    h, res = torch.zeros(1, 256), torch.zeros(1, 256)
    assert _add_norm_project(Linear(256, 128), h, res, norm) is None  # dense
    awq = Linear(256, 128)
    set_quant_method(awq, AWQLinearMethod(128))

    class OffsetNorm(RMSNorm):
        pass

    assert _add_norm_project(awq, h, res, norm) is None  # packed, but on the CPU
    stub = _NormFolding(awq.quant_method, (torch.ones(1, 128), torch.ones(1, 256)))
    awq.quant_method = stub  # type: ignore[assignment]
    assert _add_norm_project(awq, h, res, OffsetNorm(256)) is None
    assert _add_norm_project(awq, torch.zeros(2, 256), torch.zeros(2, 256), norm) is None
    assert not stub.seen  # declined before asking the layer
    assert _add_norm_project(awq, h, res, norm) is stub.answer and len(stub.seen) == 1
    awq.quant_method = stub.inner
    monkeypatch.setenv(w4a16_cuda.NORM_ENV, "0")
    assert _add_norm_project(awq, h, res, norm) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_w4a16_projection_folds_the_add_and_norm_at_one_row(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Llama-3-8B's q/k/v and gate/up shapes with random int4 weights: with
    ``HOTLOOP_W4A16_FUSED_NORM=1`` one row takes the folded launch; the new residual is the add +
    RMSNorm launch's exactly and the projection within an output rounding or two of the two launches
    (the sum of squares is added in another order)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from hotloop.kernels import w4a16_cuda
    from hotloop.kernels import w4a16_gemm as g
    from hotloop.layers.norm import RMSNorm
    from hotloop.models.llama import _add_norm_project

    if not w4a16_cuda.available(torch.device("cuda")):
        pytest.skip("the CUDA W4A16 kernels cannot be built here")
    gen = torch.Generator().manual_seed(7)
    index = torch.cuda.current_device()
    cuda_gemv = g.GemmConfig("cuda", 1, 128, 16, num_warps=8, num_stages=1)
    monkeypatch.setattr(g, "_tuned", {(index, dtype, 1, n, 4096, 128): cuda_gemv for n in (6144, 28672)})
    monkeypatch.setattr(g, "_plans", {})
    calls: list[int] = []
    folded = w4a16_cuda.gemv_add_norm

    def spy(*a: Any, **kw: Any) -> Any:
        y = folded(*a, **kw)
        calls.append(1)
        return y

    monkeypatch.setattr(w4a16_cuda, "gemv_add_norm", spy)
    for n in (6144, 28672):
        proj = _awq_layer(4096, n, dtype, gen)
        with torch.device("cuda"):
            norm = RMSNorm(4096, 1e-5, dtype)
        norm.weight.data = (1.0 + 0.2 * torch.randn(4096, generator=gen)).to("cuda", dtype)
        h = (torch.randn(1, 4096, generator=gen) * 2).to("cuda", dtype)
        res = (torch.randn(1, 4096, generator=gen) * 4).to("cuda", dtype)
        monkeypatch.setenv(w4a16_cuda.NORM_ENV, "0")
        assert _add_norm_project(proj, h, res, norm) is None
        normed, summed = norm(h, res)
        two = proj(normed)
        monkeypatch.setenv(w4a16_cuda.NORM_ENV, "1")
        got = _add_norm_project(proj, h, res, norm)
        torch.cuda.synchronize()
        assert got is not None and calls, "the folded launch did not run"
        y, new_res = got
        assert torch.equal(new_res, summed)
        err = float((y.float() - two.float()).abs().max()) / float(two.float().abs().max())
        assert err < (1e-3 if dtype == torch.float16 else 8e-3), err  # two output roundings
        calls.clear()
