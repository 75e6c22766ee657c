"""The skinny tensor-core GEMM (``kernels/skinny_gemm.py``) against cuBLAS at decode's small batches.

Per projection of the Llama-3-8B shape (and SmolLM2-135M with ``--model smollm2``) and per M, this
times ``F.linear`` (cuBLAS) and every candidate launch of the skinny GEMM's tuner, with a cold L2
(``w4a16_gemm.graph_time_us``: 8 calls in a CUDA graph, L2 flushed before each, best of 3), and
checks each result against float32. The floor is the weight bytes over the copy bandwidth measured
in the same run. The step estimate sums a decoder's projections (x layers) and the LM head.

    PYTHONPATH=$PWD python3 benchmarks/skinny_gemm.py OUT.json [--m 2,4,8,16,24,32,48,64] [--model llama3]
"""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

MODELS = {  # name -> (layers, {projection: (in K, out N)})
    "llama3": (
        32,
        {
            "qkv_proj": (4096, 6144),
            "o_proj": (4096, 4096),
            "gate_up_proj": (4096, 28672),
            "down_proj": (14336, 4096),
            "lm_head": (4096, 128256),
        },
    ),
    "smollm2": (
        30,
        {
            "qkv_proj": (576, 960),
            "o_proj": (576, 576),
            "gate_up_proj": (576, 3072),
            "down_proj": (1536, 576),
            "lm_head": (576, 49152),
        },
    ),
}


def _copy_bandwidth(dev: torch.device) -> float:
    x = torch.empty(2**29, dtype=torch.bfloat16, device=dev)
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize(dev)
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        y.copy_(x)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    return 2 * x.numel() * 2 / sorted(ts)[5]


def main() -> None:
    from hotloop.kernels import skinny_gemm as sg

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--m", default="2,4,8,16,24,32,48,64")
    ap.add_argument("--model", default="llama3", choices=sorted(MODELS))
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = _copy_bandwidth(dev)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    layers, shapes = MODELS[args.model]
    ms = [int(v) for v in args.m.split(",")]
    rows: list[dict[str, Any]] = []
    step = {m: {"cublas_us": 0.0, "best_us": 0.0, "floor_us": 0.0} for m in ms}
    for name, (k, n) in shapes.items():
        w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) / k**0.5
        reps = 1 if name == "lm_head" else layers
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            ref = x.float() @ w.float().t()
            sg._tune(x, w, None)
            key = (torch.cuda.current_device(), torch.bfloat16, sg.m_bucket(m), n, k)
            timed = sg.tuning_log[key]
            cublas = timed[0][1]
            cands = []
            for cfg, us in timed[1:]:
                assert cfg is not None
                out = sg.skinny_gemm(x, w, None, replace(cfg, block_m=sg.row_tile(m)))
                err = float((out.float() - ref).abs().max() / ref.abs().max())
                cands.append({"config": asdict(cfg), "us": round(us, 2), "max_rel_err": err})
            if not cands:
                print(f"{name:13s} M={m:3d}  no skinny launch ran; cuBLAS {cublas:7.1f}", flush=True)
                continue
            best = min(cands, key=lambda c: c["us"])
            floor = 2 * k * n / bw * 1e6
            cublas_err = float((F.linear(x, w).float() - ref).abs().max() / ref.abs().max())
            rows.append({"shape": name, "M": m, "K": k, "N": n, "cublas_us": round(cublas, 2),
                         "cublas_max_rel_err": cublas_err, "floor_us": round(floor, 2),
                         "best": best, "candidates": cands})  # fmt: skip
            step[m]["cublas_us"] += reps * cublas
            step[m]["best_us"] += reps * min(cublas, best["us"])
            step[m]["floor_us"] += reps * floor
            c = best["config"]
            print(f"{name:13s} M={m:3d}  cuBLAS {cublas:7.1f}  skinny {best['us']:7.1f} "
                  f"(n{c['block_n']} k{c['block_k']} s{c['split_k']} w{c['num_warps']} st{c['num_stages']})  "
                  f"floor {floor:6.1f}  {cublas / best['us']:.2f}x  err {best['max_rel_err']:.1e}",
                  flush=True)  # fmt: skip
    for m in ms:
        s = step[m]
        print(f"step GEMMs M={m:3d}: cuBLAS {s['cublas_us'] / 1e3:.3f} ms, best of both "
              f"{s['best_us'] / 1e3:.3f} ms, floor {s['floor_us'] / 1e3:.3f} ms", flush=True)  # fmt: skip
    meta = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "host": platform.node(),
            "model": args.model, "layers": layers}  # fmt: skip
    args.out.write_text(json.dumps({"meta": meta, "copy_GBps": bw / 1e9, "rows": rows,
                                    "step": {str(m): v for m, v in step.items()}}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
