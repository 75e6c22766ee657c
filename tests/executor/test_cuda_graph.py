"""``executor/cuda_graph.py`` without a GPU: which batch buckets get a short-context decode graph
(``wants_short_graph``), which graph a step replays (``DecodeGraphs.key_for``), and the
``HOTLOOP_DECODE_SHORT_CONTEXT`` setting. The capture and replay run in the GPU tests
(``tests/engine/test_multi_step.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hotloop.executor import cuda_graph
from hotloop.executor.cuda_graph import SHORT_SPLITS, DecodeGraphs, short_context_from_env, wants_short_graph
from hotloop.kernels import paged_decode_attention as pda
from hotloop.layers.attention import PagedAttention


def _model(num_kv_heads: int, head_dim: int = 64, layers: int = 2) -> nn.Module:
    m = nn.Module()
    m.layers = nn.ModuleList(
        PagedAttention(3 * num_kv_heads, num_kv_heads, head_dim, 0.125) for _ in range(layers)
    )
    return m


def _caches(dtype: torch.dtype, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    c = torch.zeros(2, 4, 1, 8, dtype=dtype)
    return [(c, c) for _ in range(layers)]


def test_wants_short_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bucket 1 of a 16-bit cache whose plan takes more than ``SHORT_SPLITS`` splits; not other
    buckets, not a quantized cache, not a model without paged attention, not where the splits are
    capped at ``SHORT_SPLITS`` already."""
    monkeypatch.setattr(pda, "MAX_SPLITS", 16)
    monkeypatch.setattr(pda, "FUSE_MERGE", None)
    bf16 = _caches(torch.bfloat16)
    assert pda.decode_plan(1, 3, 0, 64)[0] == 16 > SHORT_SPLITS
    assert wants_short_graph(_model(3), bf16, 1)
    assert wants_short_graph(_model(8, 128), bf16, 1)
    assert not wants_short_graph(_model(3), bf16, 2)  # measured at batch 1 only
    assert not wants_short_graph(_model(3), _caches(torch.uint8), 1)
    assert not wants_short_graph(nn.Linear(2, 2), bf16, 1)
    assert not wants_short_graph(_model(3), [], 1)
    monkeypatch.setattr(pda, "MAX_SPLITS", SHORT_SPLITS)  # HOTLOOP_DECODE_MAX_SPLITS=8: nothing to gain
    assert not wants_short_graph(_model(3), bf16, 1)


def test_decode_plan_caps_the_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short-context graph's cap lowers the split count, and the doubled fused-merge plan with it."""
    monkeypatch.setattr(pda, "MAX_SPLITS", 16)
    monkeypatch.setattr(pda, "FUSE_MERGE", None)
    assert pda.decode_plan(1, 3, 0, 64) == (16, False)
    assert pda.decode_plan(1, 3, 0, 64, 2, max_splits=8) == (8, False)
    assert pda.decode_plan(16, 8) == (4, True)  # twice num_decode_splits' 2, merged in the launch
    assert pda.decode_plan(16, 8, max_splits=4) == (4, True)
    assert pda.decode_plan(16, 8, max_splits=2) == (2, False)  # no room to double
    assert pda.decode_plan(256, 8, max_splits=8) == (1, False)
    monkeypatch.setattr(pda, "MAX_SPLITS", 4)  # HOTLOOP_DECODE_MAX_SPLITS is the lower cap
    assert pda.decode_plan(1, 3, 0, 64, 2, max_splits=8) == (4, False)
    with pytest.raises(ValueError, match="max_splits=3"):
        pda.decode_plan(1, 3, max_splits=3)


def _graphs(short_context: int, short_buckets: tuple[int, ...]) -> DecodeGraphs:
    g = DecodeGraphs.__new__(DecodeGraphs)  # the selection alone: nothing is captured
    g.short_context = short_context
    g.short_buckets = frozenset(short_buckets)
    return g


def test_key_for() -> None:
    g = _graphs(1024, (1,))
    assert g.key_for(1, 1) == (1, SHORT_SPLITS)
    assert g.key_for(1, 1024) == (1, SHORT_SPLITS)
    assert g.key_for(1, 1025) == (1, None)
    assert g.key_for(1, None) == (1, None)  # context unknown: the graph for any context
    assert g.key_for(2, 10) == (2, None)  # no short graph at this bucket
    assert _graphs(0, ()).key_for(1, 1) == (1, None)


def test_short_context_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOTLOOP_DECODE_SHORT_CONTEXT", raising=False)
    assert short_context_from_env() == cuda_graph.DEFAULT_SHORT_CONTEXT
    monkeypatch.setenv("HOTLOOP_DECODE_SHORT_CONTEXT", "0")
    assert short_context_from_env() == 0
    monkeypatch.setenv("HOTLOOP_DECODE_SHORT_CONTEXT", " 512 ")
    assert short_context_from_env() == 512
    monkeypatch.setenv("HOTLOOP_DECODE_SHORT_CONTEXT", "")
    assert short_context_from_env() == cuda_graph.DEFAULT_SHORT_CONTEXT
    for bad in ("-1", "1k", "1.5"):
        monkeypatch.setenv("HOTLOOP_DECODE_SHORT_CONTEXT", bad)
        with pytest.raises(ValueError, match="HOTLOOP_DECODE_SHORT_CONTEXT"):
            short_context_from_env()
