"""The request state machine: one generation, from waiting to finished.

WAITING -> RUNNING -> FINISHED_{STOPPED,LENGTH,ABORTED}; a RUNNING request may be PREEMPTED
(its KV blocks freed, to be recomputed), which puts it back in the waiting queue.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from hotloop.messages import FinishReason, GenerationConfig, TokenLogprob


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self._finished  # type: ignore[attr-defined,no-any-return]  # set below: hashing an Enum is slow

    @property
    def finish_reason(self) -> FinishReason | None:
        return _REASONS.get(self)


_FINISHED = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}
for _status in RequestStatus:
    object.__setattr__(_status, "_finished", _status in _FINISHED)
_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
}


_serials = itertools.count()


@dataclass(eq=False)
class Request:
    """One sequence being generated.

    ``num_computed_tokens`` counts the leading tokens of ``all_token_ids`` whose K/V is in the
    cache. The scheduler grows it; preemption resets it to 0 (recompute).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: GenerationConfig
    stop_token_ids: frozenset[int] = frozenset()
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    # Overlapped scheduling: tokens already sampled on the device by a step whose output the host
    # has not collected yet (0 or 1). They count as known tokens for scheduling; the runner takes
    # their ids from the device.
    num_pending_tokens: int = 0
    # Prefix caching: how many leading full blocks are registered in the cache.
    num_registered_blocks: int = 0
    num_preemptions: int = 0
    # Prefix caching: chain hashes of the full blocks of the known tokens (they depend on the
    # tokens only, so they survive preemption), and keys that separate equal token spans.
    block_hashes: list[int] = field(default_factory=list)
    cache_extra_keys: tuple[str, ...] = ()
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    # Opaque per-request state owned by the executor (e.g. the seeded torch.Generator).
    sampler_state: Any = None
    # Opaque per-request state owned by the output processor (the incremental detokenizer).
    detokenizer: Any = None
    # Images (``hotloop.vl.ImageInput``: pixels, the prompt tokens they fill, a content hash) and
    # the embeddings of those the encoder has run for, by index, until their tokens are computed.
    mm_inputs: tuple[Any, ...] = ()
    mm_embeds: dict[int, Any] = field(default_factory=dict)
    # M-RoPE models (Qwen2-VL): the prompt's ``[3, P]`` position ids (temporal, height, width), and
    # the offset of every later token: token ``i >= P`` sits at position ``i + position_delta``.
    mrope_positions: Any = None
    position_delta: int = 0
    # Identity of this request's current block list, for the executor's caches of it: a serial number
    # unique for the process (``id()`` is reused once an object is freed) and a count of the times
    # its blocks were freed (preemption gives it new blocks).
    serial: int = field(default_factory=lambda: next(_serials))
    block_epoch: int = 0
    # The scheduler's admission reserve: the KV slots this request will surely fill and the most it
    # may fill (``Scheduler._ends``, set when it is added).
    reserve_ends: tuple[int, int] | None = None
    # JSON mode: the grammar matcher (``hotloop.engine.grammar.RequestGrammar``), set by the engine.
    grammar: Any = None
    # Penalties read the output history on the device and a grammar's mask depends on every output
    # token: such a request's pending token must reach the host before the next step is scheduled,
    # and it never runs in a multi-step round (set from ``params``).
    needs_output_history: bool = field(init=False, default=False)
    # Plain greedy (no bias, penalties, grammar or logprobs): the argmax is the token once this many
    # output tokens are known (``min_new_tokens`` masks EOS before that); None: never (set from
    # ``params``).
    greedy_from: int | None = field(init=False, default=None)
    # GenerationConfig.prompt_logprobs: per prompt token, log p(token | the ones before), filled by the
    # executor as the prompt is prefilled (entry 0 stays None); None when not asked for
    prompt_logprobs: list[TokenLogprob | None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        p = self.params
        if p.prompt_logprobs is not None:
            self.prompt_logprobs = [None] * len(self.prompt_token_ids)
        self.needs_output_history = (
            p.repetition_penalty != 1.0
            or p.presence_penalty != 0.0
            or p.frequency_penalty != 0.0
            or p.json_mode
        )
        if p.greedy and not p.logit_bias and p.logprobs is None and not self.needs_output_history:
            self.greedy_from = p.min_new_tokens or 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_scheduled_tokens(self) -> int:
        """Known tokens including the pending one: what the scheduler may compute up to."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending_tokens

    @property
    def generation_done(self) -> bool:
        """With its pending token counted, the request has reached max_new_tokens: it will finish
        when that token is collected, so it needs no further step."""
        return self.num_pending_tokens > 0 and (
            len(self.output_token_ids) + self.num_pending_tokens >= self.params.max_new_tokens
        )

    @property
    def max_new_tokens(self) -> int:
        return self.params.max_new_tokens

    @property
    def max_total_tokens(self) -> int:
        """The most tokens this request can ever hold in the cache."""
        return self.num_prompt_tokens + self.params.max_new_tokens

    def token_ids(self, start: int, end: int) -> list[int]:
        """``all_token_ids[start:end]`` without building the concatenation."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    @property
    def is_finished(self) -> bool:
        return self.status.finished
