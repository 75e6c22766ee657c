"""LLaVA (llava-hf layout): CLIP vision tower -> 2-layer MLP projector -> a Llama-family decoder.

The decoder is our own (``hotloop.models.llama``), so image requests share the paged KV cache and
the batch with text. The runner merges ``encode_images`` output at the image-token positions and
passes the result as ``inputs_embeds``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import torch
from torch import nn

from hotloop.layers.attention import AttentionMetadata
from hotloop.models.clip import ClipVisionTower, activation
from hotloop.models.llama import KVCache, LlamaForCausalLM
from hotloop.models.registry import get_model_class

# text_config.model_type -> the architecture that serves it
TEXT_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


def text_model_class(text_config: Any) -> type[LlamaForCausalLM]:
    model_type = str(getattr(text_config, "model_type", "llama"))
    arch = TEXT_ARCHITECTURES.get(model_type)
    if arch is None:
        raise ValueError(
            f"LLaVA with a {model_type!r} language model is not supported; supported: {sorted(TEXT_ARCHITECTURES)}"
        )
    return cast(type[LlamaForCausalLM], get_model_class(arch))


class LlavaProjector(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, act: str, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, out_dim, bias=bias, dtype=dtype)
        self.act = activation(act)
        self.linear_2 = nn.Linear(out_dim, out_dim, bias=bias, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


def _canonical_name(name: str) -> str:
    """Every llava-hf checkpoint layout -> ours (``vision_tower.*``, ``multi_modal_projector.*``,
    ``language_model.model.*``, ``language_model.lm_head.*``)."""
    if name.startswith("model."):  # transformers >= 4.52: model.{vision_tower,language_model,...}
        name = name[len("model.") :]
        if name.startswith("language_model.") and not name.startswith("language_model.model."):
            name = "language_model.model." + name[len("language_model.") :]
    if name.startswith("lm_head."):
        name = "language_model." + name
    if name.startswith("vision_tower.vision_model."):
        name = "vision_tower." + name[len("vision_tower.vision_model.") :]
    return name


class LlavaForConditionalGeneration(nn.Module):
    def __init__(self, hf_config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = hf_config
        text_config = hf_config.text_config
        vc = hf_config.vision_config
        layers = hf_config.vision_feature_layer
        layers = [int(layers)] if isinstance(layers, int) else [int(i) for i in layers]
        self.select_strategy = str(getattr(hf_config, "vision_feature_select_strategy", "default"))
        if self.select_strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy={self.select_strategy!r} is not supported")
        self.image_token_id = int(hf_config.image_token_id)
        self.language_model = text_model_class(text_config)(text_config, dtype)
        self.vision_tower = ClipVisionTower(vc, layers, dtype)
        self.multi_modal_projector = LlavaProjector(
            int(vc.hidden_size) * len(layers),
            int(text_config.hidden_size),
            str(getattr(hf_config, "projector_hidden_act", "gelu")),
            bool(getattr(hf_config, "multimodal_projector_bias", True)),
            dtype,
        )

    # -- the runner's contract -------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.language_model.model(input_ids, positions, kv_caches, meta, inputs_embeds=inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.model.embed_tokens(input_ids)

    def encode_images(self, pixel_values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each image's ``[3, H, W]`` pixels -> its ``[num_image_tokens, hidden]`` embeddings (one
        batched tower pass per distinct image size)."""
        out: list[torch.Tensor | None] = [None] * len(pixel_values)
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(pixel_values):
            by_shape.setdefault(tuple(p.shape), []).append(i)
        device = self.multi_modal_projector.linear_1.weight.device
        for idx in by_shape.values():
            batch = torch.stack([pixel_values[i] for i in idx]).to(device)
            states = self.vision_tower(batch)
            if self.select_strategy == "default":
                states = [s[:, 1:] for s in states]
            feats = self.multi_modal_projector(torch.cat(states, dim=-1))  # [B, tokens, hidden]
            for j, i in enumerate(idx):
                out[i] = feats[j]
        return [cast(torch.Tensor, o) for o in out]

    # -- weights -----------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        text: list[tuple[str, torch.Tensor]] = []
        for ckpt_name, tensor in weights:
            name = _canonical_name(ckpt_name)
            if name.startswith("language_model."):
                text.append((name[len("language_model.") :], tensor))
                continue
            if name.startswith("vision_tower.") and self.vision_tower.skips_weight(
                name[len("vision_tower.") :]
            ):
                continue
            if name.endswith("position_ids"):
                continue
            param = params.get(name)
            if param is None:
                raise ValueError(f"checkpoint tensor {ckpt_name!r} matches no LLaVA parameter")
            if param.shape != tensor.shape:
                raise ValueError(
                    f"checkpoint tensor {ckpt_name!r} has shape {tuple(tensor.shape)}, "
                    f"parameter {name!r} has {tuple(param.shape)}"
                )
            param.data.copy_(tensor)
            loaded.add(name)
        loaded |= {"language_model." + k for k in self.language_model.load_weights(text)}
        return loaded
