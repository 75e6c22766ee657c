"""AWQ (Lin et al., 2023) for one decoder block: per-channel scale search and fold, clip search.

A *scale group* is a set of linear layers that read the same input, plus the op that produces
that input (an RMSNorm, or rows of a preceding linear). Multiplying the linears' input columns by
``s`` and dividing the producer's output by ``s`` leaves the block's function unchanged, but
protects the salient channels (large activations) from int4 rounding. ``s`` is
``x_mean^r / w_mean^(1 - r)``, normalised; ``r`` is searched on the group's output error under
pseudo-quantisation (``--search-scale``, where no scaling at all is a candidate too) or fixed at
``FIXED_RATIO``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from hotloop.layers.linear import Linear
from hotloop.layers.norm import RMSNorm
from hotloop.lite.blocks import BlockRunner
from hotloop.lite.quantize import _range_params, pseudo_quantize
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

SCALE_GRID = 20
FIXED_RATIO = 0.5
CLIP_GRID = 20
CLIP_MAX_SHRINK = 0.5
CLIP_BUDGET = 1 << 24  # elements of the [groups, tokens, rows] error tensor per step


@dataclass
class ScaleGroup:
    """Linears sharing one input, and the producer of that input (``prev``: norm or linear rows)."""

    name: str
    prev: RMSNorm | tuple[Linear, slice]
    linears: list[Linear]
    input_key: str  # which captured input (a module path inside the layer)
    inspect: Callable[[torch.Tensor], torch.Tensor]  # the group's input -> the output whose error counts


def decoder_scale_groups(layer: Any, runner: BlockRunner) -> tuple[list[ScaleGroup], list[str]]:
    """The scale groups of a turbo decoder layer, and reasons for fusions that were skipped."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = attn.qkv_proj, mlp.gate_up_proj
    groups = [
        ScaleGroup(
            "input_layernorm -> qkv_proj",
            layer.input_layernorm,
            [qkv],
            "self_attn.qkv_proj",
            lambda x: runner.map(lambda xb, ctx: attn(xb, *ctx), x),
        )
    ]
    skipped = []
    if attn.num_heads == attn.num_kv_heads:
        start, size = qkv.shard_offsets["v"]
        groups.append(
            ScaleGroup(
                "v_proj -> o_proj",
                (qkv, slice(start, start + size)),
                [attn.o_proj],
                "self_attn.o_proj",
                attn.o_proj,
            )
        )
    else:
        skipped.append(
            f"v_proj -> o_proj not scaled: under GQA ({attn.num_heads} query heads over "
            f"{attn.num_kv_heads} KV heads) one v_proj channel feeds {attn.num_heads // attn.num_kv_heads} "
            "o_proj channels, so a per-channel o_proj scale cannot be folded into v_proj (as AutoAWQ)"
        )
    groups.append(
        ScaleGroup(
            "post_attention_layernorm -> gate_up_proj",
            layer.post_attention_layernorm,
            [gate_up],
            "mlp.gate_up_proj",
            mlp,
        )
    )
    start, size = gate_up.shard_offsets[1]
    groups.append(
        ScaleGroup(
            "up_proj -> down_proj",
            (gate_up, slice(start, start + size)),
            [mlp.down_proj],
            "mlp.down_proj",
            mlp.down_proj,
        )
    )
    return groups, skipped


def weight_of(lin: Linear) -> torch.Tensor:
    """A dense linear's weight ``[out, in]`` (its storage, for in-place edits)."""
    return cast(torch.Tensor, lin.weight)


def weight_importance(linears: list[Linear], group_size: int) -> torch.Tensor:
    """Mean over output rows of ``|W|`` normalised by each group's max: ``[in]`` float32."""
    w = torch.cat([weight_of(lin).float() for lin in linears])
    out, k = w.shape
    wg = w.abs().reshape(out, k // group_size, group_size)
    wg = wg / wg.amax(-1, keepdim=True).clamp(min=1e-8)
    return wg.reshape(out, k).mean(0)


def scales_for_ratio(x_mean: torch.Tensor, w_mean: torch.Tensor, ratio: float) -> torch.Tensor:
    s = (x_mean.pow(ratio) / w_mean.pow(1 - ratio).clamp(min=1e-4)).clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


NO_SCALING = -1.0  # the "ratio" reported when the identity scale won


@torch.no_grad()
def search_scale(
    group: ScaleGroup, x: torch.Tensor, group_size: int, bits: int, search: bool
) -> tuple[torch.Tensor, float, float]:
    """The group's scale ``[in]`` (float32), the chosen ratio (``NO_SCALING`` for the identity) and
    its loss: the group's output error under pseudo-quantization on the calibration inputs (nan
    without ``search``).

    Without ``search``: ``FIXED_RATIO``, unevaluated (LMDeploy's default). With it: the grid's ratios
    and the identity scale (plain round-to-nearest), so a searched group never ends up with more
    calibration error than round-to-nearest gives it. On Qwen2.5-Coder-1.5B, layer 1's gate_up_proj
    has 15.7x round-to-nearest's error at ratio 0.5 (``benchmarks/awq_scale_diag.py``). Applying
    the same guard to the fixed ratio tripled its CPU time there without improving perplexity
    (4.511 against 4.491 unguarded; BENCHMARKS.md), so the fixed ratio stays unguarded."""
    x_mean = x.float().abs().mean(0)
    w_mean = weight_importance(group.linears, group_size).to(x_mean.device)
    if not search:
        return scales_for_ratio(x_mean, w_mean, FIXED_RATIO), FIXED_RATIO, float("nan")
    ratios = [i / SCALE_GRID for i in range(SCALE_GRID)]
    reference = group.inspect(x).float()
    originals = [weight_of(lin).data.clone() for lin in group.linears]
    candidates = [(NO_SCALING, torch.ones_like(x_mean))]
    candidates += [(r, scales_for_ratio(x_mean, w_mean, r)) for r in ratios]
    best: tuple[float, float, torch.Tensor] | None = None
    try:
        for ratio, s in candidates:
            sw = s.to(originals[0].dtype)
            for lin, w in zip(group.linears, originals, strict=True):
                weight_of(lin).data = pseudo_quantize(w * sw, group_size, bits) / sw
            loss = (group.inspect(x).float() - reference).pow(2).mean().item()
            if best is None or loss < best[0]:
                best = (loss, ratio, s)
    finally:
        for lin, w in zip(group.linears, originals, strict=True):
            weight_of(lin).data = w
    assert best is not None
    return best[2], best[1], best[0]


@torch.no_grad()
def apply_scale(group: ScaleGroup, s: torch.Tensor) -> None:
    """Fold ``s`` in: the producer's output divided by it, the linears' input columns multiplied."""
    if isinstance(group.prev, RMSNorm):
        group.prev.weight.div_(s.to(group.prev.weight.dtype))
    else:
        prev, rows = group.prev
        w = weight_of(prev)
        w[rows].div_(s[:, None].to(w.dtype))
        if prev.bias is not None:
            prev.bias[rows].div_(s.to(prev.bias.dtype))
    for lin in group.linears:
        w = weight_of(lin)
        w.mul_(s[None, :].to(w.dtype))


@torch.no_grad()
def search_clip(w: torch.Tensor, x: torch.Tensor, group_size: int, bits: int) -> torch.Tensor:
    """Per-(row, group) shrink of the weight range minimising the group's partial-output error.

    ``w`` ``[out, in]``, ``x`` ``[n, in]`` (a sample of the scaled inputs). Returns the factor
    ``[out, in // g]`` (1.0 = no clipping) by which each group's min and max are multiplied.

    The shrink is chosen on the even sample tokens and kept only if it also lowers the error on
    the odd ones (otherwise the group is not clipped). Without that check the search fitted the
    calibration sample: on Qwen2.5-Coder-1.5B, round-to-nearest plus the clip search had perplexity
    4.521 against 4.413 for round-to-nearest alone (``benchmarks/awq_accuracy.py --ablations``).
    """
    out, k = w.shape
    ng = k // group_size
    xg = x.float().reshape(-1, ng, group_size).transpose(0, 1)  # [ng, n, g]
    n = xg.shape[1]
    held_out = n >= 2
    steps = int(CLIP_GRID * CLIP_MAX_SHRINK)
    factors = torch.ones(out, ng, device=w.device)
    chunk = max(8, CLIP_BUDGET // max(1, ng * n))
    for r0 in range(0, out, chunk):
        wc = w[r0 : r0 + chunk].float().reshape(-1, ng, group_size)  # [oc, ng, g]
        wmin, wmax = wc.amin(-1, keepdim=True), wc.amax(-1, keepdim=True)
        best_fit = torch.full(wc.shape[:2], float("inf"), device=w.device)
        best_f = torch.ones(wc.shape[:2], device=w.device)
        check_at_best = torch.zeros(wc.shape[:2], device=w.device)
        check_unclipped = torch.zeros(wc.shape[:2], device=w.device)
        for i in range(steps):
            f = 1 - i / CLIP_GRID
            lo, hi = wmin * f, wmax * f
            wq = _fake_quant(wc.clamp(lo, hi), lo, hi, bits)
            sq = torch.bmm(xg, (wq - wc).permute(1, 2, 0)).pow(2)  # [ng, n, oc]
            if held_out:
                fit, check = sq[:, 0::2].mean(1).t(), sq[:, 1::2].mean(1).t()  # [oc, ng]
            else:
                fit = check = sq.mean(1).t()
            if i == 0:
                check_unclipped = check
            better = fit < best_fit
            best_fit = torch.where(better, fit, best_fit)
            best_f = torch.where(better, torch.full_like(best_f, f), best_f)
            check_at_best = torch.where(better, check, check_at_best)
        if held_out:
            best_f = torch.where(check_at_best < check_unclipped, best_f, torch.ones_like(best_f))
        factors[r0 : r0 + chunk] = best_f
    return factors


def _fake_quant(wg: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bits: int) -> torch.Tensor:
    scales, zeros = _range_params(lo, hi, bits)
    q = ((wg / scales).round() + zeros).clamp(0, 2**bits - 1)
    return (q - zeros) * scales


@torch.no_grad()
def apply_clip(w: torch.Tensor, factors: torch.Tensor, group_size: int) -> None:
    """Clamp each group of ``w`` ``[out, in]`` (in place) to its range times ``factors``."""
    out, k = w.shape
    wg = w.view(out, k // group_size, group_size)
    f = factors.to(w.dtype)[..., None]
    lo = wg.amin(-1, keepdim=True) * f
    hi = wg.amax(-1, keepdim=True) * f
    wg.copy_(torch.maximum(torch.minimum(wg, hi), lo))
