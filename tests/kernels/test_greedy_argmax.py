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
    nan = x.clone()
    nan[:, v // 2] = float("inf")
    nan[:, -1] = float("nan")  # NaN wins over +inf, as in torch.argmax
    nan[0, 1] = float("nan")  # and the first NaN of a row wins
    return [x, tied, flat, neg, nan]


def _check(device: str, m: int, v: int, chunk: int) -> None:
    from hotloop.kernels import counters
    from hotloop.kernels.greedy_argmax import greedy_argmax

    gen = torch.Generator().manual_seed(m * 1000 + v)
    for x in _cases(m, v, gen):
        x = x.to(device)
        for _ in range(2):  # twice: a launch that left a counter set would break the next one
            got = greedy_argmax(x, chunk=chunk)
            assert got is not None and got.dtype == torch.int64
            assert torch.equal(got, x.argmax(dim=-1)), (m, v, chunk, got, x.argmax(dim=-1))
        assert int(counters.buffer(torch.device(device), "greedy_argmax").abs().sum()) == 0


@interpret
@pytest.mark.parametrize("m,v,chunk", [(1, 100, 16), (3, 257, 32), (2, 64, 64), (1, 5, 16)])
def test_greedy_argmax_interpreted(m: int, v: int, chunk: int) -> None:
    _check("cpu", m, v, chunk)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("v", [128256, 49152, 151936, 1000, 7])
def test_greedy_argmax_gpu(m: int, v: int) -> None:
    from hotloop.kernels.greedy_argmax import CHUNK

    _check("cuda", m, v, CHUNK)


def test_greedy_argmax_declines_many_rows_and_checks_input() -> None:
    pytest.importorskip("triton")
    from hotloop.kernels.greedy_argmax import MAX_ROWS, greedy_argmax

    assert greedy_argmax(torch.zeros(MAX_ROWS + 1, 8)) is None
    with pytest.raises(ValueError, match="float32"):
        greedy_argmax(torch.zeros(1, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="chunk"):
        greedy_argmax(torch.zeros(1, 8), chunk=24)


@interpret
def test_ops_greedy_argmax_dispatches_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ops.greedy_argmax`` takes the kernel where Triton runs (forced here on CPU tensors, under
    the interpreter) for up to ``MAX_ROWS`` rows, and ``torch.argmax`` beyond."""
    from hotloop.kernels import greedy_argmax as ga
    from hotloop.kernels import ops

    calls = [0]
    real = ga.greedy_argmax

    def spy(x: torch.Tensor, chunk: int = ga.CHUNK) -> torch.Tensor | None:
        calls[0] += 1
        return real(x, chunk)

    monkeypatch.setattr(ga, "greedy_argmax", spy)
    monkeypatch.setattr(ops, "use_triton", lambda x: True)
    x = torch.randn(4, 3000)
    assert torch.equal(ops.greedy_argmax(x), x.argmax(dim=-1)) and calls[0] == 1
    big = torch.randn(ga.MAX_ROWS + 1, 50)
    assert torch.equal(ops.greedy_argmax(big), big.argmax(dim=-1)) and calls[0] == 2  # declined
