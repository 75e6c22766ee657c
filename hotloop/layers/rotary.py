"""Rotary position embedding (rotate-half / NeoX layout) for given positions, and its scaling types.

``RopeConfig.from_hf`` reads a Hugging Face config: transformers 5 keeps everything in
``config.rope_parameters`` (``rope_theta`` inside it); older configs and remote-code ones keep
``rope_theta`` at the top and the scaling dict in ``rope_scaling`` (with ``type`` or ``rope_type``).
Supported types: ``default``, ``linear``, ``dynamic`` (NTK) and ``llama3``. ``MRotaryEmbedding`` adds
M-RoPE (Qwen2-VL): three position rows, each rotating its own section of the frequencies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Everything that fixes the rotary frequencies of a model."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    max_position_embeddings: int = 2048
    # llama3 only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope type {self.rope_type!r} is not supported; supported: {ROPE_TYPES}")
        if self.rope_type != "default" and self.factor < 1.0:
            raise ValueError(f"rope scaling factor={self.factor} must be >= 1")

    @classmethod
    def from_hf(cls, hf_config: Any) -> RopeConfig:
        params = getattr(hf_config, "rope_parameters", None)
        if not isinstance(params, dict) or not params:
            params = getattr(hf_config, "rope_scaling", None) or {}
        if params and all(isinstance(v, dict) for v in params.values()):
            raise ValueError(f"per-layer-type rope parameters are not supported: {sorted(params)}")
        theta = params.get("rope_theta") or getattr(hf_config, "rope_theta", None) or 10000.0
        rope_type = params.get("rope_type") or params.get("type") or "default"
        max_pos = int(getattr(hf_config, "max_position_embeddings", 2048))
        orig = params.get("original_max_position_embeddings")
        partial = (
            params.get("partial_rotary_factor") or getattr(hf_config, "partial_rotary_factor", None) or 1.0
        )
        return cls(
            theta=float(theta),
            rope_type=str(rope_type),
            factor=float(params.get("factor", 1.0) or 1.0),
            max_position_embeddings=max_pos,
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(orig) if orig is not None else None,
            partial_rotary_factor=float(partial),
        )


def _base_inv_freq(theta: float, rotary_dim: int) -> torch.Tensor:
    """``theta^(-2i/d)`` for i in [0, d/2), float32 (computed as transformers does, for parity)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim
    return 1.0 / (theta**exponents)


def _llama3_inv_freq(inv_freq: torch.Tensor, cfg: RopeConfig) -> torch.Tensor:
    """Llama 3.1: long wavelengths divided by ``factor``, short kept, the band between interpolated."""
    context = cfg.original_max_position_embeddings or cfg.max_position_embeddings
    long_wavelen = context / cfg.low_freq_factor
    short_wavelen = context / cfg.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (context / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
    blended = (1 - smooth) * inv_freq / cfg.factor + smooth * inv_freq
    out = torch.where(wavelen > long_wavelen, inv_freq / cfg.factor, blended)
    return torch.where(wavelen < short_wavelen, inv_freq, out)


def dynamic_ntk_theta(cfg: RopeConfig, rotary_dim: int) -> float:
    """The NTK-scaled base for a context of ``max_position_embeddings * factor`` tokens."""
    length = cfg.max_position_embeddings * cfg.factor
    ratio = cfg.factor * length / cfg.max_position_embeddings - (cfg.factor - 1)
    return cfg.theta * ratio ** (rotary_dim / (rotary_dim - 2))


class RotaryEmbedding(nn.Module):
    """Rotates q/k by angle ``position * inv_freq`` (rotate-half layout, first ``rotary_dim`` dims).

    ``cos_sin(positions)`` is computed once per step and shared by every layer; ``apply_rotary``
    rotates.
    Angles are computed for the given positions directly (no table, no length limit).

    ``dynamic`` (NTK): transformers recomputes the base from the current sequence length, equal
    to the unscaled base while the length is within ``max_position_embeddings`` and growing after.
    A paged cache stores keys already rotated, so we fix the angles per position instead: positions
    below ``max_position_embeddings`` use the unscaled base (identical to transformers there), and
    positions at or beyond it use the fixed base vLLM uses, scaled for a context of
    ``max_position_embeddings * factor``. Beyond the original length transformers' output depends on
    the sequence length (and on its own cache history), so no fixed rule can match it there.
    """

    inv_freq: torch.Tensor
    long_inv_freq: torch.Tensor | None

    def __init__(self, head_dim: int, cfg: RopeConfig) -> None:
        super().__init__()
        rotary_dim = int(head_dim * cfg.partial_rotary_factor)
        if rotary_dim % 2 or rotary_dim <= 2 or rotary_dim > head_dim:
            raise ValueError(
                f"rotary dim {rotary_dim} (head_dim={head_dim}) must be even, > 2 and <= head_dim"
            )
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.cfg = cfg
        inv_freq = _base_inv_freq(cfg.theta, rotary_dim)
        if cfg.rope_type == "linear":
            inv_freq = inv_freq / cfg.factor
        elif cfg.rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, cfg)
        long_inv_freq = None
        if cfg.rope_type == "dynamic":
            long_inv_freq = _base_inv_freq(dynamic_ntk_theta(cfg, rotary_dim), rotary_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rotary_dim / 2] float32
        self.register_buffer("long_inv_freq", long_inv_freq, persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions ``[T]`` -> cos, sin ``[T, rotary_dim / 2]`` float32."""
        pos = positions.to(torch.float32)[:, None]
        inv_freq = self.inv_freq[None, :]
        if self.long_inv_freq is not None:
            long_pos = (positions >= self.cfg.max_position_embeddings)[:, None]
            inv_freq = torch.where(long_pos, self.long_inv_freq[None, :], inv_freq)
        angles = pos * inv_freq
        return angles.cos(), angles.sin()

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q ``[T, H*D]`` and k ``[T, KV*D]`` for ``positions`` ``[T]``."""
        cos, sin = self.cos_sin(positions)
        return apply_rotary(q, cos, sin, self.head_dim), apply_rotary(k, cos, sin, self.head_dim)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, type={self.cfg.rope_type}"


class MRotaryEmbedding(RotaryEmbedding):
    """M-RoPE (multimodal rotary, Qwen2-VL family): positions are ``[3, T]`` (temporal, height, width)
    and ``mrope_section`` splits the ``rotary_dim / 2`` frequencies into three runs; run ``i`` takes
    its angles from row ``i``. A 1-D ``[T]`` means the three rows are equal, which is plain rotary.
    """

    section_rows: torch.Tensor

    def __init__(self, head_dim: int, cfg: RopeConfig, mrope_section: Sequence[int]) -> None:
        super().__init__(head_dim, cfg)
        section = [int(s) for s in mrope_section]
        if len(section) != 3 or sum(section) != self.rotary_dim // 2 or min(section) < 0:
            raise ValueError(
                f"mrope_section={section} must be three sizes that add up to rotary_dim / 2 "
                f"= {self.rotary_dim // 2}"
            )
        if cfg.rope_type == "dynamic":
            raise ValueError("M-RoPE with dynamic (NTK) rope scaling is not supported")
        rows = torch.repeat_interleave(torch.arange(3), torch.tensor(section))
        self.register_buffer("section_rows", rows, persistent=False)  # [rotary_dim / 2]: 0, 1 or 2
        self.mrope_section = tuple(section)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions ``[T]`` or ``[3, T]`` -> cos, sin ``[T, rotary_dim / 2]`` float32."""
        if positions.dim() == 1:
            return super().cos_sin(positions)
        if positions.dim() != 2 or positions.shape[0] != 3:
            raise ValueError(f"M-RoPE positions must be [T] or [3, T], got {tuple(positions.shape)}")
        pos = positions.to(torch.float32).T[:, self.section_rows]  # [T, rotary_dim / 2], dense rows
        angles = pos * self.inv_freq[None, :]
        return angles.cos(), angles.sin()

    def extra_repr(self) -> str:
        return super().extra_repr() + f", mrope_section={list(self.mrope_section)}"


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rotate x ``[T, heads * head_dim]`` (or ``[T, heads, head_dim]``) by ``cos``/``sin`` ``[T, rot / 2]``.

    The first ``rot`` dims of each head are rotated (halves paired, NeoX layout), the rest pass
    through. Returns a new tensor of x's shape and dtype.
    """
    shape = x.shape
    x = x.view(shape[0], -1, head_dim)
    half = cos.shape[-1]
    rot = 2 * half
    cos = cos.to(x.dtype)[:, None, :]
    sin = sin.to(x.dtype)[:, None, :]
    x1 = x[..., :half]
    x2 = x[..., half:rot]
    parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if rot < head_dim:
        parts.append(x[..., rot:])
    return torch.cat(parts, dim=-1).view(shape)
