"""``ModelRunner.patch_pending``: each pending row takes the id its request sampled in the previous
launch, whether the requests come in that launch's order (the fast path of steady decoding) or not,
with the destination rows given or dense."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from hotloop.executor.model_runner import ModelRunner, StepHandle
from hotloop.executor.sampler import SamplerOutput


def _runner(prev: list[Any], sampled: list[int]) -> Any:
    runner = SimpleNamespace(device=torch.device("cpu"))
    runner._last = StepHandle(prev, SamplerOutput(torch.tensor(sampled), None, None, None))
    runner.index_tensor = lambda values, slot: torch.tensor(values, dtype=torch.long)
    runner.gather_rows = lambda values, index: ModelRunner.gather_rows(runner, values, index)  # type: ignore[arg-type]
    return runner


def test_patch_pending_in_order_and_reordered() -> None:
    reqs = [SimpleNamespace(name=c) for c in "abcd"]
    sampled = [10, 11, 12, 13]  # a -> 10, b -> 11, ...
    cases = [
        (reqs, [0, 1, 2, 3], True),  # steady decode: same order, rows 0..3
        (reqs[:3], [0, 1, 2], False),  # a prefix (the last request finished), rows given
        ([reqs[2], reqs[0]], [4, 1], False),  # another order, scattered rows
        ([reqs[3], reqs[1]], [0, 1], True),  # another order, dense rows
    ]
    for pending, dst, dense in cases:
        ids = torch.zeros(6, dtype=torch.long)
        runner = _runner(reqs, sampled)
        ModelRunner.patch_pending(runner, ids, torch.tensor(dst), pending, dense)  # type: ignore[arg-type]
        want = torch.zeros(6, dtype=torch.long)
        for r, row in zip(pending, dst, strict=True):
            want[row] = 10 + "abcd".index(r.name)
        assert torch.equal(ids, want), (pending, dst, dense)
        # the id -> row map is made only where the order differs
        assert (runner._last.rows is None) == all(a is b for a, b in zip(pending, reqs, strict=False))


def test_gpu_runner_gathers_into_its_persistent_buffer() -> None:
    """The GPU runner's ``gather_rows`` writes ``values[index]`` into one buffer it keeps (no
    allocation per step), and falls back to a plain gather for another dtype or a longer index."""
    from hotloop.executor.gpu_runner import GpuModelRunner

    runner = SimpleNamespace(_gathered=torch.full((4,), -1, dtype=torch.long))
    values = torch.tensor([10, 11, 12, 13, 14])
    got = GpuModelRunner.gather_rows(runner, values, torch.tensor([3, 0, 4]))  # type: ignore[arg-type]
    assert torch.equal(got, torch.tensor([13, 10, 14]))
    assert got.data_ptr() == runner._gathered.data_ptr()
    assert torch.equal(runner._gathered, torch.tensor([13, 10, 14, -1]))
    long_index = torch.tensor([0, 1, 2, 3, 4])
    assert torch.equal(GpuModelRunner.gather_rows(runner, values, long_index), values)  # type: ignore[arg-type]
    as_int32 = GpuModelRunner.gather_rows(runner, values.int(), torch.tensor([1]))  # type: ignore[arg-type]
    assert as_int32.dtype == torch.int32 and as_int32.tolist() == [11]
