"""The one-row dense GEMV with fused norm / SiLU / residual against ``reference.fused_linear``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_checks import TOL, interpret, rel_err

from hotloop.kernels import reference


def _case(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    device: str,
    *,
    norm: bool,
    silu: bool,
    res: bool,
    bias: bool,
    config: object = None,
) -> float:
    from hotloop.kernels.dense_gemv import dense_gemv

    gen = torch.Generator().manual_seed(n * 7 + k)
    rows = 2 * n if silu else n
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype).to(device)
    w = (torch.randn(rows, k, generator=gen) / k**0.5).to(dtype).to(device)
    b = (torch.randn(rows, generator=gen) * 0.1).to(dtype).to(device) if bias else None
    nw = (torch.rand(k, generator=gen) + 0.5).to(dtype).to(device) if norm else None
    r = torch.randn(m, n, generator=gen).to(dtype).to(device) if res else None
    kw = {"norm_weight": nw, "eps": 1e-5, "residual": r, "silu": silu}
    out = dense_gemv(x, w, b, config=config, **kw)  # type: ignore[arg-type]
    # the reference in float32 from the same (rounded) operands, then rounded once
    ref = reference.fused_linear(
        x.float(),
        w.float(),
        None if b is None else b.float(),
        norm_weight=None if nw is None else nw.float(),
        eps=1e-5,
        residual=None if r is None else r.float(),
        silu=silu,
    )
    assert out.shape == (m, n) and out.dtype == dtype
    return rel_err(out, ref)


FUSIONS = [
    dict(norm=False, silu=False, res=False, bias=False),
    dict(norm=True, silu=False, res=False, bias=True),  # input norm -> qkv (with a bias, Qwen2)
    dict(norm=False, silu=False, res=True, bias=False),  # o / down + residual
    dict(norm=True, silu=True, res=False, bias=False),  # post-attention norm -> gate/up -> SiLU
    dict(norm=True, silu=True, res=False, bias=True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "n,k",
    [(6144, 4096), (4096, 4096), (14336, 4096), (4096, 14336), (960, 576), (576, 1536), (1000, 300)],
)
@pytest.mark.parametrize("fusion", range(len(FUSIONS)))
def test_dense_gemv_gpu(n: int, k: int, fusion: int, dtype: torch.dtype) -> None:
    f = FUSIONS[fusion]
    for m in (1, 3):
        err = _case(m, n, k, dtype, "cuda", **f)  # type: ignore[arg-type]
        # the fused roundings (norm, SiLU, residual) are each one rounding of the dtype
        assert err < (1e-5 if dtype == torch.float32 else TOL[dtype] / 2), (m, f, err)


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,block_k,warps", [(1, 64, 1), (16, 128, 8), (2, 1024, 4), (32, 256, 2)])
def test_dense_gemv_configs_gpu(block_n: int, block_k: int, warps: int) -> None:
    from hotloop.kernels.dense_gemv import GemvConfig

    cfg = GemvConfig(block_n, block_k, warps)
    for f in FUSIONS:
        err = _case(1, 1000, 700, torch.bfloat16, "cuda", config=cfg, **f)  # type: ignore[arg-type]
        assert err < TOL[torch.bfloat16] / 2, (cfg, f, err)


@interpret
@pytest.mark.parametrize("fusion", range(len(FUSIONS)))
@pytest.mark.parametrize("n,k", [(24, 64), (10, 40)])  # even tiles, and masked ones
def test_dense_gemv_interpreted(n: int, k: int, fusion: int) -> None:
    from hotloop.kernels.dense_gemv import GemvConfig

    cfg = GemvConfig(block_n=8, block_k=32, num_warps=1)
    assert _case(2, n, k, torch.float32, "cpu", config=cfg, **FUSIONS[fusion]) < 1e-5  # type: ignore[arg-type]


@interpret
def test_dense_gemv_checks_shapes() -> None:
    from hotloop.kernels.dense_gemv import dense_gemv

    x = torch.randn(1, 32)
    with pytest.raises(ValueError, match="K=32"):
        dense_gemv(x, torch.randn(8, 16))
    with pytest.raises(ValueError, match="odd"):
        dense_gemv(x, torch.randn(7, 32), silu=True)
    with pytest.raises(ValueError, match="residual must be"):
        dense_gemv(x, torch.randn(8, 32), residual=torch.randn(1, 4))
    with pytest.raises(ValueError, match="norm_weight must be"):
        dense_gemv(x, torch.randn(8, 32), norm_weight=torch.ones(16))


def _rope_case(
    m: int,
    h: int,
    kv: int,
    d: int,
    k: int,
    dtype: torch.dtype,
    device: str,
    *,
    bias: bool,
    config: object = None,
) -> tuple[float, float, float]:
    """``dense_gemv_qkv_rope`` against ``reference.fused_qkv_rope`` on the same (rounded) operands:
    the relative errors of q, the K cache and the V cache (every slot, so a stray write shows)."""
    from hotloop.kernels.dense_gemv import dense_gemv_qkv_rope

    gen = torch.Generator().manual_seed(h * 31 + d + k)
    rows = (h + 2 * kv) * d
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype).to(device)
    w = (torch.randn(rows, k, generator=gen) / k**0.5).to(dtype).to(device)
    b = (torch.randn(rows, generator=gen) * 0.1).to(dtype).to(device) if bias else None
    nw = (torch.rand(k, generator=gen) + 0.5).to(dtype).to(device)
    ang = torch.rand(m, d // 2, generator=gen) * 50
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    nb, bs = 3, 4
    kc = torch.randn(nb, bs, kv, d, generator=gen).to(dtype).to(device)
    vc = torch.randn(nb, bs, kv, d, generator=gen).to(dtype).to(device)
    slots = torch.tensor([5, -1, 9][:m], dtype=torch.int64, device=device)  # -1: a padding row
    kc_ref, vc_ref = kc.float().clone(), vc.float().clone()
    kw = {"eps": 1e-5, "cos": cos, "sin": sin, "slot_mapping": slots, "num_heads": h, "num_kv_heads": kv}
    q = dense_gemv_qkv_rope(x, w, b, norm_weight=nw, k_cache=kc, v_cache=vc, config=config, **kw)  # type: ignore[arg-type]
    q_ref = reference.fused_qkv_rope(
        x.float(), w.float(), None if b is None else b.float(), norm_weight=nw.float(), k_cache=kc_ref,
        v_cache=vc_ref, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    assert q.shape == (m, h * d)
    return rel_err(q, q_ref), rel_err(kc, kc_ref), rel_err(vc, vc_ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "h,kv,d,k", [(32, 8, 128, 4096), (9, 3, 64, 576), (28, 4, 128, 3584), (4, 4, 32, 300)]
)
@pytest.mark.parametrize("bias", [False, True])
def test_dense_gemv_qkv_rope_gpu(h: int, kv: int, d: int, k: int, bias: bool, dtype: torch.dtype) -> None:
    tol = 1e-5 if dtype == torch.float32 else TOL[dtype] / 2
    for m in (1, 3):
        errs = _rope_case(m, h, kv, d, k, dtype, "cuda", bias=bias)
        assert max(errs) < tol, (m, errs)


@interpret
@pytest.mark.parametrize("h,kv,d,k", [(4, 2, 16, 64), (3, 1, 8, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_dense_gemv_qkv_rope_interpreted(h: int, kv: int, d: int, k: int, bias: bool) -> None:
    from hotloop.kernels.dense_gemv import GemvConfig

    for cfg in (
        GemvConfig(block_n=4, block_k=32, num_warps=1),
        GemvConfig(block_n=2, block_k=16, num_warps=1),
    ):
        errs = _rope_case(3, h, kv, d, k, torch.float32, "cpu", bias=bias, config=cfg)
        assert max(errs) < 1e-5, (cfg, errs)


@pytest.mark.gpu
@pytest.mark.parametrize("trigger", ["early", "late"])
def test_dense_gemv_qkv_rope_trigger_gpu(trigger: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """HOTLOOP_ROPE_TRIGGER moves only the PDL launch trigger: the results stay within tolerance."""
    monkeypatch.setenv("HOTLOOP_ROPE_TRIGGER", trigger)
    errs = _rope_case(1, 32, 8, 128, 4096, torch.bfloat16, "cuda", bias=False)
    assert max(errs) < TOL[torch.bfloat16] / 2, errs


def test_rope_trigger_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from hotloop.kernels.dense_gemv import _rope_late_trigger

    monkeypatch.delenv("HOTLOOP_ROPE_TRIGGER", raising=False)
    assert _rope_late_trigger()  # the default
    monkeypatch.setenv("HOTLOOP_ROPE_TRIGGER", "early")
    assert not _rope_late_trigger()
    monkeypatch.setenv("HOTLOOP_ROPE_TRIGGER", "soon")
    with pytest.raises(ValueError, match="HOTLOOP_ROPE_TRIGGER"):
        _rope_late_trigger()


@interpret
def test_dense_gemv_qkv_rope_checks() -> None:
    from hotloop.kernels.dense_gemv import dense_gemv_qkv_rope

    x, w = torch.randn(1, 32), torch.randn((4 + 2 * 2) * 8, 32)
    cache = torch.zeros(2, 4, 2, 8)
    kw = {"norm_weight": None, "eps": 1e-5, "slot_mapping": torch.zeros(1, dtype=torch.int64), "k_cache": cache,
          "v_cache": cache, "num_heads": 4, "num_kv_heads": 2}  # fmt: skip
    with pytest.raises(ValueError, match="full rotary"):
        dense_gemv_qkv_rope(x, w, None, cos=torch.ones(1, 2), sin=torch.zeros(1, 2), **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k_cache and v_cache differ"):
        dense_gemv_qkv_rope(x, w, None, cos=torch.ones(1, 4), sin=torch.zeros(1, 4),
                            **{**kw, "k_cache": cache.to(torch.uint8)})  # type: ignore[arg-type]  # fmt: skip
    u8 = cache.to(torch.uint8)  # 8 bytes a row: neither int8 (8 + 2 x 4) nor int4 (4 + 2 x 4) at D=8
    with pytest.raises(ValueError, match="fits neither int8 nor int4"):
        dense_gemv_qkv_rope(x, w, None, cos=torch.ones(1, 4), sin=torch.zeros(1, 4),
                            **{**kw, "k_cache": u8, "v_cache": u8})  # type: ignore[arg-type]  # fmt: skip


@interpret
def test_fused_roundings_equal_the_unfused_kernels_bf16() -> None:
    """bf16, interpreted: each fusion gives the same bits as the unfused Triton kernels it replaces
    (rms_norm -> GEMV -> silu_and_mul; GEMV -> residual add; GEMV -> rotary_kv_write), with the same
    K step so that every dot sums in the same order. Catches a missing or extra rounding, which the
    float32-reference comparisons above are too loose to see."""
    from hotloop.kernels.dense_gemv import GemvConfig, dense_gemv, dense_gemv_qkv_rope
    from hotloop.kernels.rms_norm import rms_norm
    from hotloop.kernels.rotary_kv_write import rotary_kv_write
    from hotloop.kernels.silu_and_mul import silu_and_mul

    bf = torch.bfloat16
    gen = torch.Generator().manual_seed(7)
    k, n = 64, 24
    cfg = GemvConfig(block_n=4, block_k=32, num_warps=1)
    x = (torch.randn(2, k, generator=gen) * 3).to(bf)
    nw = (torch.rand(k, generator=gen) + 0.5).to(bf)
    w = (torch.randn(2 * n, k, generator=gen) / 8).to(bf)
    r = torch.randn(2, n, generator=gen).to(bf)

    normed = rms_norm(x, nw, 1e-5)[0]
    unfused = silu_and_mul(dense_gemv(normed, w, config=cfg))
    assert torch.equal(dense_gemv(x, w, norm_weight=nw, eps=1e-5, silu=True, config=cfg), unfused)

    y = dense_gemv(x, w[:n], config=cfg)
    added = rms_norm(y, torch.ones(n, dtype=bf), 1e-5, r)[1]  # its residual output: y + r, rounded
    assert added is not None
    assert torch.equal(dense_gemv(x, w[:n], residual=r, config=cfg), added)

    h, kv, d = 2, 1, 8
    wq = (torch.randn((h + 2 * kv) * d, k, generator=gen) / 8).to(bf)
    ang = torch.rand(2, d // 2, generator=gen) * 50
    cos, sin = ang.cos(), ang.sin()
    slots = torch.tensor([3, 6])
    kc, vc = torch.zeros(2, 4, kv, d, dtype=bf), torch.zeros(2, 4, kv, d, dtype=bf)
    qkv = dense_gemv(x, wq, norm_weight=nw, eps=1e-5, config=cfg)
    q, kk, v = (t.reshape(2, -1, d) for t in qkv.split([h * d, kv * d, kv * d], dim=-1))
    q = q.clone()
    kc_ref, vc_ref = kc.clone(), vc.clone()
    rotary_kv_write(q, kk, v, cos, sin, kc_ref, vc_ref, slots)
    got = dense_gemv_qkv_rope(
        x, wq, None, norm_weight=nw, eps=1e-5, cos=cos, sin=sin, slot_mapping=slots, k_cache=kc,
        v_cache=vc, num_heads=h, num_kv_heads=kv, config=cfg,
    )  # fmt: skip
    assert torch.equal(got, q.reshape(2, h * d))
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)


@interpret
def test_float32_logits_are_the_rounded_output_widened() -> None:
    """``out_dtype=float32`` (the LM head): each logit is the bf16 output widened, bit for bit, as
    ``F.linear(x, W).float()`` rounds; masked tiles (a vocabulary that is not a multiple of
    ``block_n``) included."""
    from hotloop.kernels.dense_gemv import GemvConfig, dense_gemv

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 48, generator=gen).to(torch.bfloat16)
    w = (torch.randn(37, 48, generator=gen) / 7).to(torch.bfloat16)
    cfg = GemvConfig(block_n=8, block_k=16, num_warps=1)
    logits = dense_gemv(x, w, config=cfg, out_dtype=torch.float32)
    assert logits.dtype == torch.float32 and logits.shape == (1, 37)
    assert torch.equal(logits, dense_gemv(x, w, config=cfg).float())
    assert rel_err(logits, F.linear(x.float(), w.float())) < TOL[torch.bfloat16] / 2
    with pytest.raises(ValueError, match="out_dtype"):
        dense_gemv(x, w, out_dtype=torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab,hidden", [(128256, 4096), (49152, 576), (1000, 300)])
def test_lm_head_logits_gpu(vocab: int, hidden: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ops.lm_head_logits`` through ``dense_gemv`` against cuBLAS + cast: float32, and within one
    bf16 rounding of it (the sums run in a different order)."""
    from hotloop.kernels import ops

    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(1, hidden, generator=gen).to(torch.bfloat16).cuda()
    w = (torch.randn(vocab, hidden, generator=gen) / hidden**0.5).to(torch.bfloat16).cuda()
    monkeypatch.setitem(ops._state, "one_row_lm_head", True)
    got = ops.lm_head_logits(x, w)
    ref = F.linear(x, w).float()
    assert got.dtype == torch.float32 and got.shape == (1, vocab)
    assert rel_err(got, F.linear(x.float(), w.float())) < TOL[torch.bfloat16] / 2
    assert rel_err(got, ref) < TOL[torch.bfloat16] / 2
    monkeypatch.setitem(ops._state, "one_row_lm_head", False)
    assert torch.equal(ops.lm_head_logits(x, w), ref)


def test_lm_head_logits_cpu_is_linear_then_cast() -> None:
    from hotloop.kernels import ops

    x, w = torch.randn(2, 16).to(torch.bfloat16), torch.randn(40, 16).to(torch.bfloat16)
    got = ops.lm_head_logits(x, w)
    assert got.dtype == torch.float32 and torch.equal(got, F.linear(x, w).float())


def _quant_rope_pair(
    policy: int,
    h: int,
    kv: int,
    d: int,
    k: int,
    m: int,
    dtype: torch.dtype,
    device: str,
    config: object = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused rope GEMV writing a quantized cache, and the two launches it replaces (the q/k/v
    GEMV, then ``rotary_kv_write``) on the same inputs: (q, k cache, v cache) of each."""
    from hotloop.kernels import kv_quant
    from hotloop.kernels.dense_gemv import dense_gemv, dense_gemv_qkv_rope
    from hotloop.kernels.rotary_kv_write import rotary_kv_write

    gen = torch.Generator().manual_seed(policy * 100 + d + k)
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype).to(device)
    w = (torch.randn((h + 2 * kv) * d, k, generator=gen) / k**0.5).to(dtype).to(device)
    nw = (torch.rand(k, generator=gen) + 0.5).to(dtype).to(device)
    ang = torch.rand(m, d // 2, generator=gen) * 50
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    row = kv_quant.row_bytes(d, policy, x.element_size())
    kc = torch.randint(0, 256, (3, 4, kv, row), generator=gen, dtype=torch.uint8).to(device)
    vc = torch.randint(0, 256, (3, 4, kv, row), generator=gen, dtype=torch.uint8).to(device)
    slots = torch.tensor([5, -1, 9][:m], dtype=torch.int64, device=device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    q = dense_gemv_qkv_rope(
        x, w, None, norm_weight=nw, eps=1e-5, cos=cos, sin=sin, slot_mapping=slots, k_cache=kc, v_cache=vc,
        num_heads=h, num_kv_heads=kv, config=config,  # type: ignore[arg-type]
    )  # fmt: skip
    qkv = dense_gemv(x, w, norm_weight=nw, eps=1e-5, config=config)  # type: ignore[arg-type]
    qr, kr, vr = (t.reshape(m, -1, d) for t in qkv.split([h * d, kv * d, kv * d], dim=-1))
    qr = qr.clone()
    rotary_kv_write(qr, kr, vr, cos, sin, kc_ref, vc_ref, slots)
    return q, kc, vc, qr.reshape(m, h * d), kc_ref, vc_ref


@interpret
@pytest.mark.parametrize("policy", [8, 4])
def test_rope_gemv_quantized_cache_equals_the_two_launches_interpreted(policy: int) -> None:
    """bf16, interpreted: the rope GEMV into an int8 / int4 cache writes the same bytes as the q/k/v
    GEMV followed by ``rotary_kv_write`` (each head quantized by its last program), padding rows
    (slot -1) write nothing, and the arrival counters are back at zero."""
    from hotloop.kernels import counters
    from hotloop.kernels.dense_gemv import GemvConfig

    for cfg in (
        GemvConfig(block_n=2, block_k=32, num_warps=1),
        GemvConfig(block_n=8, block_k=64, num_warps=1),
    ):
        for _ in range(2):  # twice: a launch that left a counter set would break the next one
            q, kc, vc, q_ref, kc_ref, vc_ref = _quant_rope_pair(
                policy, 2, 2, 16, 64, 3, torch.bfloat16, "cpu", cfg
            )
            assert torch.equal(q, q_ref)
            assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref), cfg
            assert int(counters.buffer(torch.device("cpu"), "rope_quant").abs().sum()) == 0


@interpret
def test_rope_gemv_quantized_cache_without_counters_takes_two_launches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where no counters can be had (a first call inside a graph capture), the launcher runs the
    q/k/v GEMV and ``rotary_kv_write``: the same bytes, and a contiguous q."""
    from hotloop.kernels import counters
    from hotloop.kernels.dense_gemv import GemvConfig

    monkeypatch.setattr(counters, "counters", lambda *a: None)
    cfg = GemvConfig(block_n=2, block_k=32, num_warps=1)
    q, kc, vc, q_ref, kc_ref, vc_ref = _quant_rope_pair(8, 2, 2, 16, 64, 3, torch.bfloat16, "cpu", cfg)
    assert q.is_contiguous() and torch.equal(q, q_ref)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)


@pytest.mark.gpu
@pytest.mark.parametrize("policy", [8, 4])
@pytest.mark.parametrize("h,kv,d,k", [(32, 8, 128, 4096), (9, 3, 64, 576), (28, 4, 128, 3584)])
def test_rope_gemv_quantized_cache_gpu(policy: int, h: int, kv: int, d: int, k: int) -> None:
    """On the GPU the fused dot may sum in another order than the plain GEMV (the rotation is
    rounded as ``rotary_kv_write`` rounds it: ``NO_FMA``), so a value can land one rounding away: q within bf16 noise, the caches' dequantized rows within
    one quantization step of the two launches', almost every code equal; the counters end at zero."""
    from hotloop.kernels import counters, kv_quant

    for m in (1, 3):
        q, kc, vc, q_ref, kc_ref, vc_ref = _quant_rope_pair(policy, h, kv, d, k, m, torch.bfloat16, "cuda")
        assert rel_err(q, q_ref) < TOL[torch.bfloat16] / 2
        written = [s for s in (5, -1, 9)[:m] if s >= 0]
        for got, ref in ((kc, kc_ref), (vc, vc_ref)):
            # the slots nobody wrote keep their bytes; the written rows' codes nearly all agree
            flat_got, flat_ref = got.reshape(-1, kv, got.shape[-1]), ref.reshape(-1, kv, ref.shape[-1])
            untouched = [i for i in range(flat_got.shape[0]) if i not in written]
            assert torch.equal(flat_got[untouched], flat_ref[untouched])
            codes = kv_quant.packed_bytes(d, policy)
            assert (flat_got[written][..., :codes] != flat_ref[written][..., :codes]).float().mean() < 0.01
            a = kv_quant.dequantize_cache(got, d, torch.bfloat16).reshape(-1, kv, d)[written].float()
            b = kv_quant.dequantize_cache(ref, d, torch.bfloat16).reshape(-1, kv, d)[written].float()
            step = (b.amax(-1, keepdim=True) - b.amin(-1, keepdim=True)) / ((1 << policy) - 1)
            assert ((a - b).abs() <= step * 1.01 + 1e-3).all(), (m, policy)
    assert int(counters.buffer(torch.device("cuda"), "rope_quant").abs().sum()) == 0


# -- the staged rope GEMV (dense_gemv_qkv_rope_staged): k and v handed over, no cache write ---------
def _staged_case(
    m: int, h: int, kv: int, d: int, k: int, dtype: torch.dtype, device: str, config: object = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The staged GEMV and the cache-writing rope GEMV on the same inputs, with a float cache that
    has one slot per row: (q, kv) of the first, then (q, k cache rows, v cache rows) of the second,
    and (q, kv) of ``reference.fused_qkv_rope_staged`` in float32 over the same rounded operands."""
    from hotloop.kernels.dense_gemv import dense_gemv_qkv_rope, dense_gemv_qkv_rope_staged

    gen = torch.Generator().manual_seed(h * 13 + d + k)
    rows = (h + 2 * kv) * d
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype).to(device)
    w = (torch.randn(rows, k, generator=gen) / k**0.5).to(dtype).to(device)
    b = (torch.randn(rows, generator=gen) * 0.1).to(dtype).to(device)
    nw = (torch.rand(k, generator=gen) + 0.5).to(dtype).to(device)
    ang = torch.rand(m, d // 2, generator=gen) * 50
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    kw = {"norm_weight": nw, "eps": 1e-5, "cos": cos, "sin": sin, "num_heads": h, "num_kv_heads": kv}
    q, kvs = dense_gemv_qkv_rope_staged(x, w, b, config=config, **kw)  # type: ignore[arg-type]
    kc = torch.zeros(m, 1, kv, d, dtype=dtype, device=device)  # a cache of m blocks of one slot
    vc = torch.zeros_like(kc)
    slots = torch.arange(m, dtype=torch.int64, device=device)
    q2 = dense_gemv_qkv_rope(x, w, b, slot_mapping=slots, k_cache=kc, v_cache=vc, config=config, **kw)  # type: ignore[arg-type]
    fkw = {**kw, "norm_weight": nw.float()}
    q_ref, kv_ref = reference.fused_qkv_rope_staged(x.float(), w.float(), b.float(), **fkw)  # type: ignore[arg-type]
    assert q.shape == (m, h * d) and kvs.shape == (m, 2 * kv, d) and kvs.dtype == dtype
    return q, kvs, q2, torch.cat([kc[:, 0], vc[:, 0]], dim=1), q_ref, kv_ref


@interpret
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_gemv_staged_interpreted(dtype: torch.dtype) -> None:
    """Interpreted: the staged GEMV's q, k and v are bit for bit what the cache-writing rope GEMV
    returns and stores (the same program, its stores redirected), and agree with the float32
    reference (rotation of q and k, v as projected)."""
    from hotloop.kernels.dense_gemv import GemvConfig

    for cfg in (
        GemvConfig(block_n=4, block_k=32, num_warps=1),
        GemvConfig(block_n=2, block_k=16, num_warps=1),
    ):
        q, kvs, q2, cache_rows, q_ref, kv_ref = _staged_case(3, 4, 2, 16, 64, dtype, "cpu", cfg)
        assert torch.equal(q, q2) and torch.equal(kvs, cache_rows), cfg
        tol = 1e-5 if dtype == torch.float32 else TOL[dtype]  # (bf16: the norm's and the dot's roundings)
        assert rel_err(q, q_ref) < tol and rel_err(kvs, kv_ref) < tol


def test_reference_staged_equals_the_cache_writing_reference() -> None:
    """The two references agree: the staged one's k and v are the rows ``fused_qkv_rope`` stores."""
    gen = torch.Generator().manual_seed(3)
    m, h, kv, d, k = 2, 4, 2, 16, 48
    x, w = torch.randn(m, k, generator=gen), torch.randn((h + 2 * kv) * d, k, generator=gen)
    ang = torch.rand(m, d // 2, generator=gen) * 9
    kw = {
        "norm_weight": None,
        "eps": 1e-5,
        "cos": ang.cos(),
        "sin": ang.sin(),
        "num_heads": h,
        "num_kv_heads": kv,
    }
    q, kvs = reference.fused_qkv_rope_staged(x, w, None, **kw)  # type: ignore[arg-type]
    kc, vc = torch.zeros(m, 1, kv, d), torch.zeros(m, 1, kv, d)
    q2 = reference.fused_qkv_rope(
        x,
        w,
        None,
        slot_mapping=torch.arange(m),
        k_cache=kc,
        v_cache=vc,
        **kw,  # type: ignore[arg-type]
    )
    assert torch.equal(q, q2)
    assert torch.equal(kvs[:, :kv], kc[:, 0]) and torch.equal(kvs[:, kv:], vc[:, 0])
    assert not torch.equal(kvs[:, :kv], x.new_zeros(m, kv, d))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("h,kv,d,k", [(32, 8, 128, 4096), (9, 3, 64, 576), (28, 4, 128, 3584)])
def test_rope_gemv_staged_gpu(h: int, kv: int, d: int, k: int, dtype: torch.dtype) -> None:
    """On the GPU: v is bit for bit what the cache-writing rope GEMV stores (one program, the stores
    redirected); q and k within a rounding of it (the staged rotation rounds each product and sum on
    its own, as ``rotary_kv_write`` does for a quantized cache; the float cache's path contracts them
    into fmas); all three within the dtype's tolerance of the float32 reference."""
    for m in (1, 3):
        q, kvs, q2, cache_rows, q_ref, kv_ref = _staged_case(m, h, kv, d, k, dtype, "cuda")
        assert torch.equal(kvs[:, kv:], cache_rows[:, kv:]), m
        assert (
            rel_err(q, q2) < TOL[dtype] / 8 and rel_err(kvs[:, :kv], cache_rows[:, :kv]) < TOL[dtype] / 8
        ), m
        assert rel_err(q, q_ref) < TOL[dtype] and rel_err(kvs, kv_ref) < TOL[dtype], m


def _partials(
    m: int, h: int, splits: int, d: int, device: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random decode partials ``[m, h, splits, d]`` and log2 log-sum-exps ``[m, h, splits]`` as a split
    decode launch leaves them: a row's last splits empty (-inf, past a short context) and, with more
    than one row, a padding row whose every split is empty."""
    gen = torch.Generator().manual_seed(seed)
    part = torch.randn(m, h, splits, d, generator=gen)
    lse = torch.randn(m, h, splits, generator=gen) * 4
    if splits > 1:
        lse[0, :, splits // 2 + 1 :] = float("-inf")
    if m > 1:
        lse[-1] = float("-inf")
    return part.to(device), lse.to(device)


def _merged_case(
    m: int, h: int, splits: int, d: int, n: int, dtype: torch.dtype, device: str, *, res: bool, bias: bool,
    config: object = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``dense_gemv_merged`` and the float32 reference (merge rounded to the dtype, then the linear and
    the residual on the rounded operands)."""
    from hotloop.kernels.dense_gemv import dense_gemv_merged

    part, lse = _partials(m, h, splits, d, device, seed=h * 13 + splits + n)
    gen = torch.Generator().manual_seed(n + d)
    k = h * d
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
    b = (torch.randn(n, generator=gen) * 0.1).to(dtype).to(device) if bias else None
    r = torch.randn(m, n, generator=gen).to(dtype).to(device) if res else None
    out = dense_gemv_merged(part, lse, w, b, residual=r, config=config)  # type: ignore[arg-type]
    x = reference.merge_decode_partials(part.cpu(), lse.cpu(), dtype).to(device)
    ref = reference.fused_linear(
        x.float(), w.float(), None if b is None else b.float(), residual=None if r is None else r.float()
    )
    assert out.shape == (m, n) and out.dtype == dtype
    return out, ref


def test_reference_merge_equals_attention_over_the_whole_context() -> None:
    """The merge reference recombines splits into the attention over their union: softmax-weighted
    values over every key, computed in one piece."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 40, generator=gen) * 3  # [B, H, keys], log2 units
    values = torch.randn(2, 3, 40, 8, generator=gen)
    parts, lses = [], []
    for lo, hi in ((0, 16), (16, 24), (24, 40)):
        s = scores[..., lo:hi]
        lses.append(torch.logsumexp(s * torch.log(torch.tensor(2.0)), -1) / torch.log(torch.tensor(2.0)))
        parts.append(
            torch.einsum(
                "bhk,bhkd->bhd", torch.softmax(s * torch.log(torch.tensor(2.0)), -1), values[..., lo:hi, :]
            )
        )
    merged = reference.merge_decode_partials(torch.stack(parts, 2), torch.stack(lses, 2), torch.float32)
    whole = torch.einsum("bhk,bhkd->bhd", torch.softmax(scores * torch.log(torch.tensor(2.0)), -1), values)
    torch.testing.assert_close(merged, whole.flatten(1), rtol=1e-5, atol=1e-6)


@interpret
@pytest.mark.parametrize("h,splits,d,n", [(3, 4, 16, 24), (2, 3, 8, 10), (1, 1, 32, 8)])
@pytest.mark.parametrize("res,bias", [(True, False), (False, True)])
@pytest.mark.parametrize("block_k", [16, 64])  # a tile of splits per K step; one split at a time over the row
def test_dense_gemv_merged_interpreted(
    h: int, splits: int, d: int, n: int, res: bool, bias: bool, block_k: int
) -> None:
    from hotloop.kernels.dense_gemv import GemvConfig

    cfg = GemvConfig(block_n=8, block_k=block_k, num_warps=1)
    out, ref = _merged_case(3, h, splits, d, n, torch.float32, "cpu", res=res, bias=bias, config=cfg)
    assert rel_err(out, ref) < 1e-5


@interpret
@pytest.mark.parametrize(
    "splits,block_k", [(4, 16), (5, 32), (4, 64)]
)  # tiled (K = 48 even, masked); by split
def test_dense_gemv_merged_equals_the_merge_launch_then_the_gemv_bf16(splits: int, block_k: int) -> None:
    """bf16, interpreted: the merge in the GEMV gives the bits of the decode path's two launches (the
    merge kernel, then ``dense_gemv`` with the residual): the merged values rounded to bf16."""
    from hotloop.kernels.dense_gemv import GemvConfig, dense_gemv, dense_gemv_merged
    from hotloop.kernels.paged_decode_attention import DecodeResult, merge_partials

    part, lse = _partials(2, 3, splits, 16, "cpu", seed=5)
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(24, 48, generator=gen) / 7).bfloat16()
    r = torch.randn(2, 24, generator=gen).bfloat16()
    cfg = GemvConfig(block_n=8, block_k=block_k, num_warps=1)
    x = merge_partials(DecodeResult(torch.empty(2, 3, 16, dtype=torch.bfloat16), part, lse)).reshape(2, 48)
    two = dense_gemv(x, w, residual=r, config=cfg)
    assert torch.equal(dense_gemv_merged(part, lse, w, residual=r, config=cfg), two)


@interpret
def test_dense_gemv_merged_checks() -> None:
    from hotloop.kernels.dense_gemv import dense_gemv_merged

    part, lse = _partials(1, 2, 4, 8, "cpu", seed=0)
    with pytest.raises(ValueError, match="K = H \\* D = 16"):
        dense_gemv_merged(part, lse, torch.randn(8, 12))
    with pytest.raises(ValueError, match="lse"):
        dense_gemv_merged(part, lse[:, :, :2], torch.randn(8, 16))
    with pytest.raises(ValueError, match="float32"):
        dense_gemv_merged(part.half(), lse, torch.randn(8, 16))
    with pytest.raises(ValueError, match="residual must be"):
        dense_gemv_merged(part, lse, torch.randn(8, 16), residual=torch.randn(1, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "h,splits,d,n",
    [(9, 16, 64, 576), (32, 4, 128, 4096), (14, 8, 64, 896), (3, 2, 80, 100), (8, 1, 128, 1024)],
)
def test_dense_gemv_merged_gpu(h: int, splits: int, d: int, n: int, dtype: torch.dtype) -> None:
    for m, res, bias in ((1, True, False), (3, False, True)):
        out, ref = _merged_case(m, h, splits, d, n, dtype, "cuda", res=res, bias=bias)
        assert rel_err(out, ref) < TOL[dtype] / 2, (m, res, bias)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "block_n,block_k,warps", [(2, 64, 4), (8, 64, 4), (4, 128, 4), (8, 1024, 8), (2, 1024, 4), (16, 1024, 8)]
)
def test_dense_gemv_merged_configs_gpu(block_n: int, block_k: int, warps: int) -> None:
    from hotloop.kernels.dense_gemv import GemvConfig

    cfg = GemvConfig(block_n, block_k, warps)
    out, ref = _merged_case(1, 9, 16, 64, 576, torch.bfloat16, "cuda", res=True, bias=False, config=cfg)
    assert rel_err(out, ref) < TOL[torch.bfloat16] / 2, cfg
