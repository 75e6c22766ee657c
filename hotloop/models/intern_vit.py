"""InternViT, the vision encoder of InternVL (transformers' ``InternVLVisionModel`` layout).

A pre-norm ViT with a class token, absolute position embeddings, layer scale (``lambda_1/2``) and
optional q/k RMSNorm; LayerNorm or RMSNorm blocks. Tiles are fixed-size, so position embeddings are
used as they are (no interpolation).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hotloop.models.clip import activation


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (list, tuple)) else (int(v), int(v))


class VisionRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _norm(vc: Any, dim: int, dtype: torch.dtype) -> nn.Module:
    eps = float(getattr(vc, "layer_norm_eps", 1e-6))
    kind = str(getattr(vc, "norm_type", "layer_norm"))
    if kind == "rms_norm":
        return VisionRMSNorm(dim, eps, dtype)
    if kind != "layer_norm":
        raise ValueError(f"InternViT norm_type={kind!r} is not supported")
    return nn.LayerNorm(dim, eps=eps, dtype=dtype)


class InternPatchEmbeddings(nn.Module):
    def __init__(self, channels: int, dim: int, patch: tuple[int, int], dtype: torch.dtype) -> None:
        super().__init__()
        self.projection = nn.Conv2d(channels, dim, patch, stride=patch, dtype=dtype)


class InternVisionEmbeddings(nn.Module):
    def __init__(self, vc: Any, dtype: torch.dtype) -> None:
        super().__init__()
        dim = int(vc.hidden_size)
        (ih, iw), (ph, pw) = _pair(vc.image_size), _pair(vc.patch_size)
        self.num_patches = (ih // ph) * (iw // pw)
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim, dtype=dtype), requires_grad=False)
        self.patch_embeddings = InternPatchEmbeddings(
            int(getattr(vc, "num_channels", 3)), dim, (ph, pw), dtype
        )
        self.position_embeddings: nn.Parameter | None = None
        if getattr(vc, "use_absolute_position_embeddings", True):
            self.position_embeddings = nn.Parameter(
                torch.empty(1, self.num_patches + 1, dim, dtype=dtype), requires_grad=False
            )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        proj = self.patch_embeddings.projection
        x = proj(pixel_values.to(proj.weight.dtype)).flatten(2).transpose(1, 2)  # [B, patches, dim]
        if x.shape[1] != self.num_patches:
            raise ValueError(f"a tile gives {x.shape[1]} patches; InternViT takes {self.num_patches}")
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x if self.position_embeddings is None else x + self.position_embeddings


class InternVisionAttention(nn.Module):
    def __init__(self, vc: Any, dtype: torch.dtype) -> None:
        super().__init__()
        dim = int(vc.hidden_size)
        self.num_heads = int(vc.num_attention_heads)
        self.head_dim = dim // self.num_heads
        bias = bool(getattr(vc, "attention_bias", False))
        self.q_proj = nn.Linear(dim, dim, bias=bias, dtype=dtype)
        self.k_proj = nn.Linear(dim, dim, bias=bias, dtype=dtype)
        self.v_proj = nn.Linear(dim, dim, bias=bias, dtype=dtype)
        self.projection_layer = nn.Linear(dim, dim, dtype=dtype)
        self.q_norm: VisionRMSNorm | None = None
        self.k_norm: VisionRMSNorm | None = None
        if getattr(vc, "use_qk_norm", False):
            self.q_norm = VisionRMSNorm(dim, 1e-6, dtype)
            self.k_norm = VisionRMSNorm(dim, 1e-6, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)

        def heads(t: torch.Tensor) -> torch.Tensor:  # [B, N, dim] -> [B, heads, N, head_dim]
            return t.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)

        o = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
        return self.projection_layer(o.transpose(1, 2).reshape(B, N, -1))


class InternVisionMLP(nn.Module):
    def __init__(self, vc: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc1 = nn.Linear(int(vc.hidden_size), int(vc.intermediate_size), dtype=dtype)
        self.fc2 = nn.Linear(int(vc.intermediate_size), int(vc.hidden_size), dtype=dtype)
        self.act = activation(str(getattr(vc, "hidden_act", "gelu")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class InternVisionLayer(nn.Module):
    def __init__(self, vc: Any, dtype: torch.dtype) -> None:
        super().__init__()
        dim = int(vc.hidden_size)
        self.attention = InternVisionAttention(vc, dtype)
        self.mlp = InternVisionMLP(vc, dtype)
        self.layernorm_before = _norm(vc, dim, dtype)
        self.layernorm_after = _norm(vc, dim, dtype)
        self.lambda_1 = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self.lambda_2 = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.lambda_1 * self.attention(self.layernorm_before(x))
        return x + self.lambda_2 * self.mlp(self.layernorm_after(x))


class InternVisionEncoder(nn.Module):
    def __init__(self, vc: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer = nn.ModuleList(InternVisionLayer(vc, dtype) for _ in range(int(vc.num_hidden_layers)))


class InternVisionModel(nn.Module):
    """``[B, 3, H, W]`` tiles -> the last hidden state ``[B, 1 + patches, dim]`` (final LayerNorm
    unless ``use_mean_pooling``, as transformers' ``last_hidden_state``)."""

    def __init__(self, vc: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.embeddings = InternVisionEmbeddings(vc, dtype)
        self.encoder = InternVisionEncoder(vc, dtype)
        self.layernorm: nn.Module = nn.Identity()
        if not getattr(vc, "use_mean_pooling", True):
            self.layernorm = nn.LayerNorm(
                int(vc.hidden_size), eps=float(getattr(vc, "layer_norm_eps", 1e-6)), dtype=dtype
            )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        h = self.embeddings(pixel_values)
        for layer in self.encoder.layer:
            h = layer(h)
        return self.layernorm(h)
