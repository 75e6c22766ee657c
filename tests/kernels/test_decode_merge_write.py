"""The split merge that writes the step's token (``kernels/decode_merge_write.py``).

Against the two-launch step it replaces: ``write_kv_cache`` (the quantized write) and decode
attention over the cache as written, checked with the torch reference over the dequantized cache.
The cache bytes must be identical (the merge quantizes with the Triton write's arithmetic) and the
outputs within the float kernels' tolerance. CPU (the Triton interpreter): the merge kernel over
the Triton decode kernel's partials of the older context, and the fallback of
``decode_with_merge_write`` where the CUDA kernel cannot run. GPU: the CUDA kernel's
``exclude_newest`` launches (every variant, split counts, block sizes, padding rows), in and out of
CUDA graphs.
"""

from __future__ import annotations

import random

import pytest
import torch
from kernel_checks import TOL, rel_err
from launch_spies import spy_int8_decode_launches
from test_kv_quant_kernels import _quant_pool

from hotloop.kernels import decode_merge_write, kv_int8_decode_cuda, kv_quant, reference
from hotloop.kernels.paged_decode_attention import decode_attention_partials
from hotloop.kernels.rotary_kv_write import write_kv_cache

D = 128


def _step(
    lens: list[int], h: int, kv: int, bs: int, dtype: torch.dtype, device: str, pad: int | None = None
) -> dict[str, torch.Tensor]:
    """A decode step's inputs: an int8 pool whose row at each sequence's newest position holds a
    stale token, the step's q and k / v rows (unlike the pool's), and the slots (``pad``: that
    sequence is a padding row, slot -1)."""
    seed = random.randrange(1 << 30)
    kq, vq, _kf, _vf, tables = _quant_pool(lens, kv, D, bs, dtype, 8, device, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    B = len(lens)
    q = torch.randn(B, h, D, generator=gen).to(dtype).to(device)
    kvn = (torch.randn(B, 2 * kv, D, generator=gen) * 3).to(dtype).to(device)
    slots = torch.tensor(
        [-1 if i == pad else int(tables[i, (n - 1) // bs]) * bs + (n - 1) % bs for i, n in enumerate(lens)],
        dtype=torch.int64,
    ).to(device)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    return {"kq": kq, "vq": vq, "tables": tables, "q": q, "kv": kvn, "slots": slots, "seq": seq}


def _reference(s: dict[str, torch.Tensor], kv: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The two launches: the write, then attention over the cache as written (torch reference)."""
    kc, vc = s["kq"].clone(), s["vq"].clone()
    write_kv_cache(s["kv"][:, :kv], s["kv"][:, kv:], kc, vc, s["slots"])
    qd = s["q"].float().clamp(-65504, 65504).half().float()
    lens = s["seq"].tolist()
    ref = reference.paged_attention(
        qd, kv_quant.dequantize_cache(kc, D, dtype), kv_quant.dequantize_cache(vc, D, dtype), s["tables"],
        [1] * len(lens), lens, D**-0.5, None,
    )  # fmt: skip
    return kc, vc, ref


def _compare(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, skip: int | None = None) -> None:
    rows = [i for i in range(out.shape[0]) if i != skip]
    assert torch.isfinite(out).all()
    assert rel_err(out[rows], ref[rows]) < TOL[dtype]
    for i in rows:
        assert rel_err(out[i], ref[i]) < 2 * TOL[dtype], f"sequence {i}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("h,kv,splits", [(8, 2, 2), (4, 4, 4), (6, 1, 3)])
def test_merge_writes_the_token_and_attends_to_it(h: int, kv: int, splits: int, dtype: torch.dtype) -> None:
    """The merge over the Triton decode kernel's partials of the older context (``seq_lens - 1``):
    the same cache bytes as the quantized write and the reference's attention over them. Lengths
    put the newest token first in a block, mid-block and alone in its split; sequence 1 is a
    padding row (slot -1: nothing written)."""
    lens, bs = [2, 17, 33, 65], 16
    s = _step(lens, h, kv, bs, dtype, "cpu", pad=1)
    kc_r, vc_r, ref = _reference(s, kv, dtype)
    kc, vc = s["kq"].clone(), s["vq"].clone()
    res = decode_attention_partials(s["q"], kc, vc, s["tables"], s["seq"] - 1, D**-0.5, None, splits)
    assert res.part is not None and res.lse is not None
    out = decode_merge_write.merge_and_write(res.part, res.lse, s["q"], s["kv"], s["slots"], kc, vc, D**-0.5)
    assert torch.equal(kc, kc_r) and torch.equal(vc, vc_r)
    _compare(out, ref, dtype, skip=1)
    # the check can fail: the stale rows differ from the step's token
    assert not torch.equal(kc_r, s["kq"])


def test_merge_without_the_token_would_be_wrong() -> None:
    """The same partials merged without the token (the plain merge) miss it: the reference then
    disagrees, so the test above checks that the token is attended to."""
    from hotloop.kernels.paged_decode_attention import merge_partials

    lens, h, kv, dtype = [3, 9], 4, 2, torch.bfloat16
    s = _step(lens, h, kv, 16, dtype, "cpu")
    _kc, _vc, ref = _reference(s, kv, dtype)
    res = decode_attention_partials(s["q"], s["kq"], s["vq"], s["tables"], s["seq"] - 1, D**-0.5, None, 2)
    assert rel_err(merge_partials(res), ref) > TOL[dtype]


def test_refusals() -> None:
    part = torch.zeros(2, 4, 2, D)
    lse = torch.zeros(2, 4, 2)
    q = torch.zeros(2, 4, D, dtype=torch.bfloat16)
    kv = torch.zeros(2, 4, D, dtype=torch.bfloat16)
    cache = torch.zeros(3, 16, 2, D + 4, dtype=torch.uint8)
    slots = torch.zeros(2, dtype=torch.int64)
    merge = decode_merge_write.merge_and_write
    with pytest.raises(ValueError, match="int8"):
        merge(part, lse, q, kv, slots, torch.zeros(3, 16, 2, D // 2 + 4, dtype=torch.uint8), cache, 1.0)
    with pytest.raises(ValueError, match="kv must be"):
        merge(part, lse, q, kv[:, :3], slots, cache, cache, 1.0)
    with pytest.raises(ValueError, match="slots must be int64"):
        merge(part, lse, q, kv, slots.int(), cache, cache, 1.0)
    with pytest.raises(ValueError, match="exclude_newest needs the CUDA int8 kernel"):
        decode_attention_partials(
            q, cache, cache, torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, dtype=torch.int32), 1.0,
            None, 2, exclude_newest=True,
        )  # fmt: skip


def test_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(decode_merge_write.ENV, raising=False)
    assert decode_merge_write.enabled()
    monkeypatch.setenv(decode_merge_write.ENV, "0")
    assert not decode_merge_write.enabled()
    monkeypatch.setenv(decode_merge_write.ENV, "on")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        decode_merge_write.enabled()


def test_falls_back_to_the_write_then_decode_off_the_gpu() -> None:
    """Where the CUDA kernel cannot run (here: the CPU), the write runs first, then the plain
    decode and merge: the same bytes and the reference's output."""
    lens, h, kv, dtype = [2, 40, 17], 8, 2, torch.bfloat16
    s = _step(lens, h, kv, 16, dtype, "cpu")
    kc_r, vc_r, ref = _reference(s, kv, dtype)
    kc, vc = s["kq"].clone(), s["vq"].clone()
    out = decode_merge_write.decode_with_merge_write(
        s["q"], s["kv"], kc, vc, s["tables"], s["seq"], s["slots"], D**-0.5, num_splits=2
    )
    assert torch.equal(kc, kc_r) and torch.equal(vc, vc_r)
    _compare(out, ref, dtype)


def test_applies_to_int8_caches_without_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(decode_merge_write.ENV, raising=False)
    int8 = torch.zeros(2, 16, 2, D + 4, dtype=torch.uint8)
    int4 = torch.zeros(2, 16, 2, D // 2 + 4, dtype=torch.uint8)
    applies = decode_merge_write.applies
    assert applies(int8, D, torch.bfloat16, None)
    assert applies(torch.zeros(2, 16, 2, D + 8, dtype=torch.uint8), D, torch.float32, None)
    assert not applies(int4, D, torch.bfloat16, None)  # int4 keeps the separate write
    assert not applies(int8, D, torch.bfloat16, 4096)  # a sliding window: the CUDA kernel has none
    assert not applies(torch.zeros(2, 16, 2, D, dtype=torch.bfloat16), D, torch.bfloat16, None)
    monkeypatch.setenv(decode_merge_write.ENV, "0")
    assert not applies(int8, D, torch.bfloat16, None)


@pytest.mark.parametrize("policy,window", [(4, None), (8, 20)])
def test_int4_and_windows_write_first(
    policy: int, window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Called with an int4 cache or a sliding window, even where the CUDA kernel would take an int8
    launch (``takes`` patched true, as on a GPU), the token is written first and the plain decode
    runs, with the window: the reference's bytes and output."""
    monkeypatch.setattr(kv_int8_decode_cuda, "takes", lambda *a, **k: True)
    lens, h, kv, dtype, bs = [2, 40, 17], 8, 2, torch.bfloat16, 16
    seed = random.randrange(1 << 30)
    kq, vq, _kf, _vf, tables = _quant_pool(lens, kv, D, bs, dtype, policy, "cpu", seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(lens), h, D, generator=gen).to(dtype)
    kvn = (torch.randn(len(lens), 2 * kv, D, generator=gen) * 3).to(dtype)
    slots = torch.tensor([int(tables[i, (n - 1) // bs]) * bs + (n - 1) % bs for i, n in enumerate(lens)])
    seq = torch.tensor(lens, dtype=torch.int32)
    kc_r, vc_r = kq.clone(), vq.clone()
    write_kv_cache(kvn[:, :kv], kvn[:, kv:], kc_r, vc_r, slots)
    qd = q.float().clamp(-65504, 65504).half().float()
    ref = reference.paged_attention(
        qd, kv_quant.dequantize_cache(kc_r, D, dtype), kv_quant.dequantize_cache(vc_r, D, dtype), tables,
        [1] * len(lens), lens, D**-0.5, window,
    )  # fmt: skip
    kc, vc = kq.clone(), vq.clone()
    out = decode_merge_write.decode_with_merge_write(
        q, kvn, kc, vc, tables, seq, slots, D**-0.5, num_splits=2, sliding_window=window
    )
    assert torch.equal(kc, kc_r) and torch.equal(vc, vc_r)
    _compare(out, ref, dtype)
    if window:  # the window matters here: without it the output differs
        full = reference.paged_attention(
            qd, kv_quant.dequantize_cache(kc_r, D, dtype), kv_quant.dequantize_cache(vc_r, D, dtype), tables,
            [1] * len(lens), lens, D**-0.5, None,
        )  # fmt: skip
        assert rel_err(out, full) > TOL[dtype]


LENS_GPU = [2, 17, 64, 65, 66, 300, 64 * 40 + 5, 129, 1]  # 1: no older context (every split empty)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["", "vt", "vt3", "vtw", "vt3w", "rows"])
@pytest.mark.parametrize("h,kv", [(32, 8), (28, 4), (8, 8)])
@pytest.mark.parametrize("bs", [16, 64])
def test_cuda_kernel_excludes_the_newest_token_gpu(
    h: int, kv: int, bs: int, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA kernel over the older context, then the merge, against the two launches: every
    variant, with and without the early prologue, splits that do and do not divide the context."""
    monkeypatch.setenv(kv_int8_decode_cuda.VARIANT_ENV, variant)
    seen = spy_int8_decode_launches(monkeypatch)
    for dtype, splits, early in ((torch.bfloat16, 16, "1"), (torch.float16, 3, "0"), (torch.bfloat16, 2, "")):
        monkeypatch.setenv(kv_int8_decode_cuda.EARLY_ENV, early)
        s = _step(LENS_GPU, h, kv, bs, dtype, "cuda", pad=4)
        s["seq"][4] = 0  # a CUDA graph's padding row: length 0, slot -1
        kc_r, vc_r, ref = _reference({**s, "seq": s["seq"].clamp(min=1)}, kv, dtype)
        kc, vc = s["kq"].clone(), s["vq"].clone()
        out = decode_merge_write.decode_with_merge_write(
            s["q"], s["kv"], kc, vc, s["tables"], s["seq"], s["slots"], D**-0.5, num_splits=splits
        )
        assert torch.equal(kc, kc_r) and torch.equal(vc, vc_r)  # (the padding row wrote nothing)
        _compare(out, ref, dtype, skip=4)
        assert torch.isfinite(out[4]).all()
    assert seen and all(ok and a["exclude_newest"] for ok, a in seen), seen


@pytest.mark.gpu
def test_in_a_cuda_graph_gpu() -> None:
    """Captured once, replayed after the step's inputs change in place: the new token's row and the
    output follow the replayed inputs."""
    lens, h, kv, dtype, bs = [300, 2, 1000], 32, 8, torch.bfloat16, 16
    s = _step(lens, h, kv, bs, dtype, "cuda")
    kc, vc = s["kq"].clone(), s["vq"].clone()

    def run() -> torch.Tensor:
        return decode_merge_write.decode_with_merge_write(
            s["q"], s["kv"], kc, vc, s["tables"], s["seq"], s["slots"], D**-0.5, num_splits=8
        )

    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for _ in range(2):
        s["q"].copy_(torch.randn_like(s["q"].float()).to(dtype))
        s["kv"].copy_((torch.randn_like(s["kv"].float()) * 2).to(dtype))
        before = {**s, "kq": kc.clone(), "vq": vc.clone()}  # the last replay's token rows: stale now
        graph.replay()
        torch.cuda.synchronize()
        kc_r, vc_r, ref = _reference(before, kv, dtype)
        assert not torch.equal(kc_r, before["kq"])
        assert torch.equal(kc, kc_r) and torch.equal(vc, vc_r)
        _compare(out, ref, dtype)
