"""``--random-token-ids``: prompts as token-id lists of exact lengths."""

from __future__ import annotations

import pytest

from hotloop.bench.datasets import random_dataset


def test_token_id_prompts_have_exact_lengths_and_shared_prefix() -> None:
    reqs = random_dataset(5, 40, 8, range_ratio=0.5, prefix_len=6, seed=1, token_id_vocab=100)
    for r in reqs:
        assert isinstance(r.prompt, list) and all(0 <= t < 100 for t in r.prompt)
        assert r.prompt_len == len(r.prompt) and 6 + 20 <= len(r.prompt) <= 6 + 60
        assert r.prompt[:6] == reqs[0].prompt[:6]
    assert random_dataset(5, 40, 8, seed=1, token_id_vocab=100) == random_dataset(
        5, 40, 8, seed=1, token_id_vocab=100
    )
    with pytest.raises(ValueError, match="vocabulary size"):
        random_dataset(1, 4, 4, token_id_vocab=0)


def test_sse_lines_split_on_newline_only() -> None:
    import asyncio

    from hotloop.bench.serve import _sse_lines

    class Resp:
        async def aiter_bytes(self):  # type: ignore[no-untyped-def]
            body = 'data: {"text": "a\u2028b"}\n\ndata: [DO'.encode() + b"NE]\r\n"
            for i in range(0, len(body), 5):
                yield body[i : i + 5]

    async def collect() -> list[str]:
        return [line async for line in _sse_lines(Resp())]

    assert asyncio.run(collect()) == ['data: {"text": "a\u2028b"}', "", "data: [DONE]"]
