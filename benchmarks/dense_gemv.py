"""The one-row fused dense GEMV (``kernels/dense_gemv.py``) against cuBLAS and the unfused kernels.

For the Llama-3-8B and SmolLM2-135M decoder shapes at M = 1 (batch-1 decode), in bf16:

1. Per projection: ``F.linear`` (cuBLAS) alone, the unfused kernels the decoder launches for it
   (add + RMSNorm before qkv and gate/up, SiLU after gate/up), and the fused kernel with its fusion
   (input norm for qkv, residual for o and down, norm + SiLU for gate/up) for every launch in a
   grid of ``GemvConfig``; the best and the default are named. Each over 8 distinct weights back
   to back in one CUDA graph, per call. The floor is the weight bytes over the copy bandwidth
   measured in the same run.
2. Per layer (attention left out): the unfused chain as ``LlamaDecoderLayer.forward`` launches it
   (add + RMSNorm, qkv, o, add + RMSNorm, gate/up, SiLU, down: 7 kernels, cuBLAS adding a split-K
   reduction to some) against the fused chain (``forward_one_row``: 4 launches) and a hybrid
   (gate/up by cuBLAS with its norm and SiLU kernels, the rest fused), over 8 distinct layers
   captured in one CUDA graph, per layer.

Launches use programmatic dependent launch where the GPU and Triton have it (``HOTLOOP_PDL``);
the fused layer chain is also timed without it.

GPU times are CUDA-graph replays (median of 10) with no L2 flush: the distinct weights exceed the
L2, as a decode step's do. (An L2 flush before each call, as ``w4a16_gemm.graph_time_us`` does,
added about 10 us to a 56 us call in an earlier version of this script: the flush's dirty lines
are written back while the next kernel runs.)

    python benchmarks/dense_gemv.py OUT.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# model -> hidden, qkv out, ffn
MODELS = {"llama3-8b": (4096, 6144, 14336), "smollm2-135m": (576, 960, 1536)}
GRID = [
    (bn, bk, w)
    for bn, (bk, w) in itertools.product((2, 4, 8, 16), ((256, 2), (512, 4), (1024, 4), (1024, 8), (2048, 8)))
] + [(1, 2048, 8), (2, 4096, 8), (4, 512, 2), (1, 1024, 4)]
# the same launches without the weights' evict-first hint
NO_EVICT = [(2, 2048, 8), (4, 256, 2), (2, 1024, 4), (4, 512, 2), (8, 1024, 4)]


def copy_bandwidth(dev: torch.device) -> float:
    """Device-to-device copy of 1 GiB, bytes read + written per second (best of 5)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(6):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) / 1e3)
    return 2 * a.numel() / best


def projections(hidden: int, qkv: int, ffn: int) -> list[tuple[str, int, int, dict[str, bool]]]:
    return [
        ("qkv", qkv, hidden, {"norm": True}),
        ("o", hidden, hidden, {"res": True}),
        ("gate_up", ffn, hidden, {"norm": True, "silu": True}),
        ("down", hidden, ffn, {"res": True}),
    ]


def graph_us(fn: Any, calls: int, reps: int = 10) -> float:
    """Median GPU time per call of ``fn()`` (which makes ``calls`` calls), captured in a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000 / calls)
    return sorted(times)[reps // 2]


def time_projection(
    name: str, n: int, k: int, f: dict[str, bool], dev: torch.device, bw: float, copies: int = 8
) -> dict[str, Any]:
    """Each launch over ``copies`` distinct weights back to back in one graph (as a decode step
    runs the layers: cold weights, no flush in between), per call."""
    from hotloop.kernels import reference
    from hotloop.kernels import rms_norm as rn
    from hotloop.kernels import silu_and_mul as sm
    from hotloop.kernels.dense_gemv import GemvConfig, default_config, dense_gemv

    dt = torch.bfloat16
    silu, norm, res = f.get("silu", False), f.get("norm", False), f.get("res", False)
    rows = 2 * n if silu else n
    x = torch.randn(1, k, device=dev).to(dt)
    ws = [(torch.randn(rows, k, device=dev) / k**0.5).to(dt) for _ in range(copies)]
    nw = (torch.rand(k, device=dev) + 0.5).to(dt) if norm else None
    r = torch.randn(1, n, device=dev).to(dt) if res else None
    kw: dict[str, Any] = {"norm_weight": nw, "eps": 1e-5, "residual": r, "silu": silu}
    ref = reference.fused_linear(
        x.float(),
        ws[0].float(),
        norm_weight=None if nw is None else nw.float(),
        eps=1e-5,
        residual=None if r is None else r.float(),
        silu=silu,
    )
    floor_us = rows * k * 2 / bw * 1e6

    def cublas() -> None:
        for w in ws:
            F.linear(x, w)

    def unfused() -> None:
        # what LlamaDecoderLayer.forward launches for this projection: the add + norm before qkv
        # and gate/up, SiLU after gate/up; the residual add rides in the next norm
        for w in ws:
            h = rn.rms_norm(x, nw, 1e-5, x)[0] if nw is not None else x
            y = F.linear(h, w)
            if silu:
                sm.silu_and_mul(y)

    timed = []
    for bn, bk, warps, evict in [(*c, True) for c in GRID] + [(*c, False) for c in NO_EVICT]:
        cfg = GemvConfig(bn, bk, warps, evict)
        out = dense_gemv(x, ws[0], config=cfg, **kw)
        err = float((out.double() - ref.double()).norm() / ref.double().norm())

        def fused(cfg: GemvConfig = cfg) -> None:
            for w in ws:
                dense_gemv(x, w, config=cfg, **kw)

        timed.append(
            {"block_n": bn, "block_k": bk, "num_warps": warps, "evict_first": evict, "rel_err": err,
             "us": graph_us(fused, copies)}
        )  # fmt: skip
    best = min(timed, key=lambda t: t["us"])
    d = default_config(n, k, silu, norm)
    want = (d.block_n, d.block_k, d.num_warps, d.evict_first)
    default = next(t for t in timed if (t["block_n"], t["block_k"], t["num_warps"], t["evict_first"]) == want)
    return {
        "proj": name,
        "n": n,
        "k": k,
        "fusion": f,
        "floor_us": floor_us,
        "cublas_linear_us": graph_us(cublas, copies),
        "unfused_us": graph_us(unfused, copies),
        "best": best,
        "default": default,
        "grid": timed,
    }


def time_layers(
    hidden: int, qkv: int, ffn: int, dev: torch.device, bw: float, layers: int = 8
) -> dict[str, Any]:
    from hotloop.kernels import pdl
    from hotloop.kernels import rms_norm as rn
    from hotloop.kernels import silu_and_mul as sm
    from hotloop.kernels.dense_gemv import dense_gemv

    dt = torch.bfloat16

    def mk(rows: int, k: int) -> torch.Tensor:
        return (torch.randn(rows, k, device=dev) / k**0.5).to(dt)

    ws = [(mk(qkv, hidden), mk(hidden, hidden), mk(2 * ffn, hidden), mk(hidden, ffn)) for _ in range(layers)]
    n1 = (torch.rand(hidden, device=dev) + 0.5).to(dt)
    n2 = (torch.rand(hidden, device=dev) + 0.5).to(dt)
    h0 = torch.randn(1, hidden, device=dev).to(dt)
    o_in = torch.randn(1, hidden, device=dev).to(dt)  # stands in for attention's output

    def unfused() -> None:
        h, res = h0, h0
        for wq, wo, wgu, wd in ws:
            x, res = rn.rms_norm(h, n1, 1e-5, res)
            F.linear(x, wq)
            o = F.linear(o_in, wo)
            x, res = rn.rms_norm(o, n2, 1e-5, res)
            h = F.linear(sm.silu_and_mul(F.linear(x, wgu)), wd)

    def fused() -> None:
        h = h0
        for wq, wo, wgu, wd in ws:
            dense_gemv(h, wq, norm_weight=n1, eps=1e-5)
            h = dense_gemv(o_in, wo, residual=h)
            a = dense_gemv(h, wgu, norm_weight=n2, eps=1e-5, silu=True)
            h = dense_gemv(a, wd, residual=h)

    def hybrid() -> None:  # gate/up through cuBLAS (its own norm and SiLU kernels), the rest fused
        h = h0
        for wq, wo, wgu, wd in ws:
            dense_gemv(h, wq, norm_weight=n1, eps=1e-5)
            h = dense_gemv(o_in, wo, residual=h)
            a = sm.silu_and_mul(F.linear(rn.rms_norm(h, n2, 1e-5)[0], wgu))
            h = dense_gemv(a, wd, residual=h)

    variants = (("unfused", unfused), ("fused", fused), ("hybrid_gate_up_cublas", hybrid))
    out = {f"{name}_us_per_layer": graph_us(fn, layers) for name, fn in variants}
    out["pdl"] = pdl.pdl_enabled(dev)
    os.environ["HOTLOOP_PDL"] = "0"  # the fused chain again, each launch waiting for the one before
    pdl.reset()
    out["fused_no_pdl_us_per_layer"] = graph_us(fused, layers)
    del os.environ["HOTLOOP_PDL"]
    pdl.reset()
    weight_bytes = 2 * (qkv * hidden + hidden * hidden + 2 * ffn * hidden + hidden * ffn)
    out["floor_us_per_layer"] = weight_bytes / bw * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "host": platform.node(),
        "copy_GBps": bw / 1e9,
        "models": {},
    }
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    for model, (hidden, qkv, ffn) in MODELS.items():
        rows = []
        for name, n, k, f in projections(hidden, qkv, ffn):
            row = time_projection(name, n, k, f, dev, bw)
            rows.append(row)
            b, d = row["best"], row["default"]
            print(
                f"{model:13s} {name:8s} floor {row['floor_us']:7.1f} us  cuBLAS {row['cublas_linear_us']:7.1f}  "
                f"unfused {row['unfused_us']:7.1f}  "
                f"fused default {d['us']:7.1f} ({d['block_n']},{d['block_k']},{d['num_warps']})  "
                f"best {b['us']:7.1f} ({b['block_n']},{b['block_k']},{b['num_warps']},{b['evict_first']}) "
                f"err {b['rel_err']:.1e}",
                flush=True,
            )
        layer = time_layers(hidden, qkv, ffn, dev, bw)
        print(
            f"{model:13s} layer: unfused {layer['unfused_us_per_layer']:.1f} us, fused "
            f"{layer['fused_us_per_layer']:.1f} us (PDL {layer['pdl']}; "
            f"{layer['fused_no_pdl_us_per_layer']:.1f} without), "
            f"gate/up by cuBLAS {layer['hybrid_gate_up_cublas_us_per_layer']:.1f}"
            f" us, floor {layer['floor_us_per_layer']:.1f} us",
            flush=True,
        )
        result["models"][model] = {"projections": rows, "layer": layer}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
