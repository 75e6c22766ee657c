"""The CUDA C W4A16 one-row GEMV (``kernels/w4a16_cuda.py``) and its build (``kernels/cuda_jit.py``).

CPU: the variants' limits, the tuner's templates, nvcc discovery, and (where nvcc is installed) that
the source compiles for sm_90a and the cubin is cached. GPU: every variant against float32
dequantize-then-matmul and against the torch model of its 16-bit arithmetic (the Triton ``half2``
kernel's), the fp16 headroom, split-K counters left at zero, and a CUDA-graph replay.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kernel_checks import random_awq, spiky_x
from test_w4a16_gemm import _assert_rounds_like, _half2_emulated, _rel_max_err

from hotloop.kernels import counters, cuda_jit, reference, w4a16_cuda
from hotloop.kernels.w4a16_layout import pack_int4
from hotloop.utils import env as env_mod

pytest.importorskip("triton")

LLAMA3_8B = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N) of qkv, o, gate/up, down


def test_tile_and_fits() -> None:
    assert w4a16_cuda.tile(4, 16) == (128, 1024)
    assert w4a16_cuda.tile(8, 8) == (256, 256)
    assert w4a16_cuda.tile(4, 16, 128) == (128, 512)
    assert w4a16_cuda.kernel_name(torch.bfloat16, 4, 16) == "w4a16_gemv_bf16_nl4_r16"
    assert w4a16_cuda.kernel_name(torch.float16, 4, 32, 128, 8) == "w4a16_gemv_f16_nl4_r32_t128_e8"
    assert (
        w4a16_cuda.kernel_name(torch.float16, 4, 32, 128, 8, coherent=True)
        == "w4a16_gemv_f16_nl4_r32_t128_e8ld"
    )
    assert (
        w4a16_cuda.kernel_name(torch.bfloat16, 4, 32, 256, 8, coherent=True, silu=True)
        == "w4a16_gemv_bf16_nl4_r32_e8ld_silu"
    )

    def why(m: int, n: int, k: int, group: int, dtype: torch.dtype, nl: int = 4, r: int = 16) -> str:
        return w4a16_cuda.fits(m, n, k, group, dtype, nl, r) or ""

    assert w4a16_cuda.fits(1, 4096, 4096, 128, torch.bfloat16, 4, 16) is None
    assert "one row" in why(2, 4096, 4096, 128, torch.bfloat16)
    assert "float16 or bfloat16" in why(1, 4096, 4096, 128, torch.float32)
    assert "N=4000" in why(1, 4000, 4096, 128, torch.bfloat16)
    assert "K=1536" in why(1, 4096, 1536, 128, torch.bfloat16)
    assert "group_size=8" in why(1, 4096, 4096, 8, torch.bfloat16)
    assert "no variant" in why(1, 4096, 4096, 128, torch.bfloat16, nl=3)
    assert w4a16_cuda.fits(1, 4096, 512, 128, torch.bfloat16, 4, 16, 128) is None
    assert "K=512" in (w4a16_cuda.fits(1, 4096, 512, 128, torch.bfloat16, 4, 16) or "")
    assert "no variant" in (w4a16_cuda.fits(1, 4096, 4096, 128, torch.bfloat16, 4, 8, 128) or "")


def test_gemv_refuses_what_does_not_fit() -> None:
    qweight, qzeros, scales = random_awq(1536, 256, 128, torch.bfloat16, "cpu")
    x = torch.randn(1, 1536, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="K=1536"):
        w4a16_cuda.gemv(x, qweight, qzeros, scales, 128, 4, 16)


def test_tuner_templates_fit_or_refuse() -> None:
    from hotloop.kernels import w4a16_gemm as g

    dev = torch.device("cpu")
    for template, waves in g._cuda_templates():
        cols, rows = w4a16_cuda.tile(template.block_n // 32, template.block_k, template.num_warps * 32)
        cfg = g.fit_config(template, 1, 28672, 4096, 128, dev, waves)
        assert cfg.kind == "cuda" and cfg.split_k == 4096 // rows and cfg.block_n == cols
        assert (cfg.block_n // 32, cfg.block_k, cfg.num_warps * 32) in w4a16_cuda.VARIANTS
        with pytest.raises(ValueError, match="does not tile"):
            g.fit_config(template, 1, 28672, 4096 + rows // 2, 128, dev, waves)


def test_candidates_include_cuda_only_where_buildable(monkeypatch: pytest.MonkeyPatch) -> None:
    from hotloop.kernels import w4a16_gemm as g

    monkeypatch.setattr(g, "_cuda_buildable", lambda: False)
    assert not any(t.kind == "cuda" for t, _ in g.candidates(1))
    monkeypatch.setattr(g, "_cuda_buildable", lambda: True)
    assert sum(t.kind == "cuda" for t, _ in g.candidates(1)) == len(w4a16_cuda.VARIANTS)
    assert not any(t.kind == "cuda" for t, _ in g.candidates(2))
    monkeypatch.setenv(g.HALF2_ENV, "0")  # 16-bit partial sums refused: the CUDA kernel has them too
    assert not any(t.kind == "cuda" for t, _ in g.candidates(1))


def test_find_nvcc_and_switch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 0.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("HOTLOOP_NVCC", str(fake))
    assert cuda_jit.find_nvcc() == str(fake)
    monkeypatch.setenv(cuda_jit.ENV, "0")
    assert not cuda_jit.enabled()
    assert cuda_jit.load(w4a16_cuda.SOURCE, torch.device("cuda", 0), ["x"]) is None
    assert not w4a16_cuda.available(torch.device("cuda", 0))
    monkeypatch.setenv(cuda_jit.ENV, "1")
    assert cuda_jit.load(w4a16_cuda.SOURCE, torch.device("cpu"), ["x"]) is None


def test_pdl_attribute_layout() -> None:
    """The driver's CUlaunchAttribute: a 4-byte id, 4 bytes of padding, a 64-byte value whose first
    int is 1; built in the struct's own memory (an earlier version wrote through a bytes copy of
    the field, which corrupted CPython's shared empty bytes object)."""
    import ctypes

    attr = cuda_jit.pdl_attribute()
    raw = bytes(attr)
    assert ctypes.sizeof(attr) == 72 and len(raw) == 72
    assert int.from_bytes(raw[0:4], "little") == 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert int.from_bytes(raw[8:12], "little") == 1 and raw[12:] == bytes(60)


def test_compile_reports_nvcc_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "nvcc"
    fake.write_text(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo v0; exit 0; fi\necho 'bad source' >&2\nexit 2\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path / "cache"))
    with pytest.raises(cuda_jit.CudaError, match="bad source"):
        cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / w4a16_cuda.SOURCE, "sm_90a", nvcc=str(fake))


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_source_compiles_for_hopper_and_is_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path))
    source = cuda_jit.SOURCE_DIR / w4a16_cuda.SOURCE
    cubin = cuda_jit.compile_cubin(source, "sm_90a")
    assert cubin[:4] == b"\x7fELF"
    # whole symbol names (NUL-bounded in the ELF string table): a kernel's name is a prefix of its
    # early forms' names, so a plain substring search would pass with the kernel missing
    names = {part.decode() for part in cubin.split(b"\0") if part.startswith(b"w4a16_gemv_")}
    for dtype in (torch.bfloat16, torch.float16):
        for v in w4a16_cuda.VARIANTS:
            for early_rows in (0, w4a16_cuda.EARLY_ROWS):
                assert w4a16_cuda.kernel_name(dtype, *v, early_rows=early_rows) in names
            assert w4a16_cuda.kernel_name(dtype, *v, early_rows=8, coherent=True) in names
    assert set(w4a16_cuda._names()) <= names  # every kernel the launcher may load
    cached = list((tmp_path / "cuda").glob("*.cubin"))
    assert len(cached) == 1
    monkeypatch.setenv("HOTLOOP_NVCC", "/nonexistent/nvcc")
    assert cuda_jit.compile_cubin(source, "sm_90a", nvcc=cuda_jit.find_nvcc() or "nvcc") == cubin


def _require_cuda_kernels() -> None:
    if not w4a16_cuda.available(torch.device("cuda")):
        pytest.skip("the CUDA kernels cannot be built here (no nvcc)")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", LLAMA3_8B + [(1024, 256)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_every_variant(
    shape: tuple[int, int], dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every variant, with and without its early weight loads, against float32
    dequantize-then-matmul (the half2 GEMV's bounds: fp16 2e-3, bf16 1e-2 of max |y|) and against
    the torch model of the 16-bit arithmetic (one output rounding apart); the split counters are all
    zero again after each launch."""
    _require_cuda_kernels()
    k, n = shape
    qweight, qzeros, scales = random_awq(k, n, 128, dtype, "cuda", seed=k + n)
    x = spiky_x(k, dtype, n)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    emulated = _half2_emulated(x, qweight, qzeros, scales, 128, 8)
    tol = 2e-3 if dtype == torch.float16 else 1e-2
    ulp = 2.0**-11 if dtype == torch.float16 else 2.0**-8
    ran = 0
    for v in w4a16_cuda.VARIANTS:
        if w4a16_cuda.fits(1, n, k, 128, dtype, *v) is not None:
            continue
        for early in w4a16_cuda.EARLY_VALUES:
            monkeypatch.setenv(w4a16_cuda.EARLY_ENV, early)
            got = w4a16_cuda.gemv(x, qweight, qzeros, scales, 128, *v)
            torch.cuda.synchronize()
            assert got.dtype == dtype and got.shape == (1, n)
            assert _rel_max_err(got, want) < tol, (v, early, _rel_max_err(got, want))
            _assert_rounds_like(got, emulated, ulp)
            assert int(counters.buffer(x.device, "w4a16_cuda").abs().sum()) == 0
            ran += 1
    fit = sum(w4a16_cuda.fits(1, n, k, 128, dtype, *v) is None for v in w4a16_cuda.VARIANTS)
    assert ran == len(w4a16_cuda.EARLY_VALUES) * fit and fit >= (5 if k >= 4096 else 3)


def _silu_and_mul_like_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """``kernels/silu_and_mul.py``'s roundings in torch: the SiLU rounded to 16 bits, then the product."""
    k = gate_up.shape[1] // 2
    g, u = gate_up[:, :k].float(), gate_up[:, k:].float()
    act = (g / (1.0 + torch.exp(-g))).to(gate_up.dtype)
    return (act.float() * u).to(gate_up.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(14336, 4096), (1024, 256)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_silu_mul_gemv_equals_the_two_launches(shape: tuple[int, int], dtype: torch.dtype) -> None:
    """``gemv_silu_mul`` (the SiLU-and-mul folded into the down projection's loads of x), every
    variant: within bf16 / fp16 tolerance of float32 dequantize-then-matmul of the SiLU-and-mul, and
    equal to the separate ``silu_and_mul`` + ``gemv`` launches (the same roundings, as Triton emits
    them: ex2.approx, div.full)."""
    _require_cuda_kernels()
    from hotloop.kernels.silu_and_mul import silu_and_mul

    k, n = shape
    qweight, qzeros, scales = random_awq(k, n, 128, dtype, "cuda", seed=k + 3 * n)
    gen = torch.Generator().manual_seed(k)
    gate_up = (torch.randn(1, 2 * k, generator=gen) * 3).to(dtype).cuda()
    act = silu_and_mul(gate_up)
    # the roundings the kernel copies (torch's exp may differ from Triton's in the last bit)
    assert _rel_max_err(act, _silu_and_mul_like_triton(gate_up).float()) < 1e-2
    want = reference.w4a16_matmul(act.float(), qweight, qzeros, scales.float(), 128)
    tol = 2e-3 if dtype == torch.float16 else 1e-2
    ran = 0
    for v in w4a16_cuda.VARIANTS:
        if w4a16_cuda.fits(1, n, k, 128, dtype, *v) is not None:
            continue
        got = w4a16_cuda.gemv_silu_mul(gate_up, qweight, qzeros, scales, 128, *v)
        two = w4a16_cuda.gemv(act, qweight, qzeros, scales, 128, *v)
        torch.cuda.synchronize()
        assert got.dtype == dtype and got.shape == (1, n)
        assert _rel_max_err(got, want) < tol, (v, _rel_max_err(got, want))
        # the kernel rounds as silu_and_mul does (ex2.approx, div.full; the SiLU, then the product, to
        # 16 bits), so both feed the GEMV the same x and give the same output
        assert torch.equal(got, two), (v, _rel_max_err(got, two.float()))
        assert int(counters.buffer(gate_up.device, "w4a16_cuda").abs().sum()) == 0
        ran += 1
    assert ran >= 3


def test_silu_mul_gemv_refuses_wrong_operands() -> None:
    """The fused launch's operand checks, which run before any GPU work: the row must be [1, 2K]."""
    qweight, qzeros, scales = random_awq(256, 128, 128, torch.bfloat16, "cpu", seed=1)
    for bad in (torch.zeros(1, 256, dtype=torch.bfloat16), torch.zeros(2, 512, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match=r"gate_up must be \[1, 512\]"):
            w4a16_cuda.gemv_silu_mul(bad, qweight, qzeros, scales, 128, 4, 16)
    strided = torch.zeros(1, 1024, dtype=torch.bfloat16)[:, ::2]
    with pytest.raises(ValueError, match="gate_up must be contiguous"):
        w4a16_cuda.gemv_silu_mul(strided, qweight, qzeros, scales, 128, 4, 16)


def test_silu_fusion_is_on_unless_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HOTLOOP_W4A16_FUSED_SILU`` (on unless 0); the engine-level helper declines on the CPU."""
    from hotloop.kernels.w4a16_gemm import w4a16_silu_mul_gemm

    monkeypatch.delenv(w4a16_cuda.SILU_ENV, raising=False)
    assert w4a16_cuda.silu_fusion()
    monkeypatch.setenv(w4a16_cuda.SILU_ENV, "0")
    assert not w4a16_cuda.silu_fusion()
    monkeypatch.setenv(w4a16_cuda.SILU_ENV, "yes")  # a wrong value: said once, read as on
    said: list[str] = []
    monkeypatch.setattr(env_mod, "_warned", set())
    monkeypatch.setattr(w4a16_cuda.logger, "warning", lambda msg, *args: said.append(msg % args))
    assert w4a16_cuda.silu_fusion() and w4a16_cuda.silu_fusion()
    assert said == ["HOTLOOP_W4A16_FUSED_SILU='yes': use 0 or 1; taking 1"]
    monkeypatch.setenv(w4a16_cuda.SILU_ENV, "1")
    assert w4a16_cuda.silu_fusion()
    qweight, qzeros, scales = random_awq(256, 128, 128, torch.bfloat16, "cpu", seed=1)
    assert (
        w4a16_silu_mul_gemm(torch.zeros(1, 512, dtype=torch.bfloat16), qweight, qzeros, scales, 128) is None
    )


@pytest.mark.gpu
def test_gpu_fp16_headroom() -> None:
    """Eight consecutive activations of 4000 against q - z = 15: an fp16 partial sum of eight rows
    would reach 480,000 (past 65,504) without the kernel's 1/16."""
    _require_cuda_kernels()
    k, n, group = 2048, 64, 32
    qweight = pack_int4(torch.full((k, n), 15, dtype=torch.int64)).cuda()
    qzeros = pack_int4(torch.zeros(k // group, n, dtype=torch.int64)).cuda()
    scales = torch.full((k // group, n), 1e-3, dtype=torch.float16, device="cuda")
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(1)).half()
    x[0, 32:40] = 4000.0
    x = x.cuda()
    got = w4a16_cuda.gemv(x, qweight, qzeros, scales, group, 2, 16)
    assert torch.isfinite(got).all()
    assert _rel_max_err(got, reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), group)) < 2e-3


@pytest.mark.gpu
def test_gpu_graph_replay_and_tuner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A captured launch replays to the eager result with new activations; the tuner times the
    variants at M = 1 (they appear in its log) and its choice is correct."""
    _require_cuda_kernels()
    from hotloop.kernels import w4a16_gemm as g

    k, n = 4096, 6144
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda", seed=3)
    x = spiky_x(k, torch.bfloat16, 3)
    out = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    w4a16_cuda.gemv(x, qweight, qzeros, scales, 128, 4, 16, out=out)  # the counters exist before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w4a16_cuda.gemv(x, qweight, qzeros, scales, 128, 4, 16, out=out)
    x.copy_(spiky_x(k, torch.bfloat16, 4))
    graph.replay()
    torch.cuda.synchronize()
    eager = w4a16_cuda.gemv(x, qweight, qzeros, scales, 128, 4, 16)
    assert torch.equal(out, eager)

    monkeypatch.delenv(g.TUNE_ENV, raising=False)
    monkeypatch.setattr(g, "_from_disk", lambda tkey: None)  # time here, whatever another test stored
    monkeypatch.setattr(g, "_to_disk", lambda tkey, cfg: None)
    monkeypatch.setattr(g, "_tuned", {})
    monkeypatch.setattr(g, "_plans", {})
    got = g.w4a16_gemm(x, qweight, qzeros, scales, 128)
    key = next(kk for kk in g.tuning_log if kk[2] == 1 and kk[3] == n and kk[4] == k)
    assert any(cfg.kind == "cuda" for cfg, _ in g.tuning_log[key])
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    assert _rel_max_err(got, want) < 1e-2


def test_early_load_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HOTLOOP_W4A16_EARLY``: on by default with the loads that really start before the wait
    (``ld``: 8 rows), ``1`` for the ``ld.global.nc`` form (issued after it), ``all`` for every row of
    the thread's, ``0`` for none."""
    monkeypatch.delenv(w4a16_cuda.EARLY_ENV, raising=False)
    assert w4a16_cuda.early() and w4a16_cuda.early_coherent()
    assert w4a16_cuda.early_rows(32) == w4a16_cuda.EARLY_ROWS == 8
    monkeypatch.setenv(w4a16_cuda.EARLY_ENV, "all")
    assert w4a16_cuda.early() and w4a16_cuda.early_coherent()
    assert w4a16_cuda.early_rows(16) == 16 and w4a16_cuda.early_rows(8) == 8
    assert w4a16_cuda.early_rows(32) == w4a16_cuda.EARLY_ROWS  # 32 rows held across the wait: 255 registers
    monkeypatch.setenv(w4a16_cuda.EARLY_ENV, "1")
    assert w4a16_cuda.early() and not w4a16_cuda.early_coherent()
    monkeypatch.setenv(w4a16_cuda.EARLY_ENV, "0")
    assert not w4a16_cuda.early() and not w4a16_cuda.early_coherent()
    assert w4a16_cuda.early_rows(32) == 0
    monkeypatch.setenv(w4a16_cuda.EARLY_ENV, "LD")  # a wrong value: said once, read as the default
    said: list[str] = []
    monkeypatch.setattr(w4a16_cuda, "_warned_values", set())
    monkeypatch.setattr(w4a16_cuda.logger, "warning", lambda msg, *args: said.append(msg % args))
    assert w4a16_cuda.early() and w4a16_cuda.early_coherent()
    assert said == ["HOTLOOP_W4A16_EARLY='LD': use one of 0, 1, ld, all; taking ld"]


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_loads_meant_to_precede_the_wait_are_not_nc(tmp_path: Path) -> None:
    """ptxas (CUDA 13.0) moves ``griddepcontrol.wait`` above every ``ld.global.nc`` in front of it
    (seen in the SASS: the "early" loads then start after the wait), but leaves plain ``ld.global``
    where it is. The kernels whose loads must start before the wait (the CUDA-core GEMV's ``_e<E>ld``,
    every tensor-core GEMV) therefore issue none through ``.nc`` there; an ``_e<E>ld`` kernel of R rows
    issues exactly E weight-row loads before the wait and R - E after it."""
    import re
    import subprocess

    for source in (w4a16_cuda.SOURCE, "w4a16_gemv_tc.cu"):
        ptx_path = tmp_path / (source + ".ptx")
        subprocess.run(
            [str(cuda_jit.find_nvcc()), "-ptx", "-arch=sm_90a", "-O3", "-std=c++17", "-o", str(ptx_path),
             str(cuda_jit.SOURCE_DIR / source)],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        ptx = ptx_path.read_text()
        bodies = re.findall(r"\.entry (\w+)\((.*?)\n}\n", ptx, flags=re.S)
        checked = 0
        for name, body in bodies:
            if not (re.search(r"_e\d+ld(_silu)?$", name) or name.startswith("w4a16_gemv_tc_")):
                continue
            before, after = body.split("griddepcontrol.wait", 1)
            assert "ld.global" in before, name  # the early loads are there
            assert "ld.global.nc" not in before, name
            m = re.search(r"_r(\d+)(?:_t\d+)?_e(\d+)ld(?:_silu)?$", name)
            if m:  # the weight rows: 16-byte loads past L1, early or streamed
                rows, early = int(m.group(1)), int(m.group(2))
                assert before.count("ld.global.L1::no_allocate.v4") == early, name
                assert after.count("ld.global.nc.L1::no_allocate.v4") == rows - early, name
            checked += 1
        want = (
            len([n for n in w4a16_cuda._names() if n.endswith(("ld", "ld_silu"))])
            if source == w4a16_cuda.SOURCE
            else 10
        )
        assert checked >= want, (source, checked, want)


def test_every_early_form_launches_a_compiled_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """For every ``HOTLOOP_W4A16_EARLY`` value, variant and dtype, the kernel ``gemv`` would launch is
    one of the names it loads (``_names``); ``all`` takes ``_e8ld`` at 8 rows, ``_e16ld`` at 16 and the
    default 8 rows at 32."""
    names = set(w4a16_cuda._names())
    for value in w4a16_cuda.EARLY_VALUES:
        monkeypatch.setenv(w4a16_cuda.EARLY_ENV, value)
        for dtype in (torch.bfloat16, torch.float16):
            for nl, r, t in w4a16_cuda.VARIANTS:
                name = w4a16_cuda.kernel_name(
                    dtype, nl, r, t, w4a16_cuda.early_rows(r), w4a16_cuda.early_coherent()
                )
                assert name in names, (value, name)
                if value == "all":
                    assert name.endswith({8: "_e8ld", 16: "_e16ld", 32: "_e8ld"}[r]), name
