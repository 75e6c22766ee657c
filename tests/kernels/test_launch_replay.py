"""``kernels/launch_replay.py``: a layer's attention launches, recorded on one cache and replayed onto
another, give bit for bit what launching them directly on that cache gives (GPU); off where it cannot
work (CPU, interpreter, switch)."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")


def test_off_without_a_gpu_or_when_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from hotloop.kernels import launch_replay

    assert not launch_replay.available(torch.device("cpu"))
    monkeypatch.setenv("HOTLOOP_LAUNCH_REPLAY", "0")
    assert not launch_replay.available(torch.device("cuda", 0))


def test_a_plan_refuses_tensors_of_another_layout() -> None:
    from hotloop.kernels.launch_replay import LaunchPlan

    a, b = torch.zeros(4, 8), torch.zeros(4, 8)
    plan = LaunchPlan((a, b))
    plan._note(lambda *args: None, (a, b))
    assert plan.matches((torch.ones(4, 8), torch.ones(4, 8)))
    assert not plan.matches((torch.ones(4, 8), torch.ones(8, 4)))  # shape
    assert not plan.matches((torch.ones(4, 8), torch.ones(8, 4).T))  # strides
    assert not plan.matches((torch.ones(4, 8), torch.ones(4, 8, dtype=torch.float64)))  # dtype
    assert not plan.matches((torch.ones(4, 8),))
    with pytest.raises(ValueError, match="differ"):
        plan.replay((torch.ones(4, 8),))
    plan.valid = False
    assert not plan.matches((torch.ones(4, 8), torch.ones(4, 8)))


def _mixed_step(dev: torch.device, bs: int, H: int, KV: int, D: int, quant: int):  # type: ignore[no-untyped-def]
    """Three decodes (contexts 40, 17, 70) and two prefills (30 fresh tokens; 20 after 25 cached) as
    the runner lays them out, with random q/k/v, and three layers' random caches."""
    from hotloop.executor.kv_cache import allocate_kv_cache
    from hotloop.layers.attention import AttentionMetadata

    g = torch.Generator(device="cpu").manual_seed(0)
    seqs = [(40, 1), (17, 1), (70, 1), (30, 30), (45, 20)]  # (seq_len after the step, new tokens)
    nb = 64
    perm = torch.randperm(nb, generator=g).tolist()
    width = max(-(-s // bs) for s, _ in seqs)
    tables, slots, nxt = [], [], 0
    for s, n in seqs:
        row = perm[nxt : nxt + -(-s // bs)]
        nxt += len(row)
        tables.append(row + [0] * (width - len(row)))
        slots += [row[p // bs] * bs + p % bs for p in range(s - n, s)]
    T = sum(n for _, n in seqs)
    qstart = [0]
    for _, n in seqs:
        qstart.append(qstart[-1] + n)
    nd = 3
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
        query_lens=[n for _, n in seqs],
        seq_lens=[s for s, _ in seqs],
        seq_lens_t=torch.tensor([s for s, _ in seqs], dtype=torch.int32, device=dev),
        query_start_t=torch.tensor(qstart, dtype=torch.int32, device=dev),
        max_query_len=max(n for _, n in seqs),
        num_decodes=nd,
        prefill_query_start_t=torch.tensor([x - nd for x in qstart[nd:]], dtype=torch.int32, device=dev),
    )

    class _Cfg:
        num_kv_heads, head_dim, num_layers = KV, D, 3

    caches = allocate_kv_cache(_Cfg(), nb, bs, torch.bfloat16, dev, quant)  # type: ignore[arg-type]
    for kc, vc in caches:  # every layer's earlier context differs (quantized caches: filled by the test)
        if not quant:
            kc.copy_(torch.randn(kc.shape, generator=g).to(dev, torch.bfloat16))
            vc.copy_(torch.randn(vc.shape, generator=g).to(dev, torch.bfloat16))
    qkv = torch.randn(T, (H + 2 * KV) * D, generator=g).to(dev, torch.bfloat16)
    pos = torch.cat([torch.arange(s - n, s) for s, n in seqs]).to(dev)
    return meta, caches, qkv, pos, T


@pytest.mark.gpu
@pytest.mark.parametrize("quant", [0, 8, 4])
def test_replayed_attention_equals_direct_launches(quant: int) -> None:
    from hotloop.kernels import launch_replay
    from hotloop.layers.attention import PagedAttention

    dev = torch.device("cuda", 0)
    assert launch_replay.available(dev)
    H, KV, D, bs = 8, 2, 128, 16
    meta, caches, qkv0, pos, T = _mixed_step(dev, bs, H, KV, D, quant)
    if quant:  # real quantized context: write every slot of every cache through the kernels first
        from hotloop.kernels.rotary_kv_write import rotary_kv_write

        every = torch.arange(64 * bs, dtype=torch.int64, device=dev)
        g = torch.Generator(device="cpu").manual_seed(1)
        for kc, vc in caches:
            kv = torch.randn(every.numel(), 2, KV, D, generator=g).to(dev, torch.bfloat16)
            ones = torch.ones(every.numel(), D // 2, device=dev)
            zeros = torch.zeros(every.numel(), D // 2, device=dev)
            qd = torch.empty(every.numel(), H, D, dtype=torch.bfloat16, device=dev)
            rotary_kv_write(qd, kv[:, 0], kv[:, 1], ones, zeros, kc, vc, every)
    attn = PagedAttention(H, KV, D, D**-0.5)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    ang = pos.float()[:, None] * inv[None, :]
    cos_sin = (ang.cos(), ang.sin())
    qkv = torch.empty_like(qkv0)  # the static buffer: q is rotated in place, so refilled per layer
    q, k, v = qkv[:, : H * D], qkv[:, H * D : (H + KV) * D], qkv[:, (H + KV) * D :]
    out = torch.empty(T, H * D, dtype=torch.bfloat16, device=dev)
    direct = [(kc.clone(), vc.clone()) for kc, vc in caches]
    expected = []
    for cache in direct:
        qkv.copy_(qkv0)
        attn(q, k, v, cache, meta, cos_sin, out=out)
        expected.append(out.clone())

    qkv.copy_(qkv0)
    with launch_replay.record(caches[0]) as plan:
        attn(q, k, v, caches[0], meta, cos_sin, out=out)
    assert plan.valid and plan.matches(caches[1])
    assert len(plan.launches) == 4  # rotary + KV write, decode, merge, prefill
    got = [out.clone()]
    for cache in caches[1:]:
        qkv.copy_(qkv0)
        plan.replay(cache)
        got.append(out.clone())
    torch.cuda.synchronize()
    for i in range(3):
        assert torch.equal(got[i], expected[i]), f"layer {i}: attention output differs"
        assert torch.equal(caches[i][0], direct[i][0]) and torch.equal(caches[i][1], direct[i][1]), (
            f"layer {i}: cache contents differ"
        )
    assert not torch.equal(expected[1], expected[2])  # the layers' contexts differ, and so do outputs


@pytest.mark.gpu
def test_a_view_of_a_swappable_tensor_invalidates_the_plan() -> None:
    from hotloop.kernels import launch_replay
    from hotloop.kernels.launch_replay import _probe_kernel

    dev = torch.device("cuda", 0)
    x, y = torch.ones(64, device=dev), torch.empty(64, device=dev)
    with launch_replay.record((x, y)) as plan:
        _probe_kernel[(1,)](x[:32], y, 32, 1.0, BLOCK=64)
    assert not plan.valid


def test_a_replay_swaps_the_recorded_tensors_in_place() -> None:
    """The swap bookkeeping, with a stand-in launcher: the recorded arguments, the swappable tensors
    replaced where they stood, the others (and non-tensors) passed as recorded."""
    from hotloop.kernels.launch_replay import LaunchPlan

    k0, v0, q = torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(2, 8)
    calls: list[tuple[object, ...]] = []
    plan = LaunchPlan((k0, v0))
    plan._note(lambda *a: calls.append(a), (7, q, k0, "meta", v0, 3))
    plan._note(lambda *a: calls.append(a), (q, 5))
    assert plan.slots == [(0, 2, 0), (0, 4, 1)] and plan.valid
    k1, v1 = torch.ones(4, 8), torch.ones(4, 8)
    plan.replay((k1, v1))
    assert calls[0][2] is k1 and calls[0][4] is v1 and calls[0][1] is q
    assert calls[0][0] == 7 and calls[0][3] == "meta" and calls[0][5] == 3
    assert calls[1][0] is q and calls[1][1] == 5
    view = LaunchPlan((k0, v0))
    view._note(lambda *a: None, (k0[1:],))  # a view would keep reading the recorded tensor
    assert not view.valid


def test_an_empty_or_nested_recording_is_not_replayed() -> None:
    import triton

    from hotloop.kernels import launch_replay

    method = triton.runtime.JITFunction.run
    with launch_replay.record((torch.zeros(2),)) as outer:
        with launch_replay.record((torch.zeros(2),)) as inner:
            pass
    assert triton.runtime.JITFunction.run is method  # restored
    assert not outer.valid  # it would miss the inner body's launches
    assert inner.valid and not inner.matches((torch.zeros(2),))  # valid, but nothing to replay


def test_marking_a_kernel_twice_records_its_launches_once() -> None:
    import triton

    from hotloop.kernels.launch_replay import recordable

    def body(x_ptr):  # never compiled here
        pass

    fn = triton.runtime.JITFunction(body)
    run = recordable(fn).run
    assert recordable(fn).run is run and fn._hotloop_recordable
