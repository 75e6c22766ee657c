"""BlockManager: exact block ids, reference counts and a full pool after every test."""

from __future__ import annotations

import pytest

from hotloop.engine.block_manager import BlockManager
from hotloop.engine.request import Request
from hotloop.messages import GenerationConfig


def make_request(rid: str, n_prompt: int) -> Request:
    return Request(rid, list(range(n_prompt)), GenerationConfig(max_new_tokens=8))


def test_allocate_exact_ids_and_free_order() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = make_request("a", 9), make_request("b", 4)
    assert bm.num_new_blocks(a, 9) == 3
    assert bm.allocate(a, 9) == [0, 1, 2]
    assert bm.allocate(b, 4) == [3]
    assert bm.num_free_blocks == 4
    assert [bm.ref_count(i) for i in range(8)] == [1, 1, 1, 1, 0, 0, 0, 0]
    # a grows by one computed token at a time: a new block only at the boundary
    a.num_computed_tokens = 9
    assert bm.num_new_blocks(a, 3) == 0
    assert bm.num_new_blocks(a, 4) == 1
    assert bm.allocate(a, 4) == [4]
    bm.free(a)
    assert a.block_ids == []
    assert bm.num_free_blocks == 7
    # freed blocks go to the back of the queue, in the request's order
    c = make_request("c", 16)
    assert bm.allocate(c, 16) == [5, 6, 7, 0]
    bm.free(b)
    bm.free(c)
    assert bm.num_free_blocks == 8
    bm.check_consistency()


def test_cannot_over_allocate() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    r = make_request("r", 12)
    assert not bm.can_allocate(r, 12)
    with pytest.raises(RuntimeError, match="need 3 blocks, 2 free"):
        bm.allocate(r, 12)
    assert bm.num_free_blocks == 2 and r.block_ids == []


def test_double_free_is_caught() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    r = make_request("r", 4)
    bm.allocate(r, 4)
    ids = list(r.block_ids)
    bm.free(r)
    r.block_ids = ids
    with pytest.raises(RuntimeError, match="freed more often"):
        bm.free(r)


def test_usage() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    r = make_request("r", 3)
    bm.allocate(r, 3)
    assert bm.usage == pytest.approx(0.5)
    bm.free(r)
    assert bm.usage == 0.0
