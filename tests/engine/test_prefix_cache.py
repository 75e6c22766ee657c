"""Prefix caching: exact block ids, reference counts, eviction order and counters, without torch."""

from __future__ import annotations

from hotloop.config import SchedulerConfig
from hotloop.engine.block_manager import BlockManager
from hotloop.engine.prefix_cache import ROOT_HASH, chain_hashes, hash_block
from hotloop.engine.request import Request, RequestStatus
from hotloop.engine.scheduler import Scheduler, SchedulerOutput
from hotloop.messages import GenerationConfig


def make(num_blocks: int = 8, block_size: int = 4, budget: int = 64) -> Scheduler:
    # (exact block ids under a tight pool: without the admission reserve, tested in test_scheduler.py)
    cfg = SchedulerConfig(
        max_batch_size=8, max_prefill_token_num=budget, session_len=1024, reserve_sure=0.0, reserve_max=0.0
    )
    return Scheduler(cfg, BlockManager(num_blocks, block_size, enable_prefix_caching=True))


def req(rid: str, tokens: list[int], max_new: int = 16) -> Request:
    return Request(rid, list(tokens), GenerationConfig(max_new_tokens=max_new))


def run_step(s: Scheduler, token: int = 7) -> SchedulerOutput:
    out = s.schedule()
    s.advance(out)
    for x in out.scheduled:
        if x.samples:
            x.request.num_pending_tokens -= 1  # the engine collects the sampled token
            x.request.output_token_ids.append(token)
    return out


def plan(out: SchedulerOutput) -> list[tuple[str, int, int]]:
    return [(x.request.request_id, x.start, x.num_tokens) for x in out.scheduled]


def refs(bm: BlockManager) -> list[int]:
    return [bm.ref_count(i) for i in range(bm.num_blocks)]


P10 = list(range(100, 110))  # 10 tokens: two full blocks of 4 and a partial one


def test_hash_chain_depends_on_parent_tokens_and_extra_keys() -> None:
    a = hash_block(ROOT_HASH, [1, 2, 3, 4])
    assert a == hash_block(ROOT_HASH, [1, 2, 3, 4])
    assert a != hash_block(ROOT_HASH, [1, 2, 3, 5])
    assert a != hash_block(ROOT_HASH, [1, 2, 3, 4], ("adapter-x",))
    assert hash_block(a, [5, 6, 7, 8]) != hash_block(ROOT_HASH, [5, 6, 7, 8])
    known: list[int] = []
    assert chain_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, known) == [a, hash_block(a, [5, 6, 7, 8])]
    assert len(chain_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 4, known)) == 3


def test_hit_shares_full_blocks_and_skips_their_prefill() -> None:
    s = make()
    bm = s.block_manager
    a = req("a", P10)
    s.add(a)
    assert plan(run_step(s)) == [("a", 0, 10)]
    assert a.block_ids == [0, 1, 2] and a.num_cached_tokens == 0
    assert (bm.prefix_queries, bm.prefix_hits) == (10, 0)
    # b shares a's two full blocks; its partial third block is private, so only 2 tokens prefill
    b = req("b", P10)
    s.add(b)
    out = run_step(s)
    assert plan(out) == [("a", 10, 1), ("b", 8, 2)]
    assert b.block_ids == [0, 1, 3] and b.num_cached_tokens == 8
    assert refs(bm)[:4] == [2, 2, 1, 1]
    assert (bm.prefix_queries, bm.prefix_hits) == (20, 8)
    assert bm.prefix_hit_rate == 0.4
    s.finish(a, RequestStatus.FINISHED_STOPPED)
    s.finish(b, RequestStatus.FINISHED_STOPPED)
    assert bm.num_free_blocks == 8
    bm.check_consistency()


def test_fully_cached_prompt_still_computes_its_last_token() -> None:
    s = make()
    bm = s.block_manager
    p8 = P10[:8]
    a = req("a", p8)
    s.add(a)
    run_step(s)
    s.finish(a, RequestStatus.FINISHED_STOPPED)
    # both blocks of a are cached and evictable; b (same 8 tokens) may take only the first:
    # its last token must run to give logits, and that token's block must be private
    b = req("b", p8)
    s.add(b)
    out = run_step(s)
    assert plan(out) == [("b", 4, 4)] and out.scheduled[0].samples
    assert b.block_ids[0] == 0 and b.block_ids[1] != 1 and b.num_cached_tokens == 4
    assert bm.prefix_cache is not None and bm.prefix_cache.is_evictable(1)
    s.finish(b, RequestStatus.FINISHED_STOPPED)
    bm.check_consistency()


def test_lru_eviction_order_and_reuse_of_free_cached_blocks() -> None:
    s = make(num_blocks=6)
    bm = s.block_manager
    pc = bm.prefix_cache
    assert pc is not None
    a, b = req("a", [1] * 8 + [2]), req("b", [3] * 8 + [4])
    s.add(a)
    s.add(b)
    run_step(s)
    assert a.block_ids == [0, 1, 2] and b.block_ids == [3, 4, 5]
    s.finish(a, RequestStatus.FINISHED_STOPPED)  # 0, 1 evictable (tail first), 2 uncached -> free
    s.finish(b, RequestStatus.FINISHED_STOPPED)
    assert pc.evictable_order() == [1, 0, 4, 3]
    assert bm.num_free_blocks == 6 and refs(bm) == [0] * 6
    # a new unrelated prompt takes the uncached free blocks first, then evicts LRU: 1, then 0
    c = req("c", [9] * 13)
    s.add(c)
    run_step(s)
    assert c.block_ids == [2, 5, 1, 0]
    assert pc.evictable_order() == [4, 3]
    # b's prefix is still cached: a hit takes block 3 back out of the evictable set
    s.finish(c, RequestStatus.FINISHED_STOPPED)
    # c's three full blocks 2, 5, 1 are cached (tail first); its partial block 0 is plain free
    assert pc.evictable_order() == [4, 3, 1, 5, 2]
    b2 = req("b2", [3] * 8 + [4])
    s.add(b2)
    out = run_step(s)
    assert plan(out) == [("b2", 8, 1)]
    assert b2.block_ids[:2] == [3, 4] and refs(bm)[3] == 1 and refs(bm)[4] == 1
    assert 3 not in pc.evictable_order() and 4 not in pc.evictable_order()
    s.finish(b2, RequestStatus.FINISHED_STOPPED)
    assert bm.num_free_blocks == 6
    bm.check_consistency()


def test_decode_registers_blocks_that_fill_up() -> None:
    s = make()
    bm = s.block_manager
    pc = bm.prefix_cache
    assert pc is not None
    a = req("a", [5] * 6)
    s.add(a)
    run_step(s)  # 6 computed: block 0 full
    assert pc.is_cached(0) and not pc.is_cached(1)
    run_step(s)  # 7 computed
    run_step(s)  # 8 computed: block 1 full (its last token is a generated one)
    assert pc.is_cached(1)
    # a second request whose prompt is a's prompt plus its outputs hits both blocks
    b = req("b", [5] * 6 + [7, 7, 7])
    s.add(b)
    out = run_step(s)
    assert ("b", 8, 1) in plan(out) and b.block_ids[:2] == [0, 1]
    s.finish(a, RequestStatus.FINISHED_STOPPED)
    s.finish(b, RequestStatus.FINISHED_STOPPED)
    bm.check_consistency()


def test_same_prompt_admitted_together_keeps_one_copy_cached() -> None:
    s = make()
    bm = s.block_manager
    a, b = req("a", P10), req("b", P10)
    s.add(a)
    s.add(b)
    run_step(s)  # both miss (nothing was computed when they were admitted)
    assert a.block_ids == [0, 1, 2] and b.block_ids == [3, 4, 5]
    pc = bm.prefix_cache
    assert pc is not None and pc.is_cached(0) and not pc.is_cached(3)
    s.finish(b, RequestStatus.FINISHED_STOPPED)
    assert pc.evictable_order() == [] and bm.num_free_blocks == 5
    s.finish(a, RequestStatus.FINISHED_STOPPED)
    bm.check_consistency()


def test_preempted_request_recomputes_from_its_cached_blocks() -> None:
    s = make(num_blocks=5)
    bm = s.block_manager
    a, b = req("a", [1] * 7), req("b", [2] * 7)
    s.add(a)
    s.add(b)
    run_step(s)  # a: [0, 1], b: [2, 3], 7 computed each + 1 sampled
    run_step(s)  # 8 computed each: both second blocks full and cached
    assert a.block_ids == [0, 1] and b.block_ids == [2, 3]
    out = run_step(s)  # a takes the last free block 4; b needs one more and there is none
    assert [r.request_id for r in out.preempted] == ["b"]
    assert a.block_ids == [0, 1, 4]
    pc = bm.prefix_cache
    assert pc is not None and pc.evictable_order() == [3, 2]
    s.finish(a, RequestStatus.FINISHED_LENGTH)
    out = run_step(s)
    # b had 9 known tokens: its two cached blocks come back, only the 9th token is recomputed
    assert plan(out) == [("b", 8, 1)] and b.block_ids[:2] == [2, 3]
    assert b.num_cached_tokens == 0  # usage reports the first admission, which had no hit
    # and so do the counters /metrics exports: two 7-token prompts queried, no hit; the re-admission
    # (its own output recomputed from its own freed blocks) is not a prompt served from the cache
    assert (bm.prefix_queries, bm.prefix_hits) == (14, 0)
    s.finish(b, RequestStatus.FINISHED_LENGTH)
    assert bm.num_free_blocks == 5
    bm.check_consistency()


def test_abort_mid_chunked_prefill_caches_only_computed_full_blocks() -> None:
    s = make(budget=5)
    bm = s.block_manager
    pc = bm.prefix_cache
    assert pc is not None
    a = req("a", list(range(1, 13)))
    s.add(a)
    run_step(s)  # 5 of 12 computed: block 0 full, block 1 partial
    assert a.block_ids == [0, 1] and pc.is_cached(0) and not pc.is_cached(1)
    s.finish(a, RequestStatus.FINISHED_ABORTED)
    assert pc.evictable_order() == [0] and bm.num_free_blocks == 8
    b = req("b", list(range(1, 13)))
    s.add(b)
    assert plan(run_step(s)) == [("b", 4, 5)] and b.block_ids[0] == 0
    s.finish(b, RequestStatus.FINISHED_ABORTED)
    bm.check_consistency()


def test_admission_counts_reclaimed_blocks_against_the_free_pool() -> None:
    s = make(num_blocks=3)
    bm = s.block_manager
    a = req("a", [1] * 9)
    s.add(a)
    run_step(s)
    s.finish(a, RequestStatus.FINISHED_STOPPED)  # blocks 0, 1 cached and evictable; 2 free
    # b hits 0 and 1 and needs one more block: exactly the pool
    b = req("b", [1] * 8 + [3, 3, 3])
    s.add(b)
    assert plan(run_step(s)) == [("b", 8, 3)] and b.block_ids == [0, 1, 2]
    assert bm.num_free_blocks == 0
    s.finish(b, RequestStatus.FINISHED_STOPPED)
    bm.check_consistency()


def test_disabled_cache_never_hits() -> None:
    cfg = SchedulerConfig(
        max_batch_size=8, max_prefill_token_num=64, session_len=1024, reserve_sure=0.0, reserve_max=0.0
    )
    s = Scheduler(cfg, BlockManager(8, 4))
    for rid in ("a", "b"):
        s.add(req(rid, P10))
        run_step(s)
    assert s.running[1].block_ids == [3, 4, 5] and s.running[1].num_cached_tokens == 0
    assert s.block_manager.prefix_queries == 0
