"""Qwen2 / Qwen2.5: the Llama decoder with q/k/v biases (no o_proj bias).

Sliding window only where the config enables it: ``use_sliding_window`` and ``layer_types``
(transformers derives those from ``max_window_layers``); see ``layer_sliding_windows``.
"""

from __future__ import annotations

from typing import Any

from hotloop.models.llama import DecoderArgs, LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_args(cls, hf_config: Any) -> DecoderArgs:
        return DecoderArgs.from_hf(hf_config, qkv_bias=True, o_bias=False)
