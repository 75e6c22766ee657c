"""Token embedding and the LM head (optionally tied to the embedding's weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hotloop.kernels import ops
from hotloop.layers.linear import default_weight_loader, set_weight_loader


class VocabEmbedding(nn.Module):
    """``input_ids [T]`` -> ``[T, hidden]``.

    ``offload_to_host()`` moves the table into pinned host memory; ids on a GPU are then looked up
    there by ``kernels/embedding_gather.py`` (only the looked-up rows cross PCIe)."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)
        set_weight_loader(self.weight, default_weight_loader)

    @property
    def on_host(self) -> bool:
        return self.weight.device.type == "cpu"

    def offload_to_host(self) -> None:
        """Keep the table in pinned host memory from now on (the device copy is freed)."""
        if self.on_host:
            return
        w = self.weight.detach()
        host = torch.empty(w.shape, dtype=w.dtype, pin_memory=True).copy_(w)  # one host copy, pinned
        self.weight = nn.Parameter(host, requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.is_cuda and self.on_host:
            from hotloop.kernels.embedding_gather import embedding_gather

            return embedding_gather(input_ids, self.weight)
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    """``hidden [N, hidden]`` -> float32 logits ``[N, vocab]`` (``float32=False``: the weight's dtype
    allowed, see ``ops.lm_head_logits``).

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

    def forward(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        return ops.lm_head_logits(hidden, self.weight, float32)
