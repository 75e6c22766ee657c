"""The Qwen2-VL / Qwen2.5-VL vision transformer (transformers' ``visual`` layout) at native resolution.

An image arrives as its patches (``hotloop.vl.qwen2_vl_preprocess``): ``[t, h', w', m*m, patch_dim]``,
``h' x w'`` merge blocks of ``m x m`` patches each, in the image processor's order. The patch
embedding (a Conv3d over ``temporal_patch x patch x patch``, run as a linear) feeds pre-norm blocks with
2D rotary (height and width angles side by side) and attention within each image frame; Qwen2.5-VL
blocks outside ``fullatt_block_indexes`` attend only within windows of merge blocks. The patch
merger concatenates each ``m x m`` block and projects it to the language model's hidden size.

Qwen2-VL: LayerNorm blocks, ``fc1 -> act -> fc2`` MLP. Qwen2.5-VL: RMSNorm blocks, gated MLP,
window attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hotloop.layers.rotary import apply_rotary
from hotloop.models.clip import activation
from hotloop.models.intern_vit import VisionRMSNorm

NORM_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class VisionArgs:
    """The shape of one Qwen2(.5)-VL vision tower, resolved from its ``vision_config``."""

    width: int
    depth: int
    num_heads: int
    intermediate_size: int
    out_size: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    in_channels: int
    act: str
    rope_theta: float
    gated: bool  # Qwen2.5-VL: RMSNorm, gated MLP, window attention
    window_size: int = 0  # pixels; 0 for full attention in every block
    full_attention_blocks: tuple[int, ...] = ()

    @classmethod
    def qwen2_vl(cls, vc: Any) -> VisionArgs:
        width = int(vc.embed_dim)
        return cls(
            width=width,
            depth=int(vc.depth),
            num_heads=int(vc.num_heads),
            intermediate_size=int(width * float(getattr(vc, "mlp_ratio", 4))),
            out_size=int(vc.hidden_size),
            gated=False,
            **_common(vc),
        )

    @classmethod
    def qwen2_5_vl(cls, vc: Any) -> VisionArgs:
        return cls(
            width=int(vc.hidden_size),
            depth=int(vc.depth),
            num_heads=int(vc.num_heads),
            intermediate_size=int(vc.intermediate_size),
            out_size=int(vc.out_hidden_size),
            gated=True,
            window_size=int(getattr(vc, "window_size", 112)),
            full_attention_blocks=tuple(int(i) for i in getattr(vc, "fullatt_block_indexes", ()) or ()),
            **_common(vc),
        )

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch: channels x temporal x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def window_blocks(self) -> int:
        """A window's side in merge blocks (Qwen2.5-VL)."""
        return self.window_size // self.merge_size // self.patch_size


def _common(vc: Any) -> dict[str, Any]:
    rope = getattr(vc, "rope_parameters", None) or {}
    return dict(
        patch_size=int(vc.patch_size),
        temporal_patch_size=int(getattr(vc, "temporal_patch_size", 2)),
        merge_size=int(getattr(vc, "spatial_merge_size", 2)),
        in_channels=int(getattr(vc, "in_channels", None) or getattr(vc, "in_chans", None) or 3),
        act=str(getattr(vc, "hidden_act", "quick_gelu")),
        rope_theta=float(rope.get("rope_theta", None) or 10000.0),
    )


def _norm(args: VisionArgs, dim: int, dtype: torch.dtype) -> nn.Module:
    if args.gated:
        return VisionRMSNorm(dim, NORM_EPS, dtype)
    return nn.LayerNorm(dim, eps=NORM_EPS, dtype=dtype)


Segments = list[tuple[int, torch.Tensor]]  # (length, token indices [B * length]) per length


def segments(lengths: Sequence[int], device: torch.device) -> Segments:
    """Consecutive segments of ``lengths`` (each image frame, or each window) grouped by length, so
    equal-length segments run as one attention batch; computed once per tower pass."""
    by_len: dict[int, list[int]] = {}
    start = 0
    for n in lengths:
        by_len.setdefault(n, []).append(start)
        start += n
    return [
        (n, (torch.tensor(starts)[:, None] + torch.arange(n)).reshape(-1).to(device))
        for n, starts in by_len.items()
    ]


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segs: Segments) -> torch.Tensor:
    """q, k, v ``[N, heads, head_dim]`` -> ``[N, heads, head_dim]``, attending within each segment."""
    out = torch.empty_like(q)
    for n, idx in segs:

        def heads(t: torch.Tensor, n: int = n, idx: torch.Tensor = idx) -> torch.Tensor:
            return t[idx].view(-1, n, *t.shape[1:]).transpose(1, 2)  # [B, heads, n, head_dim]

        o = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
        out[idx] = o.transpose(1, 2).reshape(-1, *q.shape[1:])
    return out


class PatchEmbed(nn.Module):
    def __init__(self, args: VisionArgs, dtype: torch.dtype) -> None:
        super().__init__()
        kernel = (args.temporal_patch_size, args.patch_size, args.patch_size)
        self.proj = nn.Conv3d(args.in_channels, args.width, kernel, stride=kernel, bias=False, dtype=dtype)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """``[N, patch_dim]`` -> ``[N, width]``: stride == kernel, so the Conv3d is a linear over
        flattened patches."""
        w = self.proj.weight
        return F.linear(patches.to(w.dtype), w.reshape(w.shape[0], -1))


class VisionRotary(nn.Module):
    """2D rotary: the first half of the angles follow a patch's row, the second half its column."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"the vision head_dim {head_dim} must be a multiple of 4 for 2D rotary")
        dim = head_dim // 2
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rows, cols ``[N]`` -> cos, sin ``[N, head_dim / 2]`` float32."""
        angles = torch.cat(
            [rows.float()[:, None] * self.inv_freq, cols.float()[:, None] * self.inv_freq], dim=-1
        )
        return angles.cos(), angles.sin()


class VisionAttention(nn.Module):
    def __init__(self, args: VisionArgs, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads, self.head_dim = args.num_heads, args.head_dim
        self.qkv = nn.Linear(args.width, 3 * args.width, dtype=dtype)
        self.proj = nn.Linear(args.width, args.width, dtype=dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segs: Segments) -> torch.Tensor:
        N = x.shape[0]
        q, k, v = self.qkv(x).view(N, 3, self.num_heads, self.head_dim).unbind(1)  # [N, heads, head_dim]
        # rotated in float32, as transformers does
        q = apply_rotary(q.float(), cos, sin, self.head_dim).to(v.dtype)
        k = apply_rotary(k.float(), cos, sin, self.head_dim).to(v.dtype)
        return self.proj(segment_attention(q, k, v, segs).reshape(N, -1))


class VisionMLP(nn.Module):
    """Qwen2-VL: ``fc2(act(fc1(x)))``."""

    def __init__(self, args: VisionArgs, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc1 = nn.Linear(args.width, args.intermediate_size, dtype=dtype)
        self.act = activation(args.act)
        self.fc2 = nn.Linear(args.intermediate_size, args.width, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionGatedMLP(nn.Module):
    """Qwen2.5-VL: ``down(act(gate(x)) * up(x))``, with biases."""

    def __init__(self, args: VisionArgs, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(args.width, args.intermediate_size, dtype=dtype)
        self.up_proj = nn.Linear(args.width, args.intermediate_size, dtype=dtype)
        self.down_proj = nn.Linear(args.intermediate_size, args.width, dtype=dtype)
        self.act = activation(args.act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    def __init__(self, args: VisionArgs, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm1 = _norm(args, args.width, dtype)
        self.norm2 = _norm(args, args.width, dtype)
        self.attn = VisionAttention(args, dtype)
        self.mlp: nn.Module = VisionGatedMLP(args, dtype) if args.gated else VisionMLP(args, dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segs: Segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segs)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Norm each patch, concatenate each ``m x m`` block, then ``Linear -> GELU -> Linear``."""

    def __init__(self, args: VisionArgs, dtype: torch.dtype) -> None:
        super().__init__()
        merged = args.width * args.merge_size**2
        self.ln_q = _norm(args, args.width, dtype)
        self.mlp = nn.Sequential(
            nn.Linear(merged, merged, dtype=dtype), nn.GELU(), nn.Linear(merged, args.out_size, dtype=dtype)
        )
        self.merged = merged

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, width]`` (blocks of ``m*m`` consecutive patches) -> ``[N / m^2, out_size]``."""
        return self.mlp(self.ln_q(x).reshape(-1, self.merged))


def window_order(grid: tuple[int, int, int], side: int) -> tuple[torch.Tensor, list[int]]:
    """Merge-block indices of a ``t x h x w`` grid regrouped into windows of ``side x side`` blocks
    (windows row by row, blocks row by row inside; edge windows are smaller), and each window's size."""
    t, h, w = grid
    idx = torch.arange(t * h * w).view(t, h, w)
    order: list[torch.Tensor] = []
    sizes: list[int] = []
    for ti in range(t):
        for r in range(0, h, side):
            for c in range(0, w, side):
                block = idx[ti, r : r + side, c : c + side].reshape(-1)
                order.append(block)
                sizes.append(block.numel())
    return torch.cat(order), sizes


class Qwen2VisionTransformer(nn.Module):
    """Images' patches -> their merged embeddings ``[t * h' * w', out_size]`` each."""

    def __init__(self, args: VisionArgs, dtype: torch.dtype) -> None:
        super().__init__()
        if args.gated and args.window_blocks < 1:
            raise ValueError(
                f"window_size={args.window_size} is smaller than a merge block "
                f"({args.merge_size} x {args.patch_size} pixels)"
            )
        self.args = args
        self.patch_embed = PatchEmbed(args, dtype)
        self.rotary_pos_emb = VisionRotary(args.head_dim, args.rope_theta)
        self.blocks = nn.ModuleList(VisionBlock(args, dtype) for _ in range(args.depth))
        self.merger = PatchMerger(args, dtype)

    def grid_of(self, patches: torch.Tensor) -> tuple[int, int, int]:
        """``[t, h', w', m*m, patch_dim]`` -> ``(t, h', w')`` (merge blocks), checking the layout."""
        a = self.args
        if patches.dim() != 5 or tuple(patches.shape[3:]) != (a.merge_size**2, a.patch_dim):
            raise ValueError(
                f"image patches of shape {tuple(patches.shape)}; the vision tower takes "
                f"[t, h', w', {a.merge_size**2}, {a.patch_dim}]"
            )
        t, h, w = patches.shape[:3]
        return int(t), int(h), int(w)

    def _positions(self, grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each patch's (row, column) in the processor's order: block by block, ``m x m`` inside."""
        t, h, w = grid
        m = self.args.merge_size
        inner = torch.arange(m * m)
        rows = (torch.arange(h)[:, None, None] * m + (inner // m)[None, None, :]).expand(h, w, m * m)
        cols = (torch.arange(w)[None, :, None] * m + (inner % m)[None, None, :]).expand(h, w, m * m)
        return rows.reshape(-1).repeat(t), cols.reshape(-1).repeat(t)

    def _window_permutation(self, grids: Sequence[tuple[int, int, int]]) -> tuple[torch.Tensor, list[int]]:
        """Patch indices in window order (windows never cross images or frames) and each window's
        length in patches (Qwen2.5-VL)."""
        unit = self.args.merge_size**2
        orders: list[torch.Tensor] = []
        lengths: list[int] = []
        base = 0
        for g in grids:
            order, sizes = window_order(g, self.args.window_blocks)
            orders.append(order + base)
            lengths += [n * unit for n in sizes]
            base += g[0] * g[1] * g[2]
        blocks = torch.cat(orders)
        return (blocks[:, None] * unit + torch.arange(unit)).reshape(-1), lengths

    def forward(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each image's ``[t, h', w', m*m, patch_dim]`` patches -> ``[t * h' * w', out_size]``."""
        a = self.args
        device = self.patch_embed.proj.weight.device
        grids = [self.grid_of(p) for p in images]
        x = self.patch_embed(torch.cat([p.reshape(-1, a.patch_dim) for p in images]).to(device))
        rows, cols = zip(*(self._positions(g) for g in grids), strict=True)
        row, col = torch.cat(rows), torch.cat(cols)
        frames = segments([h * w * a.merge_size**2 for t, h, w in grids for _ in range(t)], device)
        windows = frames
        perm: torch.Tensor | None = None
        if a.gated:  # run in window order, as transformers does, and restore the order at the end
            perm, lengths = self._window_permutation(grids)
            row, col, perm = row[perm], col[perm], perm.to(device)
            x = x[perm]
            windows = segments(lengths, device)
        cos, sin = self.rotary_pos_emb(row.to(device), col.to(device))
        for i, blk in enumerate(self.blocks):
            full = not a.gated or i in a.full_attention_blocks
            x = blk(x, cos, sin, frames if full else windows)
        if perm is not None:
            x = torch.empty_like(x).index_copy_(0, perm, x)
        return list(torch.split(self.merger(x), [t * h * w for t, h, w in grids]))
