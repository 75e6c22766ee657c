"""One launch of each W4A16 one-row kernel on the gate/up shape (4096 x 28672), for Nsight Compute.

    ncu --clock-control none --launch-skip 6 -k regex:'w4a16|read_' --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats --section SchedulerStats python3 benchmarks/ncu_w4a16.py

Runs: the CUDA-core GEMV (4, 32) and (4, 16), the tensor-core GEMV on the AutoAWQ layout
(``w4a16_gemv_tc``: (4, 16, 8) and (2, 32, 4)), and the read-only probes of
``benchmarks/cuda/read_probe.cu`` (a plain stream and the GEMV's pattern): six launches, in two
rounds. The first round builds and warms up; ``--launch-skip 6`` profiles the second only (as
``bash benchmarks/gpu_check.sh OUT ncu`` does). (The sixteenth session's tensor-core GEMV on a
repacked layout, ``w4a16_mma``, was profiled here too until it was removed in the thirty-third.)
"""

from __future__ import annotations

from pathlib import Path

import torch

from hotloop.kernels import cuda_jit, w4a16_cuda, w4a16_gemv_tc
from hotloop.kernels.w4a16_layout import pack_int4

K, N, G = 4096, 28672, 128


def main() -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    qw = pack_int4(torch.randint(0, 16, (K, N), device=dev, generator=gen, dtype=torch.int32))
    qz = pack_int4(torch.randint(0, 16, (K // G, N), device=dev, generator=gen, dtype=torch.int32))
    sc = (torch.rand(K // G, N, device=dev, generator=gen) * 0.01 + 1e-3).to(torch.bfloat16)
    x = torch.randn(1, K, device=dev, generator=gen).to(torch.bfloat16)
    probes = cuda_jit.load(
        str(Path(__file__).resolve().parent / "cuda" / "read_probe.cu"),
        dev,
        ["read_stream_u8", "read_gemv_nl4_r32"],
    )
    assert probes is not None
    sink = torch.zeros(4, dtype=torch.int32, device=dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for _ in range(2):  # the first round builds and warms; ncu profiles both (filter with --launch-skip)
        w4a16_cuda.gemv(x, qw, qz, sc, G, 4, 32)
        w4a16_cuda.gemv(x, qw, qz, sc, G, 4, 16)
        w4a16_gemv_tc.gemv(x, qw, qz, sc, G, 4, 16, 8)
        w4a16_gemv_tc.gemv(x, qw, qz, sc, G, 2, 32, 4)
        probes["read_stream_u8"]((sms * 4,), 256, (qw, qw.numel() // 4, sink))
        probes["read_gemv_nl4_r32"]((N // 128, K // 2048), 256, (qw, sink, N, K))
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
