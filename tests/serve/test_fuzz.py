"""Hypothesis-generated malformed requests against the live server: at least 1,000 of them, each
answered with a 4xx and an OpenAI-shaped error (never a 5xx), and afterwards a normal request still
gets the right answer and the KV pool is full.

Every generated request carries at least one invalid part (a field with a bad type or value,
a broken body, an unknown model), on top of random valid-looking noise, so none of them runs a
long generation.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx2 as httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_proc import API_KEY
from test_concurrency import wait_pool_full

MODEL = "SmolLM2-135M-Instruct"
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
    },
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 1},
    "/generate": {"prompt": "hi", "max_new_tokens": 1},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [1, 2]},
}

not_number = st.text(max_size=8).filter(lambda s: not _is_number(s))
any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
non_list = (
    st.none() | st.integers() | not_number | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)
huge = st.integers(min_value=600, max_value=10**12)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


# Definitely-invalid values per field (pydantic's lax mode would accept "3" for an int, so text is
# never numeric; some values are valid types but out of range or over the context).
BAD: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.floats(max_value=-1e-6, allow_nan=False)
    | not_number
    | st.lists(st.integers(), min_size=1),
    "top_p": st.floats(max_value=0.0, allow_nan=False)
    | st.floats(min_value=1.0001, allow_nan=False)
    | not_number,
    "n": st.integers(max_value=0) | st.integers(min_value=129) | not_number | st.just(1.5),
    "max_tokens": st.integers(max_value=0) | huge | not_number | st.just(2.5),
    "max_completion_tokens": st.integers(max_value=0) | huge | not_number,
    "top_logprobs": st.integers(max_value=-1) | st.integers(min_value=21) | not_number,
    "presence_penalty": st.floats(min_value=2.001, allow_nan=False, allow_infinity=False) | not_number,
    "frequency_penalty": st.floats(max_value=-2.001, allow_nan=False, allow_infinity=False) | not_number,
    "repetition_penalty": st.floats(max_value=0.0, allow_nan=False) | not_number,
    "min_p": st.floats(min_value=1.001, allow_nan=False) | st.floats(max_value=-0.001, allow_nan=False),
    "top_k": st.integers(max_value=-2) | not_number,
    "seed": not_number | st.integers(min_value=2**64) | st.lists(st.integers(), min_size=1),
    "stop": st.integers() | st.lists(st.integers(), min_size=1) | st.lists(st.text(max_size=2), min_size=65),
    "logit_bias": st.just({"abc": 1.0})
    | st.just({"99999999": 1.0})
    | st.just({"5": 1000.0})
    | st.integers()
    | not_number,  # not null (valid) nor a small dict (may be a valid bias)
    "response_format": st.just({"type": "json_schema"}) | st.just({"type": "xml"}) | not_number,
    "model": st.text(min_size=1, max_size=12).filter(lambda s: s != MODEL),
    "stream": not_number.filter(
        lambda s: s.lower() not in ("true", "false", "yes", "no", "on", "off", "t", "f", "y", "n", "1", "0")
    ),
    "messages": st.just([])
    | non_list.filter(lambda v: v is not None)
    | st.lists(any_json.filter(lambda x: not isinstance(x, dict)), min_size=1, max_size=2)
    | st.just([{"role": "bot", "content": "x"}])
    | st.just([{"content": "x"}])
    | st.just([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    | st.just([{"role": "user", "content": [{"type": "video"}]}])
    | st.just([{"role": "user", "content": 5}]),
    "prompt": st.just([])
    | st.just("")
    | st.none()
    | st.integers()
    | st.just([["a"], 1])
    | st.lists(st.integers(min_value=10**6), min_size=1, max_size=3)
    | st.just([[]])
    | st.lists(st.integers(min_value=0, max_value=100), min_size=600, max_size=601),
    "suffix": st.text(min_size=1, max_size=5),
    "input_ids": st.just([]) | st.lists(st.integers(max_value=-1), min_size=1, max_size=3) | not_number,
    "tokens": st.lists(st.integers(min_value=10**6), min_size=1, max_size=3) | not_number | st.none(),
    "max_new_tokens": st.integers(max_value=0) | huge | not_number,
    "logprobs": st.integers(min_value=21) | st.integers(max_value=-1) | not_number,
}
BAD_FIELDS = {
    "/v1/chat/completions": [
        "temperature",
        "top_p",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_p",
        "top_k",
        "seed",
        "stop",
        "logit_bias",
        "response_format",
        "model",
        "stream",
        "messages",
    ],
    "/v1/completions": [
        "temperature",
        "top_p",
        "n",
        "max_tokens",
        "presence_penalty",
        "min_p",
        "top_k",
        "seed",
        "stop",
        "logit_bias",
        "model",
        "prompt",
        "suffix",
        "logprobs",
    ],
    "/generate": [
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_new_tokens",
        "input_ids",
        "logprobs",
        "model",
        "repetition_penalty",
    ],
    "/tokenize": ["model", "messages"],
    "/detokenize": ["tokens", "model"],
}
NOISE = st.dictionaries(
    st.sampled_from(["user", "echo", "ignore_eos", "skip_special_tokens", "x_extra"]),
    st.booleans() | st.text(max_size=4),
    max_size=2,
)


@st.composite
def malformed(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """-> (path, body bytes, content type)."""
    path = draw(st.sampled_from(sorted(BASES)))
    kind = draw(st.sampled_from(["field"] * 6 + ["garbage", "json", "content_type", "missing"]))
    if kind == "garbage":
        raw = draw(st.binary(max_size=40).filter(lambda b: not _is_json_object(b)))
        return path, raw, "application/json"
    if kind == "json":
        value = draw(any_json.filter(lambda v: not isinstance(v, dict)))
        return path, json.dumps(value).encode(), "application/json"
    body = dict(BASES[path])
    if kind == "content_type":
        return (
            path,
            json.dumps(body).encode(),
            draw(st.sampled_from(["text/plain", "application/xml", "multipart/form-data"])),
        )
    if kind == "missing":
        required = {
            "/v1/chat/completions": "messages",
            "/v1/completions": "prompt",
            "/generate": "prompt",
            "/tokenize": "prompt",
            "/detokenize": "tokens",
        }[path]
        body.pop(required)
        body.update(draw(NOISE))
        return path, json.dumps(body).encode(), "application/json"
    fields = draw(st.lists(st.sampled_from(BAD_FIELDS[path]), min_size=1, max_size=3, unique=True))
    body.update(draw(NOISE))
    for f in fields:
        body[f] = draw(BAD[f])
    return path, json.dumps(body).encode(), "application/json"


def _is_json_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except (ValueError, UnicodeDecodeError):
        return False


def test_fuzzed_malformed_requests_then_a_normal_one(server) -> None:
    statuses: Counter[int] = Counter()
    http = httpx.Client(base_url=server.base_url, timeout=30, headers={"Authorization": f"Bearer {API_KEY}"})

    @settings(
        max_examples=1100,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(malformed())
    def check(case: tuple[str, bytes, str]) -> None:
        path, raw, ctype = case
        resp = http.post(path, content=raw, headers={"Content-Type": ctype})
        statuses[resp.status_code] += 1
        assert 400 <= resp.status_code < 500, (path, raw[:200], resp.status_code, resp.text[:300])
        body = resp.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["message"]

    try:
        check()
    finally:
        http.close()
    assert sum(statuses.values()) >= 1000, statuses
    assert set(statuses) <= {400, 404}, statuses
    wait_pool_full(server)
    ok = httpx.post(
        f"{server.base_url}/v1/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
        json={"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0},
    )
    assert ok.status_code == 200 and "Paris" in ok.json()["choices"][0]["text"]
    assert httpx.get(f"{server.base_url}/health").status_code == 200
