"""The batch-256 decode step's dense GEMMs: cuBLAS against ``kernels/tiled_gemm.py``'s launches.

For each Llama-3-8B projection at each M, times (GPU time, cold L2, ``w4a16_gemm.graph_time_us``):

- ``cublas``: ``F.linear(x, W)`` (what the engine calls), and for gate/up ``F.linear`` followed by
  ``silu_and_mul`` (``cublas_silu``), for o/down ``F.linear`` followed by the fused residual RMSNorm
  (``cublas_norm``), the launches the tiled kernel's epilogues replace;
- every candidate ``TiledConfig`` in ``"store"`` mode, in ``"partials"`` mode with K split 2 and 4
  (o/down; the reduction left to the consumer), and gate/up in ``"silu"`` mode;
- for o/down, the best partials launch followed by ``rms_norm_partials`` (``tiled_norm``).

Each candidate's output is checked against a float32 reference; a launch that fails to compile or
run is skipped. Floors: the weight bytes over the copy bandwidth and the FLOPs over the bf16 matmul
rate, both measured in the same run.

    PYTHONPATH=$PWD python3 benchmarks/tiled_gemm_sweep.py OUT.json [--m 256] [--budget-s 420]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

SHAPES = {  # name -> (in_features K, out_features N)
    "o_proj": (4096, 4096),
    "down_proj": (14336, 4096),
    "qkv_proj": (4096, 6144),
    "gate_up_proj": (4096, 28672),
}


def candidates(silu: bool) -> list[Any]:
    from hotloop.kernels.tiled_gemm import TiledConfig

    out = []
    for bm, bn, bk, stages, warps in itertools.product(
        (64, 128), (64, 128, 256), (64, 128), (3, 4, 5), (4, 8)
    ):
        b_rows = bn * (2 if silu else 1)
        if stages * (bm + b_rows) * bk * 2 > 220 * 1024:
            continue
        if bm * b_rows >= 128 * 256 and warps == 4:
            continue
        if bm * b_rows <= 64 * 64 and warps == 8:
            continue
        if silu and bn > 128:
            continue
        out.append(TiledConfig(bm, bn, bk, 1, warps, stages))
    return out


def main() -> None:
    from dataclasses import asdict, replace

    from hotloop.kernels.rms_norm import rms_norm
    from hotloop.kernels.silu_and_mul import silu_and_mul
    from hotloop.kernels.tiled_gemm import tiled_gemm
    from hotloop.kernels.w4a16_gemm import graph_time_us

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--m", default="256")
    ap.add_argument("--budget-s", type=float, default=420.0)
    args = ap.parse_args()
    t0 = time.monotonic()
    dev = torch.device("cuda")
    from dense_gemm import _ceilings  # benchmarks/ is on the path when run as a script

    bw, fl = _ceilings(dev)
    print(f"ceilings: copy {bw / 1e9:.0f} GB/s, bf16 matmul {fl / 1e12:.0f} TFLOP/s", flush=True)
    from hotloop.kernels.rms_norm import rms_norm_partials as norm_partials

    rows: list[dict[str, Any]] = []
    meta = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "host": platform.node()}

    def save() -> None:
        args.out.write_text(json.dumps({"meta": meta, "copy_GBps": bw / 1e9, "matmul_TFLOPs": fl / 1e12,
                                        "rows": rows}, indent=1))  # fmt: skip

    for m in (int(v) for v in args.m.split(",")):
        for name, (k, n) in SHAPES.items():
            torch.manual_seed(0)
            w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            res = torch.randn(m, n, dtype=torch.bfloat16, device=dev)
            nw = torch.rand(n, dtype=torch.bfloat16, device=dev) + 0.5
            ref = x.float() @ w.float().t()
            row: dict[str, Any] = {"shape": name, "M": m, "K": k, "N": n}
            row["floor_us"] = round(max(2 * k * n / bw, 2 * m * k * n / fl) * 1e6, 2)
            row["cublas"] = round(graph_time_us(partial(F.linear, x, w), dev), 2)
            silu = name == "gate_up_proj"
            norm = name in ("o_proj", "down_proj")
            if silu:
                row["cublas_silu"] = round(
                    graph_time_us(lambda x=x, w=w: silu_and_mul(F.linear(x, w)), dev), 2
                )
                half = n // 2
                g, u = ref[:, :half].bfloat16().float(), ref[:, half:].bfloat16().float()
                ref_silu = (g * torch.sigmoid(g)).bfloat16().float() * u
            if norm:
                row["cublas_norm"] = round(
                    graph_time_us(
                        lambda x=x, w=w, nw=nw, res=res: rms_norm(F.linear(x, w), nw, 1e-5, residual=res), dev
                    ),
                    2,
                )
            timed: list[dict[str, Any]] = []
            modes = [("store", 1)] + ([("partials", 2), ("partials", 4)] if norm else [])
            if silu:
                modes.append(("silu", 1))
            for mode, split in modes:
                for cfg in candidates(mode == "silu"):
                    if time.monotonic() - t0 > args.budget_s:
                        break
                    cfg = replace(cfg, split_k=split)
                    if k % (split * cfg.block_k):
                        continue
                    fn = partial(tiled_gemm, x, w, cfg, mode)
                    try:
                        y = fn()
                        torch.cuda.synchronize(dev)
                    except Exception as e:  # a launch this GPU or compiler cannot run
                        print(f"  skip {mode} {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                        torch.cuda.synchronize(dev)
                        continue
                    if mode == "partials":
                        err = (y.sum(0) - ref).abs().max().item()
                    elif mode == "silu":
                        err = (y.float() - ref_silu).abs().max().item()
                    else:
                        err = (y.float() - ref).abs().max().item()
                    us = graph_time_us(fn, dev)
                    timed.append({"mode": mode, **asdict(cfg), "us": round(us, 2), "maxerr": err,
                                  "programs": cfg.programs(m, n // 2 if silu else n)})  # fmt: skip
            timed.sort(key=lambda t: t["us"])
            row["tiled"] = timed
            for mode in ("store", "partials", "silu"):
                best = [t for t in timed if t["mode"] == mode]
                if best:
                    row[f"best_{mode}"] = best[0]
            line = f"M={m:4d} {name:13s} floor {row['floor_us']:7.1f}  cublas {row['cublas']:7.1f}"
            if silu:
                line += f"  cublas+silu {row['cublas_silu']:7.1f}"
            if norm:
                line += f"  cublas+norm {row['cublas_norm']:7.1f}"
            for mode in ("store", "partials", "silu"):
                b = row.get(f"best_{mode}")
                if b:
                    line += (f"  {mode} {b['us']:7.1f} ({b['block_m']}x{b['block_n']}x{b['block_k']}"
                             f" s{b['split_k']} w{b['num_warps']} st{b['num_stages']}, err {b['maxerr']:.2g})")  # fmt: skip
            if norm and row.get("best_partials"):
                b = row["best_partials"]
                cfg = replace(candidates(False)[0], **{k2: b[k2] for k2 in
                              ("block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages")})  # fmt: skip
                row["tiled_norm"] = round(graph_time_us(
                    lambda x=x, w=w, cfg=cfg, nw=nw, res=res: norm_partials(tiled_gemm(x, w, cfg, "partials"), nw, 1e-5, residual=res), dev), 2)  # fmt: skip
                line += f"  tiled+norm {row['tiled_norm']:7.1f}"
            print(line, flush=True)
            for t in timed[:6]:
                print(f"    {t}", flush=True)
            rows.append(row)
            save()
    save()


if __name__ == "__main__":
    main()
