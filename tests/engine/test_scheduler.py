"""Scheduler: continuous batching, chunked prefill, admission limits and preemption, with exact ids."""

from __future__ import annotations

import argparse

import pytest

from hotloop.cli.engine_args import add_engine_args, engine_config_from_args
from hotloop.config import ConfigError, EngineConfig, SchedulerConfig
from hotloop.engine.block_manager import BlockManager
from hotloop.engine.request import Request, RequestStatus
from hotloop.engine.scheduler import Scheduler, SchedulerOutput
from hotloop.messages import GenerationConfig


def make(
    num_blocks: int = 16, block_size: int = 4, max_batch: int = 8, budget: int = 64, reserve_max: float = 0.0
) -> Scheduler:
    """(the mechanics with exact ids are tested without the admission reserve; its own tests pass
    ``reserve_max``)"""
    cfg = SchedulerConfig(
        max_batch_size=max_batch,
        max_prefill_token_num=budget,
        session_len=1024,
        reserve_sure=reserve_max,
        reserve_max=reserve_max,
    )
    return Scheduler(cfg, BlockManager(num_blocks, block_size))


def req(rid: str, n: int, max_new: int = 16) -> Request:
    return Request(rid, list(range(1, n + 1)), GenerationConfig(max_new_tokens=max_new))


def run_step(s: Scheduler, token: int = 7) -> SchedulerOutput:
    """Schedule, pretend to execute, append a token to every request that samples."""
    out = s.schedule()
    s.advance(out)
    for x in out.scheduled:
        if x.samples:
            x.request.num_pending_tokens -= 1  # the engine collects the sampled token
            x.request.output_token_ids.append(token)
    return out


def plan(out: SchedulerOutput) -> list[tuple[str, int, int]]:
    return [(x.request.request_id, x.start, x.num_tokens) for x in out.scheduled]


def test_prefill_then_decode_and_join_mid_flight() -> None:
    s = make()
    a = req("a", 6)
    s.add(a)
    out = run_step(s)
    assert plan(out) == [("a", 0, 6)]
    assert a.block_ids == [0, 1] and a.status is RequestStatus.RUNNING
    assert plan(run_step(s)) == [("a", 6, 1)]
    b = req("b", 3)
    s.add(b)
    out = run_step(s)  # b joins while a decodes
    assert plan(out) == [("a", 7, 1), ("b", 0, 3)]
    assert a.block_ids == [0, 1] and b.block_ids == [2]
    out = run_step(s)  # a's 9th token needs a third block
    assert plan(out) == [("a", 8, 1), ("b", 3, 1)]
    assert a.block_ids == [0, 1, 3] and b.block_ids == [2]


def test_chunked_prefill_under_budget_mixed_with_decodes() -> None:
    s = make(budget=5)
    a = req("a", 2)
    s.add(a)
    run_step(s)
    long = req("long", 12)
    s.add(long)
    out = run_step(s)
    assert plan(out) == [("a", 2, 1), ("long", 0, 5)]
    assert not out.scheduled[1].samples and long.output_token_ids == []
    out = run_step(s)
    assert plan(out) == [("a", 3, 1), ("long", 5, 5)]
    out = run_step(s)
    assert plan(out) == [("a", 4, 1), ("long", 10, 2)]
    assert out.scheduled[1].samples and long.output_token_ids == [7]
    assert plan(run_step(s)) == [("a", 5, 1), ("long", 12, 1)]


def test_budget_shared_between_prefills_fifo() -> None:
    s = make(budget=8)
    for rid, n in (("a", 5), ("b", 5), ("c", 2)):
        s.add(req(rid, n))
    out = run_step(s)
    assert plan(out) == [("a", 0, 5), ("b", 0, 3)]  # c waits: the budget is spent
    out = run_step(s)
    assert plan(out) == [("a", 5, 1), ("b", 3, 2), ("c", 0, 2)]


def test_max_batch_size_bounds_admission() -> None:
    s = make(max_batch=2)
    for rid in "abc":
        s.add(req(rid, 2, max_new=2))
    out = run_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["a", "b"]
    assert s.num_waiting == 1
    a = s.running[0]
    s.finish(a, RequestStatus.FINISHED_STOPPED)
    out = run_step(s)
    assert plan(out) == [("b", 2, 1), ("c", 0, 2)]


def test_admission_waits_for_blocks() -> None:
    s = make(num_blocks=3, block_size=4)
    a, b = req("a", 8), req("b", 8)
    s.add(a)
    s.add(b)
    out = run_step(s)
    assert plan(out) == [("a", 0, 8)]  # b needs 2 blocks, only 1 free
    assert s.num_waiting == 1


def test_preemption_newest_first_and_resume() -> None:
    s = make(num_blocks=4, block_size=4)
    a, b = req("a", 4), req("b", 4)
    s.add(a)
    s.add(b)
    run_step(s)  # a: [0], b: [1]; each has 4 tokens + 1 sampled
    assert a.block_ids == [0] and b.block_ids == [1]
    out = run_step(s)  # both cross into a second block: [2], [3]
    assert plan(out) == [("a", 4, 1), ("b", 4, 1)]
    assert a.block_ids == [0, 2] and b.block_ids == [1, 3]
    for _ in range(3):
        run_step(s)
    # now each holds 8 computed + 1 pending token: a needs a third block and the pool is empty
    out = run_step(s)
    assert [r.request_id for r in out.preempted] == ["b"]
    assert plan(out) == [("a", 8, 1)]
    assert b.status is RequestStatus.PREEMPTED and b.block_ids == [] and b.num_computed_tokens == 0
    assert a.block_ids == [0, 2, 1]
    assert list(s.waiting) == [b]
    # b resumes (recomputing prompt + its outputs) once a finishes
    s.finish(a, RequestStatus.FINISHED_LENGTH)
    out = run_step(s)
    assert plan(out) == [("b", 0, 9)]
    assert b.status is RequestStatus.RUNNING and out.scheduled[0].samples
    s.finish(b, RequestStatus.FINISHED_LENGTH)
    assert s.block_manager.num_free_blocks == 4
    s.block_manager.check_consistency()


def test_self_preemption_when_alone_is_never_needed_for_valid_requests() -> None:
    # A request that fits the pool on its own always makes progress when it runs alone.
    s = make(num_blocks=2, block_size=4)
    a = req("a", 3, max_new=5)
    s.add(a)
    for _ in range(5):
        out = run_step(s)
        assert out.scheduled and not out.preempted
    assert a.num_output_tokens == 5


# -- the admission reserve ---------------------------------------------------------------------------
def _finish_done(s: Scheduler, out: SchedulerOutput) -> None:
    for x in out.scheduled:
        r = x.request
        if x.samples and len(r.output_token_ids) >= r.params.max_new_tokens:
            s.finish(r, RequestStatus.FINISHED_LENGTH)


def _drain(s: Scheduler, limit: int = 500) -> int:
    """Run to the end; returns the steps taken."""
    for step in range(limit):
        if not s.has_unfinished():
            return step
        _finish_done(s, run_step(s))
    raise AssertionError("did not finish")


def test_reserve_keeps_room_for_the_outputs_ignore_eos_will_produce() -> None:
    # 4-token prompts (1 block of 4) that will surely grow by 8 (2 more blocks): 3 blocks each at the
    # end, so a 16-block pool admits 5 and keeps the 6th waiting, and nobody is ever preempted
    s = make(num_blocks=16, reserve_max=1.0)
    for i in range(6):
        s.add(Request(f"r{i}", [1, 2, 3, 4], GenerationConfig(max_new_tokens=8, ignore_eos=True)))
    out = run_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["r0", "r1", "r2", "r3", "r4"]
    assert s.num_waiting == 1 and s.block_manager.num_free_blocks == 11
    _finish_done(s, out)
    _drain(s)
    assert s.num_preemptions == 0 and s.block_manager.num_free_blocks == 16
    # without it all six start, and growth is served by preempting
    s = make(num_blocks=16, reserve_max=0.0)
    for i in range(6):
        s.add(Request(f"r{i}", [1, 2, 3, 4], GenerationConfig(max_new_tokens=8, ignore_eos=True)))
    assert len(run_step(s).scheduled) == 6
    _drain(s)
    assert s.num_preemptions > 0 and s.block_manager.num_free_blocks == 16


def test_reserve_counts_min_new_tokens_and_not_stop_ended_requests() -> None:
    # min_new_tokens=8 is sure; ignore_eos with a stop word is not (it may stop early)
    for params, admitted in (
        (GenerationConfig(max_new_tokens=8, min_new_tokens=8), 5),
        (GenerationConfig(max_new_tokens=8, ignore_eos=True, stop_token_ids=[9]), 6),
        (GenerationConfig(max_new_tokens=8), 6),
    ):
        s = make(num_blocks=16, reserve_max=1.0)
        for i in range(6):
            s.add(Request(f"r{i}", [1, 2, 3, 4], params))
        assert len(run_step(s).scheduled) == admitted, params


def test_reserve_jumps_after_a_preemption_and_decays() -> None:
    cfg = SchedulerConfig(
        max_batch_size=8, max_prefill_token_num=64, session_len=1024, reserve_max=0.5, reserve_decay_steps=4
    )
    s = Scheduler(cfg, BlockManager(16, 4))
    assert s.reserve == 0.0  # no preemption yet: admit what fits now
    for i in range(6):  # may-stop requests: nothing is sure, so all six start and one gets preempted
        s.add(Request(f"r{i}", [1, 2, 3, 4], GenerationConfig(max_new_tokens=8)))
    seen = []
    for _ in range(40):
        out = run_step(s)
        seen.append((bool(out.preempted), s.reserve))
        _finish_done(s, out)
        if not s.has_unfinished():
            break
    first = next(i for i, (pre, _r) in enumerate(seen) if pre)
    assert seen[first][1] == 0.5  # full after the preempting step
    # then down by (0.5 - 0) / 4 a step until 0 (or back to 0.5 at the next preemption)
    for (pre, r), (_p0, r0) in zip(seen[first + 1 :], seen[first:-1], strict=True):
        assert r == 0.5 if pre else r == max(0.0, r0 - 0.125)
    assert s.block_manager.num_free_blocks == 16


def test_reserve_growth_is_capped_by_the_session() -> None:
    # max_new_tokens past the session: the reserve counts only up to session_len
    cfg = SchedulerConfig(max_batch_size=8, max_prefill_token_num=64, session_len=8)
    s = Scheduler(cfg, BlockManager(16, 4))
    r = Request("a", [1, 2, 3, 4], GenerationConfig(max_new_tokens=100, ignore_eos=True))
    s.add(r)
    assert r.reserve_ends == (8, 8) and s._blocks_reserved(r, 1) == 1


def test_reserve_rounds_each_request_to_blocks() -> None:
    # 4-token prompts that surely fill one more slot (max_new_tokens 2: the last token is never
    # written): one more block each, so a 5-block pool takes two, not the three a pooled count of
    # 3 tokens (one block) would let in
    s = make(num_blocks=5, reserve_max=1.0)
    for i in range(3):
        s.add(Request(f"r{i}", [1, 2, 3, 4], GenerationConfig(max_new_tokens=2, ignore_eos=True)))
    out = run_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["r0", "r1"]
    _finish_done(s, out)
    _drain(s)
    assert s.num_preemptions == 0 and s.block_manager.num_free_blocks == 5


def test_reserve_counts_the_free_cached_blocks_a_hit_takes() -> None:
    cfg = SchedulerConfig(max_batch_size=8, max_prefill_token_num=64, session_len=1024)
    s = Scheduler(cfg, BlockManager(5, 4, enable_prefix_caching=True))
    s.add(Request("a", list(range(1, 9)), GenerationConfig(max_new_tokens=1, ignore_eos=True)))
    _drain(s)  # leaves its two full blocks cached and free
    s.add(Request("b", [50, 51, 52, 53], GenerationConfig(max_new_tokens=12, ignore_eos=True)))
    _finish_done(s, run_step(s))  # b holds 1 block, will surely need 3 more
    s.add(Request("c", list(range(1, 10)), GenerationConfig(max_new_tokens=3, ignore_eos=True)))
    out = run_step(s)  # c would take the 2 cached blocks and 1 new: no room for b's growth
    assert [x.request.request_id for x in out.scheduled] == ["b"]
    _finish_done(s, out)
    _drain(s)
    assert s.num_preemptions == 0 and s.block_manager.num_free_blocks == 5


def test_reserve_holds_back_the_uncertain_rest_after_a_preemption() -> None:
    # requests that may stop at EOS: nothing is sure, so the reserve decides. 4-token prompts that
    # may fill 7 more slots: 3 blocks each at most, 5 of them in 16 blocks
    for reserve, admitted in ((0.0, 6), (1.0, 5)):
        cfg = SchedulerConfig(
            max_batch_size=8, max_prefill_token_num=64, session_len=1024, reserve_decay_steps=1000
        )
        s = Scheduler(cfg, BlockManager(16, 4))
        s.reserve = reserve  # (as right after a preempting step)
        for i in range(6):
            s.add(Request(f"r{i}", [1, 2, 3, 4], GenerationConfig(max_new_tokens=8)))
        assert len(run_step(s).scheduled) == admitted


def test_schedule_conservativeness_flag_range_and_mapping() -> None:
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ConfigError, match=r"schedule_conservativeness=.* must be a number in \[0, 1\]"):
            EngineConfig(schedule_conservativeness=bad)
    ap = argparse.ArgumentParser()
    add_engine_args(ap)
    cfg = engine_config_from_args(ap.parse_args(["--schedule-conservativeness", "0.25"]))
    assert cfg.schedule_conservativeness == 0.25
    with pytest.raises(ValueError, match="reserve_min=0.5 and reserve_max=0.25"):
        SchedulerConfig(8, 64, 1024, reserve_max=0.25, reserve_min=0.5)
