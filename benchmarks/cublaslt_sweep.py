"""Every cuBLASLt algorithm the heuristic offers against ``F.linear`` (cuBLAS' first choice), per
decode-step GEMM of the Llama-3-8B shape, timed in CUDA graphs with a cold L2.

    python benchmarks/cublaslt_sweep.py --m 256 --out sweep.json

For each (M, N, K): ``F.linear``'s time, each algorithm's time and its largest difference from
``F.linear``'s output, the best, and what the best saves per decode step (32 layers; the LM head
once). Each time is the median of 5 replays of a graph of ``--reps`` launches that cycle through
enough weight copies to exceed 200 MB, so no launch finds its weights in L2. GPU only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from hotloop.kernels import cublaslt

# (name, N, K, times per step): Llama-3-8B
SHAPES = [
    ("qkv", 6144, 4096, 32),
    ("o", 4096, 4096, 32),
    ("gate_up", 28672, 4096, 32),
    ("down", 4096, 14336, 32),
    ("lm_head", 128256, 4096, 1),
]


def _time_us(launch, reps: int) -> float:
    """Median over 5 replays of one graph holding ``reps`` calls of ``launch(i)``, per call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            launch(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            launch(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times)


def _one(name: str, n: int, k: int, per_step: int, m: int, dtype: torch.dtype, reps: int, count: int) -> dict:
    dev = torch.device("cuda")
    copies = max(1, -(-200_000_000 // (n * k * 2)))
    ws = [torch.randn(n, k, device=dev, dtype=dtype) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device=dev, dtype=dtype)
    outs = [torch.empty(m, n, device=dev, dtype=dtype) for _ in range(copies)]
    ref = F.linear(x, ws[0]).float()
    base = _time_us(lambda i: torch.matmul(x, ws[i % copies].t(), out=outs[i % copies]), reps)
    tried = []
    for j, a in enumerate(cublaslt.heuristics(dev, dtype, m, n, k, count)):
        try:
            err = float((cublaslt.matmul(x, ws[0], a).float() - ref).abs().max())
            t = _time_us(lambda i, a=a: cublaslt.matmul(x, ws[i % copies], a, out=outs[i % copies]), reps)
        except cublaslt.CublasLtError as e:
            print(f"  {name} algo #{j}: {e}", file=sys.stderr)
            continue
        tried.append({"index": j, "desc": a.describe(), "us": t, "max_abs_diff": err})
    ok = [t for t in tried if t["max_abs_diff"] <= 0.05 * float(ref.abs().max()) + 1e-3]
    best = min(ok, key=lambda t: t["us"]) if ok else None
    flops = 2 * m * n * k
    row = {
        "name": name,
        "m": m,
        "n": n,
        "k": k,
        "per_step": per_step,
        "flinear_us": base,
        "flinear_tflops": flops / base / 1e6,
        "algos": tried,
        "best": best,
        "saved_ms_per_step": (base - best["us"]) * per_step / 1e3 if best else 0.0,
    }
    first = tried[0]["us"] if tried else float("nan")
    print(
        f"M={m:4d} {name:8s} N={n:6d} K={k:5d}  F.linear {base:7.1f} us ({row['flinear_tflops']:4.0f} TF)  "
        f"heuristic #0 {first:7.1f}  best {best['us'] if best else float('nan'):7.1f} us "
        f"({flops / best['us'] / 1e6 if best else 0:4.0f} TF) [{best['desc'] if best else '-'}]  "
        f"{len(tried)} algos; saves {row['saved_ms_per_step']:.3f} ms/step",
        flush=True,
    )
    return row


def sweep(m: int, dtype: torch.dtype, reps: int, count: int) -> list[dict]:
    rows = []
    for name, n, k, per_step in SHAPES:
        rows.append(_one(name, n, k, per_step, m, dtype, reps, count))
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", default="256", help="comma-separated row counts (decode batch sizes)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--count", type=int, default=32, help="algorithms to ask the heuristic for")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    dtype = getattr(torch, a.dtype)
    rows = []
    for m in (int(v) for v in a.m.split(",")):
        rows += sweep(m, dtype, a.reps, a.count)
        total = sum(r["saved_ms_per_step"] for r in rows if r["m"] == m)
        print(f"M={m}: the best algorithms save {total:.3f} ms per decode step", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
