"""Dense bf16 GEMMs of a batched decode step (Llama-3-8B shapes): which cuBLAS call is fastest.

The batch-256 decode step spends about 6 ms in cuBLAS (BENCHMARKS.md). The profile showed
different cuBLAS kernels per projection, and the o_proj one far below the matmul rate. This times,
per shape and M, the ways of issuing the same product:

- ``linear``: ``F.linear(x, W)``, ``W [N, K]`` (what ``layers/linear.py`` does);
- ``mm_t``: ``torch.mm(x, Wt)`` with the weight stored transposed, ``Wt [K, N]`` contiguous;
- ``linear_lt`` / ``mm_t_lt``: the same with ``torch.backends.cuda.preferred_blas_library("cublaslt")``;
- ``swap``: ``torch.mm(W, x.t())``, the transposed product ``y^T [N, M]`` (cuBLAS sees the problem
  with M and N exchanged, so its heuristic picks other tiles: at M = 256 the untransposed gate/up
  projection runs 224 tiles of 256x128 on 132 multiprocessors);
- ``swap_xt``: the same with ``x^T [K, M]`` contiguous (as a producer that writes it so would give).
  On an H100 (benchmarks/results/gpu_2026-12-07a) neither moved gate/up at M = 256 (108 us either way).

``--variants`` picks some (default: all).

Times are GPU times with a cold L2 (``w4a16_gemm.graph_time_us``). Floors: the weight bytes over
the copy bandwidth and the FLOPs over the bf16 matmul rate, both measured in the same run.

    PYTHONPATH=$PWD python3 benchmarks/dense_gemm.py OUT.json [--m 256,384,512]

With ``PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_TUNING=1`` torch's TunableOp times the
implementations it has for each GEMM at its first call and keeps the fastest; the results are written
to ``PYTORCH_TUNABLEOP_FILENAME`` and printed. (On CUDA with torch 2.11 its only candidate was cuBLAS'
default: benchmarks/results/gpu_2026-12-02c/call3.)
"""

from __future__ import annotations

import argparse
import json
import platform
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

SHAPES = {  # name -> (in_features K, out_features N)
    "qkv_proj": (4096, 6144),
    "o_proj": (4096, 4096),
    "gate_up_proj": (4096, 28672),
    "down_proj": (14336, 4096),
    "lm_head": (4096, 128256),
}


VARIANTS = ("linear", "mm_t", "linear_lt", "mm_t_lt", "swap", "swap_xt")


def _ceilings(dev: torch.device) -> tuple[float, float]:
    """(copy bytes/s, bf16 matmul FLOP/s), medians of 10 CUDA-event timings."""
    x = torch.empty(2**29, dtype=torch.bfloat16, device=dev)
    y = torch.empty_like(x)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)

    def med(fn: Any) -> float:
        fn()
        torch.cuda.synchronize(dev)
        ts = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
        return sorted(ts)[5]

    bw = 2 * x.numel() * 2 / med(lambda: y.copy_(x))
    fl = 2 * 8192**3 / med(lambda: a @ a)
    return bw, fl


def main() -> None:
    from hotloop.kernels.w4a16_gemm import graph_time_us

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--m", default="256,384,512")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    wanted = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown or not wanted:
        ap.error(
            f"--variants {args.variants!r}: {', '.join(unknown) or 'none given'}; choose from {', '.join(VARIANTS)}"
        )
    dev = torch.device("cuda")
    bw, fl = _ceilings(dev)
    print(f"ceilings: copy {bw / 1e9:.0f} GB/s, bf16 matmul {fl / 1e12:.0f} TFLOP/s", flush=True)
    rows = []
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02
        wt = w.t().contiguous()
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            xt = x.t().contiguous()
            ref = (x.float() @ w.float().t()).to(torch.bfloat16)
            variants = {
                "linear": partial(F.linear, x, w),
                "mm_t": partial(torch.mm, x, wt),
                "swap": partial(torch.mm, w, x.t()),
                "swap_xt": partial(torch.mm, w, xt),
            }
            row: dict[str, Any] = {"shape": name, "M": m, "K": k, "N": n}
            for lib in ("default", "cublaslt"):
                torch.backends.cuda.preferred_blas_library("cublaslt" if lib == "cublaslt" else "cublas")
                for vname, fn in variants.items():
                    key = vname if lib == "default" else f"{vname}_lt"
                    if key not in wanted:
                        continue
                    y = fn()
                    y = y.t() if vname.startswith("swap") else y
                    row[key] = round(graph_time_us(fn, dev), 2)
                    row[key + "_maxerr"] = (y.float() - ref.float()).abs().max().item()
            torch.backends.cuda.preferred_blas_library("cublas")
            floor = max(2 * k * n / bw, 2 * m * k * n / fl) * 1e6
            row["floor_us"] = round(floor, 2)
            times = {v: row[v] for v in wanted if v in row}
            best = min(times, key=lambda v: times[v])
            print(f"{name:13s} M={m:4d}  " + "  ".join(f"{v} {t:7.1f}" for v, t in times.items())
                  + f"  floor {floor:6.1f}  best {best}", flush=True)  # fmt: skip
            rows.append(row)
    if torch.cuda.tunable.is_enabled():  # PYTORCH_TUNABLEOP_ENABLED=1 (it writes its file at exit)
        for r in torch.cuda.tunable.get_results():
            print("tunableop:", r, flush=True)
    meta = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "host": platform.node()}
    args.out.write_text(json.dumps({"meta": meta, "copy_GBps": bw / 1e9, "matmul_TFLOPs": fl / 1e12,
                                    "rows": rows}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
