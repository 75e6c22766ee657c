"""W4A16 GEMM vs bf16 ``torch.matmul`` at Llama-3-8B layer shapes on one GPU.

For M in (1, 16, 64, 256, 2048) and each projection shape, times the Triton W4A16 kernel (the
``auto`` launch, plus the split-K and tiled launches) against ``x @ W.T`` with a dense bf16
weight, and names per shape the smallest M at which int4 stops winning. Random int4 weights: the
speed does not depend on the values. Needs CUDA.

    python benchmarks/awq_gemm.py benchmarks/results/awq_gemm_h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
from functools import partial
from pathlib import Path
from typing import Any

import torch

M_VALUES = (1, 16, 64, 256, 2048)
# name -> (in_features, out_features) for Llama-3-8B (hidden 4096, 32/8 heads of 128, ffn 14336)
SHAPES = {
    "qkv_proj": (4096, 6144),
    "o_proj": (4096, 4096),
    "gate_up_proj": (4096, 28672),
    "down_proj": (14336, 4096),
}
GROUP = 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="JSON results file")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--rep-ms", type=int, default=200, help="timing budget per measurement")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("awq_gemm.py needs a CUDA GPU")
    import triton
    from triton.testing import do_bench

    from hotloop.kernels import reference
    from hotloop.kernels.w4a16_gemm import choose_config, w4a16_gemm
    from hotloop.kernels.w4a16_layout import pack_int4

    dtype = getattr(torch, args.dtype)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict[str, Any]] = []
    print(
        f"{'shape':<14}{'M':>6}{'bf16 us':>10}{'w4a16 us':>10}{'splitk':>9}{'tiled':>9}{'speedup':>9}{'TB/s w4':>9}"
    )
    for name, (k, n) in SHAPES.items():
        qweight = pack_int4(torch.randint(0, 16, (k, n), device=dev, generator=gen))
        qzeros = pack_int4(torch.randint(0, 16, (k // GROUP, n), device=dev, generator=gen))
        scales = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.01 + 1e-3).to(dtype)
        w_dense = reference.w4a16_dequantize(qweight, qzeros, scales, GROUP).t().contiguous()  # [n, k]
        for m in M_VALUES:
            x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
            # correctness first: a wrong kernel's speed means nothing
            want = x.float() @ w_dense.float().t()
            got = w4a16_gemm(x, qweight, qzeros, scales, GROUP).float()
            rel = float((got - want).abs().max() / want.abs().max())
            w_t = w_dense.t()
            times = {"bf16": do_bench(partial(torch.matmul, x, w_t), rep=args.rep_ms)}
            for key, path in (("w4a16", "auto"), ("splitk", "splitk"), ("tiled", "tiled")):
                fn = partial(w4a16_gemm, x, qweight, qzeros, scales, GROUP, path=path)
                times[key] = do_bench(fn, rep=args.rep_ms)
            # the same launch with each packed word loaded once and repeated in registers
            expanded = dataclasses.replace(choose_config(m, n, k, GROUP, dev), expand_words=True)
            try:
                fn = partial(w4a16_gemm, x, qweight, qzeros, scales, GROUP, config=expanded)
                times["auto_expand_words"] = do_bench(fn, rep=args.rep_ms)
            except Exception as e:  # a compiler that rejects the reshape: report, keep going
                print(f"expand_words launch failed: {type(e).__name__}: {e}"[:200])
            cfg = choose_config(m, n, k, GROUP, dev)
            weight_bytes = k * n // 2 + scales.numel() * 2 + qzeros.numel() * 4
            row = {
                "shape": name,
                "k": k,
                "n": n,
                "m": m,
                "us": {key: round(v * 1000, 2) for key, v in times.items()},
                "speedup_vs_bf16": round(times["bf16"] / times["w4a16"], 3),
                "w4a16_weight_tbps": round(weight_bytes / (times["w4a16"] * 1e-3) / 1e12, 3),
                "auto_config": str(cfg),
                "max_rel_err": rel,
            }
            rows.append(row)
            us = row["us"]
            print(
                f"{name:<14}{m:>6}{us['bf16']:>10.1f}{us['w4a16']:>10.1f}{us['splitk']:>9.1f}"
                f"{us['tiled']:>9.1f}{row['speedup_vs_bf16']:>9.2f}{row['w4a16_weight_tbps']:>9.2f}"
                + ("  (check failed!)" if rel > 2e-2 else ""),
                flush=True,
            )
    crossover = {}
    for name in SHAPES:
        losing = [r["m"] for r in rows if r["shape"] == name and r["speedup_vs_bf16"] < 1.0]
        crossover[name] = min(losing) if losing else None
    print("smallest M where int4 stops winning:", crossover)
    report = {
        "benchmark": "awq_gemm",
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "host": platform.platform(),
        "dtype": args.dtype,
        "group_size": GROUP,
        "rows": rows,
        "int4_stops_winning_at_m": crossover,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
