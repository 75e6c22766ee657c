"""Probe: CUTLASS 3's Hopper mixed-input GEMM (int4 x bf16, group-wise scales and zero points) against
bf16 cuBLAS and the engine's W4A16 launch, at the row counts of issue 5's offline decode steps and of
prefill (Llama-3-8B projections).

    bash benchmarks/build_cutlass_probe.sh w4a16   # nvcc + the nvidia-cutlass wheel's headers, minutes
    PYTHONPATH=$PWD python3 benchmarks/w4a16_cutlass_probe.py --out probe.json [--m 256,384,1040,2048]
    PYTHONPATH=$PWD python3 benchmarks/w4a16_cutlass_probe.py --check-packing   # CPU: the conversion only

Issue 5's offline row (W4A16 throughput no lower than bf16's) is at 0.84x: every W4A16 launch here
takes 1.4-2.6x bf16 cuBLAS's time at M = 256-2048 (BENCHMARKS.md, thirtieth session), because Triton's
``tl.dot`` takes the dequantized tile through shared memory. CUTLASS's mixed-input collective converts
the int4 operand in registers on its way to ``wgmma``. This times, per projection and row count:
``F.linear`` on the dequantized bf16 weight (cuBLAS), the engine's ``w4a16_gemm`` (its tuned default
launch), and each configuration of ``benchmarks/cuda/w4a16_cutlass_probe.cu``, all in CUDA graphs of
``--reps`` launches that cycle through enough weight copies (over 200 MB) that no launch finds its
weight in L2. Each CUTLASS result is checked against the float32 dequantize-then-matmul reference.
The weights are AutoAWQ's layout converted here (q - 8 as signed int4, K-major, CUTLASS's reordered
layout; zero = (8 - z) * scale). The engine's own copy of the GEMM, with the six configurations that won
somewhere here, is ``hotloop/kernels/w4a16_cutlass.py`` (``HOTLOOP_W4A16_KERNEL=cutlass``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

# (this script's folder is on the path: benchmarks/cublaslt_sweep.py, benchmarks/w4a16_large_sweep.py)
from cublaslt_sweep import SHAPES as CUBLASLT_SHAPES
from cublaslt_sweep import _time_us
from w4a16_large_sweep import _weights as awq_weights  # random AutoAWQ weights, (k, n, dtype, device)

from hotloop.kernels.w4a16_cutlass import (
    signed_k_major,
)  # (the engine's conversion, HOTLOOP_W4A16_KERNEL=cutlass)

DEFAULT_LIB = Path(__file__).resolve().parent.parent / "build" / "cutlass_probe" / "libw4a16_cutlass_probe.so"
GROUP = 128
# the four projections of a layer: name, N (out), K (in), launches per decode step (32 layers)
SHAPES = [row for row in CUBLASLT_SHAPES if row[0] != "lm_head"]


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.w4probe_num_configs.restype = ctypes.c_int
    lib.w4probe_config_name.restype = ctypes.c_char_p
    lib.w4probe_config_name.argtypes = [ctypes.c_int]
    lib.w4probe_workspace.restype = ctypes.c_size_t
    lib.w4probe_workspace.argtypes = [ctypes.c_int] * 6
    lib.w4probe_gemm.restype = ctypes.c_int
    lib.w4probe_gemm.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
    lib.w4probe_gemm.argtypes += [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.w4probe_reorder.restype = ctypes.c_int
    lib.w4probe_reorder.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return lib


def check_packing() -> float:
    """CPU: the largest difference between :func:`signed_k_major`'s weights, unpacked again, and
    AutoAWQ's dequantization (``kernels.reference``) on random tensors; 0 when the packing is exact."""
    from hotloop.kernels import reference

    k, n = 2 * GROUP, 64
    qweight, qzeros, scales = awq_weights(k, n, torch.bfloat16, torch.device("cpu"))
    packed, zero = signed_k_major(qweight, qzeros, scales)
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, k).to(torch.int16)
    q = torch.where(nib > 7, nib - 16, nib).float()  # [N, K], sign-extended
    w = q * scales.float().repeat_interleave(GROUP, 0).t() + zero.repeat_interleave(GROUP, 0).t()
    ref = reference.w4a16_dequantize(qweight, qzeros, scales.float(), GROUP).t()  # [N, K]
    return float((w - ref).abs().max())


def to_cutlass(
    lib: ctypes.CDLL, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AutoAWQ tensors -> (reordered int4 weight bytes [N, K/2], scales, zeros [K/g, N] in ``dtype``)."""
    packed, zero = signed_k_major(qweight, qzeros, scales)
    out = torch.empty_like(packed)
    n, k = packed.shape[0], packed.shape[1] * 2
    torch.cuda.synchronize()
    if lib.w4probe_reorder(packed.data_ptr(), out.data_ptr(), n, k) != 0:
        raise RuntimeError("w4probe_reorder failed")
    return out, scales.float().to(dtype).contiguous(), zero.to(dtype).contiguous()


def copies(t: torch.Tensor) -> list[torch.Tensor]:
    """``t`` and clones of it, over 200 MB in all, so that a launch cycling through them misses L2."""
    count = max(1, -(-200_000_000 // (t.numel() * t.element_size())))
    return [t] + [t.clone() for _ in range(count - 1)]


def one(lib: ctypes.CDLL, name: str, n: int, k: int, per_step: int, m: int, reps: int) -> dict[str, Any]:
    from hotloop.kernels import reference
    from hotloop.kernels import w4a16_gemm as g
    from hotloop.kernels.w4a16_dequant import w4a16_dequantize

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    qw, qz, sc = awq_weights(k, n, torch.bfloat16, dev)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    ref = reference.w4a16_matmul(x.float(), qw, qz, sc.float(), GROUP).float()
    scale = float(ref.abs().max())
    w_lin = w4a16_dequantize(qw, qz, sc, GROUP).t().contiguous()  # [N, K] bf16, for cuBLAS
    flops = 2 * m * n * k
    floor_us = flops / 783e12 * 1e6
    wbytes = n * k // 2 + 2 * (k // GROUP) * n * 2  # int4 weight, 16-bit scales and zeros

    outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(8)]
    lins = copies(w_lin)
    bf16_us = _time_us(lambda i: torch.matmul(x, lins[i % len(lins)].t(), out=outs[i % len(outs)]), reps)
    lins.clear()

    qws = copies(qw)
    g.w4a16_gemm(x, qw, qz, sc, GROUP)  # (tunes the launch outside the graph)
    engine_us = _time_us(lambda i: g.w4a16_gemm(x, qws[i % len(qws)], qz, sc, GROUP), reps)
    engine_err = float((g.w4a16_gemm(x, qw, qz, sc, GROUP).float() - ref).abs().max()) / scale
    qws.clear()

    cfgs: list[dict[str, Any]] = []
    prepared: dict[torch.dtype, tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]] = {}
    for c in range(lib.w4probe_num_configs()):
        cname = lib.w4probe_config_name(c).decode()
        sdtype = torch.float16 if "fp16" in cname else torch.bfloat16
        if sdtype not in prepared:  # (both scale types stay: the configurations interleave them)
            w0, s0, z0 = to_cutlass(lib, qw, qz, sc, sdtype)
            prepared[sdtype] = (copies(w0), s0, z0)
        wsize = lib.w4probe_workspace(c, m, n, k, GROUP, sms)
        work = torch.empty(max(wsize, 1), device=dev, dtype=torch.uint8)

        def launch(i: int, c: int = c, work: torch.Tensor = work, ops: tuple = prepared[sdtype]) -> int:
            wq, s0, z0 = ops
            return lib.w4probe_gemm(
                c, x.data_ptr(), wq[i % len(wq)].data_ptr(), s0.data_ptr(), z0.data_ptr(),
                outs[i % len(outs)].data_ptr(), m, n, k, GROUP, work.data_ptr(), sms,
                torch.cuda.current_stream().cuda_stream,
            )  # fmt: skip

        outs[0].fill_(float("nan"))  # (a launch that writes nothing must not pass on an earlier output)
        rc = launch(0)
        torch.cuda.synchronize()
        if rc != 0:
            cfgs.append({"config": cname, "rc": rc})
            continue
        err = float((outs[0].float() - ref).abs().max()) / scale
        us = _time_us(launch, reps)
        cfgs.append(
            {"config": cname, "us": us, "tflops": flops / us / 1e6, "rel_err": err, "ok": err <= 2e-2}
        )
    prepared.clear()
    for c in cfgs:
        if "us" in c:
            c["weight_gbps"] = wbytes / c["us"] / 1e3
    good = [c for c in cfgs if c.get("ok")]
    best = min(good, key=lambda c: c["us"]) if good else None
    row = {
        "name": name, "m": m, "n": n, "k": k, "per_step": per_step, "bf16_cublas_us": bf16_us,
        "engine_w4a16_us": engine_us, "engine_rel_err": engine_err, "flop_floor_us": floor_us,
        "weight_bytes": wbytes, "engine_weight_gbps": wbytes / engine_us / 1e3,
        "configs": cfgs, "best": best,
    }  # fmt: skip
    print(
        f"M={m:5d} {name:8s} bf16 {bf16_us:7.1f} | engine W4A16 {engine_us:7.1f} "
        f"({wbytes / engine_us / 1e3:.0f} GB/s of weights) | FLOP floor {floor_us:6.1f} | "
        + " | ".join(
            f"{c['config']}: "
            + (
                (f"{c['us']:.1f}" if c["ok"] else f"{c['us']:.1f} WRONG {c['rel_err']:.3g}")
                if "us" in c
                else f"rc {c['rc']}"
            )
            for c in cfgs
        ),
        flush=True,
    )
    torch.cuda.empty_cache()
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", default="1,16,256,384,1040,2048", help="comma-separated row counts")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--lib", default=str(DEFAULT_LIB))
    p.add_argument("--out", default=None)
    p.add_argument(
        "--check-packing", action="store_true", help="only check the weight conversion (CPU) and exit"
    )
    a = p.parse_args()
    try:
        ms = [int(v) for v in a.m.split(",")]
    except ValueError:
        p.error(f"--m {a.m!r}: want comma-separated positive row counts, e.g. 1,16,256")
    if any(m < 1 for m in ms):
        p.error(f"--m {a.m!r}: every row count must be at least 1")
    if a.reps < 1:
        p.error(f"--reps {a.reps}: must be at least 1")
    packing_err = check_packing()
    print(
        f"weight conversion against AutoAWQ's dequantization (CPU): max difference {packing_err}", flush=True
    )
    if packing_err != 0.0:
        print("the int4 conversion does not reproduce AutoAWQ's weights", file=sys.stderr)
        return 1
    if a.check_packing:
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if not Path(a.lib).is_file():
        p.error(f"--lib {a.lib}: no such file; build it with `bash benchmarks/build_cutlass_probe.sh w4a16`")
    lib = load(Path(a.lib))
    names = [lib.w4probe_config_name(c).decode() for c in range(lib.w4probe_num_configs())]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; configs: {names}", flush=True)
    rows = []
    for m in ms:
        for name, n, k, per_step in SHAPES:
            rows.append(one(lib, name, n, k, per_step, m, a.reps))
        got = [r for r in rows if r["m"] == m]
        tot = {
            "bf16": sum(r["bf16_cublas_us"] * r["per_step"] for r in got) / 1e3,
            "engine": sum(r["engine_w4a16_us"] * r["per_step"] for r in got) / 1e3,
            "cutlass": sum((r["best"]["us"] if r["best"] else float("nan")) * r["per_step"] for r in got)
            / 1e3,
        }
        print(
            f"M={m}: the 32 layers' four GEMMs: bf16 cuBLAS {tot['bf16']:.3f} ms, engine W4A16 "
            f"{tot['engine']:.3f} ms, best correct CUTLASS per projection {tot['cutlass']:.3f} ms "
            f"({tot['cutlass'] / tot['bf16']:.2f}x bf16)",
            flush=True,
        )
    if a.out:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(a.out, "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "commit": commit,
                    "configs": names,
                    "packing_max_diff": packing_err,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
