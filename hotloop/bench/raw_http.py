"""A lean HTTP/1.1 client for the load generator's streaming POSTs to ``http://`` servers.

``hotloop bench serve`` runs hundreds of concurrent streams in one Python process, and the client's
own cost per streamed chunk shows up in every latency it measures: with httpx, 256 concurrent
streams of a 2,112-token prompt read their first chunk about 0.5 s after the server sent it on a
busy host. This client does only what the benchmark needs: one connection per request
(``Connection: close``), a JSON body sent in one write, the status line and headers parsed, and the
body read as chunked transfer coding or up to ``Content-Length`` / the end of the stream. Its
``stream`` has the shape of ``httpx.AsyncClient.stream`` for the calls the benchmark makes
(``status_code``, ``aread``, ``aiter_bytes``), so ``send_request`` works with either client.
``https://`` URLs and everything else stay with httpx.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit


class RawResponse:
    """The status and the body stream of one response."""

    def __init__(self, reader: asyncio.StreamReader, status_code: int, headers: dict[str, str]) -> None:
        self._reader = reader
        self.status_code = status_code
        self.headers = headers

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        r = self._reader
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await r.readline()
                if not size_line:
                    raise ConnectionError("the connection closed inside a chunked body")
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    await r.readline()  # the empty trailer line
                    return
                data = await r.readexactly(size)
                await r.readexactly(2)  # CRLF after the chunk
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await r.read(min(left, 65536))
                if not data:
                    raise ConnectionError(f"the connection closed with {left} body bytes unread")
                left -= len(data)
                yield data
        else:
            while data := await r.read(65536):
                yield data

    async def aread(self) -> bytes:
        return b"".join([c async for c in self.aiter_bytes()])


class RawClient:
    """``stream("POST", url, json=..., headers=...)`` over a fresh connection per call."""

    def __init__(self, timeout: float = 600.0) -> None:
        self.timeout = timeout

    @staticmethod
    def supports(url: str) -> bool:
        return urlsplit(url).scheme == "http"

    @asynccontextmanager
    async def stream(
        self, method: str, url: str, json: Any = None, headers: dict[str, str] | None = None
    ) -> AsyncIterator[RawResponse]:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"RawClient handles http:// URLs only, got {url!r}")
        host, port = parts.hostname, parts.port or 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        body = _dumps(json) if json is not None else b""
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Accept: text/event-stream",
            "Connection: close",
        ]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.timeout)
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            status_line = await asyncio.wait_for(reader.readline(), self.timeout)
            fields = status_line.split(None, 2)
            if len(fields) < 2 or not fields[0].startswith(b"HTTP/"):
                raise ConnectionError(f"not an HTTP response: {status_line[:80]!r}")
            resp_headers: dict[str, str] = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                resp_headers[name.strip().lower()] = value.strip()
            yield RawResponse(reader, int(fields[1]), resp_headers)
        finally:
            writer.close()


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")
