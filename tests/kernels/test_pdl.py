"""``kernels/pdl.py``: programmatic dependent launch is off where it cannot work or is turned off."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")


def test_off_on_cpu_and_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    from hotloop.kernels import pdl

    pdl.reset()
    assert not pdl.pdl_enabled(torch.device("cpu"))
    assert pdl.launch_kwargs(torch.device("cpu")) == {}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.pdl_enabled(torch.device("cuda", 0))
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv("HOTLOOP_PDL", "0")
    assert not pdl.pdl_enabled(torch.device("cuda", 0))
    pdl.reset()


@pytest.mark.gpu
def test_on_for_hopper_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from hotloop.kernels import pdl

    monkeypatch.delenv("HOTLOOP_PDL", raising=False)
    pdl.reset()
    dev = torch.device("cuda", 0)
    hopper = torch.cuda.get_device_capability(dev)[0] >= 9
    assert pdl.pdl_enabled(dev) == (hopper and pdl.HAS_GDC and pdl._launch_takes_pdl())
    assert pdl.launch_kwargs(dev) == ({"launch_pdl": True} if pdl.pdl_enabled(dev) else {})
