"""Per-group AWQ diagnosis: for the first decoder layers of a model, each scale group's output error
under int4 g128 pseudo-quantization with no scaling (round-to-nearest), with the fixed ratio 0.5,
and with the best ratio of the search grid, on calibration inputs (16 x 256 tokens of pydoc).

    PYTHONPATH=$PWD python benchmarks/awq_scale_diag.py MODEL_FOLDER [NUM_LAYERS]

It showed why AWQ lost to round-to-nearest on Qwen2.5-Coder-1.5B (GGUF-derived weights): most
groups are better off unscaled, and one (layer 1's gate_up_proj, massive activation channels) had
15.7x round-to-nearest's error at ratio 0.5. ``awq.search_scale`` now always weighs the identity.
"""

from __future__ import annotations

import sys
import time

import torch

from hotloop.lite import awq
from hotloop.lite.auto_awq import LINEAR_INPUTS, AWQOptions, _load_source, _samples
from hotloop.lite.blocks import BlockRunner
from hotloop.lite.quantize import pseudo_quantize

GROUP, BITS = 128, 4


def group_loss(group: awq.ScaleGroup, x: torch.Tensor, ref: torch.Tensor, s: torch.Tensor) -> float:
    """The group's output error with its linears pseudo-quantized after scaling by ``s``."""
    originals = [awq.weight_of(lin).data.clone() for lin in group.linears]
    sw = s.to(originals[0].dtype)
    try:
        for lin, w in zip(group.linears, originals, strict=True):
            awq.weight_of(lin).data = pseudo_quantize(w * sw, GROUP, BITS) / sw
        return float((group.inspect(x).float() - ref).pow(2).mean())
    finally:
        for lin, w in zip(group.linears, originals, strict=True):
            awq.weight_of(lin).data = w


def main() -> int:
    model = sys.argv[1] if len(sys.argv) > 1 else None
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    torch.manual_seed(0)
    t0 = time.time()
    path, net, _cfg = _load_source(model, torch.device("cpu"))
    opts = AWQOptions(calib_samples=16, calib_seqlen=256, device="cpu")
    runner = BlockRunner(net, _samples(path, opts), 4, torch.device("cpu"))
    print(f"loaded in {time.time() - t0:.0f}s", flush=True)
    for i in range(layers):
        inputs = runner.run_layer(i, LINEAR_INPUTS)
        groups, _ = awq.decoder_scale_groups(runner.layers[i], runner)
        for group in groups:
            x = inputs[group.input_key]
            ref = group.inspect(x).float()
            x_mean = x.float().abs().mean(0)
            w_mean = awq.weight_importance(group.linears, GROUP)
            rtn = group_loss(group, x, ref, torch.ones_like(x_mean))
            losses = {
                r / awq.SCALE_GRID: group_loss(
                    group, x, ref, awq.scales_for_ratio(x_mean, w_mean, r / awq.SCALE_GRID)
                )
                for r in range(awq.SCALE_GRID)
            }
            best = min(losses, key=lambda r: losses[r])
            fixed = losses[awq.FIXED_RATIO]
            print(
                f"layer {i} {group.name:42s} rtn {rtn:.3e}  fixed{awq.FIXED_RATIO} {fixed:.3e} ({fixed / rtn:.2f}x)"
                f"  best r={best:.2f} {losses[best]:.3e} ({losses[best] / rtn:.2f}x)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
