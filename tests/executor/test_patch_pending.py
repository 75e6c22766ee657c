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
