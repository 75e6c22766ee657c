"""``GpuModelRunner._graph_bucket`` (one pass over the rows, run every step) against the rule it
implements, spelled out with the helpers it short-cuts: every row one sampled token, the buffers
fit the step, no image token, no 3-D (M-RoPE) positions."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

from hotloop.executor.gpu_runner import GpuModelRunner
from hotloop.vl import merge, mrope


def _rule(runner: Any, out: Any) -> int | None:
    g, buffers, rows = runner.graphs, runner.buffers, out.scheduled
    fits = (
        len(rows) <= buffers.max_seqs
        and sum(s.num_tokens for s in rows) <= buffers.max_tokens
        and all(len(s.request.block_ids) <= buffers.width for s in rows)
    )
    if (
        g is not None
        and len(rows) <= g.max_batch
        and all(s.num_tokens == 1 and s.samples for s in rows)
        and fits
        and not merge.has_images(rows)
        and not mrope.needs_3d(rows)
    ):
        return g.bucket_for(len(rows))
    return None


def _random_step(rng: random.Random) -> Any:
    rows = []
    for _ in range(rng.randint(0, 6)):
        prompt = rng.randint(1, 8)
        images: tuple[Any, ...] = ()
        if rng.random() < 0.3:
            at = rng.randrange(prompt)
            images = (SimpleNamespace(offset=at, end=at + rng.randint(1, 3)),)
        req = SimpleNamespace(
            block_ids=[0] * rng.randint(0, 4),
            prompt_token_ids=[0] * prompt,
            num_prompt_tokens=prompt,
            mm_inputs=images,
            # 3-D positions come with images, and (checked too) without
            mrope_positions=object() if rng.random() < (0.5 if images else 0.1) else None,
        )
        rows.append(
            SimpleNamespace(
                request=req,
                num_tokens=1 if rng.random() < 0.85 else rng.randint(2, 3),
                samples=rng.random() < 0.9,
                start=rng.randint(0, prompt + 2),
            )
        )
    return SimpleNamespace(scheduled=rows)


def test_graph_bucket_follows_the_rule() -> None:
    rng = random.Random(0)
    taken = 0
    for _ in range(5000):
        max_batch = rng.randint(0, 6)
        graphs = SimpleNamespace(max_batch=max_batch, bucket_for=lambda b: b) if rng.random() < 0.9 else None
        buffers = SimpleNamespace(
            max_seqs=rng.randint(0, 6), max_tokens=rng.randint(0, 6), width=rng.randint(0, 3)
        )
        runner = SimpleNamespace(graphs=graphs, buffers=buffers)
        out = _random_step(rng)
        got = GpuModelRunner._graph_bucket(runner, out)  # type: ignore[arg-type]
        assert got == _rule(runner, out)
        taken += got is not None
    assert taken > 100  # the graph path itself is exercised, not only refusals
