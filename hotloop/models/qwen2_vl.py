"""Qwen2-VL and Qwen2.5-VL (transformers' layouts): a native-resolution vision tower
(``hotloop.models.qwen2_vl_vision``) whose merged patches fill the ``<|image_pad|>`` tokens of a
Qwen2 decoder with M-RoPE.

M-RoPE: every token has three positions (temporal, height, width); ``rope_parameters.mrope_section``
says which frequencies each row drives. The runner computes a prompt's ``[3, P]`` positions from each
image's ``extra["mrope_grid"]`` (``hotloop.vl.mrope``) and passes ``[3, T]`` positions for steps
covering such a prompt, plain ``[T]`` positions otherwise (all three rows equal).

Checkpoints: transformers >= 4.52 saves ``model.visual.*`` / ``model.language_model.*`` /
``lm_head.*``; older ones (and the Hub's Qwen releases) ``visual.*`` / ``model.*`` / ``lm_head.*``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from hotloop.layers.rotary import MRotaryEmbedding
from hotloop.models.llama import DecoderArgs, LlamaForCausalLM
from hotloop.models.qwen2 import Qwen2ForCausalLM
from hotloop.models.qwen2_vl_vision import Qwen2VisionTransformer, VisionArgs
from hotloop.models.vision_language import VisionLanguageModel

DEFAULT_MROPE_SECTION = (16, 24, 24)  # transformers' default (head_dim 128)


def mrope_section_of(text_config: Any) -> tuple[int, ...]:
    params = getattr(text_config, "rope_parameters", None)
    if not isinstance(params, dict) or not params:
        params = getattr(text_config, "rope_scaling", None) or {}
    return tuple(int(s) for s in params.get("mrope_section") or DEFAULT_MROPE_SECTION)


class Qwen2VLTextForCausalLM(Qwen2ForCausalLM):
    """The Qwen2 decoder with M-RoPE; ``positions`` may be ``[T]`` or ``[3, T]``."""

    def __init__(self, hf_config: Any, dtype: torch.dtype) -> None:
        super().__init__(hf_config, dtype)
        self.model.rotary_emb = MRotaryEmbedding(
            self.args.head_dim, self.args.rope, mrope_section_of(hf_config)
        )

    @classmethod
    def decoder_args(cls, hf_config: Any) -> DecoderArgs:
        args = super().decoder_args(hf_config)
        # transformers' Qwen2-VL attention always uses hidden_size // num_heads
        return dataclasses.replace(args, head_dim=args.hidden_size // args.num_heads)


class Qwen2VLForConditionalGeneration(VisionLanguageModel):
    """Qwen2-VL: LayerNorm ViT blocks with a plain MLP, full attention in every block."""

    def __init__(self, hf_config: Any, dtype: torch.dtype) -> None:
        super().__init__(hf_config, dtype)
        args = self.vision_args(hf_config.vision_config)
        hidden = int(hf_config.text_config.hidden_size)
        if args.out_size != hidden:
            raise ValueError(
                f"the vision tower outputs {args.out_size} features; the language model's hidden size is {hidden}"
            )
        self.visual = Qwen2VisionTransformer(args, dtype)

    @classmethod
    def vision_args(cls, vision_config: Any) -> VisionArgs:
        return VisionArgs.qwen2_vl(vision_config)

    def build_language_model(self, text_config: Any, dtype: torch.dtype) -> LlamaForCausalLM:
        return Qwen2VLTextForCausalLM(text_config, dtype)

    def encode_images(self, pixel_values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each image's patches ``[t, h', w', m*m, patch_dim]`` -> ``[t * h' * w', hidden]``; all
        images go through the tower together (attention stays within each image)."""
        return self.visual(pixel_values)

    def canonical_name(self, name: str) -> str:
        if name.startswith("model.") and not name.startswith(("model.visual.", "model.language_model.")):
            return "language_model." + name  # the older layout: model.{embed_tokens,layers,norm}
        return super().canonical_name(name)


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    """Qwen2.5-VL: RMSNorm ViT blocks with a gated MLP and window attention outside
    ``fullatt_block_indexes``."""

    @classmethod
    def vision_args(cls, vision_config: Any) -> VisionArgs:
        return VisionArgs.qwen2_5_vl(vision_config)
