"""Token embedding and LM head, tied and untied."""

from __future__ import annotations

import torch

from hotloop.layers.embedding import LMHead, VocabEmbedding


def test_tied_head_is_the_embedding_weight() -> None:
    emb = VocabEmbedding(50, 8, torch.float32)
    head = LMHead(50, 8, torch.float32, tie_to=emb)
    module = torch.nn.ModuleDict({"embed": emb, "head": head})
    assert [n for n, _ in module.named_parameters()] == ["embed.weight"]
    emb.weight.data.normal_()
    h = torch.randn(3, 8)
    torch.testing.assert_close(head(h), h @ emb.weight.T)


def test_untied_head_logits_are_float32() -> None:
    emb = VocabEmbedding(50, 8, torch.bfloat16)
    head = LMHead(50, 8, torch.bfloat16)
    assert head.weight is not emb.weight
    emb.weight.data.normal_()
    head.weight.data.normal_()
    x = emb(torch.tensor([1, 2, 49]))
    assert x.shape == (3, 8) and x.dtype == torch.bfloat16
    assert head(x).dtype == torch.float32


def test_head_logits_in_the_model_dtype_on_request() -> None:
    """``float32=False`` off the one-row path: the bf16 product itself, whose exact widening is the
    default float32 logits; its argmax is theirs (the decode graphs' greedy ids above 16 rows)."""
    head = LMHead(50, 8, torch.bfloat16)
    head.weight.data.normal_()
    x = torch.randn(20, 8).to(torch.bfloat16)
    low = head(x, float32=False)
    assert low.dtype == torch.bfloat16
    assert torch.equal(low.float(), head(x))
    assert torch.equal(low.argmax(-1), head(x).argmax(-1))


def test_greedy_logits_float32_follows_the_argmax_kernel() -> None:
    from hotloop.kernels import greedy_argmax, ops

    rows = greedy_argmax.MAX_ROWS
    assert ops.greedy_logits_float32(1) and ops.greedy_logits_float32(rows)
    assert not ops.greedy_logits_float32(rows + 1)
    was = ops._state["greedy_argmax"]
    ops.set_greedy_argmax(False)
    try:
        assert not ops.greedy_logits_float32(1)
    finally:
        ops.set_greedy_argmax(was)
