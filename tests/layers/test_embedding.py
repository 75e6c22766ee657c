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
