"""The CUDA C 16-bit-KV decode attention with the splits merged in the launch
(``kernels/kv_float_decode_cuda.py``) against the torch reference.

GPU: head dims 64 and 128, GQA groups 1 to 8 (SmolLM2's 9 / 3 among them), fp16 and bf16, block sizes
16 and 64, 2 to 16 splits (16: a non-portable cluster), tile tails and padding rows, no merge launch,
CUDA-graph replay and the piecewise graphs' launch replay. CPU: when the kernel applies, and that its
source compiles for sm_90a.
"""

from __future__ import annotations

import random

import pytest
import torch
from kernel_checks import TOL, rel_err
from test_attention_kernels import _pool

from hotloop.kernels import cuda_jit, kv_float_decode_cuda, launch_replay, reference
from hotloop.kernels.paged_decode_attention import paged_decode_attention


def _why(
    q: torch.Tensor, cache: torch.Tensor, group: int = 4, window: int = 0, splits: int = 16
) -> str | None:
    return kv_float_decode_cuda.why_not(q, cache, cache, group, window, splits)


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kv_float_decode_cuda.ENV, raising=False)
    q = torch.zeros(1, 8, 128, dtype=torch.bfloat16)
    cache = torch.zeros(4, 16, 2, 128, dtype=torch.bfloat16)
    assert "HOTLOOP_FLOAT_CUDA_DECODE is not 1" in str(_why(q, cache))
    monkeypatch.setenv(kv_float_decode_cuda.ENV, "yes")
    with pytest.raises(ValueError, match="HOTLOOP_FLOAT_CUDA_DECODE='yes' must be 1"):
        _why(q, cache)


def test_why_not_names_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kv_float_decode_cuda.ENV, "1")
    q = torch.zeros(1, 8, 128, dtype=torch.bfloat16)
    cache = torch.zeros(4, 16, 2, 128, dtype=torch.bfloat16)
    assert "float32 queries" in str(_why(q.float(), cache.float()))
    assert "torch.float16 cache" in str(_why(q, cache.half()))
    assert "head_dim 96" in str(_why(torch.zeros(1, 8, 96, dtype=torch.bfloat16), cache[..., :96]))
    assert "GQA group of 12" in str(_why(q, cache, group=12))
    assert "sliding window" in str(_why(q, cache, window=256))
    assert "1 splits" in str(_why(q, cache, splits=1))
    assert "32 splits" in str(_why(q, cache, splits=32))
    assert "block size of 48" in str(_why(q, torch.zeros(4, 48, 2, 128, dtype=torch.bfloat16)))
    wide = torch.zeros(4, 16, 2, 132, dtype=torch.bfloat16)[..., 2:130]  # rows 4 bytes off 16
    assert "not 16-byte aligned" in str(_why(q, wide))
    assert "not on a GPU" in str(_why(q, cache))  # everything else holds: the device decides


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_source_compiles_for_hopper(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path))
    cubin = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / kv_float_decode_cuda.SOURCE, "sm_90a")
    for name in kv_float_decode_cuda.kernel_names():
        assert name.encode() in cubin


# -- GPU ------------------------------------------------------------------------------------------
def _spies(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[object]]:
    """Record the CUDA kernel's launches and the Triton merge's (which must not run)."""
    from hotloop.kernels import paged_decode_attention as pda

    launched: list[int] = []
    real_launch = kv_float_decode_cuda.launch

    def spy(*args: object, **kwargs: object) -> bool:
        ok = real_launch(*args, **kwargs)  # type: ignore[arg-type]
        launched.append(int(ok))
        return ok

    monkeypatch.setattr(kv_float_decode_cuda, "launch", spy)
    merges: list[object] = []
    real_merge = pda._merge_kernel

    class MergeSpy:
        def __getitem__(self, grid: object) -> object:
            merges.append(grid)
            return real_merge[grid]

    monkeypatch.setattr(pda, "_merge_kernel", MergeSpy())
    return launched, merges


def _case(
    lens: list[int],
    h: int,
    kv: int,
    d: int,
    bs: int,
    dtype: torch.dtype,
    splits: int,
    strided_q: bool = False,
) -> None:
    seed = random.randrange(1 << 30)
    k, v, tables = _pool(lens, kv, d, bs, dtype, "cuda", seed)
    gen = torch.Generator().manual_seed(seed + 1)
    if strided_q:  # q as the attention layer passes it: the q columns of a fused qkv buffer
        qkv = torch.randn(len(lens), (h + 2 * kv) * d, generator=gen).to(dtype).cuda()
        q = qkv[:, : h * d].unflatten(1, (h, d))
    else:
        q = torch.randn(len(lens), h, d, generator=gen).to(dtype).cuda()
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))  # every element must be written
    paged_decode_attention(q, k, v, tables, seq, d**-0.5, None, splits, out=out)
    ref = reference.paged_attention(
        q.float(), k.float(), v.float(), tables, [1] * len(lens), lens, d**-0.5, None
    )
    live = seq > 0
    assert rel_err(out[live], ref[live]) < TOL[dtype]
    for i in torch.nonzero(live).flatten().tolist():  # an error in one short sequence or tile tail
        assert rel_err(out[i], ref[i]) < 2 * TOL[dtype], f"sequence {i} (length {lens[i]})"
    assert (out[~live] == 0).all()


LENS = [0, 1, 17, 63, 64, 65, 300, 1031, 64 * 40 + 5, 4096]


@pytest.mark.gpu
@pytest.mark.parametrize("h,kv", [(9, 3), (32, 8), (28, 4), (16, 2), (6, 1), (8, 8)])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_gpu(h: int, kv: int, d: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kv_float_decode_cuda.ENV, "1")
    launched, merges = _spies(monkeypatch)
    for lens, splits, bs in (
        ([640], 16, 64),
        ([129], 16, 16),
        ([4096], 8, 64),
        (LENS, 2, 64),
        (LENS, 5, 16),
        (LENS, 16, 64),
    ):
        _case(lens, h, kv, d, bs, dtype, splits)
    _case(LENS, h, kv, d, 64, dtype, 4, strided_q=True)
    assert launched == [1] * 7, "the CUDA kernel did not run"
    assert merges == []


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_decode_strided_caches_and_output_gpu(d: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """K every other block of a larger pool, V rows padded (other strides than K's), out a slice of a
    wider buffer: each stride goes to the kernel as given."""
    monkeypatch.setenv(kv_float_decode_cuda.ENV, "1")
    launched, merges = _spies(monkeypatch)
    seed = random.randrange(1 << 30)
    lens = [1, 200, 1031, 0, 2100]
    k, v, tables = _pool(lens, 4, d, 32, torch.bfloat16, "cuda", seed)
    k_big = torch.zeros(2 * k.shape[0], *k.shape[1:], dtype=k.dtype, device="cuda")
    k_big[::2] = k
    v_big = torch.zeros(*v.shape[:3], d + 8, dtype=v.dtype, device="cuda")
    v_big[..., :d] = v
    ks, vs = k_big[::2], v_big[..., :d]
    assert ks.stride(0) == 2 * k.stride(0) and vs.stride(2) == d + 8
    q = torch.randn(len(lens), 16, d, generator=torch.Generator().manual_seed(seed)).bfloat16().cuda()
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out_big = torch.full((len(lens), 16, d + 16), float("nan"), dtype=q.dtype, device="cuda")
    out = out_big[..., :d]
    paged_decode_attention(q, ks, vs, tables, seq, d**-0.5, None, 8, out=out)
    assert launched == [1] and merges == []
    ref = reference.paged_attention(
        q.float(), k.float(), v.float(), tables, [1] * len(lens), lens, d**-0.5, None
    )
    live = seq > 0
    assert rel_err(out[live], ref[live]) < TOL[torch.bfloat16]
    assert (out[~live] == 0).all() and torch.isnan(out_big[..., d:]).all()  # nothing past the slice


@pytest.mark.gpu
def test_decode_in_a_cuda_graph_and_launch_replay_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kv_float_decode_cuda.ENV, "1")
    launched, merges = _spies(monkeypatch)
    seed = random.randrange(1 << 30)
    lens = [300, 2000, 1, 64]
    k, v, tables = _pool(lens, 3, 64, 64, torch.bfloat16, "cuda", seed)
    q = torch.randn(len(lens), 9, 64, generator=torch.Generator().manual_seed(seed)).bfloat16().cuda()
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    paged_decode_attention(q, k, v, tables, seq, 0.125, None, 16, out=out)  # compile and load first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(q, k, v, tables, seq, 0.125, None, 16, out=out)
    assert launched == [1, 1]
    for new in ([300, 2000, 1, 64], [301, 1500, 0, 700]):
        seq.copy_(torch.tensor(new, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference.paged_attention(q.float(), k.float(), v.float(), tables, [1] * 4, new, 0.125, None)
        live = seq > 0
        assert rel_err(out[live], ref[live]) < TOL[torch.bfloat16]
        assert (out[~live] == 0).all()
    if launch_replay.available(torch.device("cuda")):
        k2, v2, _t = _pool(lens, 3, 64, 64, torch.bfloat16, "cuda", seed + 7)
        seq.copy_(torch.tensor(lens, dtype=torch.int32))
        with launch_replay.record((k, v)) as plan:
            paged_decode_attention(q, k, v, tables, seq, 0.125, None, 8, out=out)
        assert plan.valid and len(plan.launches) == 1  # the CUDA kernel alone: no merge launch
        out.fill_(float("nan"))
        plan.replay((k2, v2))
        torch.cuda.synchronize()
        ref = reference.paged_attention(q.float(), k2.float(), v2.float(), tables, [1] * 4, lens, 0.125, None)
        assert rel_err(out, ref) < TOL[torch.bfloat16]
    assert merges == []
