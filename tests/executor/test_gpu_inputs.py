"""The GPU runner's persistent input buffers (run on the CPU): block-table rows are rewritten when a
request's blocks change, even when only the tail would differ by count."""

from __future__ import annotations

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
