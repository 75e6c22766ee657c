"""The operand checks and launch buffers the CUDA one-row W4A16 GEMVs share
(``kernels/w4a16_one_row.py``): each refusal names the operand and what it must be."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from kernel_checks import random_awq

from hotloop.kernels import counters, w4a16_one_row


def _operands() -> tuple[torch.Tensor, ...]:
    qweight, qzeros, scales = random_awq(256, 64, 128, torch.bfloat16, "cpu")
    return torch.randn(1, 256, dtype=torch.bfloat16), qweight, qzeros, scales


def test_check_operands_returns_k_and_n() -> None:
    assert w4a16_one_row.check_operands(*_operands(), 128) == (256, 64)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda o: (torch.randn(1, 128, dtype=torch.bfloat16), *o[1:]), r"x must be \[1, 256\]"),
        (lambda o: (o[0].reshape(1, 1, 256), *o[1:]), r"x must be \[1, 256\]"),
        (lambda o: (o[0], o[1].to(torch.int64), *o[2:]), "qweight and qzeros must be int32"),
        (lambda o: (o[0], o[1], o[2], o[3].half()), "scales dtype torch.float16 must equal x dtype"),
        (lambda o: (o[0].repeat(1, 2)[:, ::2], *o[1:]), "x must be contiguous and 16-byte aligned"),
        (
            lambda o: (torch.randn(1, 257, dtype=torch.bfloat16)[:, 1:], *o[1:]),
            "x must be contiguous and 16-byte",
        ),
    ],
)
def test_check_operands_names_what_is_wrong(change: Callable[[tuple], tuple], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        w4a16_one_row.check_operands(*change(_operands()), 128)


def test_launch_buffers() -> None:
    x = torch.randn(1, 256, dtype=torch.bfloat16)
    out, ws, cnt = w4a16_one_row.launch_buffers(x, 64, 1, 1, "test_one_row", None)
    assert out.shape == (1, 64) and out.dtype == torch.bfloat16 and ws is None and cnt is None
    out, ws, cnt = w4a16_one_row.launch_buffers(x, 64, 4, 2, "test_one_row", out)
    assert ws is not None and ws.shape == (4, 64) and ws.dtype == torch.float32
    assert cnt is not None and int(cnt[:2].abs().sum()) == 0
    assert cnt.data_ptr() == counters.buffer(x.device, "test_one_row").data_ptr()
    with pytest.raises(ValueError, match=r"out must be a contiguous \[1, 64\] torch.bfloat16"):
        w4a16_one_row.launch_buffers(x, 64, 1, 1, "test_one_row", torch.empty(1, 64))
