"""The L2 prefetch (``kernels/l2_prefetch.py``): it changes no data, takes one to three tensors
within a byte budget, and refuses what it cannot prefetch. Its PTX assembling for sm_90 is checked
with the other kernels in ``test_aot_compile.py``."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import HAS_CUDA, HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")


def test_l2_prefetch_refuses_cpu_and_strided_tensors_and_too_many() -> None:
    from hotloop.kernels.l2_prefetch import l2_prefetch

    with pytest.raises(ValueError, match="CUDA"):
        l2_prefetch([torch.zeros(4)])
    with pytest.raises(ValueError, match="one to three"):
        l2_prefetch([])
    if HAS_CUDA:
        with pytest.raises(ValueError, match="contiguous"):
            l2_prefetch([torch.zeros(8, 8, device="cuda").t()])


def test_ops_l2_prefetch_is_a_no_op_off_the_gpu() -> None:
    from hotloop.kernels import ops

    ops.l2_prefetch([torch.zeros(4)])  # CPU tensors: nothing to prefetch, no error


@pytest.mark.gpu
def test_l2_prefetch_leaves_data_unchanged_gpu() -> None:
    from hotloop.kernels import l2_prefetch as lp

    gen = torch.Generator(device="cuda").manual_seed(0)
    # sizes around the line and program boundaries, three dtypes; one tensor beyond the byte budget
    ts = [
        torch.randn(4096, 4096, device="cuda", generator=gen, dtype=torch.bfloat16),
        torch.randn(333, device="cuda", generator=gen),
        torch.randint(
            0, 255, (lp.LINE * lp.LINES_PER_PROGRAM + 1,), device="cuda", generator=gen, dtype=torch.uint8
        ),
    ]
    copies = [t.clone() for t in ts]
    lp.l2_prefetch(ts)
    lp.l2_prefetch(ts[1:], max_bytes=1000)
    lp.l2_prefetch(ts[:1], max_bytes=0)  # nothing to do: no launch
    # inside a CUDA graph, as the one-row decode step runs it
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lp.l2_prefetch(ts)
    graph.replay()
    torch.cuda.synchronize()
    for t, c in zip(ts, copies, strict=True):
        assert torch.equal(t, c)
