"""Aborts, preemption and prefix sharing under a tiny KV pool, with an executor whose tokens depend on
what the KV slots hold: a block freed too early, shared while written, or cached with the wrong
tokens changes some request's output. Every scenario must drain with the whole pool free."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import pytest
from toy_engine import toy_model_config

from hotloop.config import CacheConfig, SchedulerConfig
from hotloop.engine.block_manager import BlockManager
from hotloop.engine.engine import Engine
from hotloop.engine.outputs import SampledToken
from hotloop.engine.request import Request
from hotloop.engine.scheduler import SchedulerOutput
from hotloop.messages import GenerationConfig, RequestError

EOS = 0
VOCAB = 128


class CharTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join("" if i == EOS else chr(i) for i in ids)


class KVExecutor:
    """Writes each computed token's id into its KV slot (block, offset); a sampled token is a hash of
    every slot the step reads, so it equals the solo run's only if the request's blocks hold its own
    tokens. Writing into a block another request also holds is an error."""

    def __init__(self) -> None:
        self.pool: dict[tuple[int, int], int] = {}
        self.bm: BlockManager | None = None
        self.device_last: dict[int, int] = {}  # the last sampled token per request serial

    def _input(self, req: Request, pos: int) -> int:
        if pos < req.num_tokens:
            return req.token_ids(pos, pos + 1)[0]
        return self.device_last[req.serial]  # a pending token: on the device only

    def _run_row(self, req: Request, pos: int, token: int) -> int:
        assert self.bm is not None
        bs = self.bm.block_size
        b = req.block_ids[pos // bs]
        assert self.bm.ref_count(b) == 1, f"{req.request_id} writes position {pos} into shared block {b}"
        self.pool[(b, pos % bs)] = token
        seen = [self.pool.get((req.block_ids[i // bs], i % bs), -1) for i in range(pos + 1)]
        return zlib.crc32(repr(seen).encode()) % (VOCAB - 1) + 1  # never EOS

    def execute(self, out: SchedulerOutput) -> list[SampledToken]:
        tokens = []
        for s in out.scheduled:
            req = s.request
            t = 0
            for pos in range(s.start, s.start + s.num_tokens):
                t = self._run_row(req, pos, self._input(req, pos))
            if s.samples:
                self.device_last[req.serial] = t
                tokens.append(SampledToken(t))
        return tokens

    def score(self, request: Request, start: int, num_tokens: int) -> list[float]:
        return [0.0] * min(num_tokens, request.num_tokens - 1 - start)


@dataclass
class Handle:
    tokens: Any
    steps: int


class OverlapKVExecutor(KVExecutor):
    """The same with ``launch``/``collect`` (the engine overlaps steps) and ``collect_steps``
    (multi-step rounds)."""

    supports_multi_step = True

    def launch(self, out: SchedulerOutput, steps: int = 1) -> Any:
        if steps == 1:
            return Handle(self.execute(out), 1)
        rows = []
        for s in out.scheduled:
            req = s.request
            left = req.params.max_new_tokens - req.num_output_tokens - req.num_pending_tokens
            ids: list[int] = []
            for j in range(steps):
                pos = s.start + j
                ids.append(
                    self._run_row(req, pos, ids[-1] if j else self._input(req, pos)) if j < left else 1
                )
            self.device_last[req.serial] = ids[min(left, steps) - 1]
            rows.append(ids)
        return Handle(rows, steps)

    def collect(self, handle: Handle) -> list[SampledToken]:
        return handle.tokens  # type: ignore[no-any-return]

    def collect_steps(self, handle: Handle) -> list[list[int]]:
        return handle.tokens  # type: ignore[no-any-return]


def make_engine(
    mode: str = "plain",
    num_blocks: int = 64,
    block_size: int = 4,
    session_len: int = 40,
    budget: int = 100,
    prefix: bool = False,
    max_batch_size: int = 4,
) -> Engine:
    mc = toy_model_config(VOCAB, session_len, EOS)
    ex = KVExecutor() if mode == "plain" else OverlapKVExecutor()
    e = Engine(
        ex,
        CharTokenizer(),
        mc,
        CacheConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=prefix),
        SchedulerConfig(
            max_batch_size=max_batch_size,
            max_prefill_token_num=budget,
            session_len=session_len,
            reserve_sure=0.0,
            reserve_max=0.0,
        ),
        overlap=mode != "plain",
        num_scheduler_steps=4 if mode == "multi" else 1,
        full_batch_steps=4 if mode == "multi" else 1,
    )
    ex.bm = e.block_manager
    return e


def run(
    e: Engine,
    adds: dict[int, list[tuple[str, list[int], int]]],
    aborts: dict[int, list[str]] | None = None,
    abort_on_output: frozenset[str] = frozenset(),
) -> tuple[dict[str, list[int]], dict[str, str], dict[str, int]]:
    """Step ``e`` until it drains, adding and aborting requests at the given step numbers, and aborting
    those in ``abort_on_output`` twice, in the two steps after their first output. Returns each
    request's output ids, its finish reason, and its computed tokens when its abort was issued (-1:
    not known to the engine then). Checks the pool's consistency after every step."""
    aborts = {k: list(v) for k, v in (aborts or {}).items()}
    outs: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    at_abort: dict[str, int] = {}
    last = max([*adds, *aborts])
    for step in range(500):
        for rid, prompt, m in adds.get(step, []):
            e.add_request(rid, prompt, GenerationConfig(max_new_tokens=m, ignore_eos=True))
        for rid in aborts.get(step, []):
            req = e.requests.get(rid)
            at_abort.setdefault(rid, req.num_computed_tokens if req is not None else -1)
            e.abort_request(rid)
        if step > last and not e.has_unfinished():
            break
        for o in e.step():
            assert o.request_id not in reasons, f"{o.request_id}: an output after its final one"
            if o.request_id in abort_on_output and o.request_id not in outs:
                aborts.setdefault(step + 1, []).append(o.request_id)
                aborts.setdefault(step + 2, []).append(o.request_id)
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                assert o.finish_reason is not None
                reasons[o.request_id] = o.finish_reason
        e.block_manager.check_consistency()
    assert not e.has_unfinished()
    return outs, reasons, at_abort


def solo(prompt: list[int], max_new_tokens: int) -> list[int]:
    outs, _, _ = run(make_engine(), {0: [("x", prompt, max_new_tokens)]})
    return outs["x"]


def assert_pool_full(e: Engine) -> None:
    assert e.num_free_blocks == e.num_total_blocks
    assert e.block_manager.usage == 0.0
    e.block_manager.check_consistency()
    assert e.requests == {} and not e.scheduler.running and not e.scheduler.waiting


SHARED = [(7 * i) % 120 + 3 for i in range(9)]


@pytest.mark.parametrize("prefix", [False, True], ids=["no-prefix-cache", "prefix-cache"])
@pytest.mark.parametrize("mode", ["plain", "overlap", "multi"])
def test_aborts_and_preemption_in_a_tiny_pool_keep_outputs_and_free_every_block(
    mode: str, prefix: bool
) -> None:
    """Two samples of one prompt (n=2) and a third sharing its prefix, a long prompt prefilled in
    chunks and aborted mid-prefill, one aborted mid-decode twice, an abort after a finish and one of
    an unknown id, all in 8 blocks of 4 tokens, which forces preemption."""
    reqs = {
        "a": (SHARED + [90, 91], 14),
        "b": (SHARED + [90, 91], 14),
        "c": (SHARED[:8] + [50, 51, 52], 12),
        "long": ([5 + i for i in range(18)], 6),
        "d": ([60, 61, 62], 16),
    }
    e = make_engine(mode, num_blocks=8, budget=3, prefix=prefix)
    adds = {0: [("long", *reqs["long"])], 1: [("a", *reqs["a"]), ("b", *reqs["b"])], 2: [("d", *reqs["d"])]}
    adds[12] = [("c", *reqs["c"])]
    aborts = {3: ["long"], 11: ["nope"], 60: ["a", "a"]}
    outs, reasons, at_abort = run(e, adds, aborts, abort_on_output=frozenset({"d"}))
    assert e.scheduler.num_preemptions > 0
    assert 0 < at_abort["long"] < 18  # mid-prefill
    assert reasons["long"] == "abort" and outs.get("long", []) == []
    assert reasons["d"] == "abort" and 0 < len(outs["d"]) < 16  # mid-decode
    assert at_abort["a"] == -1  # it had finished
    assert "nope" not in reasons
    assert_pool_full(e)
    for rid in ("a", "b", "c"):
        assert reasons[rid] == "length"
        assert outs[rid] == solo(*reqs[rid]), rid
    assert outs["d"] == solo(*reqs["d"])[: len(outs["d"])]
    if prefix:
        assert e.block_manager.prefix_hits > 0
    if mode != "plain":
        assert e.num_overlapped_steps > 0
    if mode == "multi":
        assert e.num_multi_step_launches > 0


def test_score_refusals_name_input_ids_and_its_real_limit() -> None:
    """``score`` puts every token through the cache, the last one included: it takes up to
    ``max_tokens_per_request`` tokens and its refusals must say so for ``input_ids`` (not for a
    "prompt" one token shorter, with a limit one too low)."""
    e = make_engine(num_blocks=8, block_size=4, session_len=24)
    assert e.score(list(range(1, 25))) == [0.0] * 23  # 24 tokens: exactly session_len
    with pytest.raises(
        RequestError, match=r"input_ids has 25 tokens, which exceeds session_len=24; score at most 24"
    ) as ei:
        e.score(list(range(1, 26)))
    assert ei.value.param == "input_ids"
    e = make_engine(num_blocks=4, block_size=4, session_len=24)
    assert len(e.score(list(range(1, 17)))) == 15  # the whole pool
    with pytest.raises(
        RequestError, match=r"input_ids has 17 tokens, which exceeds the KV cache's 16 tokens"
    ) as ei:
        e.score(list(range(1, 18)))
    assert ei.value.param == "input_ids"
    with pytest.raises(RequestError, match=r"input_ids\[1\] = 500 is not a token id in \[0, 128\)") as ei:
        e.score([1, 500, 2])
    assert ei.value.param == "input_ids"
    assert_pool_full(e)
