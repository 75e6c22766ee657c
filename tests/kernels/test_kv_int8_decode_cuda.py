"""The CUDA C int8-KV decode attention (``kernels/kv_int8_decode_cuda.py``) against the torch reference.

``paged_decode_attention`` sends an int8 cache at head dim 128 here; the reference is
``reference.paged_attention`` in float32 over the same cache dequantized, with the float kernels'
tolerances (the codes, scales and zeros are exact). GPU: GQA groups 1 to 8, block sizes 16 to 128,
split counts that do and do not divide the context, tile tails, padding rows, a cache that is every
other block of a larger pool, bf16 queries beyond fp16's range, CUDA-graph replay and the piecewise
graphs' launch replay. CPU: when the kernel applies, and that its source compiles for sm_90a.
"""

from __future__ import annotations

import random

import pytest
import torch
from kernel_checks import TOL, rel_err
from launch_spies import spy_int8_decode_launches
from test_kv_quant_kernels import _quant_pool

from hotloop.kernels import cuda_jit, kv_int8_decode_cuda, kv_quant, launch_replay, reference
from hotloop.kernels.paged_decode_attention import paged_decode_attention


def _why(q: torch.Tensor, quant: int = 8, group: int = 4, window: int = 0, fused: bool = False) -> str | None:
    cache = torch.zeros(4, 16, 2, 132, dtype=torch.uint8)
    return kv_int8_decode_cuda.why_not(q, cache, cache, quant, group, window, fused)


def test_why_not_names_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    q = torch.zeros(2, 8, 128, dtype=torch.bfloat16)
    assert "int4" in str(_why(q, quant=4))
    assert "float32" in str(_why(q.float()))
    assert "head_dim 64" in str(_why(torch.zeros(2, 8, 64, dtype=torch.bfloat16)))
    assert "group of 16" in str(_why(q, group=16))
    assert "sliding window" in str(_why(q, window=128))
    assert "merge fused" in str(_why(q, fused=True))
    assert "not on a GPU" in str(_why(q))
    monkeypatch.setenv(kv_int8_decode_cuda.ENV, "0")
    assert kv_int8_decode_cuda.ENV in str(_why(q))


def test_why_not_refuses_unaligned_blocks() -> None:
    q = torch.zeros(2, 8, 128, dtype=torch.float16)
    pool = torch.zeros(4 * 16 * 1 * 132 + 4, dtype=torch.uint8)
    shifted = pool[4:].view(4, 16, 1, 132)  # base 4 bytes past an aligned one
    assert "16-byte aligned" in str(kv_int8_decode_cuda.why_not(q, shifted, shifted, 8, 8, 0, False))


def test_machine_checks_are_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(kv_int8_decode_cuda, "_machine", {})
    monkeypatch.setattr(cuda_jit, "find_nvcc", lambda: calls.append(1) or "/usr/bin/nvcc")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (8, 0))
    assert "older than Hopper" in str(kv_int8_decode_cuda._machine_why_not(0))
    assert "older than Hopper" in str(kv_int8_decode_cuda._machine_why_not(0))
    assert calls == [1]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    assert kv_int8_decode_cuda._machine_why_not(1) is None
    monkeypatch.setattr(cuda_jit, "find_nvcc", lambda: None)
    assert kv_int8_decode_cuda._machine_why_not(2) == "no nvcc"


def test_why_not_refuses_other_block_sizes() -> None:
    q = torch.zeros(2, 8, 128, dtype=torch.float16)
    cache = torch.zeros(4, 48, 1, 132, dtype=torch.uint8)
    assert "block size of 48" in str(kv_int8_decode_cuda.why_not(q, cache, cache, 8, 8, 0, False))


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_source_compiles_for_hopper(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path))
    cubin = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / kv_int8_decode_cuda.SOURCE, "sm_90a")
    for name in kv_int8_decode_cuda.kernel_names():
        assert name.encode() in cubin


def test_variant_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kv_int8_decode_cuda.VARIANT_ENV, raising=False)
    assert kv_int8_decode_cuda.variant() == "auto"
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, "")
    assert kv_int8_decode_cuda.variant() == "auto"
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, "vt3")
    assert kv_int8_decode_cuda.variant() == "vt3"
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, "fast")
    with pytest.raises(ValueError, match="must be one of"):
        kv_int8_decode_cuda.variant()


def test_grid_order_env_and_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kv_int8_decode_cuda.GRID_ENV, raising=False)
    assert kv_int8_decode_cuda.grid_order() == "heads"
    monkeypatch.setenv(kv_int8_decode_cuda.GRID_ENV, "seq")
    assert kv_int8_decode_cuda.grid_order() == "seq"
    monkeypatch.setenv(kv_int8_decode_cuda.GRID_ENV, "rows")
    with pytest.raises(ValueError, match="HOTLOOP_KV_CUDA_GRID='rows' must be one of"):
        kv_int8_decode_cuda.grid_order()
    assert kv_int8_decode_cuda.launch_grid(300, 8, 2, "seq") == ((300, 8, 2), 0)
    assert kv_int8_decode_cuda.launch_grid(300, 8, 2, "heads") == ((8, 300, 2), 1)
    assert kv_int8_decode_cuda.launch_grid(70000, 8, 1, "heads") == ((70000, 8, 1), 0)  # y limit


def test_choose_takes_the_environment_then_the_grid_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, "vt3")
    assert kv_int8_decode_cuda.choose(1, 8, 16, torch.device("cpu")) == "vt3"
    monkeypatch.delenv(kv_int8_decode_cuda.VARIANT_ENV)
    monkeypatch.setattr(kv_int8_decode_cuda, "_sm_count", lambda index: 132)
    assert kv_int8_decode_cuda.choose(1, 8, 16, torch.device("cpu")) == "vtw"
    assert kv_int8_decode_cuda.choose(300, 8, 1, torch.device("cpu")) == "vt3w"
    for gone in ("vtwc", "vtwk"):  # timed slower and removed (benchmarks/results/gpu_2026-12-01e)
        monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, gone)
        with pytest.raises(ValueError, match="must be one of"):
            kv_int8_decode_cuda.choose(1, 8, 16, torch.device("cpu"))


def test_auto_variant_by_grid() -> None:
    # one block per SM or fewer: the deeper ring; more: the 3-tile ring that fits 4 blocks an SM
    assert kv_int8_decode_cuda.pick_variant(1 * 8 * 16, 132) == "vtw"
    assert kv_int8_decode_cuda.pick_variant(132, 132) == "vtw"
    assert kv_int8_decode_cuda.pick_variant(133, 132) == "vt3w"
    assert kv_int8_decode_cuda.pick_variant(256 * 8, 132) == "vt3w"
    # both have the fused write too
    assert {"vtw", "vt3w"} <= set(kv_int8_decode_cuda.FUSED_VARIANTS)
    for name in ("vtw", "vt3w", *kv_int8_decode_cuda.FUSED_VARIANTS):
        assert name in kv_int8_decode_cuda.VARIANTS


# -- GPU ------------------------------------------------------------------------------------------
def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record each CUDA launch's outcome (1: launched), so a test cannot pass on the Triton path."""
    launched: list[int] = []
    real = kv_int8_decode_cuda.launch

    def spy(*args: object, **kwargs: object) -> bool:
        ok = real(*args, **kwargs)  # type: ignore[arg-type]
        launched.append(int(ok))
        return ok

    monkeypatch.setattr(kv_int8_decode_cuda, "launch", spy)
    return launched


def _merge_spy(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Record the Triton merge's launches."""
    from hotloop.kernels import paged_decode_attention as pda

    calls: list[object] = []
    real = pda._merge_kernel

    class Spy:
        def __getitem__(self, grid: object) -> object:
            calls.append(grid)
            return real[grid]

    monkeypatch.setattr(pda, "_merge_kernel", Spy())
    return calls


def _check(out: torch.Tensor, ref: torch.Tensor, seq: torch.Tensor, dtype: torch.dtype) -> None:
    """The whole batch within the float kernels' tolerance, and each live sequence within twice it
    (an error confined to one short sequence or one tile tail would vanish in the batch's norm)."""
    live = seq > 0
    assert rel_err(out[live], ref[live]) < TOL[dtype]
    for i in torch.nonzero(live).flatten().tolist():
        assert rel_err(out[i], ref[i]) < 2 * TOL[dtype], f"sequence {i} (length {int(seq[i])})"
    assert (out[~live] == 0).all()


def _case(
    lens: list[int],
    h: int,
    kv: int,
    bs: int,
    dtype: torch.dtype,
    splits: int | None,
    monkeypatch: pytest.MonkeyPatch,
    sliced: bool = False,
    q_scale: float = 1.0,
    strided_q: bool = False,
) -> None:
    launched = _spy(monkeypatch)
    seed = random.randrange(1 << 30)
    kq, vq, kf, vf, tables = _quant_pool(lens, kv, 128, bs, dtype, 8, "cuda", seed, sliced)
    gen = torch.Generator().manual_seed(seed + 1)
    if strided_q:  # q as the attention layer passes it: the q columns of a fused qkv buffer
        qkv = (torch.randn(len(lens), (h + 2 * kv) * 128, generator=gen) * q_scale).to(dtype).cuda()
        q = qkv[:, : h * 128].unflatten(1, (h, 128))
        assert q.stride(0) == (h + 2 * kv) * 128
    else:
        q = (torch.randn(len(lens), h, 128, generator=gen) * q_scale).to(dtype).cuda()
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.full((len(lens), h, 128), float("nan"), dtype=dtype, device="cuda")  # all must be written
    paged_decode_attention(q, kq, vq, tables, seq, 128**-0.5, None, splits, out=out)
    assert launched == [1], "the CUDA kernel did not run"
    qd = q.float().clamp(-65504, 65504).half().float()  # the kernel dots fp16 queries, as the Triton one
    ref = reference.paged_attention(qd, kf, vf, tables, [1] * len(lens), lens, 128**-0.5, None)
    _check(out, ref, seq, dtype)


LENS = [0, 1, 17, 63, 64, 65, 300, 1031, 64 * 40 + 5, 4096]


@pytest.mark.gpu
@pytest.mark.parametrize("h,kv", [(8, 8), (32, 8), (28, 4), (16, 2), (6, 1)])  # groups 1, 4, 7, 8, 6
@pytest.mark.parametrize("bs", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_gpu(h: int, kv: int, bs: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    for splits in (1, 2, 5, 16, None):
        _case(LENS, h, kv, bs, dtype, splits, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["rows", "vt", "vt3", "vtw", "vt3w"])
@pytest.mark.parametrize("h,kv", [(8, 8), (32, 8), (28, 4), (16, 2), (6, 1)])
@pytest.mark.parametrize("bs", [16, 64])
def test_decode_variants_gpu(h: int, kv: int, bs: int, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, variant)
    for splits in (1, 5, None):
        _case(LENS, h, kv, bs, torch.bfloat16, splits, monkeypatch)
    _case(LENS, h, kv, bs, torch.float16, 2, monkeypatch, sliced=True, strided_q=True)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["rows", "vt", "vt3", "vt3w"])
@pytest.mark.parametrize("h,kv", [(32, 8), (28, 4), (6, 1)])
def test_decode_seq_grid_gpu(h: int, kv: int, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the default grid is heads-fastest (every other test runs it); this is the other order
    monkeypatch.setenv(kv_int8_decode_cuda.GRID_ENV, "seq")
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, variant)
    for splits in (1, 5, None):
        _case(LENS, h, kv, 64, torch.bfloat16, splits, monkeypatch)
    _case(LENS, h, kv, 16, torch.float16, 2, monkeypatch, sliced=True, strided_q=True)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 4])
def test_decode_sliced_pool_strided_and_large_queries_gpu(
    splits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _case(LENS, 32, 8, 64, torch.bfloat16, splits, monkeypatch, sliced=True)
    _case(LENS, 32, 8, 16, torch.float16, splits, monkeypatch, sliced=True)
    _case(LENS, 28, 4, 64, torch.bfloat16, splits, monkeypatch, strided_q=True)
    # bf16 queries past fp16's range are clamped into it, as the Triton kernel does
    _case([5, 700], 32, 8, 64, torch.bfloat16, splits, monkeypatch, q_scale=3e4)


@pytest.mark.gpu
def test_decode_matches_the_triton_kernel_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    seed = random.randrange(1 << 30)
    lens = [3000, 1, 129, 0, 777]
    kq, vq, _kf, _vf, tables = _quant_pool(lens, 8, 128, 64, torch.bfloat16, 8, "cuda", seed)
    q = torch.randn(len(lens), 32, 128, generator=torch.Generator().manual_seed(seed)).bfloat16().cuda()
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    launched = _spy(monkeypatch)
    ours = paged_decode_attention(q, kq, vq, tables, seq, 0.088, None, 4)
    assert launched == [1], "the CUDA kernel did not run"
    monkeypatch.setenv(kv_int8_decode_cuda.ENV, "0")
    triton_out = paged_decode_attention(q, kq, vq, tables, seq, 0.088, None, 4)
    assert launched == [1], "the Triton kernel should have run"
    assert rel_err(ours, triton_out) < 1e-2
    assert not torch.equal(ours, torch.zeros_like(ours))


# -- the fused rotary + KV write (HOTLOOP_KV_CUDA_FUSED_WRITE) ---------------------------------------
def _fused_write_case(
    lens: list[int],
    h: int,
    kv: int,
    bs: int,
    dtype: torch.dtype,
    splits: int | None,
    device: str,
    monkeypatch: pytest.MonkeyPatch,
    rotated: bool = False,
) -> tuple[list[object], float]:
    """The same step two ways: ``rotary_kv_write`` then decode (the reference) and decode with
    ``write_kv`` (q unrotated, this step's k / v not yet in the cache; with ``rotated``, q and k as
    ``rotary_kv_write`` rotated them, the way the staged q/k/v GEMV hands them over). Asserts that the caches agree
    (every byte outside the new tokens' rows identical; the new rows' dequantized values within a
    code step) and that each output matches the torch reference over the cache it wrote. Returns
    the launches the spy saw and the smallest fraction of the new rows' code and pair bytes that
    are equal (the kernel rounds as the Triton write does, so 1.0 is expected)."""
    from hotloop.kernels.rotary_kv_write import rotary_kv_write

    monkeypatch.setenv(kv_int8_decode_cuda.FUSED_ENV, "1")
    seed = random.randrange(1 << 30)
    kq, vq, _kf, _vf, tables = _quant_pool(lens, kv, 128, bs, dtype, 8, device, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    B, D = len(lens), 128
    qkv = torch.randn(B, (h + 2 * kv) * D, generator=gen).to(dtype).to(device)  # one fused projection
    pos = torch.tensor([max(n - 1, 0) for n in lens])
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2).float() / D))
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    slots = torch.tensor(
        [int(tables[i, (n - 1) // bs]) * bs + (n - 1) % bs if n > 0 else -1 for i, n in enumerate(lens)],
        dtype=torch.int64,
    ).to(device)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)

    def views(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            t[:, : h * D].unflatten(1, (h, D)),
            t[:, h * D : (h + kv) * D].unflatten(1, (kv, D)),
            t[:, (h + kv) * D :].unflatten(1, (kv, D)),
        )

    # the reference: the write, then decode
    kc_r, vc_r, qkv_r = kq.clone(), vq.clone(), qkv.clone()
    q_r, k_r, v_r = views(qkv_r)
    qkv_unrotated = qkv_r.clone()
    # (rotate_k: k rotated in place too, the exact values the write quantized, for `rotated`)
    rotary_kv_write(q_r, k_r, v_r, cos, sin, kc_r, vc_r, slots, rotate_k=rotated)
    out_r = paged_decode_attention(q_r, kc_r, vc_r, tables, seq, D**-0.5, None, splits)
    # fused
    spied = spy_int8_decode_launches(monkeypatch)
    kc_f, vc_f = kq.clone(), vq.clone()
    q_f, k_f, v_f = views(qkv_r.clone() if rotated else qkv_unrotated)
    if rotated:  # rows without a slot (padding) were not rotated: the kernel does not write them
        assert not torch.equal(k_f, views(qkv_unrotated)[1]) or not (slots >= 0).any()
    w = kv_int8_decode_cuda.FusedWrite(k_f, v_f, cos, sin, slots, rotated=rotated)
    out_f = paged_decode_attention(q_f, kc_f, vc_f, tables, seq, D**-0.5, None, splits, write_kv=w)

    launched: list[object] = [(ok, a["fused"]) for ok, a in spied]
    new_rows = torch.zeros(kq.shape[0], bs, dtype=torch.bool)
    for sl in slots.tolist():
        if sl >= 0:
            new_rows[sl // bs, sl % bs] = True
    same = []
    for c_f, c_r in ((kc_f, kc_r), (vc_f, vc_r)):
        # codes [NB, BS, KV, 128] then pairs [NB, BS, KV, 4] in each block (kv_quant's layout)
        flat_f, flat_r = c_f.reshape(kq.shape[0], -1), c_r.reshape(kq.shape[0], -1)
        codes_f = flat_f[:, : bs * kv * D].reshape(-1, bs, kv, D)
        codes_r = flat_r[:, : bs * kv * D].reshape(-1, bs, kv, D)
        pairs_f = flat_f[:, bs * kv * D :].reshape(-1, bs, kv, 4)
        pairs_r = flat_r[:, bs * kv * D :].reshape(-1, bs, kv, 4)
        old = ~new_rows.to(c_f.device)
        assert torch.equal(codes_f[old], codes_r[old]) and torch.equal(pairs_f[old], pairs_r[old])
        same.append((codes_f[~old] == codes_r[~old]).float().mean().item() if (~old).any() else 1.0)
        same.append((pairs_f[~old] == pairs_r[~old]).float().mean().item() if (~old).any() else 1.0)
        deq_f = kv_quant.dequantize_cache(c_f, D, dtype)[~old]
        deq_r = kv_quant.dequantize_cache(c_r, D, dtype)[~old]
        if deq_r.numel():
            step = (deq_r.amax(-1) - deq_r.amin(-1)) / 255  # a code step of each row
            assert ((deq_f - deq_r).abs() <= 1.01 * step[..., None] + 1e-6).all()
    # each output against the torch reference over the cache it wrote (q rotated as rotary_kv_write does)
    qd = q_r.float().clamp(-65504, 65504).half().float()
    for out, kc, vc in ((out_f, kc_f, vc_f), (out_r, kc_r, vc_r)):
        kf = kv_quant.dequantize_cache(kc, D, dtype)
        vf = kv_quant.dequantize_cache(vc, D, dtype)
        ref = reference.paged_attention(qd, kf, vf, tables, [1] * B, lens, D**-0.5, None)
        _check(out, ref, seq, dtype)
    return launched, min(same)


FUSED_LENS = [0, 1, 17, 64, 65, 300, 64 * 40 + 5]


@pytest.mark.parametrize("rotated", [False, True])
def test_fused_write_falls_back_off_the_gpu(rotated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the CUDA kernel cannot take the launch (here: no GPU) ``write_kv`` runs
    ``rotary_kv_write`` first (the write alone when q and k arrive rotated): the same bytes and the
    same output as the two calls."""
    launched, same = _fused_write_case(
        [0, 1, 17, 65], 8, 2, 16, torch.bfloat16, 2, "cpu", monkeypatch, rotated
    )
    assert launched == [] and same == 1.0


def test_fused_write_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    q = torch.zeros(3, 8, 128, dtype=torch.bfloat16)
    k = torch.zeros(3, 2, 128, dtype=torch.bfloat16)
    cache = torch.zeros(4, 16, 2, 132, dtype=torch.uint8)
    cs = torch.zeros(3, 64)
    slots = torch.zeros(3, dtype=torch.int64)

    def why(w: kv_int8_decode_cuda.FusedWrite, c: torch.Tensor = cache) -> str | None:
        return kv_int8_decode_cuda.fused_why_not(q, c, w)

    ok = kv_int8_decode_cuda.FusedWrite(k, k, cs, cs, slots)
    assert why(ok) is None
    assert "must be [3, 4, 128]" in str(why(ok, torch.zeros(4, 16, 4, 132, dtype=torch.uint8)))  # KV heads
    assert "full rotary" in str(
        why(kv_int8_decode_cuda.FusedWrite(k, k, torch.zeros(3, 32), torch.zeros(3, 32), slots))
    )
    assert "must be [3, 2, 128]" in str(why(kv_int8_decode_cuda.FusedWrite(k.float(), k, cs, cs, slots)))
    assert "int64" in str(why(kv_int8_decode_cuda.FusedWrite(k, k, cs, cs, slots.int())))
    strided = torch.zeros(3, 2, 256, dtype=torch.bfloat16)[:, :, :128]
    assert "contiguous rows" in str(why(kv_int8_decode_cuda.FusedWrite(strided, k, cs, cs, slots)))
    for name in ("rows", "probe3"):  # only the O^T kernels (or the auto choice, always one of them)
        monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, name)
        monkeypatch.setitem(kv_int8_decode_cuda.VARIANTS, "probe3", kv_int8_decode_cuda.PROBES["probe3"])
        assert "fused write is in the vt/vt3/vtw/vt3w kernels" in str(why(ok))


def test_fused_write_falls_back_when_the_kernels_do_not_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA kernel accepted the launch but could not be built here (``launch`` returns False):
    the write runs first, then the Triton kernel, with the same bytes and output as the two calls."""
    monkeypatch.setattr(kv_int8_decode_cuda, "why_not", lambda *a, **k: None)
    monkeypatch.setattr(kv_int8_decode_cuda, "fused_why_not", lambda *a, **k: None)
    monkeypatch.setattr(kv_int8_decode_cuda, "launch", lambda *a, **k: False)
    launched, same = _fused_write_case([0, 1, 17, 65], 8, 2, 16, torch.bfloat16, 2, "cpu", monkeypatch)
    assert same == 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["", "vt", "vt3", "vtw", "vt3w"])
@pytest.mark.parametrize("h,kv", [(32, 8), (28, 4), (8, 8), (6, 1)])
@pytest.mark.parametrize("bs", [16, 64])
def test_fused_write_gpu(h: int, kv: int, bs: int, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fused kernel, unrotated and rotated input (the staged GEMV's), against the two launches.
    The fused kernels request their first tiles before the wait (EARLY): the newest row is put in
    after it, whichever tile (a split's first or a later one) holds it."""
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, variant)
    runs = [
        (torch.bfloat16, 1, "seq", False),
        (torch.bfloat16, 5, "heads", True),
        (torch.float16, None, "seq", False),
        (torch.bfloat16, 16, "heads", True),
    ]
    for dtype, splits, grid, rotated in runs:
        monkeypatch.setenv(kv_int8_decode_cuda.GRID_ENV, grid)
        launched, same = _fused_write_case(FUSED_LENS, h, kv, bs, dtype, splits, "cuda", monkeypatch, rotated)
        assert launched and all(ok and w is not None for ok, w in launched), "the fused kernel did not run"
        assert same == 1.0, f"only {same:.4f} of the new rows' bytes equal the two-launch write's"


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["vtw", "vt3w", "vt", "rows"])
@pytest.mark.parametrize("splits", [1, 3, 16])
@pytest.mark.parametrize("early", ["1", "0"])
def test_early_prologue_gpu(variant: str, splits: int, early: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """HOTLOOP_KV_CUDA_EARLY=1: the first tiles requested before the wait and the newest token's row
    read from the cache after it, plainly (=0: every copy after the wait). Right after
    ``rotary_kv_write`` wrote that row (the kernel launched just before, as in a decode step), the
    output matches the reference over the cache as written; a stale newest row would not."""
    from hotloop.kernels.rotary_kv_write import rotary_kv_write

    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, variant)
    monkeypatch.setenv(kv_int8_decode_cuda.EARLY_ENV, early)
    lens, h, kv, bs, dtype, D = FUSED_LENS, 32, 8, 16, torch.bfloat16, 128
    seed = random.randrange(1 << 30)
    kq, vq, _kf, _vf, tables = _quant_pool(lens, kv, D, bs, dtype, 8, "cuda", seed)
    gen = torch.Generator().manual_seed(seed + 1)
    B = len(lens)
    q = torch.randn(B, h, D, generator=gen).to(dtype).cuda()
    k = (torch.randn(B, kv, D, generator=gen) * 4).to(dtype).cuda()  # unlike the pool's rows
    v = (torch.randn(B, kv, D, generator=gen) * 4).to(dtype).cuda()
    slots = torch.tensor(
        [int(tables[i, (n - 1) // bs]) * bs + (n - 1) % bs if n > 0 else -1 for i, n in enumerate(lens)],
        dtype=torch.int64,
    ).cuda()
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    half = torch.zeros(B, D // 2, device="cuda")
    launched = _spy(monkeypatch)
    for _ in range(3):  # the write, then decode at once: three steps, rows overwritten each time
        k.mul_(-1)
        rotary_kv_write(q.clone(), k, v, half.cos(), half, kq, vq, slots)  # a zero-angle rotation
        out = paged_decode_attention(q, kq, vq, tables, seq, D**-0.5, None, splits)
        kf = kv_quant.dequantize_cache(kq, D, dtype)
        vf = kv_quant.dequantize_cache(vq, D, dtype)
        qd = q.float().clamp(-65504, 65504).half().float()
        _check(out, reference.paged_attention(qd, kf, vf, tables, [1] * B, lens, D**-0.5, None), seq, dtype)
    assert launched and all(launched), "the CUDA kernel did not run"


def test_early_env(monkeypatch: pytest.MonkeyPatch) -> None:
    early = kv_int8_decode_cuda.early_enabled
    monkeypatch.delenv(kv_int8_decode_cuda.EARLY_ENV, raising=False)
    assert early(132, 132) and not early(133, 132)  # by default: grids that fit the SMs once
    monkeypatch.setenv(kv_int8_decode_cuda.EARLY_ENV, "0")
    assert not early(8, 132)
    monkeypatch.setenv(kv_int8_decode_cuda.EARLY_ENV, "1")
    assert early(8, 132) and early(4096, 132)
    monkeypatch.setenv(kv_int8_decode_cuda.EARLY_ENV, "yes")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        early(8, 132)


@pytest.mark.gpu
def test_fused_write_rows_variant_falls_back_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, "rows")
    launched, same = _fused_write_case(FUSED_LENS, 32, 8, 64, torch.bfloat16, 2, "cuda", monkeypatch)
    assert launched and all(ok and w is None for ok, w in launched) and same == 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("variant,splits", [("", 4), ("", 16), ("vt3w", 1)])
def test_decode_in_a_cuda_graph_gpu(variant: str, splits: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, variant)
    merges = _merge_spy(monkeypatch)
    seed = random.randrange(1 << 30)
    lens = [900, 2000, 1, 64]
    kq, vq, kf, vf, tables = _quant_pool(lens, 8, 128, 64, torch.bfloat16, 8, "cuda", seed)
    q = torch.randn(len(lens), 32, 128, generator=torch.Generator().manual_seed(seed)).bfloat16().cuda()
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    launched = _spy(monkeypatch)
    paged_decode_attention(q, kq, vq, tables, seq, 0.088, None, splits, out=out)  # compile and load first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(q, kq, vq, tables, seq, 0.088, None, splits, out=out)
    assert launched == [1, 1], "the CUDA kernel did not run"
    for new in ([900, 2000, 1, 64], [901, 1500, 0, 700]):
        seq.copy_(torch.tensor(new, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference.paged_attention(q.float().half().float(), kf, vf, tables, [1] * 4, new, 0.088, None)
        _check(out, ref, seq, torch.bfloat16)
    assert (merges == []) == (splits == 1)  # with splits, the merge launch follows


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["", "vt3w"])
def test_decode_launch_replay_swaps_the_caches_gpu(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The piecewise graphs record one layer's attention launches and replay them on the others'
    caches (``launch_replay``): the CUDA launch must be recorded, with the caches swappable."""
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, variant)
    if not launch_replay.available(torch.device("cuda")):
        pytest.skip("launch replay is off here")
    seed = random.randrange(1 << 30)
    lens = [700, 33]
    kq, vq, _kf, _vf, tables = _quant_pool(lens, 8, 128, 64, torch.float16, 8, "cuda", seed)
    kq2, vq2, kf2, vf2, _t = _quant_pool(lens, 8, 128, 64, torch.float16, 8, "cuda", seed + 7)
    q = torch.randn(len(lens), 32, 128, generator=torch.Generator().manual_seed(seed)).half().cuda()
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    launched = _spy(monkeypatch)
    with launch_replay.record((kq, vq)) as plan:
        paged_decode_attention(q, kq, vq, tables, seq, 0.088, None, 2, out=out)
    assert launched == [1], "the CUDA kernel did not run"
    # the CUDA kernel, then the Triton merge
    assert plan.valid and len(plan.launches) == 2
    assert [ti for _li, _ai, ti in plan.slots] == [0, 1]  # the CUDA launch's k and v caches
    out.fill_(float("nan"))
    plan.replay((kq2, vq2))
    torch.cuda.synchronize()
    ref = reference.paged_attention(q.float(), kf2, vf2, tables, [1, 1], lens, 0.088, None)
    _check(out, ref, seq, torch.float16)
