"""What holds the tensor-core one-row W4A16 GEMV (``kernels/w4a16_gemv_tc.py``) above a plain read.

For each Llama-3-8B projection at M = 1 (bf16, GPU time with a cold L2, ``w4a16_gemm.graph_time_us``):
every variant; beside it the plain stream of the same ``qweight`` bytes (``benchmarks/cuda/read_probe.cu``) and the CUDA-core GEMV's best launch
(``kernels/w4a16_cuda.py``, early loads on). Every launch is checked against float32
dequantize-then-matmul first. Last, the four projections of 8 layers in one CUDA graph with each
kernel's best launch (as ``w4a16_read_probe.py``'s decode chain).

    python benchmarks/w4a16_tc_sweep.py OUT.json
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import torch
from awq_gemm import GROUP, SHAPES, graph_replay_us  # (benchmarks/ is on the path when this script runs)

from hotloop.kernels import cuda_jit, reference, w4a16_cuda, w4a16_gemv_tc
from hotloop.kernels.w4a16_gemm import graph_time_us
from hotloop.kernels.w4a16_layout import pack_int4


def _awq(k: int, n: int, dev: torch.device, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device=dev).manual_seed(seed)
    qw = pack_int4(torch.randint(0, 16, (k, n), device=dev, generator=gen, dtype=torch.int32))
    qz = pack_int4(torch.randint(0, 16, (k // GROUP, n), device=dev, generator=gen, dtype=torch.int32))
    sc = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.01 + 1e-3).to(dtype)
    return qw, qz, sc


def main() -> None:
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    probes = cuda_jit.load(
        str(Path(__file__).resolve().parent / "cuda" / "read_probe.cu"), dev, ["read_stream_u4"]
    )
    if probes is None:
        raise SystemExit("the read probes did not build (see the log); nvcc is needed")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    sink = torch.zeros(4, dtype=torch.int32, device=dev)
    rows: list[dict] = []
    best: dict[str, dict] = {}

    def record(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    for name, (k, n) in SHAPES.items():
        qw, qz, sc = _awq(k, n, dev, dtype, 0)
        x = torch.randn(1, k, device=dev).to(dtype)
        wbytes = qw.numel() * 4
        exact = reference.w4a16_matmul(x.float(), qw, qz, sc.float(), GROUP)
        for per_sm in (2, 4):
            us = graph_time_us(
                partial(probes["read_stream_u4"], (sms * per_sm,), 256, (qw, wbytes // 16, sink)), dev
            )
            record({"shape": name, "probe": f"stream_u4_b{per_sm}", "us": round(us, 2)})
        cuda_best = None
        for v in w4a16_cuda.VARIANTS:
            if w4a16_cuda.fits(1, n, k, GROUP, dtype, *v) is not None:
                continue
            us = graph_time_us(partial(w4a16_cuda.gemv, x, qw, qz, sc, GROUP, *v), dev)
            if cuda_best is None or us < cuda_best[1]:
                cuda_best = (v, us)
        assert cuda_best is not None
        record({"shape": name, "probe": "cuda_best", "variant": cuda_best[0], "us": round(cuda_best[1], 2)})
        tc_best = None
        for v in w4a16_gemv_tc.VARIANTS:
            if w4a16_gemv_tc.fits(1, n, k, GROUP, dtype, *v) is not None:
                continue
            call = partial(w4a16_gemv_tc.gemv, x, qw, qz, sc, GROUP, *v)
            got = call().float()
            err = float((got - exact).abs().max() / exact.abs().max())
            if err > 4e-3:
                raise SystemExit(f"{name} {v}: error {err}")
            us = graph_time_us(call, dev)
            record(
                {
                    "shape": name,
                    "probe": "tc",
                    "variant": v,
                    "us": round(us, 2),
                    "tb_s": round(wbytes / us / 1e6, 3),
                }
            )
            if tc_best is None or us < tc_best[1]:
                tc_best = (v, us)
        assert tc_best is not None
        best[name] = {"cuda": cuda_best[0], "tc": tc_best[0]}
        record({"shape": name, "probe": "tc_best", "variant": tc_best[0], "us": round(tc_best[1], 2)})

    layers = [{name: _awq(k, n, dev, dtype, 100 + i) for name, (k, n) in SHAPES.items()} for i in range(8)]
    xs = {name: torch.randn(1, k, device=dev).to(dtype) for name, (k, n) in SHAPES.items()}
    outs = {name: torch.empty(1, n, device=dev, dtype=dtype) for name, (k, n) in SHAPES.items()}

    def chain_cuda() -> None:
        for layer in layers:
            for name, (qw, qz, sc) in layer.items():
                w4a16_cuda.gemv(xs[name], qw, qz, sc, GROUP, *best[name]["cuda"], out=outs[name])

    def chain_tc() -> None:
        for layer in layers:
            for name, (qw, qz, sc) in layer.items():
                w4a16_gemv_tc.gemv(xs[name], qw, qz, sc, GROUP, *best[name]["tc"], out=outs[name])

    for label, fn in (("cuda", chain_cuda), ("tc", chain_tc), ("cuda", chain_cuda), ("tc", chain_tc)):
        record({"chain": label, "us_per_layer": round(min(graph_replay_us(fn)) / len(layers), 2)})
    with open(sys.argv[1], "w") as f:
        json.dump({"device": torch.cuda.get_device_name(dev), "rows": rows, "best": best}, f, indent=1)


if __name__ == "__main__":
    main()
