"""The tensor-core W4A16 one-row GEMV on the AutoAWQ layout (``kernels/w4a16_gemv_tc.py``).

CPU: the variants' limits, the tuner's templates, and (where nvcc is installed) that the source
compiles for sm_90a with every kernel in the cubin. GPU: every variant against float32
dequantize-then-matmul (float32 sums throughout, so within about one output rounding), extreme
zero points and codes, split-K counters left at zero, and a CUDA-graph replay.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kernel_checks import random_awq, spiky_x
from test_w4a16_gemm import _rel_max_err

from hotloop.kernels import counters, cuda_jit, reference, w4a16_gemv_tc
from hotloop.kernels.w4a16_layout import pack_int4

pytest.importorskip("triton")

LLAMA3_8B = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N) of qkv, o, gate/up, down


def test_tile_and_fits() -> None:
    assert w4a16_gemv_tc.tile(4, 16, 8) == (256, 512)
    assert w4a16_gemv_tc.tile(2, 32, 4) == (128, 512)
    assert w4a16_gemv_tc.kernel_name(torch.bfloat16, 4, 16, 8) == "w4a16_gemv_tc_bf16_w4_i16_n8"

    def why(
        m: int, n: int, k: int, group: int, dtype: torch.dtype, v: tuple[int, int, int] = (4, 16, 8)
    ) -> str:
        return w4a16_gemv_tc.fits(m, n, k, group, dtype, *v) or ""

    for v in w4a16_gemv_tc.VARIANTS:
        for k, n in LLAMA3_8B:
            assert w4a16_gemv_tc.fits(1, n, k, 128, torch.bfloat16, *v) is None, (v, k, n)
    assert "one row" in why(2, 4096, 4096, 128, torch.bfloat16)
    assert "float16 or bfloat16" in why(1, 4096, 4096, 128, torch.float32)
    assert "N=4000" in why(1, 4000, 4096, 128, torch.bfloat16)
    assert "K=1280" in why(1, 4096, 1280, 128, torch.bfloat16)
    assert "group_size=32" in why(1, 4096, 4096, 32, torch.bfloat16)  # a warp's 64 rows span two groups
    assert "group_size=192" in why(1, 4096, 4096 * 3, 192, torch.bfloat16)  # 3 warps a group
    assert "no variant" in why(1, 4096, 4096, 128, torch.bfloat16, (3, 16, 8))
    assert w4a16_gemv_tc.fits(1, 4096, 4096, 64, torch.bfloat16, 4, 16, 8) is None
    assert w4a16_gemv_tc.fits(1, 4096, 4096, 512, torch.bfloat16, 4, 16, 4) is None  # a block inside a group


def test_gemv_refuses_what_does_not_fit() -> None:
    qweight, qzeros, scales = random_awq(1280, 256, 128, torch.bfloat16, "cpu")
    x = torch.randn(1, 1280, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="K=1280"):
        w4a16_gemv_tc.gemv(x, qweight, qzeros, scales, 128, 4, 16, 8)


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_source_compiles_for_hopper(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path))
    cubin = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / w4a16_gemv_tc.SOURCE, "sm_90a")
    assert cubin[:4] == b"\x7fELF"
    for dtype in (torch.bfloat16, torch.float16):
        for v in w4a16_gemv_tc.VARIANTS:
            assert w4a16_gemv_tc.kernel_name(dtype, *v).encode() in cubin


def _require_kernels() -> None:
    if not w4a16_gemv_tc.available(torch.device("cuda")):
        pytest.skip("the CUDA kernels cannot be built here (no nvcc, or not a Hopper GPU)")


# float32 sums throughout: the output is about one rounding of float32 dequantize-then-matmul. The
# bound, relative to max |y|: a 16-bit rounding of the largest output plus the float32 sums' error
# (the sums carry 128 x or 1024 x per row before the group's correction takes it off)
_TOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", LLAMA3_8B + [(1024, 256), (2048, 576 * 4)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_every_variant(shape: tuple[int, int], dtype: torch.dtype) -> None:
    _require_kernels()
    k, n = shape
    qweight, qzeros, scales = random_awq(k, n, 128, dtype, "cuda", seed=k + n)
    x = spiky_x(k, dtype, n)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    ran = 0
    for v in w4a16_gemv_tc.VARIANTS:
        if w4a16_gemv_tc.fits(1, n, k, 128, dtype, *v) is not None:
            continue
        got = w4a16_gemv_tc.gemv(x, qweight, qzeros, scales, 128, *v)
        torch.cuda.synchronize()
        assert got.dtype == dtype and got.shape == (1, n)
        err = _rel_max_err(got, want)
        print(f"{shape} {dtype} {v}: rel max err {err:.2e}")
        assert err < _TOL[dtype], (v, err)
        assert int(counters.buffer(x.device, "w4a16_gemv_tc").abs().sum()) == 0
        ran += 1
    assert ran >= 3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("group", [64, 128, 256, 512])
def test_gpu_extreme_codes_and_groups(dtype: torch.dtype, group: int) -> None:
    """Codes and zero points at 0 and 15 (the nibbles' ends, every column of a word), groups of 64 to
    512 rows (a block across several groups, or inside one)."""
    _require_kernels()
    k, n = 2048, 512
    gen = torch.Generator().manual_seed(group)
    codes = torch.randint(0, 2, (k, n), generator=gen) * 15
    zeros = torch.randint(0, 2, (k // group, n), generator=gen) * 15
    qweight = pack_int4(codes).cuda()
    qzeros = pack_int4(zeros).cuda()
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 1e-3).to(dtype).cuda()
    x = torch.randn(1, k, generator=gen).to(dtype).cuda()
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), group)
    ran = 0
    for v in w4a16_gemv_tc.VARIANTS:
        if w4a16_gemv_tc.fits(1, n, k, group, dtype, *v) is not None:
            continue
        got = w4a16_gemv_tc.gemv(x, qweight, qzeros, scales, group, *v)
        assert _rel_max_err(got, want) < _TOL[dtype], (v, _rel_max_err(got, want))
        ran += 1
    assert ran >= 2


@pytest.mark.gpu
def test_gpu_graph_replay_follows_new_inputs() -> None:
    _require_kernels()
    k, n, dtype = 4096, 4096, torch.bfloat16
    qweight, qzeros, scales = random_awq(k, n, 128, dtype, "cuda", seed=3)
    x = torch.randn(1, k, device="cuda").to(dtype)
    out = torch.empty(1, n, device="cuda", dtype=dtype)
    w4a16_gemv_tc.gemv(x, qweight, qzeros, scales, 128, 4, 16, 8, out=out)  # compile, counters
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w4a16_gemv_tc.gemv(x, qweight, qzeros, scales, 128, 4, 16, 8, out=out)
    for seed in range(3):
        x.copy_(
            torch.randn(1, k, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).to(dtype)
        )
        graph.replay()
        torch.cuda.synchronize()
        want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
        assert _rel_max_err(out, want) < _TOL[dtype]


def test_tuner_templates_fit_or_refuse(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from hotloop.kernels import w4a16_gemm as g

    dev = torch.device("cpu")
    for template, waves in g._cuda_tc_templates():
        variant = (template.block_n // 64, template.block_k, template.num_warps)
        cols, rows = w4a16_gemv_tc.tile(*variant)
        cfg = g.fit_config(template, 1, 28672, 4096, 128, dev, waves)
        assert cfg.kind == "cuda_tc" and cfg.split_k == 4096 // rows and cfg.block_n == cols
        assert variant in w4a16_gemv_tc.VARIANTS
        with pytest.raises(ValueError, match="does not tile"):
            g.fit_config(template, 1, 28672 + cols // 2, 4096, 128, dev, waves)
    monkeypatch.setattr(g, "_cuda_buildable", lambda: True)
    monkeypatch.delenv(g.CUDA_TC_ENV, raising=False)
    assert not any(t.kind == "cuda_tc" for t, _ in g.candidates(1))  # opt-in
    monkeypatch.setenv(g.CUDA_TC_ENV, "1")
    assert sum(t.kind == "cuda_tc" for t, _ in g.candidates(1)) == len(w4a16_gemv_tc.VARIANTS)
    assert not any(t.kind == "cuda_tc" for t, _ in g.candidates(2))
    monkeypatch.setenv(g.CUDA_TC_ENV, "0")
    assert not any(t.kind == "cuda_tc" for t, _ in g.candidates(1))
    monkeypatch.setenv(g.CUDA_TC_ENV, "yes")  # a wrong value: said once, read as off
    said: list[str] = []
    monkeypatch.setattr(g, "_warned_tc_values", set())
    monkeypatch.setattr(g.logger, "warning", lambda msg, *args: said.append(msg % args))
    assert not any(t.kind == "cuda_tc" for t, _ in g.candidates(1))
    assert not any(t.kind == "cuda_tc" for t, _ in g.candidates(1))
    assert said == ["HOTLOOP_W4A16_TC='yes': use 0 or 1; taking 0"]


def test_tuner_launch_passes_the_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """``w4a16_gemm``'s launch of a ``cuda_tc`` config calls the kernel with its variant and nothing
    else (a stray positional argument once landed in ``out``: the tuner skipped the failing
    candidate silently, so the kernel was never chosen)."""
    from hotloop.kernels import w4a16_gemm as g

    calls: list[tuple] = []

    def fake_gemv(x2: torch.Tensor, qw: torch.Tensor, qz: torch.Tensor, sc: torch.Tensor, group: int,
                  *variant: int, out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        calls.append(variant)
        assert out is None
        return torch.zeros(1, qw.shape[1] * 8, dtype=x2.dtype)

    monkeypatch.setattr(w4a16_gemv_tc, "gemv", fake_gemv)
    qweight, qzeros, scales = random_awq(4096, 256, 128, torch.bfloat16, "cpu")
    x = torch.randn(1, 4096, dtype=torch.bfloat16)
    for template, waves in g._cuda_tc_templates():
        cfg = g.fit_config(template, 1, 256, 4096, 128, torch.device("cpu"), waves)
        g.w4a16_gemm(x, qweight, qzeros, scales, 128, config=cfg)
    assert calls == list(w4a16_gemv_tc.VARIANTS)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_through_the_tuner_launch(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``cuda_tc`` template through ``w4a16_gemm(config=...)`` (no silent fallback: a failing
    launch would log and run the Triton GEMV), and the tuner's ``auto`` choice with only these and
    the Triton one-row launches, both against float32 dequantize-then-matmul."""
    _require_kernels()
    from hotloop.kernels import w4a16_gemm as g

    k, n = 4096, 6144
    qweight, qzeros, scales = random_awq(k, n, 128, dtype, "cuda", seed=7)
    x = spiky_x(k, dtype, 7)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    fallbacks: list[Exception] = []
    monkeypatch.setattr(g, "_warn_cuda_fallback", fallbacks.append)
    for template, waves in g._cuda_tc_templates():
        cfg = g.fit_config(template, 1, n, k, 128, x.device, waves)
        got = g.w4a16_gemm(x, qweight, qzeros, scales, 128, config=cfg)
        assert _rel_max_err(got, want) < _TOL[dtype], cfg
    assert not fallbacks, fallbacks
    monkeypatch.setenv(g.HALF2_ENV, "0")  # float32 sums only: the CUDA-core GEMV is out, this one in
    monkeypatch.setenv(g.CUDA_TC_ENV, "1")
    monkeypatch.setattr(g, "_plans", {})
    monkeypatch.setattr(g, "_tuned", {})
    monkeypatch.setattr(g, "_from_disk", lambda tkey: None)
    monkeypatch.setattr(g, "_to_disk", lambda tkey, cfg: None)
    got = g.w4a16_gemm(x, qweight, qzeros, scales, 128)
    assert _rel_max_err(got, want) < 2e-2
    timed = g.tuning_log[(torch.cuda.current_device(), dtype, 1, n, k, 128)]
    assert sum(c.kind == "cuda_tc" for c, _ in timed) == len(w4a16_gemv_tc.VARIANTS)  # every one ran
    print("tuner, float32 sums only:", sorted((round(t, 2), c.kind) for c, t in timed)[:4])
