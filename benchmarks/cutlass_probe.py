"""Probe: CUTLASS 3 Hopper GEMMs (persistent and stream-K tile schedules) against cuBLAS for the
dense projections of issue 4's batch-256 decode step and issue 3's mixed step (Llama-3-8B shape).

    bash benchmarks/build_cutlass_probe.sh   # nvcc + the nvidia-cutlass wheel's headers, minutes
    PYTHONPATH=$PWD python3 benchmarks/cutlass_probe.py --out probe.json [--m 256,1040]

The batch-256 step runs its GEMMs at about 80% of the matmul rate; cuBLAS' tiles leave a second wave
70% full for gate/up (224 tiles of 256 x 128 on 132 SMs) and under-fill the machine for q/k/v and o.
A stream-K schedule splits the K loop of the last wave's tiles over the idle SMs. This times, per
projection and row count, ``F.linear`` (cuBLAS) and each configuration of
``benchmarks/cuda/cutlass_gemm_probe.cu`` in CUDA graphs of ``--reps`` launches that cycle through
enough weight copies (over 200 MB) that no launch finds its weight in L2; checks each result against
``F.linear``'s; and sums what the best correct configuration would save per decode step (32 layers,
the LM head once). A probe only: nothing in the engine uses these kernels.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from cublaslt_sweep import (
    SHAPES,
    _time_us,
)  # benchmarks/cublaslt_sweep.py (this script's folder is on the path)

DEFAULT_LIB = Path(__file__).resolve().parent.parent / "build" / "cutlass_probe" / "libcutlass_probe.so"


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.probe_num_configs.restype = ctypes.c_int
    lib.probe_config_name.restype = ctypes.c_char_p
    lib.probe_config_name.argtypes = [ctypes.c_int]
    lib.probe_workspace.restype = ctypes.c_size_t
    lib.probe_workspace.argtypes = [ctypes.c_int] * 5
    lib.probe_gemm.restype = ctypes.c_int
    lib.probe_gemm.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.probe_gemm.argtypes += [ctypes.c_int] * 3 + [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    return lib


def one(lib: ctypes.CDLL, name: str, n: int, k: int, per_step: int, m: int, reps: int) -> dict[str, Any]:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    copies = max(1, -(-200_000_000 // (n * k * 2)))
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    ref = F.linear(x, ws[0]).float()
    tol = 0.02 * float(ref.abs().max()) + 1e-3
    base = _time_us(lambda i: torch.matmul(x, ws[i % copies].t(), out=outs[i % copies]), reps)
    flops = 2 * m * n * k
    cfgs = []
    for c in range(lib.probe_num_configs()):
        cname = lib.probe_config_name(c).decode()
        wsize = lib.probe_workspace(c, m, n, k, sms)
        work = torch.empty(max(wsize, 1), device=dev, dtype=torch.uint8)

        def launch(i: int, c: int = c, work: torch.Tensor = work) -> int:
            y = outs[i % copies]
            return lib.probe_gemm(
                c, x.data_ptr(), ws[i % copies].data_ptr(), y.data_ptr(), m, n, k, work.data_ptr(), sms,
                torch.cuda.current_stream().cuda_stream,
            )  # fmt: skip

        outs[0].fill_(float("nan"))  # (a launch that writes nothing must not pass on an earlier output)
        rc = launch(0)
        torch.cuda.synchronize()
        if rc != 0:
            cfgs.append({"config": cname, "rc": rc})
            continue
        err = float((outs[0].float() - ref).abs().max())
        us = _time_us(launch, reps)
        cfgs.append({"config": cname, "us": us, "tflops": flops / us / 1e6, "max_abs_diff": err, "ok": err <= tol,
                     "workspace_bytes": wsize})  # fmt: skip
    good = [c for c in cfgs if c.get("ok")]
    best = min(good, key=lambda c: c["us"]) if good else None
    row = {
        "name": name, "m": m, "n": n, "k": k, "per_step": per_step, "cublas_us": base,
        "cublas_tflops": flops / base / 1e6, "configs": cfgs, "best": best,
        "saved_ms_per_step": max(0.0, base - best["us"]) * per_step / 1e3 if best else 0.0,
    }  # fmt: skip
    print(
        f"M={m:5d} {name:8s} cuBLAS {base:8.1f} us ({row['cublas_tflops']:4.0f} TF) | "
        + " | ".join(
            f"{c['config'].split()[0][:4]}{c['config'][c['config'].find(' ') :]}: "
            + (f"{c['us']:.1f}{'' if c['ok'] else ' WRONG'}" if "us" in c else f"rc {c['rc']}")
            for c in cfgs
        ),
        flush=True,
    )
    torch.cuda.empty_cache()
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", default="256,1040", help="comma-separated row counts")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--lib", default=str(DEFAULT_LIB))
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if not Path(a.lib).is_file():
        p.error(
            f"--lib {a.lib}: no such file; build it with `bash benchmarks/build_cutlass_probe.sh` (nvcc needed)"
        )
    lib = load(Path(a.lib))
    names = [lib.probe_config_name(c).decode() for c in range(lib.probe_num_configs())]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; configs: {names}", flush=True)
    rows = []
    for m in (int(v) for v in a.m.split(",")):
        for name, n, k, per_step in SHAPES:
            if name == "lm_head" and m > 256:
                continue  # (a prefill step takes the LM head over its last rows only)
            rows.append(one(lib, name, n, k, per_step, m, a.reps))
        got = [r for r in rows if r["m"] == m]
        print(
            f"M={m}: cuBLAS {sum(r['cublas_us'] * r['per_step'] for r in got) / 1e3:.3f} ms per step; the best "
            f"correct CUTLASS configuration per projection saves {sum(r['saved_ms_per_step'] for r in got):.3f} ms",
            flush=True,
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "configs": names, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
