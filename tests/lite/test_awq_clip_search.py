"""The AWQ clip search (``awq.search_clip``): it clips where clipping lowers the output error, and
keeps a group unclipped when the shrink chosen on half of the sample does not hold on the other
half."""

from __future__ import annotations

import torch

from hotloop.lite import awq

G = 32


def _weights() -> torch.Tensor:
    """Four rows of one group: small weights plus one large outlier in input channel 0."""
    w = torch.randn(4, G, generator=torch.Generator().manual_seed(0)) * 0.5
    w[:, 0] = 10.0
    return w


def _inputs(odd_channel0: float) -> torch.Tensor:
    x = torch.randn(64, G, generator=torch.Generator().manual_seed(1))
    x[0::2, 0] = 0.0  # the tokens the shrink is chosen on never use the outlier's channel
    x[1::2, 0] = odd_channel0
    return x


def _output_error(w: torch.Tensor, x: torch.Tensor, factors: torch.Tensor) -> float:
    c = w.clone()
    awq.apply_clip(c, factors, G)
    q = awq.pseudo_quantize(c, G, 4)
    return float((x @ (q - w).t()).pow(2).mean())


def test_clips_an_outlier_whose_channel_carries_no_input() -> None:
    w, x = _weights(), _inputs(odd_channel0=0.0)
    f = awq.search_clip(w, x, G, 4)
    assert f.shape == (4, 1)
    assert (f < 1.0).all(), f  # the outlier costs nothing to clip and spreads the int4 grid
    assert _output_error(w, x, f) < _output_error(w, x, torch.ones_like(f))


def test_keeps_the_range_when_the_held_out_half_disagrees() -> None:
    w, x = _weights(), _inputs(odd_channel0=3.0)
    f = awq.search_clip(w, x, G, 4)
    # the even tokens alone would clip the outlier (as in the test above); on the odd ones that
    # costs far more than it saves, so no row is clipped
    assert (f == 1.0).all(), f
    fit_only = awq.search_clip(w, x[0::2].repeat_interleave(2, 0), G, 4)
    assert (fit_only < 1.0).all()
