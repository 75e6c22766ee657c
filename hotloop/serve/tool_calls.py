"""Function calling for ``/v1/chat/completions``: which format a model writes its tool calls in, how
to find them in its output, and the JSON schemas that force a call.

A model asked with ``tools`` writes a call in the format its chat template taught it. The parsers
here read the four formats that cover most open models (the names of vLLM's and LMDeploy's
``--tool-call-parser``, either family accepted):

- ``hermes`` (alias ``qwen``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one
  block per call (Qwen2.5, Qwen3, Hermes, many fine-tunes);
- ``llama3_json`` (alias ``llama3``): the reply is one JSON object ``{"name": ..., "parameters":
  {...}}`` or several separated by ``;``, optionally after ``<|python_tag|>`` (Llama 3.1 - 3.3);
- ``internlm``: ``<|action_start|><|plugin|>{"name": ..., "parameters": {...}}<|action_end|>``
  (InternLM2 / 2.5; its markers are special tokens, so such replies are decoded with them);
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` (Mistral 7B v0.3, Mistral
  Nemo / Small; ``[TOOL_CALLS]`` is a control token, decoded likewise).

Without ``--tool-call-parser`` the server picks the format its chat template names (``infer``);
a template that names none gets no parser, and ``tool_choice="auto"`` then answers 400 saying which
flag to set. ``tool_choice`` naming a function, or ``"required"``, needs no parser: the output is
constrained by a JSON schema (``forced_schema``) and read as the call itself, as vLLM does.
A reply whose call does not parse (a malformed JSON object, an unknown shape) is returned as text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

PARSERS = ("hermes", "llama3_json", "internlm", "mistral")
ALIASES = {"qwen": "hermes", "qwen2_5": "hermes", "llama3": "llama3_json"}
CHOICES = PARSERS + tuple(ALIASES)


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            d["index"] = index
        return d


def canonical(name: str | None) -> str | None:
    """The parser ``name`` stands for (aliases resolved); ValueError for an unknown one."""
    if name is None:
        return None
    name = ALIASES.get(name, name)
    if name not in PARSERS:
        raise ValueError(f"--tool-call-parser {name!r} must be one of {', '.join(CHOICES)}")
    return name


def infer(chat_template: str | None) -> str | None:
    """The parser whose markers the chat template writes, or None."""
    t = chat_template or ""
    if "<tool_call>" in t:
        return "hermes"
    if "<|plugin|>" in t or "<|action_start|>" in t:
        return "internlm"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or "ipython" in t:  # (Llama 3.1's template names both)
        return "llama3_json"
    return None


def needs_special_tokens(parser: str | None) -> bool:
    """Whether the parser's markers are special tokens that plain decoding would drop."""
    return parser in ("internlm", "mistral")


def start_markers(parser: str) -> tuple[str, ...]:
    """Text that opens a call: a streamed reply holds its text back from the first one on."""
    return {
        "hermes": ("<tool_call>",),
        "internlm": ("<|action_start|>",),
        "llama3_json": ("<|python_tag|>", "{"),
        "mistral": ("[TOOL_CALLS]",),
    }[parser]


def _call(obj: Any, args_keys: tuple[str, ...]) -> ToolCall | None:
    """A call from a parsed object: a string ``name`` and the arguments under one of ``args_keys``
    (an object, or JSON text of one). An object without them (``{"name": "Bob", "age": 3}``) is not a
    call; other keys beside them (Mistral's ``"id"``) are ignored."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    key = next((k for k in args_keys if k in obj), None)
    if key is None:
        return None
    args: Any = obj[key]
    if isinstance(args, str):  # some models write the arguments as JSON text
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_INTERNLM = re.compile(r"<\|action_start\|>\s*<\|plugin\|>(.*?)(?:<\|action_end\|>|\Z)", re.S)


def _blocks(text: str, pattern: re.Pattern[str], keys: tuple[str, ...]) -> tuple[str, list[ToolCall]] | None:
    calls = []
    for m in pattern.finditer(text):
        try:
            obj = json.loads(m.group(1).strip())
        except ValueError:
            return None
        call = _call(obj, keys)
        if call is None:
            return None
        calls.append(call)
    if not calls:
        return None
    content = pattern.sub("", text).strip()
    return content, calls


def _llama3(text: str) -> tuple[str, list[ToolCall]] | None:
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :].strip()
    if not body.startswith("{"):
        return None
    calls = []
    dec = json.JSONDecoder()
    i = 0
    while i < len(body):
        try:
            obj, end = dec.raw_decode(body, i)
        except ValueError:
            return None
        call = _call(obj, ("parameters", "arguments"))
        if call is None:
            return None
        calls.append(call)
        i = end
        while i < len(body) and body[i] in " \t\r\n;":
            i += 1
    return ("", calls) if calls else None


def _mistral(text: str) -> tuple[str, list[ToolCall]] | None:
    at = text.find("[TOOL_CALLS]")
    if at < 0:
        return None
    try:
        value, end = json.JSONDecoder().raw_decode(text[at + len("[TOOL_CALLS]") :].lstrip())
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(v, ("arguments", "parameters")) for v in items]
    if not calls or any(c is None for c in calls):
        return None
    return text[:at].strip(), [c for c in calls if c is not None]


def parse(parser: str, text: str, names: set[str] | None = None) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a reply; a reply without a call that parses, or with a call of a function
    not in ``names`` (when given), is all content."""
    if parser == "hermes":
        got = _blocks(text, _HERMES, ("arguments", "parameters"))
    elif parser == "internlm":
        got = _blocks(text, _INTERNLM, ("parameters", "arguments"))
    elif parser == "mistral":
        got = _mistral(text)
    else:
        got = _llama3(text)
    if got is None or (names is not None and any(c.name not in names for c in got[1])):
        return text, []
    return got


def content_after(parser: str, text: str, start: int) -> str:
    """The text of a reply with calls outside its calls from ``start`` (where a call begins) on:
    what a stream that sent ``text[:start]`` still owes as content."""
    if parser == "hermes":
        return _HERMES.sub("", text[start:])
    if parser == "internlm":
        return _INTERNLM.sub("", text[start:])
    return ""  # a Llama 3 or Mistral reply's calls run to its end


def function_names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object"}


def schema_param(tools: list[dict[str, Any]], name: str | None) -> str:
    """The request field a forced call's schema comes from: the named function's parameters, or
    ``tools`` for ``"required"``."""
    if name is None:
        return "tools"
    i = next(i for i, t in enumerate(tools) if t["function"]["name"] == name)
    return f"tools[{i}].function.parameters"


_DEFS_KEYS = ("$defs", "definitions")


def forced_schema(
    tools: list[dict[str, Any]], tool_choice: Any, parallel: bool = True
) -> tuple[str, str | None]:
    """(JSON schema text, the named function or None) that constrain a forced call: the named
    function's parameters, or for ``"required"`` a non-empty array of ``{"name", "parameters"}``
    objects, one shape per tool (one item only without ``parallel`` calls), with the tools'
    ``$defs`` / ``definitions`` at its root. Raises ValueError (message, param) where two tools
    define one name differently."""
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        tool = next(t for t in tools if t["function"]["name"] == name)
        return json.dumps(_parameters(tool)), name
    shapes = []
    # A tool's root-relative references ("#/$defs/X", "#/definitions/X") would not resolve once its
    # parameters sit inside the array's items, so its definitions move to the array's root (as vLLM
    # does); two tools that define one name differently cannot share it.
    hoisted: dict[str, dict[str, Any]] = {}
    for i, t in enumerate(tools):
        params = dict(_parameters(t))
        for key in _DEFS_KEYS:
            defs = params.pop(key, None)
            if defs is None:
                continue
            if not isinstance(defs, dict):
                where = f"tools[{i}].function.parameters.{key}"
                raise ValueError(f"{where} must be an object", where)
            into = hoisted.setdefault(key, {})
            for name, d in defs.items():
                if name in into and into[name] != d:
                    raise ValueError(
                        f"tools[{i}].function.parameters.{key}.{name} differs from another tool's definition "
                        f"of the same name; with tool_choice='required' every tool's definitions share one "
                        f"schema: rename one of them",
                        f"tools[{i}]",
                    )
                into[name] = d
        shapes.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [t["function"]["name"]]},
                    "parameters": params,
                },
                "required": ["name", "parameters"],
            }
        )
    array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": shapes}, **hoisted}
    if not parallel:
        array["maxItems"] = 1
    return json.dumps(array), None


def forced_calls(text: str, name: str | None) -> list[ToolCall] | None:
    """The calls of a forced reply (``forced_schema``'s output), or None if it does not parse (a
    reply cut by ``max_tokens``)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if name is not None:
        return [ToolCall(name, json.dumps(value, ensure_ascii=False))] if isinstance(value, dict) else None
    if not isinstance(value, list):
        return None
    calls = [_call(v, ("parameters",)) for v in value]
    return None if any(c is None for c in calls) else [c for c in calls if c is not None]


def call_start(parser: str, text: str) -> int | None:
    """Where the first call starts in a (partial) reply, or None."""
    if parser == "llama3_json":
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith(start_markers(parser)) else None
    found = [i for i in (text.find(m) for m in start_markers(parser)) if i >= 0]
    return min(found) if found else None


def streamable(parser: str, text: str) -> int:
    """How many leading characters of a partial reply can be streamed as content: up to the first
    call, less an end that may be the beginning of a marker (a Llama 3 reply is held while it is
    blank: it may still open with a JSON call)."""
    start = call_start(parser, text)
    if start is not None:
        return start
    if parser == "llama3_json":
        return len(text) if text.strip() else 0
    hold = 0
    for m in start_markers(parser):
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:k]):
                hold = max(hold, k)
                break
    return len(text) - hold


def check_request(tools: Any, tool_choice: Any, parser: str | None) -> str:
    """Validate a chat request's ``tools`` / ``tool_choice``; returns the mode: "none" (no tools, or
    ``tool_choice="none"``), "auto" (the reply is parsed with ``parser``) or "forced" (a named
    function or ``"required"``: the reply is constrained by ``forced_schema``). Raises ValueError
    with (message, param)."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise ValueError(f"tool_choice={tool_choice!r} needs tools; none were given", "tool_choice")
        return "none"
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools must be a non-empty list of function definitions", "tools")
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise ValueError(
                f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}',
                f"tools[{i}]",
            )
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"tools[{i}].function.name must be a non-empty string", f"tools[{i}].function.name"
            )
        if name in names:
            raise ValueError(f"tools[{i}].function.name {name!r} is given twice", f"tools[{i}].function.name")
        names.add(name)
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise ValueError(
                f'tools[{i}].function.parameters must be a JSON Schema of an object (type "object")',
                f"tools[{i}].function.parameters",
            )
    if tool_choice == "none":
        return "none"
    if tool_choice in (None, "auto"):
        if parser is None:
            raise ValueError(
                "tool_choice 'auto' needs to know how this model writes tool calls, and its chat template "
                f"names no format: start the server with --tool-call-parser ({', '.join(PARSERS)}), or "
                "name a function in tool_choice",
                "tool_choice",
            )
        return "auto"
    if tool_choice == "required":
        return "forced"
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or name not in names:
            raise ValueError(
                f"tool_choice names function {name!r}, which is not among the tools ({', '.join(sorted(names))})",
                "tool_choice",
            )
        return "forced"
    raise ValueError(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )
