"""Which decode launches ``PagedAttention`` asks for (run on the CPU with the kernels recorded): the
decode graphs' metadata leaves the split count and merge to ``decode_plan``; eager decode steps and
the decodes of a mixed step keep the warmed launches (``num_decode_splits``, a merge launch)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hotloop.kernels import ops
from hotloop.kernels import paged_decode_attention as dec
from hotloop.kernels import paged_prefill_attention as pre
from hotloop.kernels import rotary_kv_write as rkw
from hotloop.layers.attention import AttentionMetadata, PagedAttention


def test_only_graph_steps_take_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, Any]] = []

    def decode(q, k, v, tables, seq, scale, window=None, num_splits=None, **kw):  # type: ignore[no-untyped-def]
        seen.append((num_splits, kw.get("fuse_merge"), kw.get("graph_plan", False)))
        return kw["out"] if kw.get("out") is not None else torch.zeros_like(q)

    monkeypatch.setattr(dec, "paged_decode_attention", decode)
    monkeypatch.setattr(pre, "paged_prefill_attention", lambda *a, **k: None)
    monkeypatch.setattr(rkw, "rotary_kv_write", lambda *a, **k: None)
    monkeypatch.setattr(ops, "use_triton", lambda x: True)
    attn = PagedAttention(4, 2, 16, 0.25)
    cache = torch.zeros(4, 8, 2, 16)
    t = 3
    q, k, v = torch.zeros(t, 64), torch.zeros(t, 32), torch.zeros(t, 32)
    ints = torch.zeros(t + 1, dtype=torch.int32)

    def meta(**kw: Any) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=torch.zeros(t, dtype=torch.long),
            block_tables=torch.zeros(t, 2, dtype=torch.int32),
            query_lens=[1] * t,
            seq_lens=[1] * t,
            seq_lens_t=ints[:t],
            query_start_t=ints,
            max_query_len=1,
            **kw,
        )

    graph, eager = meta(decode_only=True, graph=True), meta(decode_only=True)
    mixed = meta(num_decodes=2, prefill_query_start_t=ints[:2])
    for m in (graph, eager, mixed):
        attn._forward_triton(q, k, v, (cache, cache), m, None)
    attn.attend(q, (cache, cache), graph)
    attn.attend(q, (cache, cache), eager)
    # only a graph's metadata asks for the plan; nobody passes a split count or merge of their own
    # (the launcher's default is HOTLOOP_DECODE_FUSED_MERGE=1 or not)
    plan, plain = (None, None, True), (None, None, False)
    assert seen == [plan, plain, plain, plan, plain]
