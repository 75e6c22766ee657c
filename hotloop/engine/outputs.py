"""What the engine hands back each step, per request."""

from __future__ import annotations

from dataclasses import dataclass, field

from hotloop.messages import TokenLogprob


@dataclass(slots=True)
class RequestOutput:
    """The increment one request made in one engine step.

    ``new_token_ids`` / ``new_text`` are what is new since the previous output of this request
    (text may lag tokens: bytes of an unfinished UTF-8 character or a possible stop-string prefix
    are held back). ``finish_reason`` is set on the last output: ``stop``, ``length`` or ``abort``.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_generated_tokens: int
    cached_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # GenerationConfig.prompt_logprobs: on the output that carries the first generated token, one entry
    # per prompt token (None for the first)
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass(slots=True)
class SampledToken:
    """What the executor returns for one request that sampled this step. (Not frozen: one is made
    per request per step, and a frozen dataclass's ``__init__`` costs 2.6x: 82 against 31 us for
    256.)"""

    token_id: int
    logprob: TokenLogprob | None = None
