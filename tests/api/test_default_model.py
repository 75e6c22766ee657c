"""The embedded default model (SmolLM2-135M-Instruct from its GGUF) through the pipeline."""

from __future__ import annotations

import math

import pytest
import torch

from hotloop import EngineConfig, GenerationConfig, pipeline
from hotloop.messages import RequestError

# An encyclopedia-style paragraph written for this test (not from any training set we know of).
PARAGRAPH = (
    "The Danube is the second-longest river in Europe, after the Volga. It rises in the Black Forest "
    "in Germany and flows for about 2,850 kilometres through Central and Southeastern Europe before "
    "emptying into the Black Sea. Ten countries lie along its course, more than along any other river "
    "in the world, and four national capitals, Vienna, Bratislava, Budapest and Belgrade, stand on its "
    "banks. For centuries the river was an important trade route, and today it remains a major "
    "waterway for barges carrying grain, ore and manufactured goods."
)


@pytest.fixture(scope="module")
def pipe():
    p = pipeline(backend_config=EngineConfig(device="cpu", max_batch_size=16, cache_max_entry_count=256))
    yield p
    p.close()


def test_capital_of_france(pipe) -> None:
    r = pipe("The capital of France is", gen_config=GenerationConfig(max_new_tokens=8), do_preprocess=False)
    assert "Paris" in r.text
    assert r.finish_reason in ("length", "stop")
    assert r.input_token_len == len(pipe.tokenizer.encode("The capital of France is"))


def test_perplexity_matches_transformers(pipe) -> None:
    from transformers import AutoModelForCausalLM

    ids = pipe.tokenizer.encode(PARAGRAPH)
    ours = pipe.get_ppl(ids)[0]
    model = AutoModelForCausalLM.from_pretrained(str(pipe.built.model_path), torch_dtype=torch.float32)
    with torch.no_grad():
        loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    theirs = math.exp(loss)
    assert 3.0 < theirs < 20.0, theirs  # a real model on real text (ASSETS.md: about 6.8)
    assert abs(ours - theirs) / theirs < 0.01, (ours, theirs)


def test_chat_template_is_applied_by_default(pipe) -> None:
    templated = pipe.encode("Hello")
    raw = pipe.encode("Hello", do_preprocess=False)
    assert pipe.tokenizer.decode(templated).startswith("<|im_start|>")
    assert len(templated) > len(raw)


def test_batch_stream_and_chat(pipe) -> None:
    gen = GenerationConfig(max_new_tokens=12)
    prompts = ["What is 2 + 2?", "Name a color.", [{"role": "user", "content": "Say hi."}]]
    full = pipe(prompts, gen_config=gen)
    assert len(full) == 3
    pieces: dict[int, str] = {0: "", 1: "", 2: ""}
    ends = {}
    for r in pipe.stream_infer(prompts, gen_config=gen):
        pieces[r.index] += r.text
        if r.finish_reason:
            ends[r.index] = r.finish_reason
    assert [pieces[i] for i in range(3)] == [r.text for r in full]
    assert [ends[i] for i in range(3)] == [r.finish_reason for r in full]
    s = pipe.chat("My name is Ada.", gen_config=gen)
    s = pipe.chat("What is my name?", session=s, gen_config=gen)
    assert len(s.history) == 4 and s.history[2]["content"] == "What is my name?"
    assert s.response is not None and s.response.input_token_len > len(pipe.encode("What is my name?"))


def test_seeded_sampling_and_n(pipe) -> None:
    gen = GenerationConfig(max_new_tokens=10, do_sample=True, temperature=1.0, random_seed=7, n=2)
    a = pipe("Tell me a word.", gen_config=gen)
    b = pipe("Tell me a word.", gen_config=gen)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert len(a) == 2


def test_too_long_is_refused_and_pool_stays_full(pipe) -> None:
    engine = pipe.engine
    with pytest.raises(RequestError) as e:
        pipe("hello " * 10, gen_config=GenerationConfig(max_new_tokens=10**6), do_preprocess=False)
    msg = str(e.value)
    assert "max_new_tokens is 1000000" in msg and "prompt has" in msg
    assert engine.num_free_blocks == engine.num_total_blocks


def test_stop_words_and_max_tokens(pipe) -> None:
    r = pipe(
        "Count from 1 to 20: 1, 2, 3,",
        gen_config=GenerationConfig(max_new_tokens=30, stop_words=[" 7"]),
        do_preprocess=False,
    )
    assert r.finish_reason == "stop"
    assert " 7" not in r.text and r.text.strip().endswith("6,")


def test_stream_chunks_name_their_choice(pipe) -> None:
    """With n > 1 each streamed piece says which sample it belongs to, and the pieces of a sample
    join into what pipe() returns for it (same seeds)."""
    gen = GenerationConfig(n=2, max_new_tokens=6, do_sample=True, random_seed=7, ignore_eos=True)
    whole = pipe("Once upon a time", gen_config=gen, do_preprocess=False)
    streamed: dict[int, list[int]] = {0: [], 1: []}
    for r in pipe.stream_infer("Once upon a time", gen_config=gen, do_preprocess=False):
        assert r.index == 0
        streamed[r.choice] += r.token_ids
    assert [w.choice for w in whole] == [0, 1]
    assert streamed == {0: whole[0].token_ids, 1: whole[1].token_ids}


def test_ppl_checks_every_token_id(pipe) -> None:
    vocab = pipe.engine.model_config.vocab_size
    for bad in (vocab, -1, "5"):
        with pytest.raises(RequestError, match=r"input_ids\[2\].*not a token id") as e:
            pipe.get_ppl([1, 2, bad])
        assert e.value.param == "input_ids"
    assert pipe.get_ppl([1, 2, 3])[0] > 1.0


def test_one_call_at_a_time(pipe) -> None:
    """A call while a stream is open would step the engine under it: it raises, and the open stream
    still gets all of its tokens."""
    gen = GenerationConfig(max_new_tokens=5, ignore_eos=True)
    stream = pipe.stream_infer("Hello", gen_config=gen, do_preprocess=False)
    first = next(stream)
    with pytest.raises(RuntimeError, match="already generating"):
        pipe("Hi", gen_config=gen, do_preprocess=False)
    with pytest.raises(RuntimeError, match="already generating"):
        pipe.get_ppl([1, 2, 3])
    rest = list(stream)
    assert len(first.token_ids) + sum(len(r.token_ids) for r in rest) == 5
    assert pipe("Hi", gen_config=gen, do_preprocess=False).generate_token_len == 5  # idle again
    engine = pipe.engine
    assert engine.num_free_blocks == engine.num_total_blocks


def test_seeds_are_checked_and_wrap_for_n(pipe) -> None:
    with pytest.raises(RequestError, match=r"random_seed=-1 must be an integer in \[0, 2\*\*63\)"):
        GenerationConfig(random_seed=-1)
    with pytest.raises(RequestError, match="random_seed"):
        GenerationConfig(random_seed=2**63)
    with pytest.raises(RequestError, match="min_new_tokens=9 must be <= max_new_tokens=8"):
        GenerationConfig(max_new_tokens=8, min_new_tokens=9)
    gen = GenerationConfig(n=2, max_new_tokens=3, do_sample=True, random_seed=2**63 - 1)
    out = pipe("Hi", gen_config=gen, do_preprocess=False)  # sample 1 takes seed 0
    assert [len(r.token_ids) for r in out] == [3, 3]
    with pytest.raises(RequestError, match="n=2: chat"):
        pipe.chat("Hi", gen_config=gen)


def test_a_tiny_temperature_is_greedy(pipe) -> None:
    """Dividing logits by 1e-45 overflows them; below 1e-5 a sampled request decodes greedily."""
    greedy = pipe(
        "The capital of France is", gen_config=GenerationConfig(max_new_tokens=5), do_preprocess=False
    )
    tiny = GenerationConfig(max_new_tokens=5, do_sample=True, temperature=1e-45, random_seed=3)
    assert tiny.greedy
    assert (
        pipe("The capital of France is", gen_config=tiny, do_preprocess=False).token_ids == greedy.token_ids
    )
