"""Engine: step loop, stops, aborts and refusals, with a scripted executor and exact pool accounting."""

from __future__ import annotations

import pytest
from toy_engine import toy_model_config

from hotloop.config import CacheConfig, SchedulerConfig
from hotloop.engine.engine import Engine
from hotloop.engine.outputs import RequestOutput, SampledToken
from hotloop.engine.request import Request
from hotloop.engine.scheduler import SchedulerOutput
from hotloop.messages import GenerationConfig, RequestError

EOS = 0
VOCAB = 128


class CharTokenizer:
    """Token id i is chr(i); id 0 is the special EOS."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(
            "" if (i == EOS and skip_special_tokens) else ("<eos>" if i == EOS else chr(i)) for i in ids
        )


class ScriptedExecutor:
    """Each request emits the characters of ``script[request_id]`` in order, then EOS forever."""

    def __init__(self, script: dict[str, str]) -> None:
        self.script = script
        self.steps: list[list[tuple[str, int, int]]] = []

    def execute(self, out: SchedulerOutput) -> list[SampledToken]:
        self.steps.append([(s.request.request_id, s.start, s.num_tokens) for s in out.scheduled])
        tokens = []
        for s in out.scheduled:
            if s.samples:
                text = self.script.get(s.request.request_id, "")
                k = s.request.num_output_tokens
                tokens.append(SampledToken(ord(text[k]) if k < len(text) else EOS))
        return tokens

    def score(self, request: Request, start: int, num_tokens: int) -> list[float]:
        return [0.0] * num_tokens


def make_engine(
    script: dict[str, str],
    num_blocks: int = 8,
    block_size: int = 4,
    session_len: int = 64,
    reserve: float = 1.0,
) -> Engine:
    mc = toy_model_config(VOCAB, session_len, EOS)
    return Engine(
        ScriptedExecutor(script),
        CharTokenizer(),
        mc,
        CacheConfig(block_size=block_size, num_blocks=num_blocks),
        SchedulerConfig(
            max_batch_size=4,
            max_prefill_token_num=16,
            session_len=session_len,
            reserve_sure=reserve,
            reserve_max=reserve,
        ),
    )


def run_all(engine: Engine) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    for _ in range(200):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
    assert not engine.has_unfinished()
    return outs


def text_of(outs: list[RequestOutput]) -> str:
    return "".join(o.new_text for o in outs)


def assert_pool_full(engine: Engine) -> None:
    assert engine.num_free_blocks == engine.num_total_blocks
    engine.block_manager.check_consistency()
    assert engine.requests == {}


def test_eos_length_and_stop_string() -> None:
    e = make_engine({"a": "hello", "b": "abcdefgh", "c": "one. two"})
    e.add_request("a", [65, 66], GenerationConfig(max_new_tokens=20))
    e.add_request("b", [65], GenerationConfig(max_new_tokens=3))
    e.add_request("c", [65, 66, 67], GenerationConfig(max_new_tokens=20, stop_words=["."]))
    outs = run_all(e)
    assert text_of(outs["a"]) == "hello" and outs["a"][-1].finish_reason == "stop"
    assert outs["a"][-1].num_generated_tokens == 6  # five letters and the EOS
    assert text_of(outs["b"]) == "abc" and outs["b"][-1].finish_reason == "length"
    assert text_of(outs["c"]) == "one" and outs["c"][-1].finish_reason == "stop"
    assert_pool_full(e)


def test_ignore_eos_and_min_new_tokens_reach_the_executor() -> None:
    e = make_engine({"a": "hi"})
    e.add_request("a", [65], GenerationConfig(max_new_tokens=5, ignore_eos=True))
    outs = run_all(e)
    assert outs["a"][-1].finish_reason == "length" and outs["a"][-1].num_generated_tokens == 5
    assert_pool_full(e)


def test_abort_waiting_and_running() -> None:
    e = make_engine({"a": "x" * 40, "b": "y" * 40})
    e.add_request("a", [65] * 5, GenerationConfig(max_new_tokens=20))
    e.step()
    e.step()
    assert len(e.requests["a"].block_ids) == 2
    e.abort_request("a")
    e.add_request("b", [66], GenerationConfig(max_new_tokens=20))
    e.abort_request("b")  # aborted before it ever ran
    outs = e.step()
    assert {(o.request_id, o.finish_reason) for o in outs} == {("a", "abort"), ("b", "abort")}
    assert_pool_full(e)
    e.abort_request("unknown")  # harmless
    assert e.step() == []


def test_refusals_name_the_limit_and_leave_the_pool_alone() -> None:
    e = make_engine({}, num_blocks=8, block_size=4, session_len=24)
    with pytest.raises(
        RequestError, match=r"prompt has 20 tokens and max_new_tokens is 5: 25 tokens exceed session_len=24"
    ):
        e.add_request("x", [65] * 20, GenerationConfig(max_new_tokens=5))
    with pytest.raises(RequestError, match="empty"):
        e.add_request("y", [], GenerationConfig())
    with pytest.raises(RequestError, match=r"outside the vocabulary \[0, 128\)"):
        e.add_request("z", [500], GenerationConfig(max_new_tokens=1))
    with pytest.raises(RequestError, match=r"logit_bias token id 128 is outside the vocabulary"):
        e.add_request("b", [65], GenerationConfig(max_new_tokens=1, logit_bias={5: 1.0, 128: 2.0}))
    e.add_request("ok", [65], GenerationConfig(max_new_tokens=1))
    with pytest.raises(RequestError, match="already in use"):
        e.add_request("ok", [65], GenerationConfig(max_new_tokens=1))
    run_all(e)
    assert_pool_full(e)


def test_request_larger_than_the_pool_is_refused() -> None:
    e = make_engine({}, num_blocks=2, block_size=4, session_len=64)
    with pytest.raises(RequestError, match="KV cache's 8 tokens"):
        e.add_request("x", [65] * 6, GenerationConfig(max_new_tokens=4))


def test_preemption_keeps_outputs_identical() -> None:
    script = {"a": "abcdefghijkl", "b": "mnopqrstuvwx"}
    alone = {}
    for rid in script:
        e = make_engine(script, num_blocks=16)
        e.add_request(rid, [65] * 3, GenerationConfig(max_new_tokens=12, ignore_eos=True))
        alone[rid] = text_of(run_all(e)[rid])
    # both need 4 blocks at the end: without the admission reserve both start and one is preempted
    e = make_engine(script, num_blocks=5, reserve=0.0)
    for rid in script:
        e.add_request(rid, [65] * 3, GenerationConfig(max_new_tokens=12, ignore_eos=True))
    outs = run_all(e)
    assert e.scheduler.num_preemptions > 0
    assert {rid: text_of(o) for rid, o in outs.items()} == alone
    assert_pool_full(e)
    # with it (the default) the second waits for the first's blocks: no preemption, the same text
    e = make_engine(script, num_blocks=5)
    for rid in script:
        e.add_request(rid, [65] * 3, GenerationConfig(max_new_tokens=12, ignore_eos=True))
    outs = run_all(e)
    assert e.scheduler.num_preemptions == 0
    assert {rid: text_of(o) for rid, o in outs.items()} == alone
    assert_pool_full(e)
