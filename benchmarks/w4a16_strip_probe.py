"""Does the weight layout limit the CUDA W4A16 one-row GEMV? AutoAWQ layout against strips.

For each Llama-3-8B projection at M = 1, times every CUDA GEMV variant (``kernels/w4a16_cuda.py``)
on the AutoAWQ ``qweight [K, N/8]`` and on the same words as strips ``[N/8/16, K, 16]``
(``w4a16_layout.to_strips``: a block's 64-byte pieces of consecutive rows are contiguous), with the
threads' rows in the AWQ order or a warp on 8 consecutive rows per load (``_s16w``). Checks every
output against the AWQ-layout kernel (strips: bit-identical; ``_s16w`` sums in another order:
close) and prints GPU time (cold L2, ``w4a16_gemm.graph_time_us``) and the bytes read over it.

With ``--read``, first the read-only probes of ``benchmarks/cuda/read_probe.cu``: each shape's
``qweight`` read as one plain stream, and in the GEMV's exact access pattern with no arithmetic.

    python benchmarks/w4a16_strip_probe.py OUT.json [--read]
"""

from __future__ import annotations

import json
import sys
from functools import partial

import torch

from hotloop.kernels import w4a16_cuda
from hotloop.kernels.w4a16_gemm import graph_time_us
from hotloop.kernels.w4a16_layout import pack_int4, to_strips

SHAPES = {
    "qkv_proj": (4096, 6144),
    "o_proj": (4096, 4096),
    "gate_up_proj": (4096, 28672),
    "down_proj": (14336, 4096),
}
GROUP = 128


def read_probes(dev: torch.device) -> list[dict]:
    from pathlib import Path

    from hotloop.kernels import cuda_jit

    names = ["read_stream_u4", "read_stream_u8", "read_gemv_nl4_r16", "read_gemv_nl4_r32"]
    source = Path(__file__).resolve().parent / "cuda" / "read_probe.cu"  # (an absolute path joins as itself)
    kernels = cuda_jit.load(str(source), dev, names)
    assert kernels is not None, "the read probes did not build"
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = torch.zeros(4, dtype=torch.int32, device=dev)
    rows = []
    for name, (k, n) in SHAPES.items():
        qw = torch.randint(-(2**31), 2**31 - 1, (k, n // 8), dtype=torch.int32, device=dev)
        nbytes = qw.numel() * 4
        launches = {}
        for u in (4, 8):
            for blocks_per_sm in (2, 4, 8):
                launches[f"stream_u{u}_b{blocks_per_sm}"] = partial(
                    kernels[f"read_stream_u{u}"], (sms * blocks_per_sm,), 256, (qw, nbytes // 16, out)
                )
        for r in (16, 32):
            grid = (n // 128, k // (64 * r))
            launches[f"gemv_pattern_nl4_r{r}"] = partial(
                kernels[f"read_gemv_nl4_r{r}"], grid, 256, (qw, out, n, k)
            )
        for label, call in launches.items():
            us = graph_time_us(call, dev)
            row = {"shape": name, "probe": label, "us": round(us, 2), "tb_s": round(nbytes / us / 1e6, 3)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def decode_chain(dev: torch.device, dtype: torch.dtype, rows: list[dict]) -> list[dict]:
    """The four projections of 8 distinct layers in one CUDA graph (no flush: a decode step's
    order), each shape with its fastest classic variant, then with its fastest stream variant."""
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

    def best(name: str, stream: bool) -> dict:
        cands = [
            r
            for r in rows
            if r["shape"] == name
            and r.get("layout", "").startswith("stream") == stream
            and r.get("layout") in ("awq",) + tuple(f"stream_s{s}" for _, s in w4a16_cuda.STREAM_VARIANTS)
        ]
        return min(cands, key=lambda r: r["us"])

    result = []
    for stream in (False, True):
        choice = {name: best(name, stream) for name in SHAPES}

        def run(choice: dict = choice) -> None:
            for layer in layers:
                for name, (qw, qz, sc) in layer.items():
                    c = choice[name]
                    if "stages" in c:
                        w4a16_cuda.gemv_stream(
                            xs[name], qw, qz, sc, GROUP, c["r"], c["stages"], out=outs[name]
                        )
                    else:
                        w4a16_cuda.gemv(xs[name], qw, qz, sc, GROUP, c["nl"], c["r"], out=outs[name])

        run()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        graph.replay()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0 / len(layers))
        row = {
            "chain": "stream" if stream else "classic",
            "us_per_layer": round(min(times), 2),
            "choice": {name: c["layout"] + f"/{c.get('nl', '')}/{c['r']}" for name, c in choice.items()},
        }
        print(json.dumps(row), flush=True)
        result.append(row)
    return result


def main() -> None:
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    rows = read_probes(dev) if "--read" in sys.argv else []
    for name, (k, n) in SHAPES.items():
        gen = torch.Generator(device=dev).manual_seed(0)
        qw = pack_int4(torch.randint(0, 16, (k, n), device=dev, generator=gen, dtype=torch.int32))
        qz = pack_int4(torch.randint(0, 16, (k // GROUP, n), device=dev, generator=gen, dtype=torch.int32))
        sc = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.01 + 1e-3).to(dtype)
        x = torch.randn(1, k, device=dev, generator=gen).to(dtype)
        strips = to_strips(qw)
        nbytes = qw.numel() * 4 + qz.numel() * 4 + sc.numel() * 2 + x.numel() * 2 + n * 2
        for nl, r in w4a16_cuda.VARIANTS:
            ref = None
            for layout in w4a16_cuda.LAYOUTS:
                if w4a16_cuda.fits(1, n, k, GROUP, dtype, nl, r, layout) is not None:
                    continue
                w = strips if layout else qw
                out = w4a16_cuda.gemv(x, w, qz, sc, GROUP, nl, r, layout=layout)
                if ref is None:
                    ref = out.float()
                err = (out.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
                call = partial(w4a16_cuda.gemv, x, w, qz, sc, GROUP, nl, r, layout=layout)
                us = graph_time_us(call, dev)
                row = {
                    "shape": name,
                    "nl": nl,
                    "r": r,
                    "layout": layout or "awq",
                    "us": round(us, 2),
                    "tb_s": round(nbytes / us / 1e6, 3),
                    "rel_err": err,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
        for r, stages in w4a16_cuda.STREAM_VARIANTS:
            if w4a16_cuda.stream_fits(1, n, k, GROUP, dtype, r, stages) is not None:
                continue
            ref = w4a16_cuda.gemv(x, qw, qz, sc, GROUP, 4, 16 if k % 1024 == 0 else 8).float()
            out = w4a16_cuda.gemv_stream(x, qw, qz, sc, GROUP, r, stages)
            err = (out.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
            us = graph_time_us(partial(w4a16_cuda.gemv_stream, x, qw, qz, sc, GROUP, r, stages), dev)
            row = {
                "shape": name,
                "r": r,
                "stages": stages,
                "layout": f"stream_s{stages}",
                "us": round(us, 2),
                "tb_s": round(nbytes / us / 1e6, 3),
                "rel_err": err,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    rows += decode_chain(dev, dtype, rows)
    with open(sys.argv[1], "w") as f:
        json.dump({"device": torch.cuda.get_device_name(dev), "rows": rows}, f, indent=1)
    for name in SHAPES:
        best = {}
        for row in rows:
            if row.get("shape") == name and "layout" in row:
                lay = row["layout"]
                if lay not in best or row["us"] < best[lay]["us"]:
                    best[lay] = row
        print(name, {lay: (b["us"], b["tb_s"], b["nl"], b["r"]) for lay, b in best.items()})


if __name__ == "__main__":
    main()
