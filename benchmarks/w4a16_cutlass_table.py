"""The engine's CUTLASS W4A16 GEMM (``HOTLOOP_W4A16_KERNEL=cutlass``) against bf16 ``torch.matmul``,
per Llama-3-8B projection and row count: every configuration the engine's tuner would time, its
choice, and the floors. The bf16 baseline is ``x @ W`` with ``W`` stored ``[K, N]`` (the issue's
``torch.matmul``); beside it, ``F.linear`` on ``W`` stored ``[N, K]``, as the engine's bf16 layers run
(cuBLAS' speed differs between the two layouts).

    PYTHONPATH=$PWD HOTLOOP_CACHE=build/hl_cache python3 benchmarks/w4a16_cutlass_table.py \
        --out table.json [--m 1,16,64,256,384,1040,2048]

The library is ``kernels/w4a16_cutlass.py``'s (built once, cached; carry ``build/hl_cache``). Each
candidate's result is checked against the float32 dequantize-then-matmul reference before it is timed
(a candidate that fails the check is reported and not timed). Times are
``w4a16_gemm.graph_time_us``: a CUDA graph of 8 launches, each after a write of twice the L2 (no
launch finds its weight in L2), less the same graph without them; best of 3. Per M the table sums the
four projections of a layer times 32 layers (one decode step's GEMMs). Floors, measured in the same
run (``run_gpu.measure_ceilings``): the int4 weight bytes (with bf16 scales and zero terms) over the
copy rate, and the FLOPs over bf16 ``torch.matmul``'s rate at 8,192^3. Random weights: the speed does not depend on the values.

Caveat (fifty-second session, H100, batch 256): inside an engine decode step (``step_kernels.py``,
``gpu_check.sh w4steps``) cuBLAS's projections took 6.43 ms against this table's 7.016 ms for
``F.linear`` (measured on another H100 of the same kind), while CUTLASS's matched it (5.96 against
5.957 ms). This table overstates bf16's cost by
about 8% there; read a margin under that as level, and confirm one with ``w4steps``.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch

from hotloop.kernels import reference, w4a16_cutlass
from hotloop.kernels.w4a16_gemm import graph_time_us

GROUP = 128
LAYERS = 32
# name, N (out), K (in): one Llama-3-8B layer's projections (q/k/v fused, gate/up fused)
SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))


def random_awq(k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AutoAWQ GEMM tensors: qweight [K, N/8] and qzeros [K/g, N/8] int32, scales [K/g, N] bf16."""
    g = torch.Generator("cuda").manual_seed(seed)
    qweight = torch.randint(-(2**31), 2**31 - 1, (k, n // 8), dtype=torch.int32, device="cuda", generator=g)
    qzeros = torch.randint(
        -(2**31), 2**31 - 1, (k // GROUP, n // 8), dtype=torch.int32, device="cuda", generator=g
    )
    scales = (torch.rand(k // GROUP, n, device="cuda", generator=g) * 0.02 + 0.001).bfloat16()
    return qweight, qzeros, scales


def ceilings() -> tuple[float, float]:
    """(copy GB/s, bf16 matmul TFLOP/s) measured here, as ``run_gpu.py`` measures them."""
    from run_gpu import measure_ceilings  # (this script's folder is on the path)

    c = measure_ceilings()
    return c["copy_GBps"], c["bf16_matmul_TFLOPs"]


def one(name: str, n: int, k: int, m: int, copy_gbps: float, tflops: float) -> dict[str, Any]:
    device = torch.device("cuda")
    qweight, qzeros, scales = random_awq(k, n, seed=n + k)
    wt = w4a16_cutlass.convert(qweight, qzeros, scales, GROUP)
    dense = reference.w4a16_dequantize(qweight, qzeros, scales.float(), GROUP).bfloat16()  # [K, N]
    x = torch.randn(m, k, device=device).bfloat16()
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), GROUP)
    bf16_us = graph_time_us(lambda: x @ dense, device)
    # the engine's bf16 layers: F.linear on the weight stored [N, K] (cuBLAS' other operand layout)
    dense_nk = dense.t().contiguous()
    linear_us = graph_time_us(lambda: torch.nn.functional.linear(x, dense_nk), device)
    configs = []
    for c in w4a16_cutlass.candidates(m, n, k, GROUP):
        label = w4a16_cutlass.config_label(c)
        try:
            got = w4a16_cutlass.gemm(x, wt, config=c)
        except (RuntimeError, ValueError) as e:
            configs.append({"config": label, "error": str(e)[:200]})
            continue
        err = float((got.float() - want).abs().max() / want.abs().max())
        if not err < 1e-2:  # (NaN fails too)
            configs.append({"config": label, "rel_err": err, "ok": False})
            continue
        us = graph_time_us(partial(w4a16_cutlass.gemm, x, wt, config=c), device)
        configs.append({"config": label, "us": us, "rel_err": err, "ok": True})
    tuned = w4a16_cutlass.gemm(x, wt)  # the tuner's choice (times the candidates once more)
    tuned_err = float((tuned.float() - want).abs().max() / want.abs().max())
    wbytes = wt.w.numel() * wt.w.element_size() + 2 * wt.scales.numel() * wt.scales.element_size()
    timed = [c for c in configs if c.get("ok")]
    best = min(timed, key=lambda c: c["us"]) if timed else None
    row = {
        "name": name, "m": m, "n": n, "k": k, "bf16_us": bf16_us, "bf16_linear_us": linear_us,
        "configs": configs, "best": best,
        "tuned_rel_err": tuned_err, "weight_bytes": wbytes,
        "bytes_floor_us": wbytes / copy_gbps / 1e3, "flop_floor_us": 2 * m * n * k / tflops / 1e6,
    }  # fmt: skip
    b = f"{best['config']} {best['us']:8.1f}" if best else "none ran"
    print(f"M={m:5d} {name:8s} bf16 {bf16_us:8.1f} us (F.linear {linear_us:8.1f}) | best {b} us | floors: bytes "
          f"{row['bytes_floor_us']:6.1f}, FLOPs {row['flop_floor_us']:6.1f}", flush=True)  # fmt: skip
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--m", default="1,16,64,256,384,1040,2048", help="comma-separated row counts")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    w4a16_cutlass.check_operands(torch.bfloat16, device, 4096, 4096, GROUP)
    names = w4a16_cutlass.config_names(device)
    copy_gbps, tflops = ceilings()
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbps:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s")
    rows = []
    summary = []
    for m in (int(v) for v in args.m.split(",")):
        per = [one(name, n, k, m, copy_gbps, tflops) for name, n, k in SHAPES]
        rows += per
        bf16 = LAYERS * sum(r["bf16_us"] for r in per) / 1e3
        linear = LAYERS * sum(r["bf16_linear_us"] for r in per) / 1e3
        if all(r["best"] for r in per):
            cut = LAYERS * sum(r["best"]["us"] for r in per) / 1e3
            summary.append(
                {
                    "m": m,
                    "bf16_ms": bf16,
                    "bf16_linear_ms": linear,
                    "cutlass_best_ms": cut,
                    "ratio": cut / bf16,
                }
            )
            print(f"M={m:5d} a step's GEMMs (32 layers): CUTLASS {cut:.3f} ms against bf16 {bf16:.3f} ms "
                  f"({cut / bf16:.3f}x; bf16 as F.linear on [N, K] weights, the engine's: {linear:.3f} ms)",
                  flush=True)  # fmt: skip
    out = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbps": copy_gbps,
        "bf16_tflops": tflops, "config_names": names, "rows": rows, "summary": summary,
        "tuned": w4a16_cutlass.tuned_launches(),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
