"""The CLIP vision transformer as LLaVA uses it: hidden states of chosen layers, no pooling.

Only the layers up to the deepest one asked for are built (LLaVA reads the second to last), so a
checkpoint's later layers and its post-layernorm are skipped when loading.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "quick_gelu": _quick_gelu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class ClipEmbeddings(nn.Module):
    def __init__(self, vc: Any, dtype: torch.dtype) -> None:
        super().__init__()
        dim, patch = int(vc.hidden_size), int(vc.patch_size)
        self.num_patches = (int(vc.image_size) // patch) ** 2
        self.class_embedding = nn.Parameter(torch.empty(dim, dtype=dtype), requires_grad=False)
        self.patch_embedding = nn.Conv2d(
            int(getattr(vc, "num_channels", 3)), dim, patch, stride=patch, bias=False, dtype=dtype
        )
        self.position_embedding = nn.Embedding(self.num_patches + 1, dim, dtype=dtype)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` -> ``[B, 1 + patches, dim]`` (class token first)."""
        x = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)  # [B, patches, dim]
        if x.shape[1] != self.num_patches:
            raise ValueError(
                f"the image gives {x.shape[1]} patches; the vision tower takes {self.num_patches}"
            )
        cls = self.class_embedding.expand(x.shape[0], 1, -1)
        return torch.cat([cls, x], dim=1) + self.position_embedding.weight[None]


class ClipAttention(nn.Module):
    def __init__(self, vc: Any, dtype: torch.dtype) -> None:
        super().__init__()
        dim = int(vc.hidden_size)
        self.num_heads = int(vc.num_attention_heads)
        self.head_dim = dim // self.num_heads
        self.q_proj = nn.Linear(dim, dim, dtype=dtype)
        self.k_proj = nn.Linear(dim, dim, dtype=dtype)
        self.v_proj = nn.Linear(dim, dim, dtype=dtype)
        self.out_proj = nn.Linear(dim, dim, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # [B, N, dim] -> [B, heads, N, head_dim]
            return t.view(B, N, self.num_heads, self.head_dim).transpose(1, 2)

        o = F.scaled_dot_product_attention(
            heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        )
        return self.out_proj(o.transpose(1, 2).reshape(B, N, -1))


class ClipMLP(nn.Module):
    def __init__(self, vc: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc1 = nn.Linear(int(vc.hidden_size), int(vc.intermediate_size), dtype=dtype)
        self.fc2 = nn.Linear(int(vc.intermediate_size), int(vc.hidden_size), dtype=dtype)
        self.act = activation(str(getattr(vc, "hidden_act", "quick_gelu")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ClipEncoderLayer(nn.Module):
    def __init__(self, vc: Any, dtype: torch.dtype) -> None:
        super().__init__()
        eps = float(getattr(vc, "layer_norm_eps", 1e-5))
        self.layer_norm1 = nn.LayerNorm(int(vc.hidden_size), eps=eps, dtype=dtype)
        self.self_attn = ClipAttention(vc, dtype)
        self.layer_norm2 = nn.LayerNorm(int(vc.hidden_size), eps=eps, dtype=dtype)
        self.mlp = ClipMLP(vc, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class ClipEncoder(nn.Module):
    def __init__(self, vc: Any, num_layers: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ClipEncoderLayer(vc, dtype) for _ in range(num_layers))


class ClipVisionTower(nn.Module):
    """CLIP ViT that returns the hidden states at ``feature_layers`` (transformers' indexing:
    0 is the pre-layernormed embeddings, -1 the last layer's output)."""

    def __init__(self, vc: Any, feature_layers: Sequence[int], dtype: torch.dtype) -> None:
        super().__init__()
        total = int(vc.num_hidden_layers)
        self.feature_layers = [i if i >= 0 else total + 1 + i for i in feature_layers]
        if not all(0 <= i <= total for i in self.feature_layers):
            raise ValueError(f"vision_feature_layer {list(feature_layers)} is outside 0..{total}")
        self.total_layers = total
        self.embeddings = ClipEmbeddings(vc, dtype)
        eps = float(getattr(vc, "layer_norm_eps", 1e-5))
        self.pre_layrnorm = nn.LayerNorm(int(vc.hidden_size), eps=eps, dtype=dtype)
        self.encoder = ClipEncoder(vc, max(self.feature_layers), dtype)

    def skips_weight(self, name: str) -> bool:
        """Checkpoint tensors of layers past the deepest feature layer, and the unused post-norm."""
        if name.startswith("post_layernorm."):
            return True
        if name.startswith("encoder.layers."):
            return int(name.split(".")[2]) >= len(self.encoder.layers)
        return False

    def forward(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """``[B, 3, H, W]`` -> one ``[B, 1 + patches, dim]`` per feature layer."""
        h = self.pre_layrnorm(self.embeddings(pixel_values))
        states = [h]
        for layer in self.encoder.layers:
            h = layer(h)
            states.append(h)
        return [states[i] for i in self.feature_layers]
