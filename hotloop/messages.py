"""Messages between the user and the engine: ``GenerationConfig`` in, ``Response`` out.

Field names follow LMDeploy's ``GenerationConfig`` and ``Response`` so its users can switch.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from dataclasses import dataclass, field
from typing import Any


class RequestError(ValueError):
    """A request cannot be served as given; the message names the field and the limit.

    ``param`` is the offending field, for OpenAI-shaped error bodies.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"

    def __str__(self) -> str:
        return self.value


MIN_TEMPERATURE = 1e-5  # below this a sampled request decodes greedily (as vLLM)
MAX_SEED = 2**63  # seeds lie in [0, MAX_SEED): torch generators take a signed 64-bit seed
MIN_REPETITION_PENALTY = 1e-6  # smaller penalties overflow float32 logits (x / penalty) into NaN rows
RESPONSE_FORMATS = (None, "text", "json_object", "json_schema")  # GenerationConfig.response_format


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate for one request.

    do_sample=False means greedy decoding whatever the temperature; with do_sample=True a
    temperature below ``MIN_TEMPERATURE`` (0 included) is also greedy (dividing the logits by a
    tinier one overflows them). top_k=0 and top_p=1.0 and min_p=0.0 switch those filters off.
    random_seed: an integer in [0, 2**63). min_new_tokens: until this many tokens, EOS and
    stop_token_ids are masked and stop_words do not stop (as in vLLM).
    logprobs: how many top alternatives to return with each generated token's log-probability
    (0 returns only the chosen token's; None returns none).
    prompt_logprobs (vLLM's field): the same for every prompt token after the first, log p(token |
    the tokens before it), computed while the prompt is prefilled (the first output carries them;
    ``Response.prompt_logprobs``, whose first entry is None). Such a request does not reuse prefix-
    cached blocks: every prompt position must go through the model to have logits.
    response_format: None or "text" is free text; "json_object" constrains the output to one JSON
    object (OpenAI's JSON mode; ``hotloop.engine.grammar``), "json_schema" to one JSON value that
    follows ``json_schema`` (a JSON Schema as JSON text; properties it does not list are not
    allowed, as with OpenAI's strict structured outputs). Such a request stops when the value is
    closed (finish reason stop) and outranks ``min_new_tokens`` and ``ignore_eos`` there; if it runs
    out of ``max_new_tokens`` first, its text is an unfinished value (finish reason length).
    bad_token_ids / bad_words (LMDeploy's fields): tokens that are never generated; a bad word bans
    every token whose text contains it, or, for a word found in more than 256 tokens, the tokens
    that spell it alone (``engine/word_ids.py``).
    """

    n: int = 1
    max_new_tokens: int = 512
    do_sample: bool = False
    temperature: float = 0.8
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    random_seed: int | None = None
    stop_words: tuple[str, ...] | list[str] | None = None
    stop_token_ids: tuple[int, ...] | list[int] | None = None
    ignore_eos: bool = False
    min_new_tokens: int | None = None
    skip_special_tokens: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    response_format: str | None = None
    json_schema: str | None = None
    bad_words: tuple[str, ...] | list[str] | None = None
    bad_token_ids: tuple[int, ...] | list[int] | None = None

    def __post_init__(self) -> None:
        def bad(name: str, limit: str) -> RequestError:
            return RequestError(f"{name}={getattr(self, name)!r} {limit}", param=name)

        # numbers first: a string or None where a number belongs, a NaN or an infinity is refused
        # by name (a NaN passes every one-sided comparison below)
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty"):  # fmt: skip
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
        for name in ("do_sample", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be True or False")

        def integer(v: object) -> bool:  # (a bool is an int to Python: True would mean 1)
            return isinstance(v, int) and not isinstance(v, bool)

        if not integer(self.n) or self.n < 1:
            raise bad("n", "must be an integer >= 1")
        if not integer(self.max_new_tokens) or self.max_new_tokens < 1:
            raise bad("max_new_tokens", "must be an integer >= 1")
        if self.temperature < 0:
            raise bad("temperature", "must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must lie in (0, 1]")
        if not integer(self.top_k) or self.top_k < 0:
            raise bad("top_k", "must be an integer >= 0 (0 disables it)")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must lie in [0, 1]")
        if self.repetition_penalty < MIN_REPETITION_PENALTY:
            # (0 and tiny values divide the float32 logits into infinities, a NaN row)
            raise bad("repetition_penalty", f"must be >= {MIN_REPETITION_PENALTY:g} (1 disables it)")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "must lie in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "must lie in [-2, 2]")
        if self.min_new_tokens is not None and (not integer(self.min_new_tokens) or self.min_new_tokens < 0):
            raise bad("min_new_tokens", "must be an integer >= 0")
        if self.min_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise bad("min_new_tokens", f"must be <= max_new_tokens={self.max_new_tokens}")
        if self.random_seed is not None and (
            not integer(self.random_seed) or not 0 <= self.random_seed < MAX_SEED
        ):
            raise bad("random_seed", "must be an integer in [0, 2**63)")
        if self.logprobs is not None and (not integer(self.logprobs) or not 0 <= self.logprobs <= 20):
            raise bad("logprobs", "must be an integer in [0, 20]")
        if self.prompt_logprobs is not None and (
            not integer(self.prompt_logprobs) or not 0 <= self.prompt_logprobs <= 20
        ):
            raise bad("prompt_logprobs", "must be an integer in [0, 20]")
        if self.response_format not in RESPONSE_FORMATS:
            raise bad("response_format", "must be None, 'text', 'json_object' or 'json_schema'")
        if self.response_format == "json_schema":
            try:
                schema = json.loads(self.json_schema) if isinstance(self.json_schema, str) else None
            except ValueError:
                schema = None
            if not isinstance(schema, dict):
                raise bad(
                    "json_schema",
                    "must be a JSON Schema object as JSON text with response_format='json_schema'",
                )
        elif self.json_schema is not None:
            raise bad("json_schema", "is only used with response_format='json_schema'")
        for name in ("stop_words", "bad_words"):
            words = getattr(self, name)
            if isinstance(words, str):
                words = (words,)
            if words is not None:
                if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) for w in words):
                    raise bad(name, "must be a string or a list of strings")
                object.__setattr__(self, name, tuple(w for w in words if w))
        for name in ("stop_token_ids", "bad_token_ids"):
            ids = getattr(self, name)
            if ids is not None:
                if not isinstance(ids, (list, tuple)) or not all(
                    isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
                ):
                    raise bad(name, "must be a list of token ids (integers >= 0)")
                object.__setattr__(self, name, tuple(int(t) for t in ids))
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and not math.isnan(v)
                and v != math.inf
                for v in self.logit_bias.values()
            ):
                # -inf bans a token (bad_words use it); +inf would make the softmax NaN
                raise bad("logit_bias", "must map token ids to numbers below +inf (-inf bans a token)")

    @property
    def json_mode(self) -> bool:
        """The output is constrained by a JSON grammar (``json_object`` or ``json_schema``)."""
        return self.response_format in ("json_object", "json_schema")

    @property
    def greedy(self) -> bool:
        return (not self.do_sample) or self.temperature < MIN_TEMPERATURE or self.top_k == 1

    def replace(self, **changes: Any) -> GenerationConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one token, with the top alternatives (id -> logprob). ``rank``: the
    token's place in its distribution (1: the most likely; tokens tied with it count as before it,
    as vLLM ranks), where it was computed (prompt logprobs), else None."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)
    rank: int | None = None


@dataclass
class Response:
    """The result (or, while streaming, the increment so far) of one generation.

    In a stream, ``text`` and ``token_ids`` are the new piece since the previous response;
    from ``pipe(...)`` they are the whole output.
    """

    text: str
    generate_token_len: int
    input_token_len: int
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    index: int = 0  # which prompt of the call
    cached_tokens: int = 0
    session_id: int | None = None
    choice: int = 0  # which of the prompt's ``n`` samples (GenerationConfig.n)
    # with GenerationConfig.prompt_logprobs: one per prompt token, None for the first (it has no prefix)
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.input_token_len

    @property
    def completion_tokens(self) -> int:
        return self.generate_token_len
