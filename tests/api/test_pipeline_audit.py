"""Audit of the Python pipeline API (LMDeploy-shaped): each test demonstrates one defect.

Every test here asserts the correct behaviour and fails on the code as audited, for the reason in its
docstring. They run on the CPU with the embedded default model (SmolLM2-135M-Instruct), one
module-scoped pipeline, and short generations; the seed test uses a tiny random checkpoint.
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
def test_concurrent_calls_are_refused_or_served_never_corrupted(pipe, monkeypatch) -> None:
    """``_check_idle`` (pipeline.py:177) tests ``_running`` but only ``_run`` (pipeline.py:188) sets
    it, after the prompts were encoded and submitted: two threads both pass the check and step the
    engine at once. Observed: internal errors such as "cannot reshape tensor of 0 elements" or
    "upper bound and lower bound inconsistent with step sign", often in every thread. Each call
    must either be served or get the documented "already generating" RuntimeError.

    The barrier holds both threads just past the check, which makes the race deterministic (it
    happened in 15 of 15 unpatched trials with three threads too)."""
    barrier = threading.Barrier(2, timeout=1.0)
    real = pipe.encode_with_images

    def synced(prompt, do_preprocess=True):  # type: ignore[no-untyped-def]
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        return real(prompt, do_preprocess)

    monkeypatch.setattr(pipe, "encode_with_images", synced)
    results: dict[int, object] = {}

    def worker(k: int) -> None:
        try:
            results[k] = pipe(f"Say the number {k}", gen_config=GenerationConfig(max_new_tokens=4))
        except BaseException as e:  # noqa: BLE001 - recorded and checked below
            results[k] = e

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a concurrent call hung"
    for k, r in results.items():
        if isinstance(r, BaseException):
            assert isinstance(r, RuntimeError) and "already generating" in str(r), f"thread {k}: {r!r}"
    assert any(not isinstance(r, BaseException) for r in results.values()), results
    monkeypatch.undo()
    _idle(pipe)


# -- 2. OpenAI-style content parts -----------------------------------------------------------
def test_text_content_parts_are_flattened_like_the_server(pipe) -> None:
    """OpenAI messages whose ``content`` is a list of ``{"type": "text"}`` parts crash with
    ``TypeError: can only concatenate str (not "list") to str`` from the Jinja template:
    ``encode_with_images`` (pipeline.py:112) flattens content lists only when they hold an image, so
    a text-only list reaches ``apply_chat_template`` (pipeline.py:103) as a list. The server
    (serve/chat.py:47-66) joins text parts; the pipeline must do the same."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
    plain = [{"role": "user", "content": "Hello"}]
    ids, images = pipe.encode_with_images(parts)
    assert ids == pipe.encode(plain) and images == []


# -- 3. stop words that are special tokens ---------------------------------------------------------
def test_special_token_stop_word_stops(pipe) -> None:
    """``stop_words=["<|im_end|>"]`` never matches with the default ``skip_special_tokens=True``:
    stop strings are searched in the detokenized text (engine/detokenizer.py), from which special
    tokens are dropped, so with ``ignore_eos`` (or any special end token that is not an EOS id, e.g.
    Llama 3's <|eot_id|>) generation silently runs to ``max_new_tokens``. LMDeploy turns such stop
    words into stop token ids. Here <|im_end|> is forced by logit_bias at every step."""
    g = GenerationConfig(
        max_new_tokens=6, ignore_eos=True, stop_words=["<|im_end|>"], logit_bias={IM_END: 100.0}
    )
    r = pipe("hi", gen_config=g)
    assert r.token_ids[0] == IM_END
    assert r.finish_reason == "stop" and r.generate_token_len == 1, r
    _idle(pipe)


# -- 4. bad_words / bad_token_ids ----------------------------------------------------------------
def test_bad_token_ids_supported(pipe) -> None:
    """``GenerationConfig(bad_token_ids=...)`` (an LMDeploy field) raises ``TypeError: unexpected
    keyword argument`` (messages.py:41, the field does not exist), though ``logit_bias`` already
    does the masking (a -inf bias works)."""
    r = pipe("hi", gen_config=GenerationConfig(max_new_tokens=2, bad_token_ids=[HELLO]))  # type: ignore[call-arg]
    assert HELLO not in r.token_ids


def test_bad_words_supported(pipe) -> None:
    """``GenerationConfig(bad_words=...)`` (an LMDeploy field) raises ``TypeError`` (messages.py:41)."""
    r = pipe("hi", gen_config=GenerationConfig(max_new_tokens=2, bad_words=["Hello"]))  # type: ignore[call-arg]
    assert not r.text.startswith("Hello")


# -- 5. one GenerationConfig per prompt --------------------------------------------------------------
def test_gen_config_list_per_prompt(pipe) -> None:
    """LMDeploy takes ``gen_config`` as one config or a list (one per prompt). A list crashes with
    ``AttributeError: 'list' object has no attribute 'json_mode'`` inside ``engine.validate``
    (pipeline.py:217 passes it through unchecked)."""
    rs = pipe(
        ["hi", "yo"],
        gen_config=[
            GenerationConfig(max_new_tokens=2, ignore_eos=True),
            GenerationConfig(max_new_tokens=3, ignore_eos=True),
        ],
    )
    assert [r.generate_token_len for r in rs] == [2, 3]


# -- 6. chat_template_config -----------------------------------------------------------------
def test_chat_template_config_is_accepted(pipe, monkeypatch) -> None:
    """``pipeline(model, backend_config=..., chat_template_config=...)`` (LMDeploy's signature)
    raises ``TypeError: pipeline() got unexpected arguments: ['chat_template_config']``
    (pipeline.py:56). (build_engine is stubbed with the module's engine to keep this fast.)"""
    import hotloop.api.pipeline as mod

    monkeypatch.setattr(mod, "build_engine", lambda model, cfg: pipe.built)
    p = pipeline(backend_config=EngineConfig(device="cpu"), chat_template_config=None)
    assert p.encode("Hello") == pipe.encode("Hello")


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
    """``GenerationConfig.__post_init__`` (messages.py:81-136) compares with one-sided ``<``/``<=``
    (NaN passes, wrong types raise a bare TypeError) and never checks stop_words' element types. A
    bad value must raise ``RequestError`` whose ``param`` and message name the field."""
    with pytest.raises(RequestError) as e:
        GenerationConfig(**{field: value})  # type: ignore[arg-type]
    assert e.value.param == field and field in str(e.value)


def test_non_string_stop_word_leaves_no_request_behind(pipe) -> None:
    """A non-str stop word passes validation, then raises TypeError inside ``engine.step()``; the
    abort path raises again in ``detokenizer.flush()`` (engine.py:504) before the request is popped,
    so it stays in ``engine.requests`` / ``engine._ids`` for good. It must be refused up front."""
    with pytest.raises(RequestError):
        pipe("hi", gen_config=GenerationConfig(max_new_tokens=2, stop_words=[1]))  # type: ignore[list-item]
    _idle(pipe)


# -- 8. EngineConfig.seed ----------------------------------------------------------------------
def test_engine_seed_makes_unseeded_sampling_reproducible(make_tiny_model: Callable[[str], Path]) -> None:
    """``EngineConfig.seed`` ("engine-wide random seed", cli/engine_args.py:38) is read nowhere:
    unseeded draws use torch's global RNG (executor/sampler.py:271), so two engines built with the
    same seed sample differently whenever anything else touched that RNG."""
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
    """A prompt that alone fills the session/KV limit gets "lower max_new_tokens to at most 0"
    (engine.py:167), an impossible value (max_new_tokens >= 1): the message must say the prompt
    itself is too long (it does name param='prompt')."""
    with pytest.raises(RequestError) as e:
        pipe("word " * 5000, gen_config=GenerationConfig(max_new_tokens=8))
    assert e.value.param == "prompt"
    assert "at most 0" not in str(e.value), str(e.value)


def test_chat_with_empty_message_list_raises_request_error(pipe) -> None:
    """``pipe.chat([])`` on a new session: ``self([])`` returns ``[]`` (an empty batch) and
    ``chat`` crashes with ``AttributeError: 'list' object has no attribute 'text'``
    (pipeline.py:288). It must raise RequestError naming the prompt."""
    with pytest.raises(RequestError):
        pipe.chat([])
