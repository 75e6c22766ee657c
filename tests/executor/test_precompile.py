"""``precompile_attention`` (run on the CPU with the launchers recorded): every decode split count
and both prefill tiles, with the arguments laid out as a step lays them out, so that Triton's
specializations (an integer's divisibility by 16, a stride of 1) match the step's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hotloop.executor.gpu_runner import precompile_attention
from hotloop.kernels import paged_decode_attention as dec
from hotloop.kernels import paged_prefill_attention as pre
from hotloop.layers.attention import PagedAttention


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
        self.attn = nn.ModuleList([PagedAttention(4, 2, 16, 0.25), PagedAttention(4, 2, 16, 0.25)])


def test_precompile_uses_the_step_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    def decode(q, k, v, tables, seq, scale, window, splits, **kw):  # type: ignore[no-untyped-def]
        calls.append(("decode", (splits, tables.stride(0), q.stride(0), int(seq.sum()))))

    def prefill(q, k, v, tables, seq, starts, max_q, scale, window, **kw):  # type: ignore[no-untyped-def]
        calls.append(("prefill", (max_q, tables.stride(0), int(seq.sum()))))

    monkeypatch.setattr(dec, "paged_decode_attention", decode)
    monkeypatch.setattr(pre, "paged_prefill_attention", prefill)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    cache = torch.zeros(4, 8, 2, 16, dtype=torch.bfloat16)
    precompile_attention(_Model(), [(cache, cache), (cache, cache)], torch.device("cpu"), table_width=37)
    # one distinct layer configuration: each variant once, tables with the buffers' row stride, q a
    # view of the q/k/v output ((4 + 2 * 2) heads of 16), and no token read (seq_len 0)
    assert calls == [("decode", (s, 37, 8 * 16, 0)) for s in dec.SPLIT_CHOICES] + [
        ("prefill", (1, 37, 0)),
        ("prefill", (64, 37, 0)),
    ]
