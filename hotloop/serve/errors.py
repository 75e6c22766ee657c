"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` for every failure.

``APIError`` is raised by the handlers; the exception handlers here also reshape FastAPI's own
validation errors (422 -> 400, naming the field), Starlette's 404/405 and ``RequestError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hotloop.engine.async_engine import EngineDeadError
from hotloop.messages import RequestError
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "server_error",
    500: "server_error",
}


class APIError(Exception):
    """An error answered to the client with ``status`` and the OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def error_bytes(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps(error_body(status, message, param, code)).encode()


# GenerationConfig's (LMDeploy) names -> the OpenAI request fields users wrote.
_OPENAI_PARAM = {
    "max_new_tokens": "max_tokens",
    "random_seed": "seed",
    "stop_words": "stop",
    "min_new_tokens": "min_tokens",
    "stop_token_ids": "stop_token_ids",
    "json_schema": "response_format.json_schema",
}


# an engine field named in a message (min_new_tokens=10, max_new_tokens is 4), not a quoted value
# (response_format='json_schema' stays as it is)
_ENGINE_NAME = re.compile(
    r"(?<!['\"])\b(" + "|".join(k for k, v in _OPENAI_PARAM.items() if k != v) + r")\b(?!['\"])"
)


def from_request_error(e: RequestError, native: bool = False, max_param: str = "max_tokens") -> APIError:
    """A ``RequestError`` of the engine as a 400; on the OpenAI routes the engine's field names,
    in ``param`` and in the message, become the request's (``min_new_tokens`` -> ``min_tokens``).
    ``max_param``: the request's name for ``max_new_tokens`` (chat's ``max_completion_tokens``)."""
    if native:
        return APIError(400, str(e), e.param, "invalid_value")
    names = _OPENAI_PARAM if max_param == "max_tokens" else {**_OPENAI_PARAM, "max_new_tokens": max_param}
    param = None if e.param is None else names.get(e.param, e.param)
    message = _ENGINE_NAME.sub(lambda m: names[m.group(1)], str(e))
    return APIError(400, message, param, "invalid_value")


_BASIC_TYPES = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "bytes"})


def _is_type_tag(part: Any) -> bool:
    """pydantic puts union members' type names in an error's location ('str', 'list[int]', ...)."""
    return isinstance(part, str) and (
        "[" in part or "-" in part or part in _BASIC_TYPES or part[:1].isupper()
    )


def _loc_to_param(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """('body', 'messages', 0, 'content') -> 'messages[0].content', without union type tags."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    skip_tag = False
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _is_type_tag(p):
            skip_tag = skip_tag or "tagged-union" in p
        elif skip_tag:
            skip_tag = False  # a discriminated union's tag value, e.g. 'text'
        else:
            out = f"{out}.{p}" if out else str(p)
    return out or None


def _pick_error(errors: Sequence[Any]) -> tuple[Any, list[str]]:
    """The most useful error; for a value that matches no member of a union, also the members."""
    for e in errors:
        if e.get("type") in ("union_tag_invalid", "union_tag_not_found"):
            return e, []
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    tag_pos = next((k for k, p in enumerate(loc) if _is_type_tag(p)), None)
    if tag_pos is None:
        return first, []
    same = [e for e in errors if tuple(e.get("loc", ()))[:tag_pos] == loc[:tag_pos]]
    deep = [e for e in same if len(e.get("loc", ())) > tag_pos + 2]
    if deep:
        return max(deep, key=lambda e: len(e["loc"])), []
    forms = list(dict.fromkeys(str(e["loc"][tag_pos]) for e in same if len(e.get("loc", ())) > tag_pos))
    return {**first, "loc": loc[:tag_pos]}, forms


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _validation_message(request: Request, exc: RequestValidationError) -> tuple[str, str | None, str]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None, "invalid_request"
    first = errors[0]
    etype = first.get("type", "")
    if etype == "json_invalid":
        ctx = first.get("ctx") or {}
        return f"the request body is not valid JSON: {ctx.get('error', 'malformed')}", None, "invalid_json"
    ctype = request.headers.get("content-type", "")
    if first.get("loc") in (("body",), ["body"]):
        if "json" not in ctype.lower() and ctype:
            return (f"Content-Type must be application/json (got {ctype!r})", None, "invalid_content_type")
        if etype == "missing":
            return "the request body is missing: send a JSON object", None, "invalid_request"
        # a body that was never parsed as JSON (FastAPI hands it over as bytes; a str is a JSON string)
        if isinstance(first.get("input"), bytes):
            return (
                f"the request body was not read as JSON (Content-Type {ctype!r}): send a JSON object "
                "with Content-Type: application/json",
                None,
                "invalid_content_type",
            )
        return (
            f"the request body must be a JSON object, not {_short(first.get('input'))}",
            None,
            "invalid_request",
        )
    chosen, forms = _pick_error(errors)
    etype = chosen.get("type", "")
    param = _loc_to_param(chosen.get("loc", ()))
    if etype == "missing":
        return f"{param} is required", param, "missing_required_parameter"
    msg = f"expected one of: {', '.join(forms)}" if forms else chosen.get("msg", "invalid value")
    return f"{param}={_short(chosen.get('input'))} is invalid: {msg}", param, "invalid_value"


_FASTAPI_PARSE_ERROR = "There was an error parsing the body"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        e = from_request_error(exc)
        return error_response(e.status, e.message, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = _validation_message(request, exc)
        return error_response(400, message, param, code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        if exc.status_code == 400 and message == _FASTAPI_PARSE_ERROR:
            # FastAPI's words when json.loads raised something other than a JSON syntax error
            message = (
                "the request body could not be parsed as JSON: it is not valid UTF-8, or it nests too deeply"
            )
            code = "invalid_json"
        return error_response(exc.status_code, message, None, code, headers=getattr(exc, "headers", None))

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(503, str(exc), None, "engine_unavailable")

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in a request")
        return error_response(
            500, f"internal server error: {type(exc).__name__}: {exc}", None, "internal_error"
        )
