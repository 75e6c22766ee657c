"""``bench/raw_http.py``: the lean streaming client against a hand-written HTTP/1.1 server, and
against the real hotloop app (streamed SSE equal to what httpx reads)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from hotloop.bench.raw_http import RawClient


async def _serve(handler: Any) -> tuple[asyncio.AbstractServer, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    line = (await reader.readline()).decode()
    headers = {}
    while (h := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = h.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return line, headers, body


def test_chunked_content_length_and_errors() -> None:
    seen: list[tuple[str, dict[str, str], bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, headers, body = await _read_request(reader)
        seen.append((line, headers, body))
        if "/chunked" in line:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in (b"data: 1\n\n", b"data: [DONE]", b"\n\n"):
                writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        elif "/length" in line:
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nbad request")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    async def main() -> None:
        server, port = await _serve(handler)
        async with server:
            client = RawClient(timeout=10)
            async with client.stream(
                "POST", f"http://127.0.0.1:{port}/chunked?x=1", json={"a": [1, 2]}, headers={"X-K": "v"}
            ) as r:
                assert r.status_code == 200
                assert b"".join([c async for c in r.aiter_bytes()]) == b"data: 1\n\ndata: [DONE]\n\n"
            async with client.stream("POST", f"http://127.0.0.1:{port}/length", json={}) as r:
                assert r.status_code == 400 and await r.aread() == b"bad request"
            async with client.stream("POST", f"http://127.0.0.1:{port}/eof", json={}) as r:
                assert await r.aread() == b"until the end"

    asyncio.run(main())
    line, headers, body = seen[0]
    assert line.startswith("POST /chunked?x=1 HTTP/1.1")
    assert headers["x-k"] == "v" and headers["content-type"] == "application/json"
    assert json.loads(body) == {"a": [1, 2]}


def test_refuses_https_and_reports_a_truncated_body() -> None:
    assert RawClient.supports("http://127.0.0.1:1/x") and not RawClient.supports("https://example.com/x")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
        await writer.drain()
        writer.close()

    async def main() -> None:
        client = RawClient(timeout=10)
        with pytest.raises(ValueError, match="http:// URLs only"):
            async with client.stream("POST", "https://example.com/x", json={}):
                pass
        server, port = await _serve(handler)
        async with server:
            async with client.stream("POST", f"http://127.0.0.1:{port}/x", json={}) as r:
                with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                    await r.aread()

    asyncio.run(main())
