"""JSON mode (``response_format="json_object"``) on the embedded default model (SmolLM2-135M-Instruct)
through the pipeline and the engine: the output is one JSON object, or an unfinished one at the length
limit, and plain requests in the same batch are unaffected."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hotloop import EngineConfig, GenerationConfig, pipeline
from hotloop.engine.engine import Engine

PROMPT = "Describe a cat as a short JSON object with the keys name and age."
PLAIN = ["The capital of France is", "Water boils at"]


@pytest.fixture(scope="module")
def pipe():
    p = pipeline(backend_config=EngineConfig(device="cpu", max_batch_size=8, cache_max_entry_count=64))
    yield p
    p.close()


def run(
    engine: Engine, requests: list[tuple[list[int], GenerationConfig]]
) -> list[tuple[list[int], str, Any]]:
    """Submit every request at once and step until all finish: per request its ids, text and reason."""
    ids: dict[str, list[int]] = {}
    text: dict[str, str] = {}
    reason: dict[str, Any] = {}
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(f"json-test-{i}", prompt, params)
    while len(reason) < len(requests):
        for o in engine.step():
            ids.setdefault(o.request_id, []).extend(o.new_token_ids)
            text[o.request_id] = text.get(o.request_id, "") + o.new_text
            if o.finished:
                reason[o.request_id] = o.finish_reason
    return [
        (ids[f"json-test-{i}"], text[f"json-test-{i}"], reason[f"json-test-{i}"])
        for i in range(len(requests))
    ]


def test_greedy_output_is_one_json_object(pipe) -> None:
    gen = GenerationConfig(response_format="json_object", max_new_tokens=48)
    # the object's end is the grammar's: with ignore_eos the request still stops there
    (ids, text, reason), again = run(
        pipe.engine, [(pipe.encode(PROMPT), gen), (pipe.encode(PROMPT), gen.replace(ignore_eos=True))]
    )
    assert reason == "stop", text
    assert isinstance(json.loads(text), dict), text
    assert again == (ids, text, reason)
    assert ids[-1] in pipe.engine.model_config.eos_token_ids


def test_sampled_outputs_are_json_objects_each(pipe) -> None:
    gen = GenerationConfig(
        response_format="json_object", max_new_tokens=48, do_sample=True, temperature=0.7, random_seed=3, n=2
    )
    for r in pipe(PROMPT, gen_config=gen):
        assert r.finish_reason == "stop", r.text
        assert isinstance(json.loads(r.text), dict), r.text


def test_a_json_schema_is_followed(pipe) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
    }
    gen = GenerationConfig(response_format="json_schema", json_schema=json.dumps(schema), max_new_tokens=48)
    r = pipe(PROMPT, gen_config=gen)
    cat = json.loads(r.text)
    assert r.finish_reason == "stop" and set(cat) == {"name", "age"}, r.text
    assert isinstance(cat["name"], str) and isinstance(cat["age"], int) and cat["age"] >= 0


def test_out_of_tokens_is_length_and_a_valid_prefix(pipe) -> None:
    r = pipe(PROMPT, gen_config=GenerationConfig(response_format="json_object", max_new_tokens=4))
    assert r.finish_reason == "length" and len(r.token_ids) == 4
    assert r.text.startswith("{")
    g = pipe.engine.json_grammar.matcher(pipe.engine.model_config.eos_token_ids)
    assert not any(g.advance(t) for t in r.token_ids) and not g.rejected
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.text)


def test_plain_requests_batched_with_a_json_request_are_unchanged(pipe) -> None:
    plain = GenerationConfig(max_new_tokens=8)
    prompts = [pipe.encode(p, do_preprocess=False) for p in PLAIN]
    alone = run(pipe.engine, [(p, plain) for p in prompts])
    json_gen = GenerationConfig(response_format="json_object", max_new_tokens=16)
    mixed = run(pipe.engine, [(prompts[0], plain), (pipe.encode(PROMPT), json_gen), (prompts[1], plain)])
    assert [mixed[0], mixed[2]] == alone
    assert mixed[1][1].startswith("{")


@pytest.mark.gpu
def test_json_mode_on_the_gpu_with_plain_requests_in_the_graphs() -> None:
    """On CUDA (bf16, decode CUDA graphs, overlap on) the JSON requests go through the general sampler
    with their grammar masks while the plain ones keep the graphs' greedy path. The SmolLM2-135M
    preset with dummy weights (the GPU machine has no real model): random weights make no sensible
    JSON, so the checks are the grammar's. Every token the JSON-mode request emits is one an
    independent matcher accepts; the schema request (a lone boolean: its grammar ends within a bounded
    number of tokens, whitespace capped) stops with an object that follows the schema; the plain
    outputs equal the same requests run without them."""
    p = pipeline(
        "smollm2-135m",
        backend_config=EngineConfig(
            device="cuda", dtype="bfloat16", load_format="dummy", max_batch_size=8, session_len=1024
        ),
    )
    try:
        plain = GenerationConfig(max_new_tokens=16)
        prompts = [p.encode(x, do_preprocess=False) for x in PLAIN]
        alone = run(p.engine, [(x, plain) for x in prompts])
        obj = GenerationConfig(response_format="json_object", max_new_tokens=48)
        schema = '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}'
        flag = GenerationConfig(response_format="json_schema", json_schema=schema, max_new_tokens=200)
        mixed = run(
            p.engine,
            [(prompts[0], plain), (p.encode(PROMPT), obj), (p.encode(PROMPT), flag), (prompts[1], plain)],
        )
        assert [mixed[0], mixed[3]] == alone
        eos = p.engine.model_config.eos_token_ids
        ids, text, reason = mixed[1]
        g = p.engine.json_grammar.matcher(eos)
        assert text.startswith("{") and not g.rejected, (reason, text)
        assert [g.advance(t) for t in ids] == [False] * (len(ids) - 1) + [reason == "stop"]
        if reason == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert reason == "length" and len(ids) == 48, (reason, text)
        ids, text, reason = mixed[2]
        assert reason == "stop" and ids[-1] in eos, (reason, text)
        assert isinstance(json.loads(text)["ok"], bool) and set(json.loads(text)) == {"ok"}, text
    finally:
        p.close()
