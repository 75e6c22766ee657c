"""OpenAI request fields -> ``GenerationConfig``, with the checks that need the model's limits.

OpenAI semantics: ``temperature`` defaults to 1.0 and 0 means greedy; ``top_k`` of -1 or 0 is off;
``seed`` reproduces a sampled answer (choice j of n uses ``seed + j``, so choices differ).
"""

from __future__ import annotations

import json
from typing import Any

from hotloop.messages import MAX_SEED, GenerationConfig, RequestError
from hotloop.serve.errors import APIError, from_request_error
from hotloop.serve.openai_protocol import GenerateRequest, _SamplingFields
from hotloop.serve.state import ServerState

_MAX_STOP = 64


def resolve_max_tokens(
    state: ServerState,
    prompt_len: int,
    max_tokens: int | None,
    prompt_param: str,
    max_param: str = "max_tokens",
) -> int:
    """The output budget: ``max_tokens`` if it fits the context, else a 400 naming the numbers;
    when absent, whatever room the context leaves after the prompt. ``max_param``: the request's
    field that gave ``max_tokens`` (chat's ``max_completion_tokens``), named in the error."""
    limit = state.context_limit
    where = (
        f"session_len={state.session_len}"
        if limit == state.session_len
        else (f"the KV cache's {limit} tokens (session_len={state.session_len})")
    )
    if max_tokens is None or prompt_len >= limit:
        room = limit - prompt_len
        if room < 1:  # the prompt alone leaves no room: it, not max_tokens, is what must change
            raise APIError(
                400,
                f"the prompt has {prompt_len} tokens, which leaves no room to generate within {where}; "
                f"shorten the prompt to at most {limit - 1} tokens",
                prompt_param,
                "context_length_exceeded",
            )
        return room
    assert max_tokens is not None
    if prompt_len + max_tokens > limit:
        raise APIError(
            400,
            f"the prompt has {prompt_len} tokens and {max_param} is {max_tokens}: {prompt_len + max_tokens} "
            f"tokens exceed {where}; lower {max_param} to at most {limit - prompt_len} "
            "or shorten the prompt",
            max_param,
            "context_length_exceeded",
        )
    return max_tokens


def _stop_words(stop: str | list[str] | None) -> list[str] | None:
    if stop is None:
        return None
    words = [stop] if isinstance(stop, str) else list(stop)
    if len(words) > _MAX_STOP:
        raise APIError(
            400, f"stop has {len(words)} strings; at most {_MAX_STOP} are allowed", "stop", "invalid_value"
        )
    return words


def _logit_bias(state: ServerState, bias: dict[str, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    out: dict[int, float] = {}
    vocab = state.vocab_size
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise APIError(
                400, f"logit_bias key {key!r} is not a token id", "logit_bias", "invalid_value"
            ) from None
        if not 0 <= token < vocab:
            raise APIError(
                400,
                f"logit_bias token id {token} is outside the vocabulary [0, {vocab})",
                "logit_bias",
                "invalid_value",
            )
        if not -100.0 <= value <= 100.0:
            raise APIError(
                400, f"logit_bias[{key}]={value} must lie in [-100, 100]", "logit_bias", "invalid_value"
            )
        out[token] = float(value)
    return out


def response_format_fields(body: _SamplingFields | GenerateRequest) -> tuple[str | None, str | None]:
    """``(response_format, json_schema)`` for ``GenerationConfig``: ``json_object`` (one JSON
    object), ``json_schema`` with the schema as JSON text (OpenAI's ``{"name", "schema", "strict"}``
    wrapper, or a bare schema), or ``(None, None)`` for free text."""
    rf = body.response_format
    guided = getattr(body, "guided_json", None)
    if guided is not None:
        if rf is not None and rf.type != "text":
            raise APIError(
                400, "send one of response_format and guided_json, not both", "guided_json", "invalid_value"
            )
        schema: Any = guided
        if isinstance(guided, str):
            try:
                schema = json.loads(guided)
            except ValueError:
                schema = None
        if not isinstance(schema, dict) or not schema:
            raise APIError(
                400,
                "guided_json must be a JSON Schema object (or its JSON text), e.g. "
                '{"type": "object", "properties": {...}, "required": [...]}',
                "guided_json",
                "invalid_value",
            )
        return "json_schema", json.dumps(schema)
    if rf is None or rf.type == "text":
        return None, None
    if rf.type == "json_object":
        return "json_object", None
    wrapper = rf.json_schema
    schema = wrapper.get("schema", wrapper) if isinstance(wrapper, dict) else None
    if isinstance(wrapper, dict) and "schema" not in wrapper and ({"name", "strict"} & set(wrapper)):
        schema = None  # OpenAI's wrapper without its schema: not a schema of {"name": ...} itself
    if not isinstance(schema, dict) or not schema:
        raise APIError(
            400,
            "response_format.json_schema.schema must be a JSON Schema object, e.g. "
            '{"type": "object", "properties": {...}, "required": [...]}',
            "response_format.json_schema",
            "invalid_value",
        )
    return "json_schema", json.dumps(schema)


# vLLM's request extensions hotloop does not implement, and what to send instead
_UNSUPPORTED_EXTENSIONS = {
    "guided_choice": "constrain the output with response_format json_schema, e.g. an enum",
    "guided_regex": "constrain the output with response_format json_schema (a string's pattern)",
    "guided_grammar": "constrain the output with response_format json_schema",
    "structured_outputs": "send response_format json_schema (or guided_json)",
}


def check_extensions(body: _SamplingFields) -> None:
    """vLLM's extension fields that hotloop does not implement get a 400 naming them: ignoring one
    would return unconstrained output as if it had been honoured."""
    for field, instead in _UNSUPPORTED_EXTENSIONS.items():
        if getattr(body, field, None) is not None:
            raise APIError(400, f"{field} is not supported: {instead}", field, "unsupported_parameter")
    if getattr(body, "continue_final_message", False):
        raise APIError(
            400,
            "continue_final_message is not supported: the reply always starts a new assistant turn",
            "continue_final_message",
            "unsupported_parameter",
        )


def check_stream_fields(body: _SamplingFields) -> None:
    """The fields that depend on ``stream``: ``stream_options`` belongs to a streamed request (OpenAI
    answers 400 otherwise), and ``prompt_logprobs`` above 0 (vLLM's extension) to a request that is
    not streamed (vLLM's rule: 0 is accepted with a stream and returns nothing, ``sampling_config``
    drops it)."""
    if body.stream_options is not None and not body.stream:
        raise APIError(
            400, "stream_options is only allowed with stream=true", "stream_options", "invalid_value"
        )
    if body.prompt_logprobs and body.stream:
        raise APIError(
            400,
            f"prompt_logprobs={body.prompt_logprobs} is not available with stream=true: send stream=false "
            "(or, on /v1/completions, echo=true with logprobs to stream the prompt's logprobs)",
            "prompt_logprobs",
            "unsupported_parameter",
        )


def sampling_config(
    state: ServerState,
    body: _SamplingFields,
    max_new_tokens: int,
    logprobs: int | None,
    max_param: str = "max_tokens",
) -> GenerationConfig:
    """The ``GenerationConfig`` for one choice (``choice_seed`` gives choice j its seed); errors name
    ``max_new_tokens`` as ``max_param``, the request's field."""
    temperature = 1.0 if body.temperature is None else body.temperature
    top_k = body.top_k or 0
    response_format, json_schema = response_format_fields(body)
    if body.stop_token_ids:
        state.check_token_ids(body.stop_token_ids, "stop_token_ids")
    try:
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=max(top_k, 0),
            min_p=body.min_p or 0.0,
            repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            random_seed=None if body.seed is None else body.seed % MAX_SEED,  # OpenAI: any int64
            stop_words=_stop_words(body.stop),
            stop_token_ids=body.stop_token_ids,
            ignore_eos=body.ignore_eos,
            min_new_tokens=body.min_tokens,
            skip_special_tokens=body.skip_special_tokens,
            logprobs=logprobs,
            include_stop_str_in_output=body.include_stop_str_in_output,
            logit_bias=_logit_bias(state, body.logit_bias),
            response_format=response_format,
            json_schema=json_schema,
            prompt_logprobs=None if body.stream else body.prompt_logprobs,
        )
    except RequestError as e:
        raise from_request_error(e, max_param=max_param) from e


def choice_seed(params: GenerationConfig, j: int) -> GenerationConfig:
    """Choice ``j`` of ``n``: a seeded request gives each choice its own seed."""
    if j == 0 or params.random_seed is None:
        return params
    return params.replace(random_seed=(params.random_seed + j) % MAX_SEED)


def validate_prompt(
    state: ServerState, ids: list[int], params: GenerationConfig, param: str, max_param: str = "max_tokens"
) -> None:
    """The engine's own checks (vocabulary, KV pool), reported against the user's field names."""
    try:
        state.engine.validate(ids, params)
    except RequestError as e:
        err = from_request_error(e, max_param=max_param)
        if err.param == "prompt":
            err.param = param
        raise err from e
