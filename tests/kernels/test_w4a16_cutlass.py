"""The CUTLASS W4A16 GEMM (``kernels/w4a16_cutlass.py``, ``HOTLOOP_W4A16_KERNEL=cutlass``).

CPU: the switch and its errors, the int4 conversion against AutoAWQ's dequantization, the reordered
layout against offsets CuTe printed, the operand checks, the header lookup, the tuner's candidates. GPU (Hopper, nvcc and the nvidia-cutlass headers):
the library's reorder against the torch model of the layout; the one-row tensor-core GEMV's variants
and every configuration and the tuned launch against float32 dequantize-then-matmul over M in {1, 7, 16,
64, 256, 2048} on Llama-3-8B shapes; an AWQ ``Linear`` converted after loading against the Triton path;
a CUDA-graph replay.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kernel_checks import random_awq

from hotloop.kernels import cuda_jit, reference, w4a16_cutlass

LLAMA3_8B = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N) of qkv, o, gate/up, down


def test_switch_defaults_to_triton_and_names_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(w4a16_cutlass.ENV, raising=False)
    assert not w4a16_cutlass.selected()
    monkeypatch.setenv(w4a16_cutlass.ENV, "CUTLASS")
    assert w4a16_cutlass.selected()
    monkeypatch.setenv(w4a16_cutlass.ENV, "triton")
    assert not w4a16_cutlass.selected()
    monkeypatch.setenv(w4a16_cutlass.ENV, "marlin")
    with pytest.raises(ValueError, match="HOTLOOP_W4A16_KERNEL='marlin': use one of triton, cutlass"):
        w4a16_cutlass.selected()


def test_signed_k_major_is_awq_dequantization() -> None:
    k, n, g = 256, 64, 128
    qweight, qzeros, scales = random_awq(k, n, g, torch.float32, "cpu", seed=3)
    packed, zero = w4a16_cutlass.signed_k_major(qweight, qzeros, scales)
    assert packed.shape == (n, k // 2) and packed.dtype == torch.uint8
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, k).to(torch.int16)
    q = torch.where(nib > 7, nib - 16, nib).float()  # sign-extended int4
    w = q * scales.repeat_interleave(g, 0).t() + zero.repeat_interleave(g, 0).t()
    want = reference.w4a16_dequantize(qweight, qzeros, scales, g).t()
    # ((q - 8) s + (8 - z) s against (q - z) s: float32 rounding only; a wrong nibble is off by >= 1e-3)
    torch.testing.assert_close(w, want, rtol=0, atol=1e-6)


def test_layout_offsets_match_cute() -> None:
    # offsets CuTe gives for LayoutW (tile_to_shape(LayoutAtomQuant, (64, 256, 1))), printed by a host
    # program built against CUTLASS 4.2's headers: (row, col) -> element
    printed = {(0, 0): 0, (0, 1): 4, (0, 2): 8, (0, 8): 2, (0, 9): 6, (0, 16): 1024, (1, 0): 32, (7, 0): 224}
    printed |= {(8, 0): 1, (8, 1): 5, (9, 15): 63, (16, 0): 256, (17, 0): 288, (0, 128): 8192, (15, 15): 255}
    off = w4a16_cutlass.layout_offsets(64, 256)
    for (r, c), want in printed.items():
        assert int(off[r, c]) == want, (r, c)
    assert torch.equal(off.reshape(-1).sort().values, torch.arange(64 * 256))  # a permutation
    with pytest.raises(ValueError, match="multiples of 16"):
        w4a16_cutlass.layout_offsets(24, 256)


def test_reorder_reference_puts_each_nibble_at_its_offset() -> None:
    n, k = 32, 64
    vals = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    packed = vals[:, 0::2] | (vals[:, 1::2] << 4)
    out = w4a16_cutlass.reorder_reference(packed)
    flat = torch.stack([out & 0xF, out >> 4], dim=-1).reshape(-1)
    assert torch.equal(flat[w4a16_cutlass.layout_offsets(n, k)], vals)


def test_gemv_variants_fit_llama_shapes() -> None:
    for k, n in LLAMA3_8B:
        assert w4a16_cutlass.candidates(1, n, k, 128)[0] == w4a16_cutlass.GEMV_BASE
    assert not w4a16_cutlass.gemv_fits(4096, 4096, 64, 1, 4)  # group 128 only
    assert not w4a16_cutlass.gemv_fits(4000, 4096, 128, 1, 4)  # 64-row strips
    assert w4a16_cutlass.candidates(2, 4096, 4096, 128) == (4, 5)


def test_gemv_forms_are_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(w4a16_cutlass.GEMV_SILU_ENV, raising=False)
    monkeypatch.delenv(w4a16_cutlass.GEMV_PDL_ENV, raising=False)
    assert not w4a16_cutlass.silu_fusion()
    assert not w4a16_cutlass.gemv_pdl(torch.device("cpu"))
    monkeypatch.setenv(w4a16_cutlass.GEMV_SILU_ENV, "1")
    assert w4a16_cutlass.silu_fusion()
    assert w4a16_cutlass.gemv_name(2, 4, pdl=True, silu=True) == "w4c_gemv_g2_w4_pdl_silu"
    source = (cuda_jit.SOURCE_DIR / w4a16_cutlass.GEMV_SOURCE).read_text()
    for v in w4a16_cutlass.GEMV_VARIANTS:  # every form the launcher may ask for is defined
        assert f"W4C_GEMV({v[0]}, {v[1]})" in source


def test_tuned_launches_name_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    key = (0, 256, 4096, 4096, 128)
    monkeypatch.setattr(w4a16_cutlass, "_tuned", {key: w4a16_cutlass.GEMV_BASE + 1})
    monkeypatch.setattr(w4a16_cutlass, "tuning_log", {key: [(w4a16_cutlass.GEMV_BASE + 1, 10.0), (0, 12.5)]})
    monkeypatch.setattr(w4a16_cutlass, "_libs", {})
    got = w4a16_cutlass.tuned_launches()
    assert got == [
        {"m_bucket": 256, "n": 4096, "k": 4096, "group": 128, "config": "gemv 2x4",
         "timed_us": {"gemv 2x4": 10.0, "config 0": 12.5}}
    ]  # fmt: skip


def test_operand_checks_name_the_limit() -> None:
    cpu = torch.device("cpu")
    bad = [
        ((torch.float16, 4096, 4096, 128), "bfloat16 model \\(got torch.float16\\)"),
        ((torch.bfloat16, 4096, 4096, 32), "group size that is a multiple of 64 \\(got 32\\)"),
        ((torch.bfloat16, 4096, 4004, 128), "in_features to be a multiple of 32 \\(got 4004\\)"),
        ((torch.bfloat16, 4084, 4096, 128), "out_features to be a multiple of 32 \\(got 4084\\)"),
        ((torch.bfloat16, 4096, 4096, 128), "Hopper GPU"),
    ]
    for (dtype, n, k, g), message in bad:
        with pytest.raises(w4a16_cutlass.CutlassUnavailable, match=message):
            w4a16_cutlass.check_operands(dtype, cpu, n, k, g)


def test_config_ids_outside_both_ranges_are_refused() -> None:
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    wt = w4a16_cutlass.CutlassWeight(torch.zeros(64, 32, dtype=torch.uint8), x, x, 64, 64, 64)
    for cfg in (
        -1,
        len(w4a16_cutlass.TOKEN_TILE),
        w4a16_cutlass.GEMV_BASE + len(w4a16_cutlass.GEMV_VARIANTS),
    ):
        with pytest.raises(ValueError, match=f"config={cfg}: the CUTLASS configurations are 0-8"):
            w4a16_cutlass.gemm(x, wt, config=cfg)


def test_missing_headers_say_what_to_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(w4a16_cutlass.CUTLASS_DIR_ENV, str(tmp_path))
    with pytest.raises(w4a16_cutlass.CutlassUnavailable, match="HOTLOOP_CUTLASS_DIR"):
        w4a16_cutlass.cutlass_dir()


def test_candidates_split_small_and_wide_tiles() -> None:
    assert w4a16_cutlass.num_configs_in_source() == len(w4a16_cutlass.TOKEN_TILE)
    assert w4a16_cutlass.candidates(1) == (4, 5)
    assert w4a16_cutlass.candidates(64) == (0, 1, 2, 3, 4, 5, 6, 7, 8)
    assert w4a16_cutlass.candidates(256) == (0, 1, 2, 3, 6, 7, 8)
    assert w4a16_cutlass.default_config(16) in w4a16_cutlass.candidates(16)
    assert w4a16_cutlass.default_config(300) in w4a16_cutlass.candidates(300)


def test_tuning_buckets_are_half_octaves_above_256() -> None:
    bucket = w4a16_cutlass.m_bucket
    assert [bucket(m) for m in (1, 2, 3, 17, 256, 257, 384, 385, 1040, 16384)] == [
        1, 2, 4, 32, 256, 384, 384, 512, 1536, 16384,
    ]  # fmt: skip
    assert bucket(16385) == bucket(10**6) == w4a16_cutlass.UNBOUNDED
    previous = 0
    for m in range(1, 16385):
        b = bucket(m)
        assert previous <= b and m <= b, m  # monotonic, and a bucket holds its rows
        assert b < 2 * m, m  # up to 256: the next power of two
        if m > 256:
            assert 2 * b < 3 * m, m  # above: half-octaves, under 1.5 M
        previous = b


def test_dequant_joins_the_candidates_from_the_prefill_buckets() -> None:
    both = (w4a16_cutlass.DEQUANT, w4a16_cutlass.DEQUANT_KN)  # the scratch as [N, K] and as [K, N]
    assert not set(both) & set(w4a16_cutlass.candidates(768, 4096, 4096, 128))
    assert w4a16_cutlass.candidates(769, 4096, 4096, 128)[-2:] == both
    assert w4a16_cutlass.candidates(16384, 28672, 4096, 128)[-2:] == both
    # the dequant tiles want multiples of 64
    assert not set(both) & set(w4a16_cutlass.candidates(4096, 4096 + 32, 4096, 128))
    assert w4a16_cutlass.config_label(both[0]) == "dequant + cuBLAS"
    assert w4a16_cutlass.config_label(both[1]) == "dequant [K, N] + cuBLAS"


def test_dequant_candidate_must_agree_with_the_cutlass_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    base = torch.randn(8, 64)
    wrong = {"scale": 1.0}

    def fake_launch(cfg: int, x2: torch.Tensor, wt: object, y: torch.Tensor) -> None:
        y.copy_(base * (wrong["scale"] if cfg == w4a16_cutlass.DEQUANT else 1.0))

    monkeypatch.setattr(w4a16_cutlass, "_launch", fake_launch)
    x = torch.zeros(8, 64, dtype=torch.bfloat16)
    wt = w4a16_cutlass.CutlassWeight(torch.zeros(64, 32, dtype=torch.uint8), x, x, 64, 64, 64)
    w4a16_cutlass._check_against_cutlass(w4a16_cutlass.DEQUANT, x, wt)  # agrees: no error
    wrong["scale"] = 1.1
    with pytest.raises(RuntimeError, match="from the CUTLASS tile's"):
        w4a16_cutlass._check_against_cutlass(w4a16_cutlass.DEQUANT, x, wt)


@pytest.mark.parametrize("transpose", [False, True])
def test_dequant_matmul_in_either_layout_is_x_times_w(
    transpose: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the dequant launch's scratch viewed as [N, K] (x @ W^T) or [K, N] (x @ W): on the CPU through
    # Triton's interpreter, with a CPU scratch standing in for the device's
    pytest.importorskip("triton")
    from hotloop.kernels.w4a16_layout import unpack_int4

    k, n, group = 128, 64, 64
    qweight, qzeros, scales = random_awq(k, n, group, torch.bfloat16, "cpu", seed=5)
    packed, zero = w4a16_cutlass.signed_k_major(qweight, qzeros, scales)
    w = w4a16_cutlass.reorder_reference(packed)
    wt = w4a16_cutlass.CutlassWeight(w, scales.contiguous(), zero.to(torch.bfloat16), n, k, group)
    scratch = torch.full((n * k + 64,), float("nan"), dtype=torch.bfloat16)  # (larger than needed)
    monkeypatch.setattr(w4a16_cutlass, "_ensure_scratch", lambda device, need: scratch)
    x = torch.randn(8, k).bfloat16()
    y = torch.empty(8, n, dtype=torch.bfloat16)
    w4a16_cutlass._dequant_matmul(x, wt, y, transpose=transpose)
    q = unpack_int4(qweight).float() - 8  # [K, N]
    dense = q * scales.float().repeat_interleave(group, 0) + zero.float().repeat_interleave(group, 0)
    want = x.float() @ dense
    assert _rel(y, want) < 1e-2


def _usable() -> str | None:
    if not torch.cuda.is_available():
        return "needs a GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return "needs a Hopper GPU"
    if cuda_jit.find_nvcc() is None:
        return "needs nvcc"
    try:
        w4a16_cutlass.cutlass_dir()
    except w4a16_cutlass.CutlassUnavailable as e:
        return str(e)
    return None


gpu = pytest.mark.gpu


def _require() -> None:
    reason = _usable()
    if reason:
        pytest.skip(reason)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


@gpu
@pytest.mark.parametrize("k,n", LLAMA3_8B)
def test_every_config_matches_float32_dequantize_then_matmul(k: int, n: int) -> None:
    _require()
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda", seed=k + n)
    wt = w4a16_cutlass.convert(qweight, qzeros, scales, 128)
    w4a16_cutlass.config_names(torch.device("cuda"))  # (loads the library: config_label names its tiles)
    for m in (1, 7, 16, 64, 256, 2048):
        x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).bfloat16()
        want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
        for c in w4a16_cutlass.candidates(m):
            got = w4a16_cutlass.gemm(x, wt, config=c)
            assert got.shape == (m, n) and got.dtype == torch.bfloat16
            assert _rel(got, want) < 1e-2, f"{w4a16_cutlass.config_label(c)} M={m} K={k} N={n}"
        tuned = w4a16_cutlass.gemm(x, wt)  # the tuner's choice
        assert _rel(tuned, want) < 1e-2, f"tuned M={m}"


STREAM_K_WIDE = (6, 7, 8)  # the stream-K forms of the 128 x 128 / 256 / 192 tiles


@gpu
@pytest.mark.parametrize("k,n", [(4096, 6144), (14336, 4096)])
def test_stream_k_wide_tiles_are_exact_repeatable_and_capturable(k: int, n: int) -> None:
    """At row counts where the tiles are a little over one wave (q/k/v at 384, down at 1,040) the
    stream-K launches split K across SMs: the result matches float32, is bit-for-bit the same on a
    second launch (the fix-up is ordered), and a captured launch reads new inputs on replay."""
    _require()
    names = w4a16_cutlass.config_names(torch.device("cuda"))
    assert [names[c] for c in STREAM_K_WIDE] == [
        "coop 128x128 stream-K", "coop 128x256 stream-K", "coop 128x192 stream-K",
    ]  # fmt: skip
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda", seed=k + 3 * n)
    wt = w4a16_cutlass.convert(qweight, qzeros, scales, 128)
    for m in (384, 1040):
        x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).bfloat16()
        want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
        for c in STREAM_K_WIDE:
            first = w4a16_cutlass.gemm(x, wt, config=c)
            assert _rel(first, want) < 1e-2, f"{names[c]} M={m} K={k} N={n}"
            assert torch.equal(w4a16_cutlass.gemm(x, wt, config=c), first), (
                f"{names[c]} M={m}: not repeatable"
            )
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = w4a16_cutlass.gemm(x, wt, config=c)
            x2 = torch.randn(m, k, device="cuda").bfloat16()
            x.copy_(x2)
            graph.replay()
            torch.cuda.synchronize()
            want2 = reference.w4a16_matmul(x2.float(), qweight, qzeros, scales.float(), 128)
            assert _rel(y, want2) < 1e-2, f"{names[c]} M={m}: replay"
            x.copy_(
                torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).bfloat16()
            )


@gpu
def test_library_reorder_equals_the_torch_model() -> None:
    _require()
    qweight, qzeros, scales = random_awq(512, 384, 128, torch.bfloat16, "cuda", seed=5)
    wt = w4a16_cutlass.convert(qweight, qzeros, scales, 128)
    packed, _ = w4a16_cutlass.signed_k_major(qweight, qzeros, scales)
    assert torch.equal(wt.w, w4a16_cutlass.reorder_reference(packed))


@gpu
@pytest.mark.parametrize("k,n", LLAMA3_8B)
def test_one_row_gemv_variants_match_float32(k: int, n: int) -> None:
    _require()
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda", seed=k - n)
    wt = w4a16_cutlass.convert(qweight, qzeros, scales, 128)
    gen = torch.Generator("cuda").manual_seed(k)
    x = (torch.randn(1, k, device="cuda", generator=gen) * 3).bfloat16()
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    for i, v in enumerate(w4a16_cutlass.GEMV_VARIANTS):
        if not w4a16_cutlass.gemv_fits(n, k, 128, *v):
            continue
        got = w4a16_cutlass.gemm(x, wt, config=w4a16_cutlass.GEMV_BASE + i)
        assert _rel(got, want) < 1e-2, f"GEMV {v} K={k} N={n}"
        again = w4a16_cutlass.gemm(x, wt, config=w4a16_cutlass.GEMV_BASE + i)
        assert torch.equal(got, again)  # the K split adds in a fixed order


@gpu
@pytest.mark.parametrize("k,n", [(14336, 4096), (4096, 4096)])
def test_gemv_silu_and_pdl_forms_equal_the_plain_launch(
    monkeypatch: pytest.MonkeyPatch, k: int, n: int
) -> None:
    _require()
    from hotloop.kernels.silu_and_mul import silu_and_mul

    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda", seed=k + 2 * n)
    wt = w4a16_cutlass.convert(qweight, qzeros, scales, 128)
    gate_up = (
        torch.randn(1, 2 * k, device="cuda", generator=torch.Generator("cuda").manual_seed(3)) * 2
    ).bfloat16()
    x = silu_and_mul(gate_up)
    for v in w4a16_cutlass.GEMV_VARIANTS:
        if not w4a16_cutlass.gemv_fits(n, k, 128, *v):
            continue
        monkeypatch.setenv(w4a16_cutlass.GEMV_PDL_ENV, "0")
        plain = w4a16_cutlass.gemv(x, wt, v)
        fused = w4a16_cutlass.gemv(gate_up, wt, v, silu=True)
        assert torch.equal(fused, plain), f"silu {v}"
        monkeypatch.setenv(w4a16_cutlass.GEMV_PDL_ENV, "1")
        assert torch.equal(w4a16_cutlass.gemv(x, wt, v), plain), f"pdl {v}"
        assert torch.equal(w4a16_cutlass.gemv(gate_up, wt, v, silu=True), plain), f"pdl silu {v}"
    monkeypatch.setenv(w4a16_cutlass.GEMV_PDL_ENV, "0")
    # gemv_silu_mul follows the one-row choice: a GEMV variant gives the fused launch, a CUTLASS tile None
    monkeypatch.setattr(w4a16_cutlass, "choose", lambda x2, wt: w4a16_cutlass.GEMV_BASE)
    fused = w4a16_cutlass.gemv_silu_mul(gate_up, wt)
    assert fused is not None and torch.equal(fused, w4a16_cutlass.gemv(x, wt, w4a16_cutlass.GEMV_VARIANTS[0]))
    monkeypatch.setattr(w4a16_cutlass, "choose", lambda x2, wt: 5)
    assert w4a16_cutlass.gemv_silu_mul(gate_up, wt) is None
    with pytest.raises(ValueError, match=f"\\[1, {2 * k}\\]"):
        w4a16_cutlass.gemv(x, wt, (1, 2), silu=True)


@gpu
def test_pdl_gemv_reads_the_x_the_kernel_before_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    _require()
    from hotloop.kernels.pdl import pdl
    from hotloop.kernels.silu_and_mul import silu_and_mul

    if not pdl(torch.device("cuda")):
        pytest.skip("PDL is off on this GPU / torch")
    k, n = 14336, 4096
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda", seed=21)
    wt = w4a16_cutlass.convert(qweight, qzeros, scales, 128)
    rows = torch.randn(8, 1, 2 * k, device="cuda").bfloat16()
    for v in [v for v in w4a16_cutlass.GEMV_VARIANTS if w4a16_cutlass.gemv_fits(n, k, 128, *v)]:
        monkeypatch.setenv(w4a16_cutlass.GEMV_PDL_ENV, "0")
        want = [w4a16_cutlass.gemv(silu_and_mul(r), wt, v) for r in rows]
        monkeypatch.setenv(w4a16_cutlass.GEMV_PDL_ENV, "1")
        got = [w4a16_cutlass.gemv(silu_and_mul(r), wt, v) for r in rows]  # x written just before, with PDL
        torch.cuda.synchronize()
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(a, b), f"{v} row {i}"


@gpu
def test_awq_linear_converted_after_loading_matches_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    _require()
    from hotloop.layers.linear import AWQ_PARAM_NAMES, CUTLASS_PARAM_NAMES, AWQLinearMethod, Linear

    k, n = 1024, 768
    tensors = random_awq(k, n, 128, torch.float16, "cuda", seed=7)
    layers = {}
    for kernel in ("triton", "cutlass"):
        monkeypatch.setenv(w4a16_cutlass.ENV, kernel)
        with torch.device("cuda"):
            layer = Linear(k, n, dtype=torch.bfloat16, quant_method=AWQLinearMethod(128))
        for name, t in zip(AWQ_PARAM_NAMES, tensors, strict=True):
            getattr(layer, name).data.copy_(t)
        layer.quant_method.process_weights_after_loading(layer)
        layers[kernel] = layer
    cut = layers["cutlass"]
    assert all(name not in cut._parameters for name in AWQ_PARAM_NAMES)
    assert all(name in cut._parameters for name in CUTLASS_PARAM_NAMES)
    assert sum(p.numel() * p.element_size() for p in cut.parameters()) == n * k // 2 + 2 * 2 * (k // 128) * n
    x = torch.randn(3, 5, k, device="cuda").bfloat16()
    want = reference.w4a16_matmul(x.reshape(-1, k).float(), *tensors[:2], tensors[2].float(), 128)
    got = cut(x)
    assert got.shape == (3, 5, n)
    assert _rel(got.reshape(-1, n), want) < 1e-2
    assert _rel(layers["triton"](x).reshape(-1, n), want) < 1e-2
    gate_up = torch.randn(1, 2 * k, device="cuda").bfloat16()
    monkeypatch.delenv(w4a16_cutlass.GEMV_SILU_ENV, raising=False)
    assert cut.quant_method.apply_silu_mul(cut, gate_up) is None  # opt-in
    monkeypatch.setenv(w4a16_cutlass.GEMV_SILU_ENV, "1")
    from hotloop.kernels.silu_and_mul import silu_and_mul

    monkeypatch.setattr(w4a16_cutlass, "choose", lambda x2, wt: w4a16_cutlass.GEMV_BASE)  # a GEMV at one row
    fused = cut.quant_method.apply_silu_mul(cut, gate_up)
    assert fused is not None and torch.equal(fused, cut(silu_and_mul(gate_up)))


@gpu
def test_graph_replay_reads_new_inputs() -> None:
    _require()
    k, n = 4096, 4096
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda", seed=11)
    wt = w4a16_cutlass.convert(qweight, qzeros, scales, 128)
    cases = (
        (1, w4a16_cutlass.GEMV_BASE), (1, None), (16, None), (256, None),
        (1040, w4a16_cutlass.DEQUANT), (1040, w4a16_cutlass.DEQUANT_KN),
    )  # fmt: skip
    for m, config in cases:
        x = torch.randn(m, k, device="cuda").bfloat16()
        w4a16_cutlass.gemm(x, wt, config=config)  # tuned (and the split counters made) outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = w4a16_cutlass.gemm(x, wt, config=config)
        x.copy_(torch.randn(m, k, device="cuda").bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
        assert _rel(y, want) < 1e-2
