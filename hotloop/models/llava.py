"""LLaVA (llava-hf layout): CLIP vision tower -> 2-layer MLP projector -> a Llama-family decoder.

The decoder is our own (``hotloop.models.llama``), so image requests share the paged KV cache and
the batch with text. The runner merges ``encode_images`` output at the image-token positions and
passes the result as ``inputs_embeds``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from hotloop.models.clip import ClipVisionTower, activation
from hotloop.models.vision_language import VisionLanguageModel


class LlavaProjector(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, act: str, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, out_dim, bias=bias, dtype=dtype)
        self.act = activation(act)
        self.linear_2 = nn.Linear(out_dim, out_dim, bias=bias, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(VisionLanguageModel):
    def __init__(self, hf_config: Any, dtype: torch.dtype) -> None:
        super().__init__(hf_config, dtype)
        vc = hf_config.vision_config
        layers = hf_config.vision_feature_layer
        layers = [int(layers)] if isinstance(layers, int) else [int(i) for i in layers]
        self.select_strategy = str(getattr(hf_config, "vision_feature_select_strategy", "default"))
        if self.select_strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy={self.select_strategy!r} is not supported")
        self.vision_tower = ClipVisionTower(vc, layers, dtype)
        self.multi_modal_projector = LlavaProjector(
            int(vc.hidden_size) * len(layers),
            int(hf_config.text_config.hidden_size),
            str(getattr(hf_config, "projector_hidden_act", "gelu")),
            bool(getattr(hf_config, "multimodal_projector_bias", True)),
            dtype,
        )

    def encode_images(self, pixel_values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each image's ``[3, H, W]`` pixels -> its ``[num_image_tokens, hidden]`` embeddings (one
        batched tower pass per distinct image size)."""
        out: list[torch.Tensor | None] = [None] * len(pixel_values)
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(pixel_values):
            by_shape.setdefault(tuple(p.shape), []).append(i)
        device = self.multi_modal_projector.linear_1.weight.device
        for idx in by_shape.values():
            feats = self.project_patches(torch.stack([pixel_values[i] for i in idx]).to(device))
            for j, i in enumerate(idx):
                out[i] = feats[j]
        return [cast(torch.Tensor, o) for o in out]

    def project_patches(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` -> ``[B, tokens, hidden]``: the feature layer(s) (CLS dropped for the
        ``default`` strategy), concatenated, through the projector."""
        states = self.vision_tower(pixel_values)
        if self.select_strategy == "default":
            states = [s[:, 1:] for s in states]
        out: torch.Tensor = self.multi_modal_projector(torch.cat(states, dim=-1))
        return out

    def canonical_name(self, name: str) -> str:
        name = super().canonical_name(name)
        if name.startswith("vision_tower.vision_model."):  # llava-hf before transformers 5
            name = "vision_tower." + name[len("vision_tower.vision_model.") :]
        return name

    def skips_weight(self, name: str) -> bool:
        if name.startswith("vision_tower.") and self.vision_tower.skips_weight(name[len("vision_tower.") :]):
            return True
        return super().skips_weight(name)
