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


def test_off_scope_and_batch_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside ``off()`` every launch is plain (the kernel flag and the launch attribute agree), and
    the decision comes back after it, nested or not; the row limit reads its variable."""
    from hotloop.kernels import pdl

    dev = torch.device("cuda", 0)
    monkeypatch.setattr(pdl, "_cache", {0: True})  # as on a Hopper GPU
    assert pdl.pdl(dev) and pdl.launch_kwargs(dev) == {"launch_pdl": True}
    with pdl.off():
        assert not pdl.pdl(dev) and pdl.launch_kwargs(dev) == {}
        with pdl.off():
            assert not pdl.pdl(dev)
        assert not pdl.pdl(dev)
    assert pdl.pdl(dev)
    with pytest.raises(RuntimeError), pdl.off():
        raise RuntimeError("a failed capture")
    assert pdl.pdl(dev)  # restored after an error too
    monkeypatch.delenv(pdl.MAX_DECODE_BATCH_ENV, raising=False)
    assert pdl.max_decode_batch() == pdl.DEFAULT_MAX_DECODE_BATCH == 8
    monkeypatch.setenv(pdl.MAX_DECODE_BATCH_ENV, "512")
    assert pdl.max_decode_batch() == 512
    for bad in ("many", "-1"):
        monkeypatch.setenv(pdl.MAX_DECODE_BATCH_ENV, bad)
        with pytest.raises(ValueError, match=pdl.MAX_DECODE_BATCH_ENV):
            pdl.max_decode_batch()
