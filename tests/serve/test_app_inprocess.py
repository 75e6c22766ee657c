"""The app in-process over a real ``Engine`` with a toy executor (no model): behaviour that is slow or
awkward to provoke in the live server: concurrency limits, shutdown, engine failure, CORS."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2 as httpx
import pytest
from fake_engine import make_built

from hotloop.serve import state as state_module
from hotloop.serve.api_server import ServerArgs, create_app
from hotloop.serve.gate import key_is_valid
from hotloop.serve.state import ServerState


@asynccontextmanager
async def app_client(
    args: ServerArgs | None = None, **built_kw
) -> AsyncIterator[tuple[httpx.AsyncClient, ServerState]]:
    app = create_app(make_built(**built_kw), args or ServerArgs())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as c:
            yield c, app.state.hotloop


def run(coro):
    return asyncio.run(coro)


def test_requests_beyond_max_concurrent_wait_and_all_complete() -> None:
    async def main() -> None:
        async with app_client(ServerArgs(max_concurrent_requests=2), step_delay=0.005) as (c, state):
            peak = {"open": 0, "pending": 0}
            done = asyncio.Event()

            async def watch() -> None:
                while not done.is_set():
                    peak["open"] = max(peak["open"], state.async_engine.num_open_streams)
                    peak["pending"] = max(peak["pending"], state.metrics.pending)
                    await asyncio.sleep(0.001)

            watcher = asyncio.ensure_future(watch())
            body = {"prompt": "abc", "max_tokens": 10, "temperature": 0}
            rs = await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(7)))
            done.set()
            await watcher
            assert [r.status_code for r in rs] == [200] * 7
            assert all(r.json()["usage"]["completion_tokens"] == 10 for r in rs)
            assert peak["open"] <= 2 and peak["pending"] >= 1, peak
            assert (
                state.metrics.pending == 0 and state.engine.num_free_blocks == state.engine.num_total_blocks
            )

    run(main())


def test_503_while_shutting_down() -> None:
    async def main() -> None:
        async with app_client() as (c, state):
            state.draining = True
            r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
            assert (await c.get("/health")).status_code == 503
            assert (await c.get("/v1/models")).status_code == 503

    run(main())


def test_engine_failure_fails_requests_and_health() -> None:
    async def main() -> None:
        async with app_client() as (c, state):
            assert (await c.get("/health")).status_code == 200
            state.engine.executor.fail_next = True
            r = await c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5})
            assert r.status_code == 503 and "injected executor failure" in r.json()["error"]["message"]
            h = await c.get("/health")
            assert h.status_code == 503 and h.json()["error"]["code"] == "engine_unavailable"
            r = await c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5})
            assert r.status_code == 503

    run(main())


def test_engine_failure_mid_stream_sends_an_error_event() -> None:
    async def main() -> None:
        async with app_client(step_delay=0.002) as (c, state):
            executor = state.engine.executor

            async def fail_soon() -> None:
                await asyncio.sleep(0.05)
                executor.fail_next = True

            body = {
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 200,
                "stream": True,
                "ignore_eos": True,
            }
            _, r = await asyncio.gather(fail_soon(), c.post("/v1/chat/completions", json=body))
            events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            assert (
                "error" in json.loads(events[-2])
                and json.loads(events[-2])["error"]["code"] == "engine_unavailable"
            )

    run(main())


def test_cors_preflight_needs_no_key_and_keys_are_checked() -> None:
    async def main() -> None:
        async with app_client(ServerArgs(api_keys=("k1", "k2"), allow_origins=("http://ui.example",))) as (
            c,
            _,
        ):
            r = await c.options(
                "/v1/chat/completions",
                headers={"Origin": "http://ui.example", "Access-Control-Request-Method": "POST"},
            )
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ui.example"
            assert (await c.get("/v1/models")).status_code == 401
            assert (await c.get("/v1/models", headers={"Authorization": "Bearer k2"})).status_code == 200
            assert (await c.get("/v1/models", headers={"Authorization": "Basic k2"})).status_code == 401
            assert (await c.get("/health")).status_code == 200

    run(main())
    assert key_is_valid("k2", ("k1", "k2")) and not key_is_valid("k", ("k1", "k2"))
    assert not key_is_valid("", ("k1",)) and not key_is_valid("k1", ())


def test_toy_engine_choices_stop_and_index_order() -> None:
    async def main() -> None:
        async with app_client() as (c, _):
            base = {"prompt": ["ab", "cd"], "n": 2, "max_tokens": 6, "temperature": 0}
            r = (await c.post("/v1/completions", json=base)).json()
            assert [ch["index"] for ch in r["choices"]] == [0, 1, 2, 3]
            texts = [ch["text"] for ch in r["choices"]]
            assert texts[0] == texts[1] and texts[2] == texts[3] and texts[0] != texts[2]
            assert r["usage"] == {
                "prompt_tokens": 4,
                "completion_tokens": 24,
                "total_tokens": 28,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
            stop = texts[0][2:4]
            r2 = (await c.post("/v1/completions", json={**base, "prompt": "ab", "stop": [stop]})).json()
            assert r2["choices"][0]["text"] == texts[0][: texts[0].index(stop)]
            assert r2["choices"][0]["finish_reason"] == "stop"
            eos = (
                await c.post("/v1/completions", json={"prompt": "EOS", "max_tokens": 9, "temperature": 0})
            ).json()
            assert eos["choices"][0]["finish_reason"] == "stop" and eos["usage"]["completion_tokens"] == 4
            chat = (
                await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "EOS"}]})
            ).json()
            assert chat["usage"]["completion_tokens"] == 4  # no max_tokens: up to session_len, EOS ends it

    run(main())


def test_text_that_is_not_unicode_is_a_400_naming_the_field() -> None:
    """A lone UTF-16 surrogate (a JSON string cut inside an emoji) cannot be tokenized: 400 with the
    field, never a 500; the server keeps serving."""

    async def main() -> None:
        async with app_client() as (c, state):
            cases = [
                (
                    "/v1/chat/completions",
                    '{"messages":[{"role":"user","content":"hi \\ud800 x"}],"max_tokens":2}',
                    "messages[0].content",  # (at character 3 of it, not of the rendered chat)
                ),
                (
                    "/v1/chat/completions",
                    '{"messages":[{"role":"user","content":[{"type":"text","text":"\\udfff"}]}]}',
                    "messages[0].content[0].text",
                ),
                ("/v1/completions", '{"prompt":"hi \\ud800 x","max_tokens":2}', "prompt"),
                ("/v1/completions", '{"prompt":["ok","hi \\udfff"],"max_tokens":2}', "prompt[1]"),
                ("/generate", '{"prompt":"hi \\ud800","max_new_tokens":2}', "prompt"),
                ("/tokenize", '{"prompt":"hi \\ud800"}', "prompt"),
            ]
            for path, raw, param in cases:
                r = await c.post(path, content=raw, headers={"content-type": "application/json"})
                assert r.status_code == 400, (path, r.status_code, r.text)
                err = r.json()["error"]
                assert err["param"] == param and "unpaired UTF-16 surrogate" in err["message"], (path, err)
                if param == "messages[0].content":
                    assert "at character 3;" in err["message"], err
            ok = await c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2})
            assert ok.status_code == 200
            assert state.engine.num_free_blocks == state.engine.num_total_blocks

    run(main())


def test_stream_options_need_stream_and_min_tokens_fit_max_tokens() -> None:
    async def main() -> None:
        async with app_client() as (c, _state):
            chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
            for path, body in (
                ("/v1/chat/completions", chat),
                ("/v1/completions", {"prompt": "abc", "max_tokens": 3}),
            ):
                r = await c.post(path, json={**body, "stream_options": {"include_usage": True}})
                assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options", r.text
                r = await c.post(path, json={**body, "min_tokens": 50})
                err = r.json()["error"]
                assert r.status_code == 400 and err["param"] == "min_tokens", r.text
                # the request's own names, not the engine's (min_new_tokens / max_new_tokens)
                assert "min_tokens=50" in err["message"] and "max_tokens=3" in err["message"], err
                assert "_new_tokens" not in err["message"], err
            r = await c.post("/generate", json={"prompt": "abc", "max_new_tokens": 3, "min_new_tokens": 4})
            assert r.status_code == 400 and r.json()["error"]["param"] == "min_new_tokens", r.text
            assert "max_new_tokens=3" in r.json()["error"]["message"]  # the native route's names

    run(main())


def test_advertised_max_model_len_is_what_a_request_may_hold() -> None:
    async def main() -> None:
        # a KV pool of 8 x 16 = 128 tokens under a 256-token session: a request holds at most 128
        async with app_client(session_len=256, num_blocks=8) as (c, state):
            limit = state.context_limit
            assert limit < state.session_len
            models = (await c.get("/v1/models")).json()["data"][0]
            tok = (await c.post("/tokenize", json={"prompt": "abc"})).json()
            assert models["max_model_len"] == limit == tok["max_model_len"]
            over = await c.post("/v1/completions", json={"prompt": "abc", "max_tokens": limit})
            assert over.status_code == 400  # the advertised length is the one enforced

    run(main())


def test_prompts_are_tokenized_off_the_event_loop() -> None:
    async def main() -> None:
        async with app_client() as (_c, state):
            import threading

            name = await state.tokenize_off_loop(lambda: threading.current_thread().name)
            assert name.startswith("hotloop-tokenize") and name != threading.current_thread().name

    run(main())


def test_a_json_body_without_content_type_is_read_as_json() -> None:
    async def main() -> None:
        async with app_client() as (c, _state):
            raw = json.dumps({"prompt": "abc", "max_tokens": 2})
            r = await c.post("/v1/completions", content=raw)  # no Content-Type header
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
            r = await c.post("/v1/completions", content=raw, headers={"content-type": "text/plain"})
            assert r.status_code == 400 and "Content-Type must be application/json" in r.text

    run(main())


def test_null_means_the_default_and_non_finite_numbers_are_refused() -> None:
    """OpenAI and vLLM read an explicit null on a defaulted field as the default (SDKs that write
    every field send them); Infinity is valid JSON to Python's parser but no valid temperature."""

    async def main() -> None:
        async with app_client() as (c, _state):
            msgs = [{"role": "user", "content": "x"}]
            nulls = {"n": None, "stream": None, "logprobs": None, "ignore_eos": None, "temperature": None}
            r = await c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, **nulls})
            assert r.status_code == 200 and len(r.json()["choices"]) == 1, r.text
            r = await c.post(
                "/v1/completions", json={"prompt": "abc", "max_tokens": 2, "echo": None, "n": None}
            )
            assert r.status_code == 200 and not r.json()["choices"][0]["text"].startswith("abc"), r.text
            raw = '{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"temperature":Infinity}'
            r = await c.post(
                "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
            )
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == "temperature" and "finite" in err["message"], (
                r.text
            )

    run(main())


def test_messages_and_tool_choice_openai_refuses() -> None:
    async def main() -> None:
        async with app_client() as (c, _state):
            r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": None}]})
            err = r.json()["error"]
            assert (
                r.status_code == 400 and err["param"] == "messages[0]" and "needs content" in err["message"]
            )
            ok = {"role": "assistant", "content": None, "tool_calls": []}  # an assistant turn may have none
            r = await c.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "x"}, ok], "max_tokens": 2},
            )
            assert r.status_code == 200, r.text
            r = await c.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
            )
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == "tool_choice" and "needs tools" in err["message"]

    run(main())


def test_errors_name_max_completion_tokens_when_the_request_used_it() -> None:
    """A chat request that sets ``max_completion_tokens`` (max_tokens' successor in OpenAI's API)
    hears about that field, not about a ``max_tokens`` it never sent."""

    async def main() -> None:
        async with app_client(session_len=64) as (c, state):
            messages = [{"role": "user", "content": "x"}]
            for field in ("max_completion_tokens", "max_tokens"):
                r = await c.post("/v1/chat/completions", json={"messages": messages, field: 10_000})
                err = r.json()["error"]
                assert r.status_code == 400 and set(err) == {"message", "type", "param", "code"}, r.text
                assert err["param"] == field and err["code"] == "context_length_exceeded", err
                assert f"{field} is 10000" in err["message"] and str(state.context_limit) in err["message"]
                r = await c.post(
                    "/v1/chat/completions", json={"messages": messages, field: 3, "min_tokens": 5}
                )
                err = r.json()["error"]
                assert r.status_code == 400 and err["param"] == "min_tokens", r.text
                assert f"{field}=3" in err["message"] and "_new_tokens" not in err["message"], err
            # both sent: max_completion_tokens is the one used, and the one named
            both = {"messages": messages, "max_tokens": 2, "max_completion_tokens": 10_000}
            r = await c.post("/v1/chat/completions", json=both)
            assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens", r.text
            r = await c.post("/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 2})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
            assert state.engine.num_free_blocks == state.engine.num_total_blocks

    run(main())


def test_a_json_body_that_is_not_an_object_is_not_called_a_content_type_error() -> None:
    """A JSON string sent as application/json was parsed: the error says it is not an object (as for
    a number or a list), not that the Content-Type is wrong; a body not read as JSON still is."""

    async def main() -> None:
        async with app_client() as (c, _state):
            for path in ("/v1/chat/completions", "/v1/completions", "/generate"):
                for raw in (b'"hello"', b"123", b"[1]"):
                    r = await c.post(path, content=raw, headers={"content-type": "application/json"})
                    err = r.json()["error"]
                    assert r.status_code == 400 and set(err) == {"message", "type", "param", "code"}, r.text
                    assert err["code"] == "invalid_request" and "must be a JSON object" in err["message"], err
                    assert "Content-Type" not in err["message"], err
            r = await c.post(
                "/v1/completions", content=b'{"prompt": "abc"}', headers={"content-type": "text/json"}
            )
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_content_type", r.text
            r = await c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2})
            assert r.status_code == 200, r.text

    run(main())


def test_a_prompt_with_no_room_names_the_prompt_not_max_tokens() -> None:
    async def main() -> None:
        async with app_client(session_len=64) as (c, state):
            limit = state.context_limit
            prompt = "a" * limit  # the byte tokenizer: one token a character
            for path, body, param in (
                ("/v1/completions", {"prompt": prompt, "max_tokens": 5}, "prompt"),
                ("/generate", {"prompt": prompt, "max_new_tokens": 5}, "prompt"),
            ):
                r = await c.post(path, json=body)
                err = r.json()["error"]
                assert r.status_code == 400 and err["param"] == param, r.text
                assert err["code"] == "context_length_exceeded" and f"at most {limit - 1}" in err["message"]
            r = await c.post("/generate", json={"prompt": "a" * (limit - 3), "max_new_tokens": 5})
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == "max_new_tokens", r.text
            assert err["code"] == "context_length_exceeded" and "at most 3" in err["message"]

    run(main())


def test_text_far_too_long_is_refused_before_it_is_tokenized(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with app_client() as (c, state):
            calls = []
            encode = state.tokenizer.encode
            state.tokenizer.encode = lambda text, **kw: calls.append(len(text)) or encode(text, **kw)  # type: ignore[method-assign]
            huge = "word " * 200_000
            for path, body, param in (
                ("/v1/completions", {"prompt": huge, "max_tokens": 2}, "prompt"),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]}, "messages"),
            ):
                r = await c.post(path, json=body)
                err = r.json()["error"]
                assert r.status_code == 400 and err["param"] == param, (path, r.text)
                assert err["code"] == "context_length_exceeded" and "1000000 characters" in err["message"]
            assert not calls, "the huge text was tokenized"
            r = await c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2})
            assert r.status_code == 200
            # /tokenize counts text that need not fit (as vLLM's does), up to its own bound
            calls.clear()
            r = await c.post("/tokenize", json={"prompt": huge})
            assert r.status_code == 200 and r.json()["count"] > r.json()["max_model_len"], r.text
            assert calls == [len(huge)]
            monkeypatch.setattr(state_module, "TOKENIZE_MAX_CHARS", 1000)
            r = await c.post("/tokenize", json={"prompt": huge})
            err = r.json()["error"]
            assert (
                r.status_code == 400 and err["param"] == "prompt" and "1000000 characters" in err["message"]
            )
            assert calls == [len(huge)], "the refused text was tokenized"

    run(main())


def test_body_parse_errors_say_what_is_wrong_and_health_answers_head() -> None:
    async def main() -> None:
        async with app_client() as (c, _state):
            r = await c.post(
                "/v1/completions",
                content=b'{"prompt":"caf\xe9"}',
                headers={"content-type": "application/json"},
            )
            err = r.json()["error"]
            assert r.status_code == 400 and err["code"] == "invalid_json" and "UTF-8" in err["message"], (
                r.text
            )
            raw = json.dumps({"prompt": "abc", "max_tokens": 2})
            r = await c.post("/v1/completions", content=raw, headers={"content-type": ""})
            err = r.json()["error"]
            assert r.status_code == 400 and "Content-Type: application/json" in err["message"], r.text
            assert "not b'" not in err["message"]
            r = await c.head("/health")
            assert r.status_code == 200

    run(main())


def test_json_grammar_is_compiled_off_the_event_loop_and_its_absence_is_a_400() -> None:
    import threading

    from hotloop.messages import RequestError

    async def main() -> None:
        async with app_client() as (c, state):
            threads = []

            def compiled(schema: str | None = None) -> None:
                threads.append(threading.current_thread())
                raise RequestError("JSON mode needs xgrammar: pip install xgrammar", param="response_format")

            state.engine.json_grammar.compiled = compiled  # type: ignore[method-assign]
            body = {
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_object"},
            }
            r = await c.post("/v1/chat/completions", json=body)
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == "response_format" and "xgrammar" in err["message"]
            assert threads and threads[0] is not threading.main_thread()
            assert state.engine.num_free_blocks == state.engine.num_total_blocks

    run(main())


def test_openai_and_vllm_fields_a_switching_client_sends() -> None:
    """Fields of the OpenAI API and vLLM's extensions that clients send: each is honoured, or refused
    by name; none is silently ignored."""
    from hotloop.messages import RequestError

    async def main() -> None:
        async with app_client(session_len=512, num_blocks=64) as (c, state):
            chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
            # top_logprobs 0 asks for nothing: accepted without logprobs (vLLM); above 0 it needs them
            r = await c.post("/v1/chat/completions", json={**chat, "top_logprobs": 0})
            assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None, r.text
            r = await c.post("/v1/chat/completions", json={**chat, "top_logprobs": 2})
            err = r.json()["error"]
            assert (
                r.status_code == 400 and err["param"] == "top_logprobs" and "logprobs=true" in err["message"]
            )
            # an assistant turn's refusal part is its text; in a user turn it is a 400 naming the part
            refusal = {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
            msgs = [{"role": "user", "content": "a"}, refusal, {"role": "user", "content": "b"}]
            r = await c.post("/v1/chat/completions", json={**chat, "messages": msgs})
            assert r.status_code == 200, r.text
            bad = [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]
            r = await c.post("/v1/chat/completions", json={**chat, "messages": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0]", r.text
            # vLLM's extensions hotloop lacks are refused by name, on both routes
            for field, value in (
                ("guided_choice", ["yes", "no"]),
                ("guided_regex", "[a-z]+"),
                ("guided_grammar", "root ::= 'a'"),
                ("structured_outputs", {"choice": ["a"]}),
            ):
                for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {"prompt": "x"})):
                    r = await c.post(path, json={**body, field: value})
                    err = r.json()["error"]
                    assert r.status_code == 400 and err["param"] == field, (path, r.text)
                    assert err["code"] == "unsupported_parameter"
            r = await c.post("/v1/chat/completions", json={**chat, "continue_final_message": True})
            assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
            r = await c.post("/v1/chat/completions", json={**chat, "continue_final_message": False})
            assert r.status_code == 200
            # guided_json is response_format json_schema by another name (a dict or its JSON text); the
            # toy tokenizer has no vocabulary for xgrammar, so a spy records the schema and stops there
            schemas: list[str | None] = []
            compiled = state.engine.json_grammar.compiled

            def spy(schema: str | None = None) -> object:
                schemas.append(schema)
                raise RequestError("(the test stops here)", param="response_format")

            state.engine.json_grammar.compiled = spy  # type: ignore[method-assign]
            schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
            for guided in (schema, json.dumps(schema)):
                r = await c.post("/v1/chat/completions", json={**chat, "guided_json": guided})
                assert "(the test stops here)" in r.text, r.text
                assert json.loads(schemas.pop() or "null") == schema
            state.engine.json_grammar.compiled = compiled  # type: ignore[method-assign]
            both = {"guided_json": schema, "response_format": {"type": "json_object"}}
            r = await c.post("/v1/chat/completions", json={**chat, **both})
            assert r.status_code == 400 and r.json()["error"]["param"] == "guided_json"
            r = await c.post("/v1/completions", json={"prompt": "x", "guided_json": "{not json"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "guided_json"
            nameless = {"type": "json_schema", "json_schema": {"name": "x"}}  # the wrapper, no schema
            r = await c.post("/v1/chat/completions", json={**chat, "response_format": nameless})
            assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.json_schema", (
                r.text
            )
            # the model card: one `created` (the server's), on the list and the single route alike
            listed = (await c.get("/v1/models")).json()["data"][0]
            one = (await c.get(f"/v1/models/{listed['id']}")).json()
            assert one == listed and isinstance(one["created"], int)
            # /generate's random_seed: any int64 / uint64, as the OpenAI routes take seed
            gen = {"input_ids": [1, 2], "max_new_tokens": 2, "do_sample": True}
            r = await c.post("/generate", json={**gen, "random_seed": -1})
            assert r.status_code == 200, r.text

            # a score-only completion (max_tokens 0, echo) generates no token, in usage or metrics
            def generated() -> float:
                return float(state.metrics.generation_tokens._value.get())

            before = generated()
            r = await c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 0, "echo": True, "n": 3})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 0, r.text
            assert generated() == before
            r = await c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2})
            assert generated() == before + 2
            assert state.engine.num_free_blocks == state.engine.num_total_blocks

    run(main())
