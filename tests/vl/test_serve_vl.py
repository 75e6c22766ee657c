"""``/v1/chat/completions`` with ``image_url`` parts, through the official ``openai`` client over a
real socket (the app under uvicorn in a thread) serving a tiny LLaVA: base64 and http URLs (served
locally, with the private-address refusal switched off) give transformers' greedy tokens; unreadable
bytes, a 404, an image over the size limit and a private address each get a 400 naming the problem,
and the server keeps serving."""

from __future__ import annotations

import base64
import http.server
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from vlm_fixtures import hf_llava_greedy

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.serve.api_server import ServerArgs, create_app

MAX_NEW = 5


def _png(img: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def image_server(images: list[Any]) -> Iterator[str]:
    files = {"/small.png": _png(images[1]), "/big.png": _png(images[0]), "/junk.png": b"\x89PNG broken"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _serve(app: Any) -> tuple[Any, str]:
    import uvicorn

    port = _port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}/v1"


def test_chat_completions_with_images(
    make_tiny_llava: Callable[[str], Path], images: list[Any], image_server: str
) -> None:
    import openai

    path = make_tiny_llava("default")
    built = build_engine(
        str(path),
        EngineConfig(device="cpu", dtype="float32", cache_block_seq_len=4, cache_max_entry_count=128),
    )
    size_limit = len(_png(images[1])) + 100  # the small image fits, the pasta photo does not
    args = ServerArgs(allow_private_image_urls=True, image_max_bytes=size_limit, image_fetch_timeout=5.0)
    chat = built.tokenizer.apply_chat_template(
        [{"role": "user", "content": "<image>\nWhat is this?"}], add_generation_prompt=True, tokenize=False
    )
    expected = hf_llava_greedy(path, [(chat, [images[1]])], MAX_NEW)[0][1]
    server, base_url = _serve(create_app(built, args))
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=60)

    def ask(url: str, detail: str | None = None) -> Any:
        image_url: dict[str, Any] = {"url": url} if detail is None else {"url": url, "detail": detail}
        return client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": image_url},
                        {"type": "text", "text": "What is this?"},
                    ],
                }
            ],
            max_tokens=MAX_NEW,
            temperature=0,
            extra_body={"ignore_eos": True, "skip_special_tokens": False},
        )

    try:
        want = built.tokenizer.decode(expected)
        b64 = "data:image/png;base64," + base64.b64encode(_png(images[1])).decode()
        for url, detail in ((b64, "low"), (image_server + "/small.png", None)):
            r = ask(url, detail)
            assert r.choices[0].message.content == want
            assert r.usage.completion_tokens == MAX_NEW and r.usage.prompt_tokens > 25
        bad = [
            ("data:image/png;base64," + base64.b64encode(b"garbage").decode(), "not a readable image"),
            (image_server + "/junk.png", "not a readable image"),
            (image_server + "/missing.png", "HTTP 404"),
            (image_server + "/big.png", f"larger than the limit of {size_limit} bytes"),
            ("file:///etc/hostname", "local image paths are not accepted"),
        ]
        for url, message in bad:
            with pytest.raises(openai.BadRequestError, match=message):
                ask(url)
        with pytest.raises(openai.BadRequestError, match="takes text and image_url parts, not input_audio"):
            client.chat.completions.create(
                model=client.models.list().data[0].id,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
                        ],
                    }
                ],  # fmt: skip
                max_tokens=2,
            )
        assert ask(b64).choices[0].message.content == want  # still serving
        assert built.engine.num_free_blocks == built.engine.num_total_blocks
    finally:
        server.should_exit = True

    strict, strict_url = _serve(create_app(built, ServerArgs()))
    try:
        strict_client = openai.OpenAI(base_url=strict_url, api_key="none", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="non-public address 127.0.0.1"):
            strict_client.chat.completions.create(
                model=strict_client.models.list().data[0].id,
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": image_server + "/small.png"}}],
                    }
                ],
                max_tokens=2,
            )
    finally:
        strict.should_exit = True
