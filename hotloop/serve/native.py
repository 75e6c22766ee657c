"""Native routes: ``POST /generate`` (LMDeploy ``GenerationConfig`` fields, token ids in and out),
``POST /tokenize`` and ``POST /detokenize``.

``/generate`` answers ``GenerateResponse``; streaming sends one SSE event per increment (new text
and token ids since the previous one) and ends with ``data: [DONE]``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from hotloop.engine.async_engine import EngineDeadError
from hotloop.engine.outputs import RequestOutput
from hotloop.messages import MAX_SEED, GenerationConfig, RequestError
from hotloop.serve.chat import encode_chat
from hotloop.serve.chat_template import ChatTemplateError, encode_messages
from hotloop.serve.errors import APIError, error_body, from_request_error
from hotloop.serve.jobs import SSE_DONE, EventStreamResponse, GenerationJob, run_until_disconnect, sse
from hotloop.serve.openai_protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    GenerateRequest,
    GenerateResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from hotloop.serve.params import resolve_max_tokens, response_format_fields
from hotloop.serve.state import ServerState
from hotloop.utils.text import unicode_error

router = APIRouter()

_GEN_FIELDS = (
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "random_seed",
    "stop_words",
    "stop_token_ids",
    "ignore_eos",
    "min_new_tokens",
    "skip_special_tokens",
    "logprobs",
    "prompt_logprobs",
    "include_stop_str_in_output",
)


def _prompt_ids(state: ServerState, body: GenerateRequest) -> list[int]:
    if (body.prompt is None) == (body.input_ids is None):
        raise APIError(400, "send exactly one of prompt and input_ids", "prompt", "invalid_value")
    if body.input_ids is not None:
        state.check_token_ids(body.input_ids, "input_ids")
        return list(body.input_ids)
    assert body.prompt is not None
    if body.do_preprocess:
        # the plain prompt's checks first, on the user's own text (the template's would name another
        # field and offset, and a huge prompt would tokenize for seconds before its 400)
        state.check_text_length(len(body.prompt), "prompt")
        problem = unicode_error(body.prompt, "prompt")
        if problem is not None:
            raise APIError(400, problem, "prompt", "invalid_value")
        try:
            return encode_messages(
                state.tokenizer, [{"role": "user", "content": body.prompt}], state.chat_template
            )
        except ChatTemplateError as e:
            raise APIError(400, str(e), "do_preprocess", "invalid_value") from e
    return state.encode(body.prompt, "prompt")


@router.post("/generate", response_model=GenerateResponse)
async def generate(body: GenerateRequest, request: Request) -> Any:
    state: ServerState = request.app.state.hotloop
    state.check_model(body.model)
    ids = await state.tokenize_off_loop(_prompt_ids, state, body)  # (off the event loop: long texts)
    param = "input_ids" if body.input_ids is not None else "prompt"
    if not ids:
        raise APIError(400, f"{param} is empty: it must hold at least one token", param, "invalid_value")
    if body.max_new_tokens is None or len(ids) >= state.context_limit:
        max_new = resolve_max_tokens(state, len(ids), None, param)  # (a prompt with no room: 400)
    else:
        max_new = body.max_new_tokens
        if len(ids) + max_new > state.context_limit:
            raise APIError(
                400,
                f"the prompt has {len(ids)} tokens and max_new_tokens is {max_new}: {len(ids) + max_new} "
                f"tokens exceed the context limit of {state.context_limit}; lower max_new_tokens to at "
                f"most {state.context_limit - len(ids)} or shorten the prompt",
                "max_new_tokens",
                "context_length_exceeded",
            )
    if body.stop_token_ids:
        state.check_token_ids(body.stop_token_ids, "stop_token_ids")
    try:
        fields = {k: getattr(body, k) for k in _GEN_FIELDS}
        if body.random_seed is not None:  # any int64 / uint64, as the OpenAI routes take seed
            fields["random_seed"] = body.random_seed % MAX_SEED
        response_format, json_schema = response_format_fields(body)
        params = GenerationConfig(
            max_new_tokens=max_new, response_format=response_format, json_schema=json_schema, **fields
        )
        state.engine.validate(ids, params)
    except RequestError as e:
        raise from_request_error(e, native=True) from e
    request_id = f"gen-{uuid.uuid4().hex}"
    if body.stream:
        job = await GenerationJob.start(state, request_id, [(ids, params)], native=True)
        return EventStreamResponse(_stream(job), job.close)
    return await run_until_disconnect(request, _complete(state, request_id, ids, params))


def _piece(
    o: RequestOutput,
    text: str,
    token_ids: list[int],
    logprobs: list[Any] | None,
    prompt_logprobs: list[Any] | None = None,
) -> dict[str, Any]:
    return {
        "text": text,
        "token_ids": token_ids,
        "input_token_len": o.num_prompt_tokens,
        "generate_token_len": o.num_generated_tokens,
        "finish_reason": o.finish_reason,
        "cached_tokens": o.cached_tokens,
        "logprobs": logprobs,
        "prompt_logprobs": None
        if prompt_logprobs is None
        else [None if lp is None else _lp(lp) for lp in prompt_logprobs],
    }


def _lp(lp: Any) -> dict[str, Any]:
    out = {"token_id": lp.token_id, "logprob": max(lp.logprob, -9999.0), "top": lp.top}
    if lp.rank is not None:
        out["rank"] = lp.rank
    return out


def _lps(lps: list[Any]) -> list[dict[str, Any]]:
    return [_lp(lp) for lp in lps]


async def _complete(
    state: ServerState, request_id: str, ids: list[int], params: GenerationConfig
) -> Response | dict[str, Any]:
    job = await GenerationJob.start(state, request_id, [(ids, params)], native=True)
    text, tokens, lps = "", [], []
    last = None
    prompt_lps = None
    try:
        async for _, o in job.outputs():
            if o.prompt_logprobs is not None:
                prompt_lps = o.prompt_logprobs
            text += o.new_text
            tokens.extend(o.new_token_ids)
            lps.extend(o.logprobs)
            last = o
    finally:
        job.close()
    assert last is not None
    return _piece(last, text, tokens, _lps(lps) if params.logprobs is not None else None, prompt_lps)


async def _stream(job: GenerationJob) -> AsyncIterator[str]:
    try:
        async for _, o in job.outputs():
            if o.new_token_ids or o.new_text or o.finished or o.prompt_logprobs is not None:
                lps = _lps(o.logprobs) if o.logprobs else None
                yield sse(_piece(o, o.new_text, list(o.new_token_ids), lps, o.prompt_logprobs))
        yield SSE_DONE
    except EngineDeadError as e:
        yield sse(error_body(503, str(e), None, "engine_unavailable"))
        yield SSE_DONE
    finally:
        job.close()


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.hotloop
    state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "send exactly one of prompt and messages", "prompt", "invalid_value")
    if body.messages is not None:
        # (tokenizing a long text takes a while: off the event loop, as for generation)
        ids = await state.tokenize_off_loop(encode_chat, state, body.messages, body.add_generation_prompt)
    else:
        assert body.prompt is not None
        ids = await state.tokenize_off_loop(
            state.encode,
            body.prompt,
            "prompt",
            body.add_special_tokens,
            True,  # count_only
        )
    return {"tokens": ids, "count": len(ids), "max_model_len": state.context_limit}


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.hotloop
    state.check_model(body.model)
    state.check_token_ids(body.tokens, "tokens")
    return {"prompt": state.tokenizer.decode(body.tokens, skip_special_tokens=False)}
