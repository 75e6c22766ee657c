"""Many clients at once against the live server: outputs equal to solo runs, and disconnects that
leave the KV pool full again (read from ``/metrics``)."""

from __future__ import annotations

import asyncio
import re
import time

import httpx2 as httpx
from server_proc import API_KEY

PROMPTS = [
    "The capital of France is",
    "Water boils at",
    "The largest planet in the solar system is",
    "A haiku about the sea:",
    "def fibonacci(n):",
    "The three primary colors are",
    "In 1492, Columbus",
    "The chemical symbol for gold is",
]
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def metrics(server) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics", headers=HEADERS).text
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(hotloop:[a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def wait_pool_full(server, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(server)
        idle = m["hotloop:num_requests_running"] == 0 and m["hotloop:num_requests_waiting"] == 0
        if idle and m["hotloop:kv_cache_free_blocks"] == m["hotloop:kv_cache_total_blocks"]:
            return m
        assert time.monotonic() < deadline, f"the KV pool did not refill: {m}"
        time.sleep(0.1)


def test_200_concurrent_streams_equal_solo_runs(client, model_name, server) -> None:
    """The issue's 200 concurrent streaming greedy requests, scaled for 2 CPU cores: max_tokens=8 and
    8 distinct prompts (each sent 25 times), so the whole run takes seconds, not minutes. Each
    streamed output must equal the same request run alone (non-streaming, nothing else running)."""
    from openai import AsyncOpenAI

    solo = {}
    for p in PROMPTS:
        r = client.completions.create(
            model=model_name, prompt=p, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
        )
        solo[p] = r.choices[0].text

    async def one(ac: AsyncOpenAI, p: str) -> str:
        stream = await ac.completions.create(
            model=model_name,
            prompt=p,
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def main() -> list[str]:
        async with AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=300
        ) as ac:
            return await asyncio.gather(*(one(ac, PROMPTS[i % len(PROMPTS)]) for i in range(200)))

    before = metrics(server)
    outs = asyncio.run(main())
    mismatches = [(i, o) for i, o in enumerate(outs) if o != solo[PROMPTS[i % len(PROMPTS)]]]
    assert not mismatches, mismatches[:5]
    after = wait_pool_full(server)
    key = 'hotloop:request_success_total{finished_reason="length"}'
    assert after[key] - before.get(key, 0.0) == 200 + 0  # every stream finished by length
    assert after["hotloop:generation_tokens_total"] - before["hotloop:generation_tokens_total"] == 1600


def test_disconnects_return_blocks(server, model_name) -> None:
    """Streaming clients that vanish mid-stream, and a non-streaming client that times out, get their
    requests aborted: the pool is full again long before their max_tokens could have been generated."""

    async def vanish(ac: httpx.AsyncClient, i: int) -> int:
        body = {
            "model": model_name,
            "prompt": PROMPTS[i % len(PROMPTS)],
            "max_tokens": 400,
            "stream": True,
            "temperature": 0,
            "ignore_eos": True,
        }
        seen = 0
        async with ac.stream("POST", f"{server.base_url}/v1/completions", json=body, headers=HEADERS) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    seen += 1
                    if seen == 3:
                        break  # leaving the block closes the connection mid-stream
        return seen

    async def main() -> None:
        async with httpx.AsyncClient(timeout=60) as ac:
            assert await asyncio.gather(*(vanish(ac, i) for i in range(12))) == [3] * 12

    before = metrics(server)
    start = time.monotonic()
    asyncio.run(main())
    # A non-streaming request whose client gives up after 1 s.
    try:
        httpx.post(
            f"{server.base_url}/v1/completions",
            headers=HEADERS,
            timeout=1.0,
            json={"model": model_name, "prompt": "Tell me a story", "max_tokens": 450, "ignore_eos": True},
        )
        raise AssertionError("the request should have timed out")
    except httpx.TimeoutException:
        pass
    after = wait_pool_full(server, timeout=20)
    assert time.monotonic() - start < 40  # 13 x 400+ tokens would take minutes on this CPU
    key = 'hotloop:request_success_total{finished_reason="abort"}'
    assert after.get(key, 0.0) - before.get(key, 0.0) == 13
