"""The GPU runner's persistent input buffers (run on the CPU): block-table rows are rewritten when a
request's blocks change, even when only the tail would differ by count."""

from __future__ import annotations

import pytest
import torch

from hotloop.engine.block_manager import BlockManager
from hotloop.engine.request import Request
from hotloop.engine.scheduler import ScheduledRequest, SchedulerOutput
from hotloop.executor.gpu_inputs import InputBuffers
from hotloop.messages import GenerationConfig


def _decode_step(bufs: InputBuffers, req: Request) -> list[int]:
    req.num_computed_tokens = req.num_tokens - 1
    out = SchedulerOutput([ScheduledRequest.of(req, 1)])
    step = bufs.prepare(out)
    return step.meta.block_tables[0, : len(req.block_ids)].tolist()


def test_preempted_request_gets_its_new_block_table() -> None:
    bs = 4
    bm = BlockManager(32, bs)
    bufs = InputBuffers(64, 4, 8, bs, torch.device("cpu"))
    req = Request("a", list(range(10)), GenerationConfig(max_new_tokens=8))
    filler = Request("f", list(range(12)), GenerationConfig(max_new_tokens=8))
    bm.allocate(req, 10)  # blocks 0, 1, 2
    for _ in range(2):  # both pinned host sets have seen the row
        assert _decode_step(bufs, req) == [0, 1, 2]
    bm.free(req)  # preempted: its blocks go back to the pool, it will be recomputed
    req.num_computed_tokens = 0
    bm.allocate(filler, 12)  # someone else takes 3, 4, 5
    req.output_token_ids += [1, 2, 3]  # recomputed with three more tokens: four blocks now
    bm.allocate(req, req.num_tokens)
    assert req.block_ids == [6, 7, 8, 9]
    assert _decode_step(bufs, req) == [6, 7, 8, 9]
    assert _decode_step(bufs, req) == [6, 7, 8, 9]


def test_a_new_request_in_the_same_row_is_written_whole() -> None:
    bs = 4
    bm = BlockManager(32, bs)
    bufs = InputBuffers(64, 4, 8, bs, torch.device("cpu"))
    for k in range(4):  # fresh objects (id() may be reused): each must see its own blocks
        req = Request(f"r{k}", list(range(9 + k)), GenerationConfig(max_new_tokens=4))
        bm.allocate(req, req.num_tokens)
        assert _decode_step(bufs, req) == req.block_ids
        bm.free(req)
        req.num_computed_tokens = 0


def _snapshot(bufs: InputBuffers, step: object) -> dict[str, object]:
    """Everything ``prepare`` hands on: the device buffers the step reads and the host-side fields."""
    s = step  # StepInputs
    meta = s.meta  # type: ignore[attr-defined]
    ntok = s.input_ids.shape[0]  # type: ignore[attr-defined]
    return {
        "input_ids": s.input_ids.tolist(),  # type: ignore[attr-defined]
        "positions": s.positions.tolist(),  # type: ignore[attr-defined]
        "slots": meta.slot_mapping.tolist(),
        "block_tables": meta.block_tables.tolist(),
        "seq_lens_t": meta.seq_lens_t.tolist(),
        "query_start_t": meta.query_start_t.tolist(),
        "query_lens": meta.query_lens,
        "seq_lens": meta.seq_lens,
        "max_query_len": meta.max_query_len,
        "decode_only": meta.decode_only,
        "num_decodes": meta.num_decodes,
        "prefill_qs": meta.prefill_query_start_t is None,
        "rows": s.logits_rows,  # type: ignore[attr-defined]
        "num_seqs": s.num_seqs,  # type: ignore[attr-defined]
        "pending_dense": s.pending_dense,  # type: ignore[attr-defined]
        "pending_n": None if s.pending_dst is None else s.pending_dst.shape[0],  # type: ignore[attr-defined]
        "pending_reqs": None if s.pending_reqs is None else [id(r) for r in s.pending_reqs],  # type: ignore[attr-defined]
        "ntok": ntok,
    }


def _count_steady(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the ``prepare`` calls that took the steady-decode path."""
    taken = {"steady": 0}
    real = InputBuffers._steady_decode

    def counting(self: InputBuffers, *a: object) -> object:
        got = real(self, *a)  # type: ignore[arg-type]
        taken["steady"] += got is not None
        return got

    monkeypatch.setattr(InputBuffers, "_steady_decode", counting)
    return taken


def test_steady_decode_path_equals_the_general_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlapped decoding of a batch for many steps, prepared twice, with the steady-decode path
    and without (``STEADY_DECODE``): the same device inputs and host fields every step, through
    block crossings (block size 4), a position offset, graph padding, a request that leaves the batch,
    one whose pending token is collected early, and a preemption (new block epoch)."""
    import random

    from hotloop.executor import gpu_inputs

    bs = 4
    rng = random.Random(0)
    bm = BlockManager(400, bs)
    reqs = [Request(f"r{i}", [rng.randrange(5, 99) for _ in range(3 + 2 * i)], GenerationConfig(max_new_tokens=99))
            for i in range(6)]  # fmt: skip
    reqs[2].position_delta = 7  # (multimodal rope offsets shift every later position)
    for r in reqs:
        bm.allocate(r, r.num_tokens + 1)
        r.num_computed_tokens = r.num_tokens  # prefilled; its first sampled token is pending
        r.num_pending_tokens = 1
    fast = InputBuffers(64, 8, 32, bs, torch.device("cpu"))
    slow = InputBuffers(64, 8, 32, bs, torch.device("cpu"))
    batch = list(reqs)
    taken = _count_steady(monkeypatch)
    for step in range(40):
        if step == 15:
            batch.remove(reqs[4])  # finished: the batch changes
        if step == 22:  # the engine collected r1's pending token early (no pending token this step)
            reqs[1].output_token_ids.append(rng.randrange(5, 99))
            reqs[1].num_pending_tokens = 0
        if step == 23:
            reqs[1].num_pending_tokens = 1
        if step == 30:  # preempted and re-admitted: a new block list (epoch) for r3
            bm.free(reqs[3])
            bm.allocate(reqs[3], reqs[3].num_computed_tokens + 1)
        for r in batch:
            bm.allocate(r, 1)  # room for this step's token
        out = SchedulerOutput([ScheduledRequest.of(r, 1) for r in batch])
        pad = 8 if step % 3 == 0 else None
        monkeypatch.setattr(gpu_inputs, "STEADY_DECODE", True)
        a = _snapshot(fast, fast.prepare(out, pad))
        monkeypatch.setattr(gpu_inputs, "STEADY_DECODE", False)
        b = _snapshot(slow, slow.prepare(out, pad))
        assert a == b, f"step {step}: {[(k, a[k], b[k]) for k in a if a[k] != b[k]]}"
        for r in batch:  # the step ran; the older pending token is collected, this one's is pending
            r.num_computed_tokens += 1
            if r.num_pending_tokens:
                r.output_token_ids.append(rng.randrange(5, 99))
            else:
                r.num_pending_tokens = 1
    assert taken["steady"] > 20  # the steady path did most steps


def test_multi_step_rounds_prepare_the_last_pending_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between multi-step launches every row holds ``k`` pending tokens (a round of ``k`` steps in
    flight); the next launch's input is the last of them, at ``prompt + output + k - 1``. Both paths
    (steady and the general loop) mark every row as patched from the device and compute its slot and
    length there, and agree with each other, across rounds of 4 and 3 and a request that leaves."""
    import random

    from hotloop.executor import gpu_inputs

    bs = 4
    rng = random.Random(1)
    bm = BlockManager(400, bs)
    reqs = [Request(f"r{i}", [rng.randrange(5, 99) for _ in range(2 + 3 * i)], GenerationConfig(max_new_tokens=99))
            for i in range(5)]  # fmt: skip
    for r in reqs:
        bm.allocate(r, r.num_tokens + 1)
        r.num_computed_tokens = r.num_tokens
        r.num_pending_tokens = 1  # the prefill's sampled token
    fast = InputBuffers(64, 8, 40, bs, torch.device("cpu"))
    slow = InputBuffers(64, 8, 40, bs, torch.device("cpu"))
    batch = list(reqs)
    taken = _count_steady(monkeypatch)
    for launch in range(12):
        k = 4 if launch % 3 else 3
        if launch == 7:
            batch.remove(reqs[2])
        for r in batch:
            bm.allocate(r, k)  # the round's blocks
        out = SchedulerOutput([ScheduledRequest.of(r, 1) for r in batch])
        monkeypatch.setattr(gpu_inputs, "STEADY_DECODE", True)
        step = fast.prepare(out, 8)
        a = _snapshot(fast, step)
        monkeypatch.setattr(gpu_inputs, "STEADY_DECODE", False)
        b = _snapshot(slow, slow.prepare(out, 8))
        assert a == b, f"launch {launch}: {[(key, a[key], b[key]) for key in a if a[key] != b[key]]}"
        assert step.pending_reqs == batch and step.pending_dense
        for i, r in enumerate(batch):
            p = r.num_tokens + r.num_pending_tokens - 1  # the last pending token
            assert a["slots"][i] == r.block_ids[p // bs] * bs + p % bs  # type: ignore[index]
            assert a["seq_lens"][i] == p + 1  # type: ignore[index]
        for r in batch:  # the round ran k steps; the engine collects the previous round's tokens
            r.num_computed_tokens += k
            r.output_token_ids += [rng.randrange(5, 99) for _ in range(r.num_pending_tokens)]
            r.num_pending_tokens = k
    assert taken["steady"] >= 6


def test_only_graph_metadata_asks_for_the_graph_decode_plan() -> None:
    """A decode graph's metadata is marked ``graph`` (its decode attention takes ``decode_plan``'s
    split count and fused merge, compiled at capture); an eager decode step's is not (it keeps the
    launches the warm-up compiled)."""
    bs = 4
    bm = BlockManager(32, bs)
    bufs = InputBuffers(64, 4, 8, bs, torch.device("cpu"))
    req = Request("a", list(range(10)), GenerationConfig(max_new_tokens=8))
    bm.allocate(req, 10)
    req.num_computed_tokens = req.num_tokens - 1
    step = bufs.prepare(SchedulerOutput([ScheduledRequest.of(req, 1)]))
    assert step.meta.decode_only and not step.meta.graph
    meta = bufs.graph_meta(4)
    assert meta.decode_only and meta.graph
