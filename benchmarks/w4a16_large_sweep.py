"""W4A16 tensor-core launches at large M (decode batches of 256-512, prefill), swept over tiles and
both operand orders, against bf16 cuBLAS and dequantize-then-cuBLAS on the same shapes.

The in-register tiled launch (``w4a16_gemm._w4a16_dot_kernel``) feeds the dequantized weight tile to
``tl.dot`` as its B operand. On Hopper, ``wgmma`` reads B from shared memory, so that tile goes from
registers to shared memory every K step; with the operands swapped (``out^T = W^T x^T``, the
``swap_ab`` launch the split-K path uses for M <= 32) the weight becomes the A operand, which
``wgmma`` may take from registers, and the activations (B) stream into shared memory through the
software pipeline. This sweep measures whether that, or other tiles, close the gap to bf16 at
M = 256 (offline decode steps: W4A16 offline throughput is 0.84x bf16's, BENCHMARKS.md).

Each launch is checked against the float32 reference (``kernels.reference.w4a16_matmul``) before it
is timed. Times are ``w4a16_gemm.graph_time_us`` (CUDA graph, L2 flushed before each call).

    PYTHONPATH=$PWD python benchmarks/w4a16_large_sweep.py OUT.json [--m 256,2048]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

SHAPES = {  # name -> (K, N), Llama-3-8B
    "qkv_proj": (4096, 6144),
    "o_proj": (4096, 4096),
    "gate_up_proj": (4096, 28672),
    "down_proj": (14336, 4096),
}
GROUP = 128
# (block_m, block_n, block_k, warps, stages, swap): block_m is the activation side, block_n the
# weight side (the MMA's M side when swapped)
CONFIGS = [
    (128, 128, 64, 4, 4, False),  # the current LARGE_TEMPLATES
    (128, 128, 64, 8, 4, False),
    (128, 256, 64, 8, 3, False),
    (64, 128, 64, 4, 4, True),
    (128, 128, 64, 4, 4, True),
    (128, 128, 64, 8, 4, True),
    (256, 128, 64, 8, 3, True),
    (128, 256, 64, 8, 3, True),
    (64, 256, 64, 8, 4, True),
    (128, 128, 128, 8, 3, True),
    (256, 128, 128, 8, 2, True),
    (64, 128, 128, 4, 3, True),
]


def _weights(k: int, n: int, dtype: torch.dtype, dev: torch.device):  # type: ignore[no-untyped-def]
    from hotloop.kernels.w4a16_layout import pack_int4

    gen = torch.Generator(device=dev).manual_seed(0)
    qweight = pack_int4(torch.randint(0, 16, (k, n), device=dev, generator=gen, dtype=torch.int32))
    qzeros = pack_int4(torch.randint(0, 16, (k // GROUP, n), device=dev, generator=gen, dtype=torch.int32))
    scales = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.01 + 1e-3).to(dtype)
    return qweight, qzeros, scales


def _dequant_mm(x: torch.Tensor, qw: torch.Tensor, qz: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
    from hotloop.kernels.w4a16_dequant import w4a16_dequantize

    return torch.matmul(x, w4a16_dequantize(qw, qz, sc, GROUP))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--m", default="256,512,2048")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    from hotloop.kernels import reference
    from hotloop.kernels import w4a16_gemm as g
    from hotloop.kernels.w4a16_dequant import w4a16_dequantize

    dev = torch.device("cuda")
    dtype = torch.bfloat16
    ms = [int(v) for v in args.m.split(",")]
    rows: list[dict[str, Any]] = []
    t_start = time.time()
    for name in args.shapes.split(","):
        k, n = SHAPES[name]
        qw, qz, sc = _weights(k, n, dtype, dev)
        w_dense = w4a16_dequantize(qw, qz, sc, GROUP)  # [K, N]
        w_lin = w_dense.t().contiguous()  # nn.Linear's [N, K]
        for m in ms:
            x = torch.randn(m, k, device=dev).to(dtype)
            ref = reference.w4a16_matmul(x.float(), qw, qz, sc.float(), GROUP)
            scale = ref.abs().max().item()
            bf16 = g.graph_time_us(partial(torch.nn.functional.linear, x, w_lin), dev)
            deq = g.graph_time_us(partial(_dequant_mm, x, qw, qz, sc), dev)
            floor_us = 2 * m * n * k / 783e12 * 1e6
            row: dict[str, Any] = {
                "shape": name, "m": m, "k": k, "n": n, "bf16_us": round(bf16, 2),
                "dequant_cublas_us": round(deq, 2), "flop_floor_us": round(floor_us, 2), "launches": [],
            }  # fmt: skip
            for bm, bn, bk, w, st, swap in CONFIGS:
                for waves in (0.0, 1.0):
                    tmpl = g.GemmConfig("dot", bm, bn, bk, num_warps=w, num_stages=st, swap_ab=swap)
                    cfg = g.fit_config(tmpl, m, n, k, GROUP, dev, waves)
                    if waves and cfg.split_k == 1:
                        continue  # the same launch as waves 0
                    entry: dict[str, Any] = {
                        "cfg": f"{bm}x{bn}x{bk}/w{w}/st{st}/s{cfg.split_k}" + ("/swap" if swap else "")
                    }
                    try:
                        out = g.w4a16_gemm(x, qw, qz, sc, GROUP, config=cfg)
                        err = (out.float() - ref).abs().max().item() / scale
                        entry["rel_err"] = err
                        if err > 2e-2:
                            entry["error"] = f"max error {err:.3g} of the output's scale"
                        else:
                            entry["us"] = round(
                                g.graph_time_us(partial(g.w4a16_gemm, x, qw, qz, sc, GROUP, config=cfg), dev),
                                2,
                            )
                    except Exception as e:  # noqa: BLE001 (a launch Triton cannot build is a result)
                        entry["error"] = f"{type(e).__name__}: {e}"[:300]
                    row["launches"].append(entry)
            timed = [e for e in row["launches"] if "us" in e]
            best = min(timed, key=lambda e: e["us"]) if timed else None
            row["best"] = best
            rows.append(row)
            print(
                f"{name:13s} M={m:5d} bf16 {bf16:8.1f}  dequant+cuBLAS {deq:8.1f}  floor {floor_us:7.1f}  "
                f"best {best['us'] if best else float('nan'):8.1f} {best['cfg'] if best else '-'}",
                flush=True,
            )
            for e in row["launches"]:
                print(f"    {e['cfg']:32s} {e.get('us', '')!s:>9s} {e.get('error', '')}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    Path(args.out).write_text(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "python": platform.python_version(),
                "commit": commit,
                "wall_s": round(time.time() - t_start, 1),
                "rows": rows,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
