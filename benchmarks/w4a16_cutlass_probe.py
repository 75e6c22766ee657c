"""Probe: CUTLASS 3's Hopper mixed-input GEMM (int4 x bf16, group-wise scales and zero points) against
bf16 cuBLAS and the engine's W4A16 launch, at the row counts of issue 5's offline decode steps and of
prefill (Llama-3-8B projections).

    bash benchmarks/build_cutlass_probe.sh w4a16   # nvcc + the nvidia-cutlass wheel's headers, minutes
    PYTHONPATH=$PWD python3 benchmarks/w4a16_cutlass_probe.py --out probe.json [--m 256,384,1040,2048]

Issue 5's offline row (W4A16 throughput no lower than bf16's) is at 0.84x: every W4A16 launch here
takes 1.4-2.6x bf16 cuBLAS's time at M = 256-2048 (BENCHMARKS.md, thirtieth session), because Triton's
``tl.dot`` takes the dequantized tile through shared memory. CUTLASS's mixed-input collective converts
the int4 operand in registers on its way to ``wgmma``. This times, per projection and row count:
``F.linear`` on the dequantized bf16 weight (cuBLAS), the engine's ``w4a16_gemm`` (its tuned default
launch), and each configuration of ``benchmarks/cuda/w4a16_cutlass_probe.cu``, all in CUDA graphs of
``--reps`` launches that cycle through enough weight copies (over 200 MB) that no launch finds its
weight in L2. Each CUTLASS result is checked against the float32 dequantize-then-matmul reference.
The weights are AutoAWQ's layout converted here (q - 8 as signed int4, K-major, CUTLASS's reordered
layout; zero = (8 - z) * scale). A probe only: nothing in the engine uses these kernels.
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
from cublaslt_sweep import _time_us  # benchmarks/cublaslt_sweep.py (this script's folder is on the path)

DEFAULT_LIB = Path(__file__).resolve().parent.parent / "build" / "cutlass_probe" / "libw4a16_cutlass_probe.so"
GROUP = 128
SHAPES = [  # name, N (out), K (in), launches per decode step (32 layers)
    ("qkv", 6144, 4096, 32),
    ("o", 4096, 4096, 32),
    ("gate_up", 28672, 4096, 32),
    ("down", 4096, 14336, 32),
]


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


def awq_weights(n: int, k: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random AutoAWQ ``qweight`` / ``qzeros`` / bf16 ``scales`` for a [K -> N] linear."""
    from hotloop.kernels.w4a16_layout import pack_int4

    gen = torch.Generator(device=dev).manual_seed(0)
    qweight = pack_int4(torch.randint(0, 16, (k, n), device=dev, generator=gen, dtype=torch.int32))
    qzeros = pack_int4(torch.randint(0, 16, (k // GROUP, n), device=dev, generator=gen, dtype=torch.int32))
    scales = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.01 + 1e-3).to(torch.bfloat16)
    return qweight, qzeros, scales


def to_cutlass(
    lib: ctypes.CDLL, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AutoAWQ tensors -> (reordered int4 weight bytes [N, K/2], scales, zeros [K/g, N] in ``dtype``)."""
    from hotloop.kernels.w4a16_layout import unpack_int4

    q = unpack_int4(qweight).to(torch.int16)  # [K, N] in [0, 15]
    z = unpack_int4(qzeros).to(torch.float32)  # [K/g, N]
    s = (q.t() - 8).contiguous()  # [N, K] in [-8, 7]
    packed = ((s[:, 0::2] & 0xF) | ((s[:, 1::2] & 0xF) << 4)).to(torch.uint8).contiguous()  # even k low
    out = torch.empty_like(packed)
    n, k = s.shape
    torch.cuda.synchronize()
    if lib.w4probe_reorder(packed.data_ptr(), out.data_ptr(), n, k) != 0:
        raise RuntimeError("w4probe_reorder failed")
    sc = scales.float()
    return out, sc.to(dtype).contiguous(), ((8.0 - z) * sc).to(dtype).contiguous()


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
    qw, qz, sc = awq_weights(n, k, dev)
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
        if sdtype not in prepared:
            prepared.clear()
            torch.cuda.empty_cache()
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
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if not Path(a.lib).is_file():
        p.error(f"--lib {a.lib}: no such file; build it with `bash benchmarks/build_cutlass_probe.sh w4a16`")
    lib = load(Path(a.lib))
    names = [lib.w4probe_config_name(c).decode() for c in range(lib.w4probe_num_configs())]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; configs: {names}", flush=True)
    rows = []
    for m in (int(v) for v in a.m.split(",")):
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
                {"device": torch.cuda.get_device_name(), "commit": commit, "configs": names, "rows": rows},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
