"""``POST /v1/completions``: raw prompts (text, token ids, or lists of either), ``echo``, ``logprobs``.

No chat template is applied. Choice ``index`` is ``prompt_index * n + j``. Usage counts each
prompt once, however many choices it has. ``max_tokens`` defaults to 16, as in OpenAI's API.

``echo`` with ``logprobs`` returns the prompt's tokens and their log-probabilities (the first
token's is null: it has no prefix) before the generated ones, as vLLM does; with ``max_tokens: 0``
nothing is generated (the prompt is scored: lm-evaluation-harness' loglikelihood requests).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from hotloop.engine.async_engine import EngineDeadError
from hotloop.messages import GenerationConfig
from hotloop.serve.errors import APIError, error_body
from hotloop.serve.jobs import SSE_DONE, EventStreamResponse, GenerationJob, run_until_disconnect, sse
from hotloop.serve.logprobs import (
    CompletionLogprobAccumulator,
    merge_completion_logprobs,
    prompt_completion_logprobs,
    vllm_prompt_logprobs,
)
from hotloop.serve.openai_protocol import CompletionRequest, CompletionResponse
from hotloop.serve.params import (
    check_extensions,
    check_stream_fields,
    choice_seed,
    resolve_max_tokens,
    sampling_config,
    validate_prompt,
)
from hotloop.serve.state import ServerState

router = APIRouter()


def _prompts(state: ServerState, prompt: Any, echo: bool = True) -> list[tuple[list[int], str]]:
    """Each prompt as (token ids, text for echo; token-id prompts are decoded only with ``echo``)."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        items = [prompt]
    else:
        items = list(prompt)
    if not items:
        raise APIError(
            400, "prompt is empty: send a string, a list of strings, or token ids", "prompt", "invalid_value"
        )
    out = []
    for k, p in enumerate(items):
        param = "prompt" if len(items) == 1 else f"prompt[{k}]"
        if isinstance(p, str):
            ids = state.encode(p, param)
            text = p
        else:
            ids = list(p)
            state.check_token_ids(ids, param)
            text = state.tokenizer.decode(ids, skip_special_tokens=False) if ids and echo else ""
        if not ids:
            raise APIError(400, f"{param} is empty: it must hold at least one token", param, "invalid_value")
        out.append((ids, text))
    return out


def _check_unsupported(body: CompletionRequest) -> None:
    check_stream_fields(body)
    check_extensions(body)
    if body.suffix:
        raise APIError(400, "suffix is not supported", "suffix", "unsupported_parameter")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(
            400,
            f"best_of={body.best_of} is not supported (only best_of == n)",
            "best_of",
            "unsupported_parameter",
        )
    if body.max_tokens == 0 and not body.echo:
        raise APIError(
            400,
            "max_tokens=0 generates nothing: it is only allowed with echo=true (to score the prompt)",
            "max_tokens",
            "invalid_value",
        )
    if body.max_tokens == 0 and body.min_tokens:
        raise APIError(
            400,
            f"min_tokens={body.min_tokens} with max_tokens=0: nothing is generated",
            "min_tokens",
            "invalid_value",
        )


def _ids_prompt(prompt: Any) -> bool:
    """Whether the prompt is token ids (echoed decoded, special tokens shown), not text."""
    return not isinstance(prompt, str) and not (
        isinstance(prompt, list) and prompt and isinstance(prompt[0], str)
    )


@router.post("/v1/completions", response_model=CompletionResponse)
async def create_completion(body: CompletionRequest, request: Request) -> Any:
    state: ServerState = request.app.state.hotloop
    state.check_model(body.model)
    _check_unsupported(body)
    # tokenized off the event loop: a long prompt would stall every stream in flight
    prompts = await state.tokenize_off_loop(_prompts, state, body.prompt, bool(body.echo))
    subs: list[tuple[list[int], GenerationConfig]] = []
    for k, (ids, _text) in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt[{k}]"
        # max_tokens 0 (echo only): one token is generated, as the engine needs, and dropped
        max_new = resolve_max_tokens(state, len(ids), 1 if body.max_tokens == 0 else body.max_tokens, param)
        params = sampling_config(state, body, max_new, body.logprobs)
        if body.echo and body.logprobs is not None:
            params = dataclasses.replace(
                params, prompt_logprobs=max(body.logprobs, params.prompt_logprobs or 0)
            )
        validate_prompt(state, ids, params, param)
        # vLLM's prompt_logprobs are the same for every choice of a prompt: the first computes them
        # (an echo with logprobs needs them in every choice's stream, so each computes its own)
        shared = body.prompt_logprobs is not None and not (body.echo and body.logprobs is not None)
        rest = dataclasses.replace(params, prompt_logprobs=None) if shared else params
        subs.extend((ids, choice_seed(params if j == 0 else rest, j)) for j in range(body.n))
    request_id = f"cmpl-{uuid.uuid4().hex}"
    if body.stream:
        job = await GenerationJob.start(state, request_id, subs, score_only=body.max_tokens == 0)
        return EventStreamResponse(_stream(state, body, job, request_id, prompts), job.close)
    return await run_until_disconnect(request, _complete(state, body, subs, request_id, prompts))


def _usage(prompts: list[tuple[list[int], str]], generated: list[int], cached: list[int]) -> dict[str, Any]:
    p = sum(len(ids) for ids, _ in prompts)
    c = sum(generated)
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": sum(cached)},
    }


async def _complete(
    state: ServerState,
    body: CompletionRequest,
    subs: list[tuple[list[int], GenerationConfig]],
    request_id: str,
    prompts: list[tuple[list[int], str]],
) -> Response | dict[str, Any]:
    score_only = body.max_tokens == 0  # (echo): the one generated token is dropped
    job = await GenerationJob.start(state, request_id, subs, score_only=score_only)
    n = len(subs)
    texts = [prompts[i // body.n][1] if body.echo else "" for i in range(n)]
    accs = [CompletionLogprobAccumulator(state, body.logprobs or 0, len(texts[i])) for i in range(n)]
    lps: list[dict[str, Any] | None] = [None] * n
    prompt_lps: list[Any] = [None] * n  # vLLM's prompt_logprobs, where asked for
    reasons: list[str | None] = [None] * n
    generated = [0] * n
    cached = [0] * len(prompts)
    try:
        async for i, o in job.outputs():
            if o.prompt_logprobs is not None and body.prompt_logprobs is not None:
                prompt_lps[i] = vllm_prompt_logprobs(
                    state, prompts[i // body.n][0], o.prompt_logprobs, body.prompt_logprobs
                )
            if o.prompt_logprobs is not None and body.echo and body.logprobs is not None:
                ids, echoed = prompts[i // body.n]
                lps[i] = prompt_completion_logprobs(
                    state, ids, o.prompt_logprobs, body.logprobs or 0, echoed, _ids_prompt(body.prompt)
                )
            cached[i // body.n] = max(cached[i // body.n], o.cached_tokens)
            if score_only:
                reasons[i] = "length" if o.finished else None
                continue
            texts[i] += o.new_text
            if body.logprobs is not None:
                lps[i] = merge_completion_logprobs(lps[i], accs[i].add(o.logprobs))
            generated[i] = o.num_generated_tokens
            if o.finished:
                reasons[i] = o.finish_reason
    finally:
        job.close()
    for i in range(n):  # each choice shows its prompt's (computed by the prompt's first choice)
        if prompt_lps[i] is None and body.prompt_logprobs is not None:
            prompt_lps[i] = prompt_lps[i - i % body.n]
    choices = [
        {
            "index": i,
            "text": texts[i],
            "logprobs": lps[i],
            "finish_reason": reasons[i],
            "prompt_logprobs": prompt_lps[i],
        }
        for i in range(n)
    ]
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": choices,
        "usage": _usage(prompts, generated, cached),
    }


async def _stream(
    state: ServerState,
    body: CompletionRequest,
    job: GenerationJob,
    request_id: str,
    prompts: list[tuple[list[int], str]],
) -> AsyncIterator[str]:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    base: dict[str, Any] = {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
    }
    n = len(job.streams)
    accs = [CompletionLogprobAccumulator(state, body.logprobs or 0) for _ in range(n)]
    generated = [0] * n
    cached = [0] * len(prompts)
    echoed = [not body.echo] * n

    def chunk(index: int, text: str, logprobs: Any, reason: str | None) -> str:
        payload = {
            **base,
            "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}],
        }
        if include_usage:
            payload["usage"] = None
        return sse(payload)

    score_only = body.max_tokens == 0  # (echo): the one generated token is dropped
    try:
        async for i, o in job.outputs():
            cached[i // body.n] = max(cached[i // body.n], o.cached_tokens)
            text = "" if score_only else o.new_text
            if not score_only:
                generated[i] = o.num_generated_tokens
            head = None
            if not echoed[i]:
                echoed[i] = True
                ids, prompt_text = prompts[i // body.n]
                text = prompt_text + text
                accs[i].offset = len(prompt_text)
                if o.prompt_logprobs is not None:
                    head = prompt_completion_logprobs(
                        state,
                        ids,
                        o.prompt_logprobs,
                        body.logprobs or 0,
                        prompt_text,
                        _ids_prompt(body.prompt),
                    )
            lp = (
                accs[i].add(o.logprobs)
                if body.logprobs is not None and o.logprobs and not score_only
                else None
            )
            if head is not None:
                lp = head if lp is None else merge_completion_logprobs(head, lp)
            if text or o.finished or lp is not None:
                reason = ("length" if score_only else o.finish_reason) if o.finished else None
                yield chunk(i, text, lp, reason)
        if include_usage:
            yield sse({**base, "choices": [], "usage": _usage(prompts, generated, cached)})
        yield SSE_DONE
    except EngineDeadError as e:
        yield sse(error_body(503, str(e), None, "engine_unavailable"))
        yield SSE_DONE
    finally:
        job.close()
