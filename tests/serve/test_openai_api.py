"""The live server (default model, CPU) through the official ``openai`` client: chat and completions,
streaming or not, n, stop strings, logprobs, seeds, exact usage, the native routes, and every error
case of the issue with its status and OpenAI error shape."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest
from server_proc import API_KEY

MSG = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}


def _chat(client, model_name, **kw):
    return client.chat.completions.create(model=model_name, messages=kw.pop("messages", MSG), **kw)


def _post(server, path: str, key: str | None = API_KEY, **kw) -> httpx.Response:
    headers = kw.pop("headers", {})
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(f"{server.base_url}{path}", headers=headers, timeout=60, **kw)


def _assert_error(resp: httpx.Response, status: int, param: str | None = None, *words: str) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    for w in words:
        assert w in err["message"], err
    return err


# -- happy paths ---------------------------------------------------------------------------------
def test_models(client, model_name) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct"] == [model_name]
    assert models[0].model_extra["max_model_len"] == 512


def test_chat_greedy_usage_exact_and_stream_matches(client, model_name, tokenizer) -> None:
    r = _chat(client, model_name, max_tokens=12, logprobs=True, **GREEDY)
    choice = r.choices[0]
    assert "Paris" in choice.message.content
    text = tokenizer.apply_chat_template(MSG, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == len(choice.logprobs.content) <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert choice.finish_reason in ("stop", "length")

    chunks = list(
        _chat(
            client, model_name, max_tokens=12, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_completions_forms_and_exact_usage(client, model_name, tokenizer) -> None:
    prompt = "The capital of France is"
    ids = tokenizer.encode(prompt)
    r = client.completions.create(
        model=model_name, prompt=prompt, max_tokens=6, extra_body={"ignore_eos": True}, **GREEDY
    )
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 6
    assert r.choices[0].finish_reason == "length" and "Paris" in r.choices[0].text
    # The same prompt as token ids, in a list with a string: one choice each, in order.
    r2 = client.completions.create(
        model=model_name, prompt=[ids, ids], max_tokens=6, extra_body={"ignore_eos": True}, **GREEDY
    )
    assert [c.index for c in r2.choices] == [0, 1]
    assert [c.text for c in r2.choices] == [r.choices[0].text] * 2
    assert r2.usage.prompt_tokens == 2 * len(ids) and r2.usage.completion_tokens == 12
    echo = client.completions.create(model=model_name, prompt=prompt, max_tokens=6, echo=True, **GREEDY)
    assert echo.choices[0].text == prompt + r.choices[0].text
    stream = client.completions.create(
        model=model_name, prompt=prompt, max_tokens=6, stream=True, extra_body={"ignore_eos": True}, **GREEDY
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == r.choices[0].text


def test_n3_streaming_and_not(client, model_name) -> None:
    kw = {"n": 3, "max_tokens": 8, "seed": 11, "temperature": 0.9, "extra_body": {"ignore_eos": True}}
    r = _chat(client, model_name, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 24
    texts = {c.message.content for c in r.choices}
    assert len(texts) >= 2, "choices of a seeded n=3 request must use different seeds"
    stream = _chat(client, model_name, stream=True, **kw)
    got = ["", "", ""]
    for c in stream:
        for ch in c.choices:
            got[ch.index] += ch.delta.content or ""
    assert got == [c.message.content for c in r.choices]
    comp = client.completions.create(
        model=model_name,
        prompt="Once upon a time",
        n=3,
        max_tokens=5,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    assert len(comp.choices) == 3 and len({c.text for c in comp.choices}) == 1
    assert comp.usage.completion_tokens == 15


def _counter(server, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_prompt_token_counter_counts_a_prompt_once(server, client, model_name) -> None:
    """``n`` choices of one prompt add its tokens to hotloop:prompt_tokens_total once, as usage
    reports them; two prompts of a completions request add both."""
    before = _counter(server, "hotloop:prompt_tokens_total")
    r = _chat(client, model_name, n=3, max_tokens=2, extra_body={"ignore_eos": True}, **GREEDY)
    assert _counter(server, "hotloop:prompt_tokens_total") - before == r.usage.prompt_tokens
    before = _counter(server, "hotloop:prompt_tokens_total")
    comp = client.completions.create(
        model=model_name, prompt=["One two", "Three four five"], n=2, max_tokens=2, **GREEDY
    )
    assert _counter(server, "hotloop:prompt_tokens_total") - before == comp.usage.prompt_tokens


def test_seeded_sampling_reproduces(client, model_name) -> None:
    kw = {"max_tokens": 8, "temperature": 1.0, "top_p": 0.95}
    a = _chat(client, model_name, seed=1234, **kw).choices[0].message.content
    b = _chat(client, model_name, seed=1234, **kw).choices[0].message.content
    others = {_chat(client, model_name, seed=s, **kw).choices[0].message.content for s in (1, 2)}
    assert a == b
    assert len(others | {a}) >= 2


def test_stop_strings(client, model_name) -> None:
    full = (
        client.completions.create(
            model=model_name,
            prompt="The capital of France is",
            max_tokens=10,
            extra_body={"ignore_eos": True},
            **GREEDY,
        )
        .choices[0]
        .text
    )
    assert "answer" in full, full
    r = client.completions.create(
        model=model_name, prompt="The capital of France is", max_tokens=10, stop=["answer", "zzz"], **GREEDY
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.index("answer")]
    chat = _chat(client, model_name, max_tokens=12, stop="Paris", **GREEDY).choices[0]
    assert chat.finish_reason == "stop" and "Paris" not in chat.message.content


def test_logprobs(client, model_name, tokenizer) -> None:
    r = _chat(client, model_name, max_tokens=5, logprobs=True, top_logprobs=3, **GREEDY).choices[0]
    content = r.logprobs.content
    assert "".join(t.token for t in content) == r.message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        assert [x.logprob for x in t.top_logprobs] == sorted(
            (x.logprob for x in t.top_logprobs), reverse=True
        )
        assert t.bytes == list(t.token.encode())
    c = client.completions.create(
        model=model_name, prompt="The capital of France is", max_tokens=4, logprobs=2, **GREEDY
    ).choices[0]
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == c.text and lp.text_offset[0] == 0
    assert all(
        len(t) <= 2 and max(t.values()) == pytest.approx(v)
        for t, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )


def test_logprob_bytes_are_the_tokens_raw_bytes(client, model_name, tokenizer) -> None:
    """An emoji is several byte-level tokens, each part of one UTF-8 character: each token shows
    U+FFFD as text, but its bytes are its own, and they join up into the generated text."""
    from hotloop.engine.detokenizer import byte_table

    ids = tokenizer.encode("\U0001f603", add_special_tokens=False)
    assert len(ids) > 1  # (the test needs a character split over tokens)
    r = client.chat.completions.create(
        model=model_name,
        messages=MSG,
        max_tokens=len(ids),
        logprobs=True,
        logit_bias={str(i): 100 for i in ids},
        **GREEDY,
    ).choices[0]
    table = byte_table(tokenizer, skip_special_tokens=False)
    assert table is not None
    content = r.logprobs.content
    joined = b"".join(bytes(t.bytes) for t in content)
    assert joined.decode("utf-8", errors="replace") == r.message.content
    for t in content:
        assert bytes(t.bytes) in {table[i] for i in ids}, t


def test_json_object_output_is_one_json_object(client, model_name) -> None:
    """response_format json_object: the output is one JSON object (enforced by a grammar), in chat
    and, as in vLLM, in completions; json_schema: one value that follows the schema."""
    prompt = "Describe a cat as a short JSON object with the keys name and age."
    r = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=64,
        response_format={"type": "json_object"},
        **GREEDY,
    ).choices[0]
    assert r.finish_reason == "stop" and isinstance(json.loads(r.message.content), dict), r
    c = client.completions.create(
        model=model_name,
        prompt=prompt + "\n",
        max_tokens=64,
        extra_body={"response_format": {"type": "json_object"}},
        **GREEDY,
    ).choices[0]
    assert c.finish_reason == "stop" and isinstance(json.loads(c.text), dict), c
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    r = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=64,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "cat", "schema": schema, "strict": True},
        },
        **GREEDY,
    ).choices[0]
    cat = json.loads(r.message.content)
    assert r.finish_reason == "stop" and set(cat) == {"name", "age"}, r
    assert isinstance(cat["name"], str) and isinstance(cat["age"], int)
    # vLLM's guided_json: the same schema, the same greedy value
    g = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=64,
        extra_body={"guided_json": schema},
        **GREEDY,
    ).choices[0]
    assert json.loads(g.message.content) == cat, g


def test_json_output_refuses_stop_strings_and_hides_its_end_marker(client, model_name, server) -> None:
    """A stop string could end a JSON request inside the value with finish_reason "stop": a 400
    naming stop. With ignore_eos and skip_special_tokens=false the EOS that ends the value is not
    part of the text (it parsed as "Extra data")."""
    prompt = "Describe a cat as a short JSON object with the keys name and age."
    with pytest.raises(openai.BadRequestError, match="stop strings cannot be combined with JSON output") as e:
        _chat(client, model_name, messages=[{"role": "user", "content": prompt}], max_tokens=32,
              response_format={"type": "json_object"}, stop=[","], **GREEDY)  # fmt: skip
    assert e.value.body["param"] == "stop"
    r = _chat(client, model_name, messages=[{"role": "user", "content": prompt}], max_tokens=200,
              response_format={"type": "json_object"},
              extra_body={"ignore_eos": True, "skip_special_tokens": False}, **GREEDY).choices[0]  # fmt: skip
    assert r.finish_reason == "stop", r  # the grammar ended it, not max_tokens
    assert isinstance(json.loads(r.message.content), dict), r


def test_generate_checks_the_prompt_before_its_template(server) -> None:
    """/generate with do_preprocess names prompt and the user's own offset for bad Unicode."""
    body = b'{"prompt": "ab\\ud800", "do_preprocess": true}'  # a lone surrogate, escaped in the JSON
    resp = _post(server, "/generate", content=body, headers={"Content-Type": "application/json"})
    err = _assert_error(resp, 400, "prompt")
    assert "character 2" in err["message"], err


def test_generate_takes_response_format(server) -> None:
    """/generate constrains its output with response_format as the OpenAI routes do (it was ignored:
    extra fields are dropped); a json_schema whose schema is not an object is a 400 naming it; stop words are
    refused with JSON output, naming stop_words."""
    prompt = "Describe a cat as a short JSON object with the keys name and age.\n"
    body = {"prompt": prompt, "max_new_tokens": 64, "response_format": {"type": "json_object"}}
    r = _post(server, "/generate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["finish_reason"] == "stop" and isinstance(json.loads(out["text"]), dict), out
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}
    out = _post(server, "/generate", json=body).json()
    assert set(json.loads(out["text"])) == {"age"}, out
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "cat", "schema": 7}}
    _assert_error(_post(server, "/generate", json=body), 400, "response_format.json_schema")
    body["response_format"] = {"type": "json_object"}
    _assert_error(_post(server, "/generate", json={**body, "stop_words": [","]}), 400, "stop_words")


def test_json_object_accepted_and_penalties(client, model_name) -> None:
    r = _chat(
        client,
        model_name,
        max_tokens=4,
        response_format={"type": "json_object"},
        presence_penalty=0.5,
        frequency_penalty=0.5,
        extra_body={"repetition_penalty": 1.1, "top_k": 20, "min_p": 0.05, "min_tokens": 2},
        **GREEDY,
    )
    assert r.usage.completion_tokens >= 2


def test_logit_bias_forces_a_token(client, model_name, tokenizer) -> None:
    tok = tokenizer.encode(" banana")[0]
    r = client.completions.create(
        model=model_name, prompt="Hello", max_tokens=3, logit_bias={str(tok): 100}, **GREEDY
    )
    assert r.choices[0].text.startswith(tokenizer.decode([tok]))


def test_native_generate_tokenize_detokenize(server, tokenizer) -> None:
    prompt = "The capital of France is"
    t = _post(server, "/tokenize", json={"prompt": prompt}).json()
    assert (
        t["tokens"] == tokenizer.encode(prompt)
        and t["count"] == len(t["tokens"])
        and t["max_model_len"] == 512
    )
    assert _post(server, "/detokenize", json={"tokens": t["tokens"]}).json()["prompt"] == prompt
    g = _post(
        server, "/generate", json={"input_ids": t["tokens"], "max_new_tokens": 5, "ignore_eos": True}
    ).json()
    assert len(g["token_ids"]) == g["generate_token_len"] == 5 and g["input_token_len"] == len(t["tokens"])
    assert g["text"] == tokenizer.decode(g["token_ids"], skip_special_tokens=True)
    g2 = _post(server, "/generate", json={"prompt": prompt, "max_new_tokens": 5, "ignore_eos": True}).json()
    assert g2["token_ids"] == g["token_ids"]
    with httpx.stream(
        "POST",
        f"{server.base_url}/generate",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"prompt": prompt, "max_new_tokens": 5, "ignore_eos": True, "stream": True},
    ) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    import json

    pieces = [json.loads(e) for e in events[:-1]]
    assert sum((p["token_ids"] for p in pieces), []) == g["token_ids"]
    assert pieces[-1]["finish_reason"] == "length"


def test_health_and_metrics(server) -> None:
    assert httpx.get(f"{server.base_url}/health").status_code == 200  # open without a key
    text = httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    for name in (
        "hotloop:num_requests_running",
        "hotloop:num_requests_waiting",
        "hotloop:kv_cache_usage_perc",
        "hotloop:kv_cache_free_blocks",
        "hotloop:kv_cache_total_blocks 640.0",
        "hotloop:prompt_tokens_total",
        "hotloop:generation_tokens_total",
        'hotloop:request_success_total{finished_reason="length"}',
        "hotloop:time_to_first_token_seconds_bucket",
        "hotloop:inter_token_latency_seconds_bucket",
        "hotloop:e2e_request_latency_seconds_bucket",
        "hotloop:request_queue_time_seconds_bucket",
        'hotloop:kernel_compiles_total{phase="serving"} 0.0',  # on the CPU: no Triton compiles
    ):
        assert name in text, name


# -- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value, param",
    [
        ("temperature", -0.5, "temperature"),
        ("top_p", 0.0, "top_p"),
        ("top_p", 1.5, "top_p"),
        ("n", 0, "n"),
        ("max_tokens", 0, "max_tokens"),
        ("presence_penalty", 3, "presence_penalty"),
        ("top_logprobs", 50, "top_logprobs"),
    ],
)
def test_invalid_values_400(server, model_name, field, value, param) -> None:
    body = {"model": model_name, "messages": MSG, field: value}
    _assert_error(_post(server, "/v1/chat/completions", json=body), 400, param, param)


def test_invalid_values_through_openai_client(client, model_name) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, model_name, temperature=-1)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt="hi", n=0)
    assert e.value.body["param"] == "n"


def test_context_length_400_names_the_numbers(server, model_name, tokenizer) -> None:
    prompt = "The capital of France is"
    p = len(tokenizer.encode(prompt))
    err = _assert_error(
        _post(server, "/v1/completions", json={"model": model_name, "prompt": prompt, "max_tokens": 600}),
        400,
        "max_tokens",
    )
    for number in (str(p), "600", str(p + 600), "512", str(512 - p)):
        assert number in err["message"], err
    long_prompt = list(range(100, 100 + 600))
    err = _assert_error(_post(server, "/v1/completions", json={"prompt": long_prompt, "max_tokens": 1}), 400)
    assert "600" in err["message"] and "512" in err["message"]
    _assert_error(
        _post(server, "/v1/chat/completions", json={"messages": MSG, "max_completion_tokens": 10_000}),
        400,
        "max_completion_tokens",  # the field the request used
        "512",
    )


def test_malformed_json_and_content_type(server) -> None:
    err = _assert_error(
        _post(
            server,
            "/v1/chat/completions",
            content=b'{"messages": [',
            headers={"Content-Type": "application/json"},
        ),
        400,
    )
    assert "JSON" in err["message"]
    err = _assert_error(
        _post(
            server,
            "/v1/chat/completions",
            content=b'{"messages": []}',
            headers={"Content-Type": "text/plain"},
        ),
        400,
    )
    assert "Content-Type" in err["message"]
    _assert_error(_post(server, "/v1/completions", json=["not", "an", "object"]), 400)
    _assert_error(_post(server, "/v1/chat/completions", json={}), 400, "messages", "required")


def test_401_without_a_valid_key(server) -> None:
    body = {"messages": MSG, "max_tokens": 1}
    for key in (None, "wrong", "test-key-22", ""):
        err = _assert_error(_post(server, "/v1/chat/completions", key=key, json=body), 401)
        assert err["code"] == "invalid_api_key"
    for path in ("/v1/models", "/metrics"):
        assert httpx.get(f"{server.base_url}{path}").status_code == 401
    assert _post(server, "/v1/chat/completions", key="test-key-1", json=body).status_code == 200
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_404_unknown_model(client, server) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=1)
    assert e.value.body["code"] == "model_not_found" and "gpt-4o" in e.value.body["message"]
    _assert_error(_post(server, "/v1/completions", json={"model": "x", "prompt": "hi"}), 404, "model")


def test_unsupported_features_400(server, model_name) -> None:
    image = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
    err = _assert_error(
        _post(server, "/v1/chat/completions", json={"messages": [image]}), 400, "messages[0].content[1]"
    )
    assert "text-only" in err["message"]
    _assert_error(
        _post(server, "/v1/completions", json={"prompt": "def f(", "suffix": "return 1"}), 400, "suffix"
    )
    for schema, words in (({"type": "nonsense"}, 'Unsupported type "nonsense"'), ({}, "JSON Schema object")):
        rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        _assert_error(
            _post(server, "/v1/chat/completions", json={"messages": MSG, "response_format": rf}),
            400,
            "response_format.json_schema",
            words,
        )
    text_parts = {
        "role": "user",
        "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi"}],
    }
    ok = _post(
        server, "/v1/chat/completions", json={"messages": [text_parts], "max_tokens": 2, "temperature": 0}
    )
    assert ok.status_code == 200, ok.text


def test_unknown_route_and_method(server) -> None:
    _assert_error(
        httpx.get(f"{server.base_url}/v1/nothing", headers={"Authorization": f"Bearer {API_KEY}"}), 404
    )
    _assert_error(
        httpx.get(f"{server.base_url}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"}), 405
    )


def test_completions_echo_logprobs_score_the_prompt(server, client, model_name, tokenizer) -> None:
    """``echo`` with ``logprobs`` returns the prompt's tokens with log p(token | prefix) (null for
    the first), as vLLM does, equal to transformers' own log-softmax; ``max_tokens=0`` scores the
    prompt alone (lm-evaluation-harness' loglikelihood requests); streaming carries the same."""
    import torch
    from transformers import AutoModelForCausalLM

    prompt = "The capital of France is Paris"
    ids = tokenizer.encode(prompt)
    r = client.completions.create(
        model=model_name, prompt=prompt, max_tokens=1, echo=True, logprobs=2, **GREEDY
    )
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(prompt)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) + 1
    assert lp.tokens[: len(ids)] == [tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0 and lp.text_offset[len(ids)] == len(prompt)
    root = client.models.list().data[0].model_extra["root"]
    model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    for p in range(1, len(ids)):
        assert lp.token_logprobs[p] == pytest.approx(ref[p - 1, ids[p]].item(), abs=2e-3), p
        top = lp.top_logprobs[p]
        best = ref[p - 1].topk(2)
        assert max(top.values()) == pytest.approx(best.values[0].item(), abs=2e-3), p
        assert tokenizer.decode([best.indices[0].item()]) in top
    # max_tokens=0: the prompt alone, nothing generated
    r0 = client.completions.create(model=model_name, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    lp0 = r0.choices[0].logprobs
    assert r0.choices[0].text == prompt and r0.usage.completion_tokens == 0
    assert r0.choices[0].finish_reason == "length"
    assert lp0.tokens == lp.tokens[: len(ids)] and lp0.top_logprobs == [None] * len(ids)
    assert lp0.token_logprobs[0] is None
    assert lp0.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1 : len(ids)], abs=1e-5)
    # streamed, the prompt's logprobs come with the echoed text in the first chunk
    chunks = list(
        client.completions.create(
            model=model_name, prompt=prompt, max_tokens=1, echo=True, logprobs=2, stream=True, **GREEDY
        )
    )
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    values = [
        v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs
    ]
    assert tokens == lp.tokens and values[0] is None
    assert values[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    # max_tokens=0 without echo generates nothing and shows nothing: refused, naming the field
    bad = _post(server, "/v1/completions", json={"model": model_name, "prompt": prompt, "max_tokens": 0})
    _assert_error(bad, 400, "max_tokens", "echo")


def test_prompt_logprobs_extension(server, client, model_name, tokenizer) -> None:
    """vLLM's ``prompt_logprobs``: per prompt token (null for the first) a map from token id to
    ``{logprob, rank, decoded_token}``, the prompt's own token first with its true rank, then the
    top-k; on /v1/completions per choice, on /v1/chat/completions once for the shared prompt, on
    /generate as a list (streamed: in the first event). Checked against transformers' own
    log-softmax and ranks; with stream=true on the OpenAI routes it is a 400 naming the field."""
    import torch
    from transformers import AutoModelForCausalLM

    prompt = "The capital of France is Paris"
    ids = tokenizer.encode(prompt)
    root = client.models.list().data[0].model_extra["root"]
    model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)

    def check(entries: list, ids: list[int], ref: torch.Tensor, k: int) -> None:
        assert len(entries) == len(ids) and entries[0] is None
        for p in range(1, len(ids)):
            e = entries[p]
            own = e[str(ids[p])]
            assert list(e)[0] == str(ids[p])  # the prompt's own token first
            assert own["logprob"] == pytest.approx(ref[p - 1, ids[p]].item(), abs=2e-3), p
            true_rank = int((ref[p - 1] >= ref[p - 1, ids[p]]).sum())  # (vLLM's: ties count as before)
            assert abs(own["rank"] - true_rank) <= 1, (p, own["rank"], true_rank)  # (near-ties: bf16 vs f32)
            assert own["decoded_token"] == tokenizer.decode([ids[p]])
            # the top-k besides: ranks 1..k, the prompt's token holding its own place among them
            others = {v["rank"] for t, v in e.items() if t != str(ids[p])}
            assert len(e) in (k, k + 1)
            assert others | ({own["rank"]} if len(e) == k else set()) == set(range(1, k + 1))
            assert str(ref[p - 1].argmax().item()) in e

    r = client.completions.create(
        model=model_name, prompt=prompt, max_tokens=2, n=2, extra_body={"prompt_logprobs": 3}, **GREEDY
    )
    for choice in r.choices:
        check(choice.model_extra["prompt_logprobs"], ids, ref, 3)
    plain = client.completions.create(model=model_name, prompt=prompt, max_tokens=1, **GREEDY)
    assert plain.choices[0].model_extra.get("prompt_logprobs") is None
    # chat: the templated prompt, scored once
    messages = [{"role": "user", "content": "Name a colour."}]
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(chat_ids, list):
        chat_ids = chat_ids["input_ids"]
    with torch.no_grad():
        chat_ref = torch.log_softmax(model(torch.tensor([chat_ids])).logits[0].float(), -1)
    c = client.chat.completions.create(
        model=model_name, messages=messages, max_tokens=2, n=2, extra_body={"prompt_logprobs": 1}, **GREEDY
    )
    assert len(c.choices) == 2
    check(c.model_extra["prompt_logprobs"], chat_ids, chat_ref, 1)
    # /generate: a list of {token_id, logprob, top, rank}; streamed, in the first event
    g = _post(server, "/generate", json={"input_ids": ids, "max_new_tokens": 2, "prompt_logprobs": 2}).json()
    assert g["prompt_logprobs"][0] is None and len(g["prompt_logprobs"]) == len(ids)
    for p in range(1, len(ids)):
        e = g["prompt_logprobs"][p]
        assert e["token_id"] == ids[p] and len(e["top"]) == 2 and e["rank"] >= 1
        assert e["logprob"] == pytest.approx(ref[p - 1, ids[p]].item(), abs=2e-3)
    events = _post(
        server,
        "/generate",
        json={"input_ids": ids, "max_new_tokens": 2, "prompt_logprobs": 0, "stream": True},
    ).text.split("\n\n")
    first = json.loads(events[0].removeprefix("data: "))
    assert [e and e["logprob"] for e in first["prompt_logprobs"]] == pytest.approx(
        [e and e["logprob"] for e in g["prompt_logprobs"]], abs=1e-5
    )
    # streaming on the OpenAI routes: refused, naming the field
    bad = _post(
        server,
        "/v1/completions",
        json={"model": model_name, "prompt": prompt, "prompt_logprobs": 1, "stream": True},
    )
    _assert_error(bad, 400, "prompt_logprobs", "stream")
    # (0 with a stream is accepted and returns nothing, as vLLM does)
    chunks = list(
        client.completions.create(
            model=model_name, prompt=prompt, max_tokens=2, stream=True, extra_body={"prompt_logprobs": 0}
        )
    )
    assert chunks and all(
        c.choices[0].model_extra.get("prompt_logprobs") is None for c in chunks if c.choices
    )
    bad = _post(
        server, "/v1/completions", json={"model": model_name, "prompt": prompt, "prompt_logprobs": 21}
    )
    assert bad.status_code == 400 and "prompt_logprobs" in bad.text


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                "required": ["zone"],
            },
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_forced_tool_calls_follow_the_schema(server, client, model_name) -> None:
    """A named tool_choice or "required" constrains the reply (xgrammar) to the function's
    arguments, or to a list of calls: the real model's reply parses as calls of the given tools,
    streamed or not. tool_choice auto needs a call format the default model's template does not name."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = _chat(client, model_name, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=40, **GREEDY)
    choice = r.choices[0]
    # (a forced call ends with finish_reason stop, as OpenAI and vLLM answer it)
    assert choice.finish_reason == "stop" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "London")
    r = _chat(client, model_name, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60, **GREEDY)
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason == "stop"
    for c in calls:
        args = json.loads(c.function.arguments)
        assert (c.function.name, sorted(args)) in [("get_weather", ["city"]), ("get_time", ["zone"])]
    chunks = list(
        _chat(
            client,
            model_name,
            messages=ASK,
            tools=TOOLS,
            tool_choice=named,
            max_tokens=40,
            stream=True,
            **GREEDY,
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = [tc for d in deltas if d.tool_calls for tc in d.tool_calls]
    assert len(streamed) == 1 and streamed[0].function.name == "get_weather"
    assert streamed[0].function.arguments == call.function.arguments
    assert not "".join(d.content or "" for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]
    resp = _post(server, "/v1/chat/completions", json={"model": model_name, "messages": ASK, "tools": TOOLS})
    _assert_error(resp, 400, "tool_choice", "--tool-call-parser")
    # a schema the grammar compiler refuses is named where it came from
    f = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": "x"}}}
    choice_f = {"type": "function", "function": {"name": "f"}}
    body = {"model": model_name, "messages": ASK, "tools": [TOOLS[0], f], "tool_choice": choice_f}
    _assert_error(_post(server, "/v1/chat/completions", json=body), 400, "tools[1].function.parameters")
