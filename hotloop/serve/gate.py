"""The gate in front of every route: 503 while shutting down, 401 without a valid API key.

``/health`` is open (it answers 503 itself while shutting down). Keys are compared with
``hmac.compare_digest`` against every configured key, so the time taken does not reveal a prefix.
A plain ASGI middleware, so streamed responses pass through untouched.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from hotloop.serve.errors import error_bytes
from hotloop.serve.state import ServerState

OPEN_PATHS = frozenset({"/health"})


def key_is_valid(presented: str, keys: tuple[str, ...]) -> bool:
    """Constant-time check of ``presented`` against every key (no early exit)."""
    given = presented.encode()
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key.encode())
    return ok


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = value.decode("latin-1").strip()
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


class GateMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self.state.draining:
            await _reply(send, 503, error_bytes(503, "the server is shutting down", None, "shutting_down"))
            return
        keys = self.state.api_keys
        if keys:
            token = _bearer(scope)
            if token is None or not key_is_valid(token, keys):
                body = error_bytes(
                    401,
                    "missing or invalid API key: send 'Authorization: Bearer <key>' with a key given to --api-keys",
                    None,
                    "invalid_api_key",
                )
                await _reply(send, 401, body, [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)


class JSONByDefault:
    """A POST with a body and no Content-Type is read as JSON (clients that send ``data=`` without
    the header; vLLM and OpenAI accept them). A Content-Type that is not JSON is still a 400."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            headers = scope.get("headers", [])
            if not any(name == b"content-type" for name, _ in headers):
                scope = dict(scope, headers=[*headers, (b"content-type", b"application/json")])
        await self.app(scope, receive, send)


async def _reply(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})
