"""``POST /v1/chat/completions``: messages through the chat template, streaming or not, ``n`` choices."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from hotloop.engine.async_engine import EngineDeadError
from hotloop.messages import RequestError
from hotloop.serve import tool_calls
from hotloop.serve.chat_template import ChatTemplateError, encode_messages
from hotloop.serve.errors import APIError, error_body
from hotloop.serve.jobs import SSE_DONE, EventStreamResponse, GenerationJob, run_until_disconnect, sse
from hotloop.serve.logprobs import chat_logprobs, vllm_prompt_logprobs
from hotloop.serve.openai_protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    RefusalPart,
    TextPart,
)
from hotloop.serve.params import (
    check_extensions,
    check_stream_fields,
    choice_seed,
    resolve_max_tokens,
    sampling_config,
    validate_prompt,
)
from hotloop.serve.state import ServerState
from hotloop.utils.text import unicode_error

router = APIRouter()


def _check_unicode(text: str, param: str) -> None:
    problem = unicode_error(text, param)
    if problem is not None:
        raise APIError(400, problem, param, "invalid_value")


def message_dicts(
    messages: list[ChatMessage], placeholder: str | None = None, images: list[Any] | None = None
) -> list[dict[str, Any]]:
    """Messages as the chat template wants them: text content only (parts joined by newlines).

    With ``placeholder`` (a vision-language model) an image part becomes the placeholder where it
    stands and its ``image_url`` is appended to ``images``."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.type == "image_url" and placeholder is not None and images is not None:
                    url = part.image_url  # type: ignore[union-attr]
                    images.append(url if isinstance(url, str) else url.url)
                    texts.append(placeholder)
                    continue
                if part.type == "refusal":
                    where = f"messages[{i}].content[{j}]"
                    if m.role != "assistant":
                        raise APIError(
                            400,
                            f"{where} is a refusal part; only assistant messages hold one",
                            where,
                            "invalid_value",
                        )
                    _check_unicode(part.refusal, f"{where}.refusal")  # type: ignore[union-attr]
                    texts.append(part.refusal)  # type: ignore[union-attr]
                    continue
                if part.type != "text":
                    why = (
                        f"this model takes text and image_url parts, not {part.type}"
                        if placeholder is not None
                        else "this model is text-only; send text parts only"
                    )
                    raise APIError(
                        400,
                        f"messages[{i}].content[{j}] is an {part.type} part, but {why}",
                        f"messages[{i}].content[{j}]",
                        "unsupported_content",
                    )
                _check_unicode(part.text, f"messages[{i}].content[{j}].text")  # type: ignore[union-attr]
                texts.append(part.text)  # type: ignore[union-attr]
            content = "\n".join(texts)
        elif content is not None:
            _check_unicode(content, f"messages[{i}].content")
        d: dict[str, Any] = {"role": m.role, "content": content or ""}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_calls is not None:
            d["tool_calls"] = [_template_call(c) for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def _template_call(call: Any) -> Any:
    """An assistant turn's tool call as chat templates read it: OpenAI sends the arguments as JSON
    text, and templates such as Llama 3.1's render them with ``tojson`` (a string would be quoted),
    so arguments that are a JSON object are passed as one, as vLLM does."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**fn, "arguments": args}} if isinstance(args, dict) else call


def _text_chars(content: str | list[Any] | None) -> int:
    if isinstance(content, str):
        return len(content)
    return sum(
        len(p.text) if isinstance(p, TextPart) else len(p.refusal)
        for p in content or ()
        if isinstance(p, TextPart | RefusalPart)
    )


def encode_chat(
    state: ServerState,
    messages: list[ChatMessage],
    add_generation_prompt: bool = True,
    images: list[Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of the chat; image URLs found in ``messages`` go to ``images`` (VL models only)."""
    placeholder = state.vl.placeholder if state.vl is not None else None
    state.check_text_length(sum(_text_chars(m.content) for m in messages), "messages")
    try:
        return encode_messages(
            state.tokenizer,
            message_dicts(messages, placeholder, images),
            state.chat_template,
            add_generation_prompt,
            tools,
        )
    except ChatTemplateError as e:
        raise APIError(400, str(e), "messages", "invalid_value") from e


async def expand_images(state: ServerState, ids: list[int], images: list[Any]) -> tuple[list[int], list[Any]]:
    """Fetch, decode and preprocess the images (off the event loop) and expand their placeholders.
    An image that cannot be read raises ``ImageLoadError``, a 400 naming the problem."""
    if state.vl is None:
        return ids, []
    return await asyncio.to_thread(
        state.vl.expand, ids, images, state.image_fetch_policy, state.context_limit
    )


def _tool_mode(state: ServerState, body: ChatCompletionRequest) -> str:
    """``tool_calls.check_request``'s mode, its ValueError as a 400."""
    try:
        mode = tool_calls.check_request(body.tools, body.tool_choice, state.tool_call_parser)
    except ValueError as e:
        message, param = e.args
        raise APIError(400, message, param, "invalid_value") from None
    constrained = None
    if body.response_format is not None and body.response_format.type != "text":
        constrained = "response_format"
    elif body.guided_json is not None:
        constrained = "guided_json"
    if mode == "forced" and constrained is not None:
        raise APIError(
            400,
            "a forced tool call (tool_choice required or a named function) constrains the reply itself; "
            f"it cannot be combined with {constrained}",
            constrained,
            "invalid_value",
        )
    return mode


def _check_unsupported(body: ChatCompletionRequest) -> None:
    # (0 asks for nothing and passes without logprobs, as vLLM lets it)
    if body.top_logprobs and not body.logprobs:
        raise APIError(
            400, f"top_logprobs={body.top_logprobs} needs logprobs=true", "top_logprobs", "invalid_value"
        )
    check_stream_fields(body)
    check_extensions(body)


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Any:
    state: ServerState = request.app.state.hotloop
    state.check_model(body.model)
    _check_unsupported(body)
    mode = _tool_mode(state, body)
    images: list[Any] = []
    # tokenized off the event loop: a long chat would stall every stream in flight
    ids = await state.tokenize_off_loop(
        encode_chat, state, body.messages, body.add_generation_prompt, images, body.tools
    )
    ids, mm_inputs = await expand_images(state, ids, images)
    # (errors name the field the request used: max_completion_tokens wins over max_tokens)
    requested: int | None = body.max_tokens
    max_param = "max_tokens"
    if body.max_completion_tokens is not None:
        requested, max_param = body.max_completion_tokens, "max_completion_tokens"
    max_new = resolve_max_tokens(state, len(ids), requested, "messages", max_param)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = sampling_config(state, body, max_new, logprobs, max_param)
    tools = _Tools(mode, state.tool_call_parser, parallel=body.parallel_tool_calls)
    if body.tools is not None:
        tools.names = set(tool_calls.function_names(body.tools))
    if mode == "forced":
        assert body.tools is not None
        try:
            schema, tools.name = tool_calls.forced_schema(
                body.tools, body.tool_choice, body.parallel_tool_calls
            )
        except ValueError as e:
            message, param = e.args
            raise APIError(400, message, param, "invalid_value") from None
        where = tool_calls.schema_param(body.tools, tools.name)
        try:
            params = dataclasses.replace(params, response_format="json_schema", json_schema=schema)
            # compiled off the event loop here, as GenerationJob.start does (its compile is then a
            # cache hit), so that a schema xgrammar refuses is named as the tools' field
            await asyncio.to_thread(state.engine.json_grammar.compiled, schema)
        except RequestError as e:
            if e.param != "json_schema":
                raise
            message = f"{where}: not a JSON Schema a forced tool call can follow: {e}"
            raise APIError(400, message, where, "invalid_value") from e
    elif mode == "auto" and tool_calls.needs_special_tokens(state.tool_call_parser):
        params = dataclasses.replace(params, skip_special_tokens=False)  # (the call markers)
    validate_prompt(state, ids, params, "messages", max_param)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    # the prompt's logprobs are the same for every choice: the first computes them
    rest = dataclasses.replace(params, prompt_logprobs=None)
    subs = [(ids, choice_seed(params if j == 0 else rest, j)) for j in range(body.n)]
    if body.stream:
        job = await GenerationJob.start(state, request_id, subs, mm_inputs=mm_inputs)
        return EventStreamResponse(_stream(state, body, job, request_id, len(ids), tools), job.close)
    return await run_until_disconnect(request, _complete(state, body, subs, request_id, mm_inputs, tools))


@dataclass
class _Tools:
    """How a reply's tool calls are read: ``mode`` none / auto (``parser``) / forced (``name``: the
    named function, None for ``required``)."""

    mode: str
    parser: str | None
    name: str | None = None
    names: set[str] | None = None  # the tools' function names: a call of another is text
    parallel: bool = True  # False (parallel_tool_calls): the first call of a reply only

    def split(
        self, text: str, reason: str | None
    ) -> tuple[str | None, list[tool_calls.ToolCall], str | None]:
        """(content, calls, finish reason) of a whole reply."""
        if self.mode == "forced":  # (finish reason stop, as OpenAI and vLLM give a forced call)
            calls = tool_calls.forced_calls(text, self.name)
            return (None, calls, reason) if calls else (text, [], reason)
        if self.mode == "auto" and self.parser is not None:
            content, calls = tool_calls.parse(self.parser, text, self.names)
            if calls:
                return content or None, calls if self.parallel else calls[:1], "tool_calls"
        return text, [], reason


async def _complete(
    state: ServerState,
    body: ChatCompletionRequest,
    subs: list[tuple[list[int], Any]],
    request_id: str,
    mm_inputs: list[Any] | None = None,
    tools: _Tools | None = None,
) -> Response | dict[str, Any]:
    job = await GenerationJob.start(state, request_id, subs, mm_inputs=mm_inputs or ())
    n = len(subs)
    texts = [""] * n
    lps: list[list[Any]] = [[] for _ in range(n)]
    reasons: list[str | None] = [None] * n
    generated = [0] * n
    cached = [0] * n
    prompt_lps: Any = None  # vLLM's prompt_logprobs (every choice has the same prompt)
    try:
        async for i, o in job.outputs():
            if o.prompt_logprobs is not None and body.prompt_logprobs is not None and prompt_lps is None:
                prompt_lps = vllm_prompt_logprobs(state, subs[i][0], o.prompt_logprobs, body.prompt_logprobs)
            texts[i] += o.new_text
            lps[i].extend(o.logprobs)
            generated[i] = o.num_generated_tokens
            cached[i] = max(cached[i], o.cached_tokens)
            if o.finished:
                reasons[i] = o.finish_reason
    finally:
        job.close()
    top = body.top_logprobs or 0
    tools = tools or _Tools("none", None)
    choices = []
    for i in range(n):
        content, calls, reason = tools.split(texts[i], reasons[i])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": {"content": chat_logprobs(state, lps[i], top)} if body.logprobs else None,
                "finish_reason": reason,
            }
        )
    prompt_len = len(subs[0][0])
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": choices,
        "usage": _usage(prompt_len, sum(generated), max(cached)),
        "prompt_logprobs": prompt_lps,
    }


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


async def _stream(
    state: ServerState,
    body: ChatCompletionRequest,
    job: GenerationJob,
    request_id: str,
    prompt_len: int,
    tools: _Tools | None = None,
) -> AsyncIterator[str]:
    created = int(time.time())
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    base: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": state.model_name,
    }

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None, reason: str | None = None) -> str:
        payload = {
            **base,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}],
        }
        if include_usage:
            payload["usage"] = None
        return sse(payload)

    n = len(job.streams)
    generated = [0] * n
    cached = 0
    top = body.top_logprobs or 0
    tools = tools or _Tools("none", None)
    # With tools, a reply's text is held from where a call may begin (auto) or whole (forced); its
    # calls go out in the last chunk. ``full``: the reply so far; ``sent``: characters streamed.
    full = [""] * n
    sent = [0] * n
    try:
        for i in range(n):
            yield chunk(i, {"role": "assistant", "content": ""})
        async for i, o in job.outputs():
            generated[i] = o.num_generated_tokens
            cached = max(cached, o.cached_tokens)
            lp = {"content": chat_logprobs(state, o.logprobs, top)} if body.logprobs and o.logprobs else None
            if tools.mode == "none":
                if o.new_text or o.finished or lp is not None:
                    plain = {"content": o.new_text} if o.new_text or not o.finished else {}
                    yield chunk(i, plain, lp, o.finish_reason)
                continue
            full[i] += o.new_text
            delta: dict[str, Any] = {}
            reason = None
            if not o.finished:
                if tools.mode == "auto" and tools.parser is not None:
                    upto = tool_calls.streamable(tools.parser, full[i])
                    if upto > sent[i]:
                        delta = {"content": full[i][sent[i] : upto]}
                        sent[i] = upto
            else:
                content, calls, reason = tools.split(full[i], o.finish_reason)
                if calls:
                    rest = ""
                    if tools.mode == "auto" and tools.parser is not None:
                        rest = tool_calls.content_after(tools.parser, full[i], sent[i])
                    delta = {"tool_calls": [c.to_openai(k) for k, c in enumerate(calls)]}
                    if rest.strip():
                        delta["content"] = rest
                elif len(full[i]) > sent[i]:
                    delta = {"content": full[i][sent[i] :]}
            if delta or o.finished or lp is not None:
                yield chunk(i, delta, lp, reason)
        if include_usage:
            yield sse({**base, "choices": [], "usage": _usage(prompt_len, sum(generated), cached)})
        yield SSE_DONE
    except EngineDeadError as e:
        yield sse(error_body(503, str(e), None, "engine_unavailable"))
        yield SSE_DONE
    finally:
        job.close()
