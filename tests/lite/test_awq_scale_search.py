"""``lite/awq.search_scale``: with ``search`` the identity is a candidate, so a searched group never
gets more calibration error than round-to-nearest gives it; without, the fixed ratio."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hotloop.lite import awq
from hotloop.lite.quantize import pseudo_quantize


def group_of(weight: torch.Tensor) -> awq.ScaleGroup:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lin.weight.data = weight.clone()
    return awq.ScaleGroup("test", (lin, slice(None)), [lin], "x", lin)  # type: ignore[list-item]


def rtn_loss(weight: torch.Tensor, x: torch.Tensor, g: int) -> float:
    return float((x @ pseudo_quantize(weight, g, 4).T - x @ weight.T).pow(2).mean())


def test_fixed_ratio_is_not_evaluated() -> None:
    g = torch.Generator().manual_seed(0)
    w = pseudo_quantize(torch.randn(64, 128, generator=g), 32, 4)
    x = torch.randn(256, 128, generator=g) * torch.linspace(0.1, 8.0, 128)
    s, ratio, loss = awq.search_scale(group_of(w), x, 32, 4, False)
    assert ratio == awq.FIXED_RATIO and loss != loss  # nan: nothing was evaluated
    assert not torch.equal(s, torch.ones(128))


@pytest.mark.parametrize("search", [True])
def test_weights_already_on_the_int4_grid_keep_the_identity(search: bool) -> None:
    """Round-to-nearest reproduces such weights exactly (GGUF-derived checkpoints are close to this):
    any per-channel scale moves them off the grid, so no scaling must win."""
    g = torch.Generator().manual_seed(0)
    w = pseudo_quantize(torch.randn(64, 128, generator=g), 32, 4)
    x = torch.randn(256, 128, generator=g) * torch.linspace(0.1, 8.0, 128)  # uneven channels
    s, ratio, loss = awq.search_scale(group_of(w), x, 32, 4, search)
    assert (
        ratio == awq.NO_SCALING and torch.equal(s, torch.ones(128)) and loss == pytest.approx(0.0, abs=1e-10)
    )


@pytest.mark.parametrize("search", [True])
def test_salient_channels_still_get_scaled_and_never_lose_to_rtn(search: bool) -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 128, generator=g)
    x = torch.randn(512, 128, generator=g)
    x[:, :4] *= 50.0  # a few salient input channels: AWQ's case
    grp = group_of(w)
    s, ratio, loss = awq.search_scale(grp, x, 32, 4, search)
    assert ratio != awq.NO_SCALING and not torch.equal(s, torch.ones(128))
    assert loss < rtn_loss(w, x, 32)
    assert torch.equal(grp.linears[0].weight.data, w)  # the search leaves the weights as they were
