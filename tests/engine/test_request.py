"""``Request``'s flags derived once from its ``GenerationConfig`` (read by the runner every step)."""

from __future__ import annotations

import pytest

from hotloop.engine.request import Request
from hotloop.messages import GenerationConfig


@pytest.mark.parametrize(
    "params,greedy_from,history",
    [
        (GenerationConfig(), 0, False),
        (GenerationConfig(min_new_tokens=5), 5, False),
        (GenerationConfig(do_sample=True, temperature=0.7), None, False),
        (GenerationConfig(do_sample=True, temperature=0.0), 0, False),
        (GenerationConfig(logprobs=2), None, False),
        (GenerationConfig(logit_bias={3: 1.0}), None, False),
        (GenerationConfig(repetition_penalty=1.1), None, True),
        (GenerationConfig(presence_penalty=0.5), None, True),
        (GenerationConfig(frequency_penalty=0.5), None, True),
        (GenerationConfig(response_format="json_object"), None, True),  # the grammar reads every token
        (GenerationConfig(response_format="text"), 0, False),
    ],
)
def test_flags_follow_the_params(params: GenerationConfig, greedy_from: int | None, history: bool) -> None:
    req = Request("r", [1, 2, 3], params)
    assert req.greedy_from == greedy_from
    assert req.needs_output_history is history
