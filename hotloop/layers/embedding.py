"""Token embedding and the LM head (optionally tied to the embedding's weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hotloop.layers.linear import default_weight_loader, set_weight_loader


class VocabEmbedding(nn.Module):
    """``input_ids [T]`` -> ``[T, hidden]``."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)
        set_weight_loader(self.weight, default_weight_loader)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    """``hidden [N, hidden]`` -> float32 logits ``[N, vocab]``.

    With ``tie_to`` the head shares (is) the embedding's weight Parameter, so it is loaded once,
    under the embedding's name, and ``named_parameters()`` lists it once.
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        dtype: torch.dtype | None = None,
        tie_to: VocabEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tied = tie_to is not None
        if tie_to is not None:
            if tie_to.weight.shape != (vocab_size, hidden_size):
                raise ValueError(
                    f"cannot tie LM head [{vocab_size}, {hidden_size}] to {tuple(tie_to.weight.shape)}"
                )
            self.weight = tie_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)
            set_weight_loader(self.weight, default_weight_loader)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight).float()
