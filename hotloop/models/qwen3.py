"""Qwen3: the Llama decoder with per-head q/k RMSNorm before rotary, explicit ``head_dim`` and
``attention_bias`` (on q/k/v and o)."""

from __future__ import annotations

from typing import Any

from hotloop.models.llama import DecoderArgs, LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_args(cls, hf_config: Any) -> DecoderArgs:
        bias = bool(getattr(hf_config, "attention_bias", False))
        return DecoderArgs.from_hf(hf_config, qkv_bias=bias, o_bias=bias, qk_norm=True)
