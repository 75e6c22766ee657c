"""Scheduler: continuous batching, chunked prefill, admission limits and preemption, with exact ids."""

from __future__ import annotations

from hotloop.config import SchedulerConfig
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
