"""The few-row greedy argmax kernel against ``torch.argmax``: ties, -inf, masked tails, counters."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import interpret


def _cases(m: int, v: int, gen: torch.Generator) -> list[torch.Tensor]:
    x = torch.randn(m, v, generator=gen)
    tied = x.clone()
    tied[:, v // 3] = tied[:, 2 * v // 3] = tied.max() + 1  # a tie across chunks: the first wins
    flat = torch.zeros(m, v)  # every logit tied: index 0
    neg = torch.full((m, v), float("-inf"))
    neg[:, -1] = -1e30  # the only finite logit is the last one, in the last (masked) chunk
    return [x, tied, flat, neg]


def _check(device: str, m: int, v: int, chunk: int) -> None:
    from hotloop.kernels import counters
    from hotloop.kernels.greedy_argmax import greedy_argmax

    gen = torch.Generator().manual_seed(m * 1000 + v)
    for x in _cases(m, v, gen):
        x = x.to(device)
        got = greedy_argmax(x, chunk=chunk)
        assert got is not None and got.dtype == torch.int64
        assert torch.equal(got, x.argmax(dim=-1)), (m, v, chunk)
    if device == "cuda":
        assert int(counters.buffer(torch.device("cuda"), "greedy_argmax").abs().sum()) == 0


@interpret
@pytest.mark.parametrize("m,v,chunk", [(1, 100, 16), (3, 257, 32), (2, 64, 64), (1, 5, 16)])
def test_greedy_argmax_interpreted(m: int, v: int, chunk: int) -> None:
    _check("cpu", m, v, chunk)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("v", [128256, 49152, 151936, 1000, 7])
def test_greedy_argmax_gpu(m: int, v: int) -> None:
    from hotloop.kernels.greedy_argmax import CHUNK

    for _ in range(2):  # twice: the counters are back at zero after a launch
        _check("cuda", m, v, CHUNK)


def test_greedy_argmax_declines_many_rows_and_checks_input() -> None:
    pytest.importorskip("triton")
    from hotloop.kernels.greedy_argmax import MAX_ROWS, greedy_argmax

    assert greedy_argmax(torch.zeros(MAX_ROWS + 1, 8)) is None
    with pytest.raises(ValueError, match="float32"):
        greedy_argmax(torch.zeros(1, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="chunk"):
        greedy_argmax(torch.zeros(1, 8), chunk=24)


def test_ops_greedy_argmax_is_torch_argmax_on_cpu() -> None:
    from hotloop.kernels import ops

    x = torch.randn(4, 50)
    assert torch.equal(ops.greedy_argmax(x), x.argmax(dim=-1))
