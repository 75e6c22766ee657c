"""Edges of the Python pipeline API (LMDeploy-shaped) that an audit found broken (2026-12-01): calls
from several threads, OpenAI text parts, special-token stop words, bad_words / bad_token_ids, one
config per prompt, chat_template_config, GenerationConfig's checks, EngineConfig.seed, the
over-long prompt's message, an empty chat turn; and (2026-12-02) a batch refused half-way through
submission, malformed chat messages, greedy parity of the pipeline with transformers.

On the CPU with the embedded default model (SmolLM2-135M-Instruct), one module-scoped pipeline and
short generations; the seed test uses a tiny random checkpoint.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hotloop import EngineConfig, GenerationConfig, pipeline
from hotloop.messages import RequestError

IM_END = 2  # SmolLM2's "<|im_end|>" (an EOS id, special)
HELLO = 19556  # "Hello": SmolLM2's greedy first reply token to "hi"


@pytest.fixture(scope="module")
def pipe():
    p = pipeline(backend_config=EngineConfig(device="cpu", max_batch_size=8, cache_max_entry_count=64))
    yield p
    p.close()


def _idle(p) -> None:  # type: ignore[no-untyped-def]
    e = p.engine
    assert e.num_free_blocks == e.num_total_blocks
    assert not e.requests and not p._running


# -- 1. concurrent calls from threads -----------------------------------------------------------
def _pipeline_on(pipe, monkeypatch, **kwargs):  # type: ignore[no-untyped-def]
    """Another Pipeline over the module's engine (no model load)."""
    import hotloop.api.pipeline as mod

    monkeypatch.setattr(mod, "build_engine", lambda model, cfg: pipe.built)
    return pipeline(backend_config=EngineConfig(device="cpu"), **kwargs)


def test_concurrent_calls_are_refused_or_served_never_corrupted(pipe, monkeypatch) -> None:
    """Two threads call the same pipeline at once: each call is served, one after the other, or
    refused with the documented "already generating" RuntimeError; none fails inside the engine (a
    shared engine stepped from two threads did: "cannot reshape tensor of 0 elements") and none
    hangs. (The barrier in the prompt encoding held both threads there when the engine was claimed
    only after it; now the second thread waits for the engine before it encodes, and the barrier
    times out.)"""
    p = _pipeline_on(pipe, monkeypatch)
    barrier = threading.Barrier(2, timeout=1.0)
    real = p.encode_with_images

    def synced(prompt, do_preprocess=True):  # type: ignore[no-untyped-def]
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        return real(prompt, do_preprocess)

    p.encode_with_images = synced
    results: dict[int, object] = {}

    def worker(k: int) -> None:
        try:
            results[k] = p(f"Say the number {k}", gen_config=GenerationConfig(max_new_tokens=4))
        except BaseException as e:  # noqa: BLE001 - recorded and checked below
            results[k] = e

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    hung = any(t.is_alive() for t in threads)
    if hung:  # stop the stuck thread (its next engine access raises), then drain the engine
        p._built = None
        for t in threads:
            t.join(timeout=10)
        for rid in list(pipe.engine.requests):
            pipe.engine.abort_request(rid)
        while pipe.engine.has_unfinished():
            pipe.engine.step()
    assert not hung, "a concurrent call hung"
    for k, r in results.items():
        if isinstance(r, BaseException):
            assert isinstance(r, RuntimeError) and "already generating" in str(r), f"thread {k}: {r!r}"
    assert any(not isinstance(r, BaseException) for r in results.values()), results
    _idle(pipe)


# -- 2. OpenAI-style content parts -----------------------------------------------------------
def test_text_content_parts_are_flattened_like_the_server(pipe) -> None:
    """OpenAI messages whose ``content`` is a list of text parts encode as the joined text, as the
    server joins them (the list used to reach the chat template and fail there)."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
    plain = [{"role": "user", "content": "Hello"}]
    ids, images = pipe.encode_with_images(parts)
    assert ids == pipe.encode(plain) and images == []


# -- 3. stop words that are special tokens ---------------------------------------------------------
def test_special_token_stop_word_stops(pipe) -> None:
    """A stop word that is a special token's text (``"<|im_end|>"``) stops as that token's id:
    stop strings are searched in text from which special tokens are dropped, so it would never match
    (with ``ignore_eos``, or an end token that is not an EOS id such as Llama 3's <|eot_id|>).
    <|im_end|> is forced by logit_bias at every step."""
    g = GenerationConfig(
        max_new_tokens=3, ignore_eos=True, stop_words=["<|im_end|>"], logit_bias={IM_END: 100.0}
    )
    r = pipe("hi", gen_config=g)
    assert r.token_ids[0] == IM_END
    assert r.finish_reason == "stop" and r.generate_token_len == 1, r
    _idle(pipe)


# -- 4. bad_words / bad_token_ids ----------------------------------------------------------------
def test_bad_token_ids_supported(pipe) -> None:
    """``bad_token_ids`` (LMDeploy's field) are never generated."""
    r = pipe("hi", gen_config=GenerationConfig(max_new_tokens=2, bad_token_ids=[HELLO]))  # type: ignore[call-arg]
    assert HELLO not in r.token_ids


def test_bad_words_supported(pipe) -> None:
    """``bad_words`` (LMDeploy's field): a token holding the word is never generated."""
    r = pipe("hi", gen_config=GenerationConfig(max_new_tokens=2, bad_words=["Hello"]))  # type: ignore[call-arg]
    assert not r.text.startswith("Hello")


# -- 5. one GenerationConfig per prompt --------------------------------------------------------------
def test_gen_config_list_per_prompt(pipe) -> None:
    """``gen_config`` may be a list, one config per prompt (as LMDeploy takes it)."""
    rs = pipe(
        ["hi", "yo"],
        gen_config=[
            GenerationConfig(max_new_tokens=2, ignore_eos=True),
            GenerationConfig(max_new_tokens=3, ignore_eos=True),
        ],
    )
    assert [r.generate_token_len for r in rs] == [2, 3]


def test_an_empty_gen_config_list_is_refused_not_replaced_by_the_default(pipe) -> None:
    """``gen_config=[]`` for one prompt is a count mismatch (it ran with the default config: an empty
    list is falsy)."""
    with pytest.raises(RequestError, match="list of 0 configs for 1 prompts") as e:
        pipe("hi", gen_config=[])
    assert e.value.param == "gen_config"
    with pytest.raises(RequestError, match="list of 0 configs for 1 prompts"):
        list(pipe.stream_infer("hi", gen_config=[]))


# -- 6. chat_template_config -----------------------------------------------------------------
def test_chat_template_config_is_accepted(pipe, monkeypatch) -> None:
    """``pipeline(model, backend_config=..., chat_template_config=...)`` (LMDeploy's signature) is
    accepted. (build_engine is stubbed with the module's engine to keep this fast.)"""
    p = _pipeline_on(pipe, monkeypatch, chat_template_config=None)
    assert p.encode("Hello") == pipe.encode("Hello")
    import types

    template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    for cfg in (template, types.SimpleNamespace(chat_template=template)):
        p = _pipeline_on(pipe, monkeypatch, chat_template_config=cfg)
        assert p.encode("Hello") == pipe.tokenizer.encode("Hello|", add_special_tokens=False)
    with pytest.raises(TypeError, match="chat_template_config"):
        _pipeline_on(pipe, monkeypatch, chat_template_config=types.SimpleNamespace(model_name="llama3"))


# -- 7. GenerationConfig validation holes -----------------------------------------------------------
@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", math.nan),  # passes `< 0`; sampling then returns token 0 and stops
        ("repetition_penalty", math.nan),  # passes `<= 0`; greedy then repeats token 1
        ("temperature", "0.5"),  # TypeError: '<' not supported between 'str' and 'int'
        ("top_p", None),  # TypeError: '<' not supported between 'float' and 'NoneType'
        ("stop_words", [1]),  # accepted; crashes mid-generation (detokenizer len(int))
        ("stop_token_ids", ["a"]),  # ValueError: invalid literal for int() (no field named)
    ],
)
def test_generation_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    """A NaN (which passes one-sided comparisons), a value of the wrong type, a stop word that is not
    a string or a stop id that is not an integer raises ``RequestError`` naming the field."""
    with pytest.raises(RequestError) as e:
        GenerationConfig(**{field: value})  # type: ignore[arg-type]
    assert e.value.param == field and field in str(e.value)


def test_non_string_stop_word_leaves_no_request_behind(pipe) -> None:
    """A non-str stop word is refused up front, and the engine holds no request afterwards (it used to
    fail inside ``engine.step()`` and stay in ``engine.requests``)."""
    try:
        with pytest.raises(RequestError):
            pipe("hi", gen_config=GenerationConfig(max_new_tokens=2, stop_words=[1]))  # type: ignore[list-item]
        _idle(pipe)
    finally:  # drop what the failure leaves behind, so that later tests start clean
        e = pipe.engine
        for rid, req in list(e.requests.items()):
            if req.is_finished:
                e.requests.pop(rid)
                e._ids.discard(rid)


# -- 8. EngineConfig.seed ----------------------------------------------------------------------
def test_engine_seed_makes_unseeded_sampling_reproducible(make_tiny_model: Callable[[str], Path]) -> None:
    """``EngineConfig.seed`` seeds the RNG that unseeded sampled requests draw from: two engines built
    with the same seed sample the same tokens whatever touched torch's global RNG before."""
    path = str(make_tiny_model("qwen2_bias"))
    g = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=1.0)
    outs = []
    for global_seed in (100, 200):
        torch.manual_seed(global_seed)  # other code using the global RNG
        with pipeline(path, backend_config=EngineConfig(device="cpu", seed=7, cache_max_entry_count=8)) as p:
            outs.append(p("hello world", gen_config=g, do_preprocess=False).token_ids)
    assert outs[0] == outs[1]


# -- 9. error messages -------------------------------------------------------------------------
def test_prompt_over_the_limit_error_gives_possible_advice(pipe) -> None:
    """A prompt that alone fills the session or the KV cache is refused with a message that says so
    (it used to advise "lower max_new_tokens to at most 0", an impossible value)."""
    with pytest.raises(RequestError) as e:
        pipe("word " * 5000, gen_config=GenerationConfig(max_new_tokens=8))
    assert e.value.param == "prompt"
    assert "at most 0" not in str(e.value), str(e.value)


def test_chat_with_empty_message_list_raises_request_error(pipe) -> None:
    """``pipe.chat([])`` raises RequestError naming the prompt (it failed with an AttributeError)."""
    with pytest.raises(RequestError):
        pipe.chat([])


# -- 10. a batch refused half-way through submission ----------------------------------------------
def test_a_prompt_refused_by_add_request_takes_back_the_ones_queued_before_it(pipe) -> None:
    """A JSON schema that does not compile is refused by ``engine.add_request`` (not by
    ``validate``), after the prompts before it were queued. Those stayed queued: the next call ran
    them unseen and returned with their KV blocks still held (free 5 of 6 blocks, ``pipe-0`` in
    ``engine.requests``). Now they are aborted with the refusal, and the next call is served alone."""
    pytest.importorskip("xgrammar")
    import json

    long = GenerationConfig(max_new_tokens=200, ignore_eos=True)
    bad = GenerationConfig(
        max_new_tokens=4,
        response_format="json_schema",
        json_schema=json.dumps({"type": "string", "pattern": "(?<=a)b"}),  # lookbehind: not compilable
    )
    with pytest.raises(RequestError) as e:
        pipe(["hi", "yo", "hey"], gen_config=[long, long, bad])
    assert e.value.param == "json_schema"
    _idle(pipe)
    assert not pipe.engine._inbox  # nothing queued either: it would run under the next call
    r = pipe("hi", gen_config=GenerationConfig(max_new_tokens=2, ignore_eos=True))
    assert r.generate_token_len == 2
    _idle(pipe)
    with pytest.raises(RequestError):  # the same through stream_infer
        list(pipe.stream_infer(["hi", "yo"], gen_config=[long, bad]))
    _idle(pipe)
    assert not pipe.engine._inbox


# -- 11. malformed prompts ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompts,param,message",
    [
        ([[]], "messages", "message list is empty"),  # ValueError from transformers, no field
        ([{"content": "hi"}], "messages[0].role", "needs a 'role'"),  # jinja UndefinedError
        ([{"role": "user", "content": 5}], "messages[0].content", "got int"),  # TypeError in jinja
        ([{"role": "user", "content": {"text": "hi"}}], "messages[0].content", "got dict"),
        ("caf\ud83d", "prompt", "unpaired UTF-16 surrogate"),  # the tokenizer's "TextEncodeInput must be"
        ([{"role": "user", "content": "\ud800"}], "messages", "unpaired UTF-16 surrogate"),
    ],
)
def test_malformed_prompts_are_refused_naming_the_field(pipe, prompts, param: str, message: str) -> None:
    """A message without a role or with content that is neither text nor text parts, and text that
    is not valid Unicode raise ``RequestError`` naming the field (they failed inside jinja or the
    tokenizer with errors that named none); the pipeline is idle afterwards and keeps working. (An
    empty string is an empty user turn under the chat template, as in LMDeploy: it generates.)"""
    for call in (
        lambda: pipe(prompts, gen_config=GenerationConfig(max_new_tokens=2)),
        lambda: list(pipe.stream_infer(prompts, gen_config=GenerationConfig(max_new_tokens=2))),
    ):
        with pytest.raises(RequestError, match=message) as e:
            call()
        assert e.value.param == param
        _idle(pipe)


def test_a_message_without_content_is_an_empty_turn(pipe) -> None:
    """(Kept as it was: ``content`` None or absent renders as empty text, as for an assistant turn
    that only called tools.)"""
    assert pipe.encode("") == pipe.encode([{"role": "user", "content": ""}])  # an empty user turn
    with_none = pipe.encode([{"role": "user", "content": None}])
    assert with_none == pipe.encode([{"role": "user"}]) == pipe.encode([{"role": "user", "content": ""}])


# -- 12. greedy parity with transformers on the default model -----------------------------------
def test_greedy_pipeline_matches_transformers_batch_single_and_chat(pipe) -> None:
    """Greedy tokens of ``pipe(batch)`` and ``pipe(one)`` equal transformers' ``generate`` on each
    prompt alone, in input order: templated strings and a system + user chat. (Streaming against
    ``pipe()``: test_default_model's test_batch_stream_and_chat.)"""
    from transformers import AutoModelForCausalLM

    prompts = [
        "Name three colors.",
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
        "Write a haiku about rivers.",
    ]
    g = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    batch = pipe(prompts[:2], gen_config=g)
    single = pipe(prompts[2], gen_config=g)
    model = AutoModelForCausalLM.from_pretrained(str(pipe.built.model_path), dtype=torch.float32)
    model.generation_config.eos_token_id = None
    expected = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([pipe.encode(p)])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
            expected.append(out[0, ids.shape[1] :].tolist())
    assert [r.token_ids for r in batch] + [single.token_ids] == expected
    assert [r.index for r in batch] == [0, 1]
    _idle(pipe)


# -- 13. close() with a stream open ---------------------------------------------------------------
def test_calls_after_close_raise_closed_even_with_a_stream_left_open(pipe, monkeypatch) -> None:
    """A stream left open, then ``close()``: a later call from the same thread said "already
    generating" (not that the pipeline is closed), and one from another thread, waiting for the
    engine, waited forever (the stream is never resumed). Both now raise "the pipeline is closed"."""
    p = _pipeline_on(pipe, monkeypatch)
    stream = p.stream_infer("hi", gen_config=GenerationConfig(max_new_tokens=50, ignore_eos=True))
    next(stream)
    result: dict[str, BaseException | None] = {}

    def other() -> None:
        try:
            p("yo", gen_config=GenerationConfig(max_new_tokens=2))
            result["e"] = None
        except BaseException as e:  # noqa: BLE001 - checked below
            result["e"] = e

    t = threading.Thread(target=other, daemon=True)
    t.start()
    t.join(timeout=0.5)
    assert t.is_alive()  # waits for the engine, as documented
    try:
        p.close()
        t.join(timeout=5)
        assert not t.is_alive(), "a call waiting for the engine hung after close()"
        assert isinstance(result["e"], RuntimeError) and "closed" in str(result["e"]), result
        with pytest.raises(RuntimeError, match="the pipeline is closed"):
            p("yo")
        p.close()  # (closing twice is allowed, like a file's close)
    finally:  # the stream's request lives on in the shared engine: end it
        del stream
        for rid in list(pipe.engine.requests):
            pipe.engine.abort_request(rid)
        while pipe.engine.has_unfinished():
            pipe.engine.step()
    _idle(pipe)
