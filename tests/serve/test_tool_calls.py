"""Function calling: the three tool-call formats, the request checks, and the chat route over a toy
engine that says scripted replies (``SAY:`` in fake_engine.py), streaming and not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from test_app_inprocess import app_client

from hotloop.serve import tool_calls as tc
from hotloop.serve.api_server import ServerArgs

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


# -- parsers --------------------------------------------------------------------------------------
def test_hermes_blocks_content_and_bad_json() -> None:
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = tc.parse("hermes", text)
    assert content == "Let me check."
    assert calls == [tc.ToolCall("get_weather", '{"city": "Paris"}')]
    two = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    assert tc.parse("hermes", two) == ("", [tc.ToolCall("a", "{}"), tc.ToolCall("b", '{"x": 1}')])
    # a call cut by max_tokens, a malformed object, a call without a name: all text
    for bad in (
        '<tool_call>{"name": "a", "argum',
        "<tool_call>{name: a}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "a", "arguments": [1]}</tool_call>',
    ):
        assert tc.parse("hermes", bad) == (bad, [])
    assert tc.parse("hermes", "no call here") == ("no call here", [])
    # an object that only has a name is not a call; nor is a call of a function not offered
    bob = '<tool_call>{"name": "Bob", "age": 3}</tool_call>'
    assert tc.parse("hermes", bob) == (bob, [])
    assert tc.parse("llama3_json", '{"name": "Bob", "age": 3}') == ('{"name": "Bob", "age": 3}', [])
    assert tc.parse("hermes", text, {"get_time"}) == (text, [])
    assert tc.parse("hermes", text, {"get_weather"})[1] == [tc.ToolCall("get_weather", '{"city": "Paris"}')]
    assert tc.content_after("hermes", "  Hi <tool_call>{}</tool_call> after text", 5) == " after text"


def test_llama3_json_internlm_and_mistral() -> None:
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {}}'
    assert tc.parse("llama3_json", text) == (
        "",
        [tc.ToolCall("get_weather", '{"city": "Oslo"}'), tc.ToolCall("get_time", "{}")],
    )
    assert tc.parse("llama3_json", '  {"name": "f", "arguments": {"a": 1}}') == (
        "",
        [tc.ToolCall("f", '{"a": 1}')],
    )
    assert tc.parse("llama3_json", "The answer is {x}") == ("The answer is {x}", [])
    assert tc.parse("llama3_json", '{"name": "f", "parameters": {}} trailing') == (
        '{"name": "f", "parameters": {}} trailing',
        [],
    )
    text = 'Sure<|action_start|><|plugin|>\n{"name": "get_weather", "parameters": {"city": "Rome"}}<|action_end|>'
    assert tc.parse("internlm", text) == ("Sure", [tc.ToolCall("get_weather", '{"city": "Rome"}')])
    assert tc.needs_special_tokens("internlm") and not tc.needs_special_tokens("hermes")
    text = 'On it. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Lima"}}, {"name": "get_time", "arguments": {}}]'
    assert tc.parse("mistral", text) == (
        "On it.",
        [tc.ToolCall("get_weather", '{"city": "Lima"}'), tc.ToolCall("get_time", "{}")],
    )
    assert tc.parse("mistral", '[TOOL_CALLS] [{"name": "f", "argu') == (
        '[TOOL_CALLS] [{"name": "f", "argu',
        [],
    )
    assert tc.needs_special_tokens("mistral") and tc.streamable("mistral", "Hi [TOOL") == 3
    with_id = '[TOOL_CALLS] [{"name": "get_time", "arguments": {}, "id": "a1B2c3D4e"}]'
    assert tc.parse("mistral", with_id) == ("", [tc.ToolCall("get_time", "{}")])


def test_streamable_holds_what_may_open_a_call() -> None:
    assert tc.streamable("hermes", "Hello") == 5
    assert tc.streamable("hermes", "Hello <tool") == 6  # "<tool" may be "<tool_call>"
    assert tc.streamable("hermes", "Hello <b>") == 9
    assert tc.streamable("hermes", "Hi <tool_call>{") == 3
    assert tc.streamable("llama3_json", "  ") == 0  # blank: may still open with a JSON call
    assert tc.streamable("llama3_json", ' {"name"') == 1
    assert tc.streamable("llama3_json", "Paris is") == 8
    assert tc.streamable("internlm", "ok<|action") == 2


def test_infer_and_canonical() -> None:
    assert tc.infer("{% for t in tools %}<tool_call>{% endfor %}") == "hermes"
    assert tc.infer("<|action_start|><|plugin|>") == "internlm"
    assert tc.infer("{{- '<|python_tag|>' }}") == "llama3_json"
    assert tc.infer("{{- '[AVAILABLE_TOOLS]' }}{{- '[TOOL_CALLS]' }}") == "mistral"
    assert tc.infer("{% for m in messages %}{{ m.content }}{% endfor %}") is None and tc.infer(None) is None
    assert tc.canonical("qwen") == "hermes" and tc.canonical("llama3") == "llama3_json"
    with pytest.raises(ValueError, match="--tool-call-parser 'pythonic' must be one of"):
        tc.canonical("pythonic")
    with pytest.raises(ValueError, match="--tool-call-parser"):
        ServerArgs(tool_call_parser="pythonic")


@pytest.mark.parametrize(
    ("tools", "choice", "param", "words"),
    [
        (None, "auto", "tool_choice", "needs tools"),
        ([], None, "tools", "non-empty"),
        ([{"type": "function"}], None, "tools[0]", '"type": "function"'),
        ([{"type": "function", "function": {"name": ""}}], None, "tools[0].function.name", "non-empty"),
        ([WEATHER, WEATHER], None, "tools[1].function.name", "twice"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
            None,
            "tools[0].function.parameters",
            "JSON Schema",
        ),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice", "not among the tools"),
        ([WEATHER], "sometimes", "tool_choice", '"required"'),
        (
            [WEATHER],
            {"type": "function", "function": {"name": ["f"]}},
            "tool_choice",
            "not among",
        ),  # was a 500
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            None,
            "tools[0].function.parameters",
            "object",
        ),
    ],
)
def test_check_request_names_the_field(tools: Any, choice: Any, param: str, words: str) -> None:
    with pytest.raises(ValueError) as e:
        tc.check_request(tools, choice, "hermes")
    message, got = e.value.args
    assert got == param and words in message


def test_check_request_modes() -> None:
    assert tc.check_request(None, None, None) == "none"
    assert tc.check_request([WEATHER], "none", None) == "none"
    assert tc.check_request([WEATHER], None, "hermes") == "auto"
    assert tc.check_request([WEATHER], "required", None) == "forced"
    assert (
        tc.check_request([WEATHER], {"type": "function", "function": {"name": "get_weather"}}, None)
        == "forced"
    )
    with pytest.raises(ValueError) as e:
        tc.check_request([WEATHER], "auto", None)
    assert "--tool-call-parser" in e.value.args[0]


def test_forced_schema_and_calls() -> None:
    schema, name = tc.forced_schema(
        [WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}}
    )
    assert name == "get_weather" and json.loads(schema) == WEATHER["function"]["parameters"]
    assert tc.forced_calls('{"city": "Paris"}', name) == [tc.ToolCall("get_weather", '{"city": "Paris"}')]
    schema, name = tc.forced_schema([WEATHER, TIME], "required")
    s = json.loads(schema)
    assert name is None and s["type"] == "array" and s["minItems"] == 1 and len(s["items"]["anyOf"]) == 2
    got = tc.forced_calls('[{"name": "get_time", "parameters": {}}]', None)
    assert got == [tc.ToolCall("get_time", "{}")]
    assert tc.forced_calls('{"city": "Par', "get_weather") is None  # cut by max_tokens
    assert tc.forced_calls('[{"parameters": {}}]', None) is None
    one, _ = tc.forced_schema([WEATHER, TIME], "required", parallel=False)
    assert json.loads(one)["maxItems"] == 1 and "maxItems" not in s


def _person(name: str, city_type: str = "string") -> dict[str, Any]:
    """A tool as ``openai.pydantic_function_tool`` writes one for a nested model: a ``$ref`` into
    the parameters' own ``$defs``."""
    address = {"type": "object", "properties": {"city": {"type": city_type}}, "required": ["city"]}
    params = {
        "$defs": {"Address": address},
        "type": "object",
        "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/Address"}},
        "required": ["name", "address"],
    }
    return {"type": "function", "function": {"name": name, "parameters": params}}


def test_required_hoists_each_tools_defs_to_the_root() -> None:
    xgrammar = pytest.importorskip("xgrammar")
    schema, _ = tc.forced_schema([_person("a"), _person("b"), WEATHER], "required")
    s = json.loads(schema)
    # the references stay root-relative, and the root holds what they name
    assert s["$defs"] == {"Address": _person("a")["function"]["parameters"]["$defs"]["Address"]}
    shapes = s["items"]["anyOf"]
    assert all("$defs" not in x["properties"]["parameters"] for x in shapes)
    assert shapes[0]["properties"]["parameters"]["properties"]["address"] == {"$ref": "#/$defs/Address"}
    xgrammar.Grammar.from_json_schema(schema)  # (raised "Cannot find field '$defs'" before)
    # the tool itself is not changed
    assert "$defs" in _person("a")["function"]["parameters"]
    with pytest.raises(ValueError) as e:
        tc.forced_schema([_person("a"), _person("b", city_type="integer")], "required")
    assert e.value.args[1] == "tools[1]" and "$defs.Address" in e.value.args[0]
    # a named function keeps its parameters whole (its own root)
    one, name = tc.forced_schema([_person("a")], {"type": "function", "function": {"name": "a"}})
    assert name == "a" and json.loads(one) == _person("a")["function"]["parameters"]


# -- the route, over the toy engine ---------------------------------------------------------------
def _chat(say: str, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"SAY:{say}"}], "tools": [WEATHER, TIME], **kw}


BIG = {"session_len": 2048, "num_blocks": 256}  # the byte tokenizer spends a token per character
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_auto_tool_call_reply_streamed_and_not() -> None:
    async def main() -> None:
        async with app_client(ServerArgs(tool_call_parser="qwen"), **BIG) as (c, state):
            r = await c.post("/v1/chat/completions", json=_chat(f"Checking. {CALL}"))
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "tool_calls"
            msg = choice["message"]
            assert msg["content"] == "Checking."
            (call,) = msg["tool_calls"]
            assert call["type"] == "function" and call["id"].startswith("call_")
            assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
            # plain text with tools: streamed as it comes, no calls
            r = await c.post("/v1/chat/completions", json=_chat("It is sunny"))
            assert r.json()["choices"][0]["message"] == {
                "role": "assistant",
                "content": "It is sunny",
                "tool_calls": [],
            }
            assert r.json()["choices"][0]["finish_reason"] == "stop"
            # streaming: the text before the call as content, the call in the last chunk
            async with c.stream(
                "POST", "/v1/chat/completions", json=_chat(f"Checking. {CALL}", stream=True)
            ) as s:
                lines = [
                    json.loads(x[6:]) for x in [ln async for ln in s.aiter_lines()] if x.startswith("data: {")
                ]
            deltas = [ln["choices"][0]["delta"] for ln in lines]
            content = "".join(d.get("content") or "" for d in deltas)
            assert content.strip() == "Checking." and "<tool" not in content
            # text after a call, with leading spaces: streamed whole (a review found " a" lost here)
            req = _chat(f"  Hi {CALL} after text", stream=True)
            async with c.stream("POST", "/v1/chat/completions", json=req) as s2:
                got = [
                    json.loads(x[6:])
                    for x in [ln async for ln in s2.aiter_lines()]
                    if x.startswith("data: {")
                ]
            assert "".join(ln["choices"][0]["delta"].get("content") or "" for ln in got) == "  Hi  after text"
            r = await c.post("/v1/chat/completions", json=_chat(f"  Hi {CALL} after text"))
            assert r.json()["choices"][0]["message"]["content"] == "Hi  after text"
            # parallel_tool_calls false: the first call only
            two = CALL + '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
            r = await c.post("/v1/chat/completions", json=_chat(two))
            assert [t["function"]["name"] for t in r.json()["choices"][0]["message"]["tool_calls"]] == [
                "get_weather",
                "get_time",
            ]
            r = await c.post("/v1/chat/completions", json=_chat(two, parallel_tool_calls=False))
            assert [t["function"]["name"] for t in r.json()["choices"][0]["message"]["tool_calls"]] == [
                "get_weather"
            ]
            # a reply naming a function that was not offered is text
            other = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
            r = await c.post("/v1/chat/completions", json=_chat(other))
            assert r.json()["choices"][0]["message"] == {
                "role": "assistant",
                "content": other,
                "tool_calls": [],
            }
            calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
            assert len(calls) == 1 and calls[0][0]["index"] == 0
            assert calls[0][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
            assert lines[-1]["choices"][0]["finish_reason"] == "tool_calls"
            # the tools reached the template, and a history with a call and its result renders
            history = [
                {"role": "user", "content": "SAY:done"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ]  # fmt: skip
            r = await c.post("/v1/chat/completions", json={"messages": history, "tools": [WEATHER]})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "done"
            assert state.engine.num_free_blocks == state.engine.num_total_blocks

    asyncio.run(main())


def test_tool_errors_over_http() -> None:
    async def main() -> None:
        async with app_client(**BIG) as (c, _state):  # the toy template names no call format
            r = await c.post("/v1/chat/completions", json=_chat("x"))
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["param"] == "tool_choice" and "--tool-call-parser" in err["message"]
            r = await c.post(
                "/v1/chat/completions",
                json=_chat("x", tool_choice="required", response_format={"type": "json_object"}),
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
            r = await c.post("/v1/chat/completions", json=_chat("x", tools=[{"type": "function"}]))
            assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]"
            clash = [_person("a"), _person("b", city_type="integer")]
            r = await c.post("/v1/chat/completions", json=_chat("x", tools=clash, tool_choice="required"))
            assert r.status_code == 400 and r.json()["error"]["param"] == "tools[1]"
            # tool_choice none: the tools are shown to the template, the reply is plain text
            r = await c.post("/v1/chat/completions", json=_chat(CALL, tool_choice="none"))
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == CALL

    asyncio.run(main())


def test_echoed_prompt_offsets_skip_an_added_bos() -> None:
    """text_offset of an echoed text prompt: a BOS the tokenizer added takes no characters (the
    echoed text does not hold it), so offsets point into the text and never go back; a token-id
    prompt is echoed decoded with its special tokens, which then take their width."""
    from hotloop.messages import TokenLogprob
    from hotloop.serve.logprobs import prompt_completion_logprobs

    class Tok:
        all_special_ids = [0]

    pieces = {0: b"<s>", 1: b"he", 2: b"llo"}

    class State:
        tokenizer = Tok()

        def token_text(self, t: int) -> str:
            return pieces[t].decode()

        def token_bytes(self, t: int) -> bytes:
            return pieces[t]

    lps = [None, TokenLogprob(1, -1.0, {}), TokenLogprob(2, -2.0, {})]
    text = prompt_completion_logprobs(State(), [0, 1, 2], lps, 0, "hello", specials_shown=False)  # type: ignore[arg-type]
    assert text["text_offset"] == [0, 0, 2] and text["token_logprobs"] == [None, -1.0, -2.0]
    ids = prompt_completion_logprobs(State(), [0, 1, 2], lps, 0, "<s>hello", specials_shown=True)  # type: ignore[arg-type]
    assert ids["text_offset"] == [0, 3, 5]


def test_score_only_edges() -> None:
    async def main() -> None:
        async with app_client(**BIG) as (c, state):
            body = {"prompt": "hello", "echo": True, "max_tokens": 0, "logprobs": 0}
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
            assert r.json()["choices"][0]["text"] == "hello" and r.json()["usage"]["completion_tokens"] == 0
            # (the toy says EOS after "SAY:" with nothing to say: the dropped token's reason is stop)
            async with c.stream(
                "POST", "/v1/completions", json={**body, "prompt": "SAY:", "stream": True}
            ) as s:
                lines = [
                    json.loads(x[6:]) for x in [ln async for ln in s.aiter_lines()] if x.startswith("data: {")
                ]
            reasons = [ln["choices"][0]["finish_reason"] for ln in lines if ln["choices"][0]["finish_reason"]]
            assert reasons == ["length"] and "".join(ln["choices"][0]["text"] for ln in lines) == "SAY:"
            r = await c.post("/v1/completions", json={**body, "min_tokens": 2})
            assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
            assert state.engine.num_free_blocks == state.engine.num_total_blocks

    asyncio.run(main())
