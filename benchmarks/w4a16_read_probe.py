"""How far the W4A16 one-row GEMVs are from reading their weights.

For each Llama-3-8B projection at M = 1 (GPU time, cold L2: ``w4a16_gemm.graph_time_us``):

- ``stream``: the ``qweight`` bytes read as one plain stream (``benchmarks/cuda/read_probe.cu``,
  a grid-stride loop of 16-byte loads; 2, 4 or 8 blocks per SM, 4 or 8 loads in flight per thread);
- ``gemv_pattern``: the same bytes in exactly the GEMV's access pattern (AutoAWQ layout, 4 lanes of
  16-byte loads by 64 slots of R rows, K split across blocks), with no arithmetic;
- every variant of the CUDA-core GEMV the engine uses (``kernels/w4a16_cuda.py``), each also with
  its early weight loads (``HOTLOOP_W4A16_EARLY=1``);
- every variant of the tensor-core GEMV on the AutoAWQ layout (``kernels/w4a16_gemv_tc.py``), with its
  error against float32 dequantize-then-matmul.

The differences say what a faster kernel could win: GEMV minus pattern is arithmetic and reduction
not hidden behind the loads; pattern minus stream is the access pattern and the grid. Last, the
four projections of 8 layers in one CUDA graph (``decode_chain``), with each GEMV's fastest launch
(the CUDA-core chain with and without the early loads).

    python benchmarks/w4a16_read_probe.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import torch
from awq_gemm import GROUP, SHAPES, graph_replay_us  # (benchmarks/ is on the path when this script runs)

from hotloop.kernels import cuda_jit, reference, w4a16_cuda, w4a16_gemv_tc
from hotloop.kernels.w4a16_gemm import graph_time_us
from hotloop.kernels.w4a16_layout import pack_int4

PROBES = ["read_stream_u4", "read_stream_u8", "read_gemv_nl4_r16", "read_gemv_nl4_r32"]


def decode_chain(
    dev: torch.device, dtype: torch.dtype, rows: list[dict], kernels: dict, sms: int, sink: torch.Tensor
) -> list[dict]:
    """The four projections of 8 distinct layers in one CUDA graph (no flush between them, as in a
    decode step), each shape with its fastest CUDA-core launch, then with its fastest MMA launch;
    per layer, the best of 5 replays. Last, the same chain of plain reads of each ``qweight``
    (``chain: stream``, each shape's fastest stream probe): what a GEMV chain that did no arithmetic
    would take per layer, the ceiling for issue 5's batch-1 row (32 layers of it, plus the LM head and
    the small launches, is the least a W4A16 step can take with these launches)."""
    layers = []
    for i in range(8):
        layer = {}
        for name, (k, n) in SHAPES.items():
            gen = torch.Generator(device=dev).manual_seed(100 + i)
            qw = pack_int4(torch.randint(0, 16, (k, n), device=dev, generator=gen, dtype=torch.int32))
            qz = pack_int4(
                torch.randint(0, 16, (k // GROUP, n), device=dev, generator=gen, dtype=torch.int32)
            )
            sc = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.01 + 1e-3).to(dtype)
            layer[name] = (qw, qz, sc)
        layers.append(layer)
    xs = {name: torch.randn(1, k, device=dev).to(dtype) for name, (k, n) in SHAPES.items()}
    outs = {name: torch.empty(1, n, device=dev, dtype=dtype) for name, (k, n) in SHAPES.items()}
    result = []
    for kind in ("gemv_nl", "tc"):
        choice = {}
        for name in SHAPES:
            cands = [
                r
                for r in rows
                if r.get("shape") == name
                and r["probe"].startswith(kind)
                and not r["probe"].endswith("_early")
            ]
            choice[name] = min(cands, key=lambda r: r["us"])["probe"]

        def run(choice: dict = choice) -> None:
            for layer in layers:
                for name, (qw, qz, sc) in layer.items():
                    probe = choice[name]
                    if probe.startswith("tc"):
                        w4a16_gemv_tc.gemv(xs[name], qw, qz, sc, GROUP, *_tc_variant(probe), out=outs[name])
                    else:
                        nl, r, t = _variant(probe)
                        w4a16_cuda.gemv(xs[name], qw, qz, sc, GROUP, nl, r, t, out=outs[name])

        for early in ("0", "1") if kind == "gemv_nl" else ("0",):
            os.environ[w4a16_cuda.EARLY_ENV] = early  # read at each launch, kept by the graph
            best = min(graph_replay_us(run)) / len(layers)
            row = {"chain": kind, "early": early == "1", "us_per_layer": round(best, 2), "choice": choice}
            print(json.dumps(row), flush=True)
            result.append(row)
        os.environ.pop(w4a16_cuda.EARLY_ENV, None)
    streams = {}
    for name in SHAPES:
        cands = [r for r in rows if r.get("shape") == name and r["probe"].startswith("stream_")]
        u, b = min(cands, key=lambda r: r["us"])["probe"].removeprefix("stream_u").split("_b")
        streams[name] = (int(u), int(b))

    def read_all() -> None:
        for layer in layers:
            for name, (qw, _qz, _sc) in layer.items():
                u, b = streams[name]
                kernels[f"read_stream_u{u}"]((sms * b,), 256, (qw, qw.numel() * 4 // 16, sink))

    best = min(graph_replay_us(read_all)) / len(layers)
    row = {"chain": "stream", "us_per_layer": round(best, 2), "choice": streams}
    print(json.dumps(row), flush=True)
    result.append(row)
    return result


def _tc_variant(probe: str) -> tuple[int, int, int]:
    """``tc_w4_i16_n8`` -> ``(4, 16, 8)``."""
    w, i, n = probe.removeprefix("tc_").split("_")
    return int(w[1:]), int(i[1:]), int(n[1:])


def _variant(probe: str) -> tuple[int, int, int]:
    """``gemv_nl4_r16_t256`` -> ``(4, 16, 256)``."""
    nl, rest = probe.removeprefix("gemv_nl").split("_r")
    r, t = rest.split("_t")
    return int(nl), int(r), int(t)


def main() -> None:
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    source = Path(__file__).resolve().parent / "cuda" / "read_probe.cu"  # (an absolute path joins as itself)
    kernels = cuda_jit.load(str(source), dev, PROBES)
    if kernels is None:
        raise SystemExit("the read probes did not build (see the log); nvcc is needed")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    sink = torch.zeros(4, dtype=torch.int32, device=dev)
    rows = []

    def record(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    for name, (k, n) in SHAPES.items():
        gen = torch.Generator(device=dev).manual_seed(0)
        qw = pack_int4(torch.randint(0, 16, (k, n), device=dev, generator=gen, dtype=torch.int32))
        qz = pack_int4(torch.randint(0, 16, (k // GROUP, n), device=dev, generator=gen, dtype=torch.int32))
        sc = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.01 + 1e-3).to(dtype)
        x = torch.randn(1, k, device=dev, generator=gen).to(dtype)
        wbytes = qw.numel() * 4
        for u in (4, 8):
            for per_sm in (2, 4, 8):
                call = partial(kernels[f"read_stream_u{u}"], (sms * per_sm,), 256, (qw, wbytes // 16, sink))
                us = graph_time_us(call, dev)
                record(
                    {
                        "shape": name,
                        "probe": f"stream_u{u}_b{per_sm}",
                        "us": round(us, 2),
                        "tb_s": round(wbytes / us / 1e6, 3),
                    }
                )
        for r in (16, 32):
            grid = (n // 128, k // (64 * r))
            us = graph_time_us(partial(kernels[f"read_gemv_nl4_r{r}"], grid, 256, (qw, sink, n, k)), dev)
            record(
                {
                    "shape": name,
                    "probe": f"gemv_pattern_nl4_r{r}",
                    "us": round(us, 2),
                    "tb_s": round(wbytes / us / 1e6, 3),
                }
            )
        for nl, r, t in w4a16_cuda.VARIANTS:
            if w4a16_cuda.fits(1, n, k, GROUP, dtype, nl, r, t) is not None:
                continue
            for early in ("0", "1"):
                os.environ[w4a16_cuda.EARLY_ENV] = early
                us = graph_time_us(partial(w4a16_cuda.gemv, x, qw, qz, sc, GROUP, nl, r, t), dev)
                record(
                    {
                        "shape": name,
                        "probe": f"gemv_nl{nl}_r{r}_t{t}" + ("_early" if early == "1" else ""),
                        "us": round(us, 2),
                        "tb_s": round(wbytes / us / 1e6, 3),
                    }
                )
            os.environ.pop(w4a16_cuda.EARLY_ENV, None)
        exact = reference.w4a16_matmul(x.float(), qw, qz, sc.float(), GROUP)
        for v in w4a16_gemv_tc.VARIANTS:
            if w4a16_gemv_tc.fits(1, n, k, GROUP, dtype, *v) is not None:
                continue
            got = w4a16_gemv_tc.gemv(x, qw, qz, sc, GROUP, *v).float()
            err = float((got - exact).abs().max() / exact.abs().max())
            us = graph_time_us(partial(w4a16_gemv_tc.gemv, x, qw, qz, sc, GROUP, *v), dev)
            record(
                {
                    "shape": name,
                    "probe": "tc_w{}_i{}_n{}".format(*v),
                    "us": round(us, 2),
                    "tb_s": round(wbytes / us / 1e6, 3),
                    "rel_err_vs_fp32": round(err, 6),
                }
            )
    rows += decode_chain(dev, dtype, rows, kernels, sms, sink)
    with open(sys.argv[1], "w") as f:
        json.dump({"device": torch.cuda.get_device_name(dev), "rows": rows}, f, indent=1)
    for name in SHAPES:
        mine = [r for r in rows if r.get("shape") == name]
        best = {
            kind: min((r["us"] for r in mine if r["probe"].startswith(kind)), default=None)
            for kind in ("stream", "gemv_pattern", "gemv_nl", "tc")
        }
        print(name, "best us:", best)


if __name__ == "__main__":
    main()
