"""InternLM2: the Llama decoder under another checkpoint layout, mapped on load.

Its ``attention.wqkv`` packs q/k/v per KV-head group: for each KV head ``j`` the rows are
``[q_(j*g) .. q_(j*g+g-1), k_j, v_j]`` (``g = num_heads / num_kv_heads``, each ``head_dim`` rows).
``remap_weights`` unpacks that into Llama's q/k/v names, and renames everything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from hotloop.models.llama import DecoderArgs, LlamaForCausalLM

# InternLM2 name part -> Llama name part (matched on whole dotted segments).
_RENAMES = {
    "model.tok_embeddings.": "model.embed_tokens.",
    ".attention.wo.": ".self_attn.o_proj.",
    ".feed_forward.w1.": ".mlp.gate_proj.",
    ".feed_forward.w3.": ".mlp.up_proj.",
    ".feed_forward.w2.": ".mlp.down_proj.",
    ".attention_norm.": ".input_layernorm.",
    ".ffn_norm.": ".post_attention_layernorm.",
}


def unpack_wqkv(
    packed: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """wqkv weight ``[(H + 2*KV) * D, hidden]`` (or bias ``[(H + 2*KV) * D]``) -> q, k, v."""
    group = num_heads // num_kv_heads
    rest = packed.shape[1:]
    per_group = packed.reshape(num_kv_heads, group + 2, head_dim, *rest)
    q = per_group[:, :group].reshape(num_heads * head_dim, *rest)
    k = per_group[:, group].reshape(num_kv_heads * head_dim, *rest)
    v = per_group[:, group + 1].reshape(num_kv_heads * head_dim, *rest)
    return q, k, v


class InternLM2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_args(cls, hf_config: Any) -> DecoderArgs:
        bias = bool(getattr(hf_config, "bias", False))
        return DecoderArgs.from_hf(hf_config, qkv_bias=bias, o_bias=bias)

    def remap_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        a = self.args
        for name, tensor in weights:
            if name == "output.weight":
                yield "lm_head.weight", tensor
                continue
            if ".attention.wqkv." in name:
                q, k, v = unpack_wqkv(tensor, a.num_heads, a.num_kv_heads, a.head_dim)
                for part, t in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                    yield name.replace(".attention.wqkv.", f".self_attn.{part}."), t
                continue
            for old, new in _RENAMES.items():
                if old in name:
                    name = name.replace(old, new, 1)
                    break
            yield name, tensor
