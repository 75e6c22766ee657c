"""The skinny tensor-core GEMM (``kernels/skinny_mma.py``) against cuBLAS at decode batch 2-16.

Per Llama-3-8B projection (and the LM head) and M: ``F.linear``'s GPU time (cuBLAS, what the
layers call) and every launch of the CUDA C kernel that fits, cold L2 (``w4a16_gemm.graph_time_us``),
with each one's error against float32; the floor is the weight bytes over the copy bandwidth
measured in the same run.

    python benchmarks/skinny_mma.py OUT.json [--m 2,4,8,16]
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from dense_gemm import SHAPES, _ceilings  # (benchmarks/ is on the path when this script runs)

from hotloop.kernels import skinny_mma
from hotloop.kernels.w4a16_gemm import graph_time_us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--m", default="2,4,8,16")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw, _fl = _ceilings(dev)
    print(f"copy {bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for name, (k, n) in SHAPES.items():
        w = (torch.randn(n, k, device=dev) * 0.02).bfloat16()
        floor = n * k * 2 / bw * 1e6
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev).bfloat16()
            want = x.float() @ w.float().t()
            cublas = graph_time_us(partial(F.linear, x, w), dev)
            launches = {}
            for c in skinny_mma.candidates(m, n, k, torch.bfloat16):
                got = skinny_mma.launch(x, w, None, c)
                err = float((got.float() - want).abs().max() / want.abs().max())
                launches[f"{c.mt},{c.nt},{c.u},{c.warps},s{c.split}"] = (
                    round(graph_time_us(partial(skinny_mma.launch, x, w, None, c), dev), 2),
                    round(err, 5),
                )
            best = min(launches, key=lambda v: launches[v][0]) if launches else None
            row = {"shape": name, "M": m, "N": n, "K": k, "cublas_us": round(cublas, 2),
                   "floor_us": round(floor, 2), "best": best,
                   "best_us": launches[best][0] if best else None, "launches": launches}  # fmt: skip
            rows.append(row)
            print(f"{name:13s} M={m:3d} cuBLAS {cublas:8.2f} us ({floor / cublas:4.0%} of floor)  skinny "
                  + (f"{launches[best][0]:8.2f} us ({floor / launches[best][0]:4.0%}) {best}" if best else "-")
                  + f"  floor {floor:7.2f}", flush=True)  # fmt: skip
            del x
        del w
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(dev), "copy_GBps": bw / 1e9,
                                    "rows": rows}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
