"""``executor/cuda_graph.py`` without a GPU: which short-context decode graphs a batch bucket gets
(``short_limits``), which graph a step replays (``DecodeGraphs.key_for``), and the
``HOTLOOP_DECODE_SHORT_GRAPHS`` setting. The capture and replay run in the GPU tests
(``tests/engine/test_multi_step.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hotloop.executor.cuda_graph import DecodeGraphs, short_graphs_from_env, short_limits
from hotloop.kernels import kv_quant
from hotloop.kernels import paged_decode_attention as pda
from hotloop.layers.attention import PagedAttention


def _model(num_kv_heads: int, head_dim: int = 64, layers: int = 2) -> nn.Module:
    m = nn.Module()
    m.layers = nn.ModuleList(
        PagedAttention(3 * num_kv_heads, num_kv_heads, head_dim, 0.125) for _ in range(layers)
    )
    return m


def _caches(dtype: torch.dtype, layers: int = 2, row: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    c = torch.zeros(2, 4, 1, row, dtype=dtype)
    return [(c, c) for _ in range(layers)]


def _int_caches(head_dim: int, policy: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A 16-bit model's int8 / int4 cache rows (codes, then the scale and zero point)."""
    return _caches(torch.uint8, row=kv_quant.row_bytes(head_dim, policy, 2))


def test_short_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buckets 1, 2 and 4 of a 16-bit cache get a graph per cap below their planned split count, each
    up to ``cap`` decode tiles (64 keys at head dim 64 or 128, 32 at 256); not larger buckets, not a
    quantized or float32 cache, not a model without paged attention."""
    monkeypatch.setattr(pda, "MAX_SPLITS", 16)
    monkeypatch.setattr(pda, "FUSE_MERGE", None)
    bf16 = _caches(torch.bfloat16)
    assert pda.decode_plan(1, 3, 0, 64)[0] == 16
    want = {1: 64, 2: 128, 4: 256, 8: 512}
    assert short_limits(_model(3), bf16, 1) == want
    assert list(short_limits(_model(3), bf16, 1)) == [1, 2, 4, 8]  # fewest splits first
    assert short_limits(_model(8, 128), bf16, 1) == want
    assert short_limits(_model(2, 256), bf16, 1) == {c: 32 * c for c in want}
    assert short_limits(_model(3), bf16, 4) == want  # 4 x 3 KV heads: 16 splits planned
    assert short_limits(_model(8, 128), bf16, 4) == {1: 64, 2: 128, 4: 256}  # 8 planned
    assert short_limits(_model(3), bf16, 8) == {}  # not a small batch
    assert short_limits(_model(3), _caches(torch.float16), 1) == want
    assert short_limits(_model(3), _caches(torch.uint8), 1) == {}  # a row of neither format
    assert short_limits(_model(3), _int_caches(64, 4), 1) == {}  # int4: not timed
    assert short_limits(_model(3), _caches(torch.float32), 1) == {}  # not timed
    assert short_limits(nn.Linear(2, 2), bf16, 1) == {}
    assert short_limits(_model(3), [], 1) == {}
    monkeypatch.setattr(pda, "MAX_SPLITS", 4)  # HOTLOOP_DECODE_MAX_SPLITS=4: the caps below it
    assert short_limits(_model(3), bf16, 1) == {1: 64, 2: 128}


def test_short_limits_int8(monkeypatch: pytest.MonkeyPatch) -> None:
    """An int8 cache gets caps 8 and 4 only (``SHORT_CAPS_INT8``), counted in the tiles of the kernel
    that runs: off the GPU (and at head dim 64 anywhere) the Triton kernel's 32 keys, the CUDA int8
    kernel's 64 where it takes the launch."""
    monkeypatch.setattr(pda, "MAX_SPLITS", 16)
    monkeypatch.setattr(pda, "FUSE_MERGE", None)
    assert pda.decode_plan(1, 3, 8, 64)[0] == 16
    assert short_limits(_model(3), _int_caches(64, 8), 1) == {4: 128, 8: 256}
    assert short_limits(_model(8, 128), _int_caches(128, 8), 1) == {4: 128, 8: 256}
    assert short_limits(_model(3), _int_caches(64, 8), 8) == {}
    from hotloop.kernels import kv_int8_decode_cuda

    asked: list[bool] = []

    def takes(*a: object) -> bool:  # as on an H200 with nvcc, where a merge is not fused in
        asked.append(bool(a[-1]))
        return not a[-1]

    monkeypatch.setattr(kv_int8_decode_cuda, "takes", takes)
    assert short_limits(_model(8, 128), _int_caches(128, 8), 1) == {4: 256, 8: 512}
    assert asked and not any(asked)
    monkeypatch.setattr(pda, "FUSE_MERGE", True)  # HOTLOOP_DECODE_FUSED_MERGE=1: Triton's tiles
    assert short_limits(_model(8, 128), _int_caches(128, 8), 1) == {4: 128, 8: 256}
    monkeypatch.setattr(pda, "FUSE_MERGE", None)
    monkeypatch.setattr(pda, "MAX_SPLITS", 8)  # HOTLOOP_DECODE_MAX_SPLITS=8: cap 4 alone
    assert short_limits(_model(8, 128), _int_caches(128, 8), 1) == {4: 256}


def test_short_limits_leave_out_caps_that_never_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cap whose limit is no longer than a smaller cap's would never be chosen, so none is captured:
    Triton's int8 kernel takes 64-key tiles at one split and 32 with more (1 x 64 = 2 x 32)."""
    from hotloop.executor import cuda_graph

    monkeypatch.setattr(pda, "MAX_SPLITS", 16)
    monkeypatch.setattr(pda, "FUSE_MERGE", None)
    monkeypatch.setattr(cuda_graph, "SHORT_CAPS_INT8", (8, 4, 2, 1))
    assert short_limits(_model(3), _int_caches(64, 8), 1) == {1: 64, 4: 128, 8: 256}


def test_decode_plan_caps_the_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short-context graph's cap lowers the split count, and the doubled fused-merge plan with it."""
    monkeypatch.setattr(pda, "MAX_SPLITS", 16)
    monkeypatch.setattr(pda, "FUSE_MERGE", None)
    assert pda.decode_plan(1, 3, 0, 64) == (16, False)
    assert pda.decode_plan(1, 3, 0, 64, 2, max_splits=8) == (8, False)
    assert pda.decode_plan(1, 3, 0, 64, 2, max_splits=1) == (1, False)
    assert pda.decode_plan(16, 8) == (4, True)  # twice num_decode_splits' 2, merged in the launch
    assert pda.decode_plan(16, 8, max_splits=4) == (4, True)
    assert pda.decode_plan(16, 8, max_splits=2) == (2, False)  # no room to double
    assert pda.decode_plan(256, 8, max_splits=8) == (1, False)
    monkeypatch.setattr(pda, "MAX_SPLITS", 4)  # HOTLOOP_DECODE_MAX_SPLITS is the lower cap
    assert pda.decode_plan(1, 3, 0, 64, 2, max_splits=8) == (4, False)
    for bad in (3, 24, 32):
        with pytest.raises(ValueError, match=f"max_splits={bad}"):
            pda.decode_plan(1, 3, max_splits=bad)


def _graphs(limits: dict[int, dict[int, int]]) -> DecodeGraphs:
    g = DecodeGraphs.__new__(DecodeGraphs)  # the selection alone: nothing is captured
    g.short_limits = limits
    return g


def test_key_for() -> None:
    g = _graphs({1: {1: 64, 2: 128, 4: 256, 8: 512}})
    assert [g.key_for(1, n) for n in (1, 64, 65, 128, 129, 256, 257, 512)] == [
        (1, 1), (1, 1), (1, 2), (1, 2), (1, 4), (1, 4), (1, 8), (1, 8)
    ]  # fmt: skip
    assert g.key_for(1, 513) == (1, None)
    assert g.key_for(1, None) == (1, None)  # context unknown: the graph for any context
    assert g.key_for(2, 10) == (2, None)  # no short graphs at this bucket
    assert _graphs({1: {8: 512}}).key_for(1, 3) == (1, 8)
    assert _graphs({1: {8: 512, 2: 128}}).key_for(1, 100) == (1, 2)  # fewest splits, whatever the order
    assert _graphs({}).key_for(1, 1) == (1, None)


def test_short_graphs_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOTLOOP_DECODE_SHORT_GRAPHS", raising=False)
    assert short_graphs_from_env()
    for raw, want in (("0", False), ("1", True), (" 0 ", False), ("", True)):
        monkeypatch.setenv("HOTLOOP_DECODE_SHORT_GRAPHS", raw)
        assert short_graphs_from_env() is want
    for bad in ("2", "on", "no"):
        monkeypatch.setenv("HOTLOOP_DECODE_SHORT_GRAPHS", bad)
        with pytest.raises(ValueError, match="HOTLOOP_DECODE_SHORT_GRAPHS"):
            short_graphs_from_env()


def test_step_kinds_time_each_graph_apart() -> None:
    """``--jit-schedule``'s step-time estimates keep a bucket's short-context graphs apart (their
    speeds differ), and a bucket without them keeps its one kind."""
    from types import SimpleNamespace

    from hotloop.executor.gpu_runner import GpuModelRunner

    runner = GpuModelRunner.__new__(GpuModelRunner)  # the kind alone: nothing is built
    runner.graphs = _graphs({1: {1: 64, 8: 512}})

    def out(*contexts: int) -> SimpleNamespace:
        return SimpleNamespace(scheduled=[SimpleNamespace(start=c - 1, num_tokens=1) for c in contexts])

    assert runner._step_kind(out(64), 1) == ("graph/1", 1)
    assert runner._step_kind(out(65), 1) == ("graph/8", 1)
    assert runner._step_kind(out(600), 1) == ("graph", 1)
    assert runner._step_kind(out(10, 20), 2) == ("graph", 2)
    assert runner._step_kind(SimpleNamespace(scheduled=[SimpleNamespace(start=0, num_tokens=5)]), None) == (
        "eager",
        8,
    )
