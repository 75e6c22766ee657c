"""Embedding lookup kernel (``kernels/embedding_gather.py``) against ``reference.embedding``: the same
rows, bit for bit, from a device table and from a pinned host table (GPU), and under the
interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import HAS_CUDA, HAS_TRITON, interpret

from hotloop.kernels import reference

CASES = [(1, 96, torch.float32), (7, 100, torch.float16), (33, 3000, torch.float32)]  # hidden: odd, > 1 tile


def _case(t: int, hidden: int, dtype: torch.dtype, device: str, pinned: bool, id_dtype: torch.dtype) -> None:
    from hotloop.kernels.embedding_gather import embedding_gather

    g = torch.Generator().manual_seed(t * 1000 + hidden)
    vocab = 517
    table = torch.randn(vocab, hidden, generator=g).to(dtype)
    table = table.pin_memory() if pinned else table.to(device)
    ids = torch.randint(0, vocab, (t,), generator=g).to(id_dtype)
    ids[0] = vocab - 1  # the last row
    ids = ids.to(device)
    out = embedding_gather(ids, table)
    assert out.device == ids.device and out.dtype == dtype
    assert torch.equal(out.cpu(), reference.embedding(ids.cpu(), table.cpu()))


@interpret
@pytest.mark.parametrize("t,hidden,dtype", CASES)
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_gather_interpreted(t: int, hidden: int, dtype: torch.dtype, id_dtype: torch.dtype) -> None:
    _case(t, hidden, dtype, "cpu", False, id_dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("t,hidden,dtype", [*CASES, (256, 4096, torch.bfloat16)])
@pytest.mark.parametrize("pinned", [True, False])
def test_gather_gpu(t: int, hidden: int, dtype: torch.dtype, pinned: bool) -> None:
    _case(t, hidden, dtype, "cuda", pinned, torch.int64)


def test_gather_checks_its_inputs() -> None:
    if not HAS_TRITON:
        pytest.skip("needs triton")
    from hotloop.kernels.embedding_gather import embedding_gather

    table = torch.zeros(10, 4)
    with pytest.raises(ValueError, match="ids must be"):
        embedding_gather(torch.zeros(2, 2, dtype=torch.int64), table)
    with pytest.raises(ValueError, match="int32 or int64"):
        embedding_gather(torch.zeros(2), table)
    # ids need not be contiguous
    if not HAS_CUDA:
        table = torch.randn(10, 4)
        ids = torch.tensor([3, 7, 1, 9, 0, 5])[::2]
        assert torch.equal(embedding_gather(ids, table), table[ids])
    with pytest.raises(ValueError, match="dense rows"):
        embedding_gather(torch.zeros(2, dtype=torch.int64), torch.zeros(4, 10).t())


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gather_rejects_a_pageable_host_table() -> None:
    from hotloop.kernels.embedding_gather import embedding_gather

    with pytest.raises(ValueError, match="pinned"):
        embedding_gather(torch.zeros(2, dtype=torch.int64, device="cuda"), torch.zeros(10, 4))
