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

3. The rotary embedding and KV write fused into the q/k/v GEMV (``dense_gemv_qkv_rope``, over a
   grid of launches) against the q/k/v GEMV followed by ``rotary_kv_write``.
4. The LM head: ``F.linear(x, W).float()`` (cuBLAS and a cast) against ``dense_gemv`` storing
   float32 logits, over a few launches (2 distinct weights per graph: each is larger than the L2).

Launches use programmatic dependent launch where the GPU and Triton have it (``HOTLOOP_PDL``);
the fused layer chain is also timed without it.

GPU times are CUDA-graph replays (median of 10) with no L2 flush: the distinct weights exceed the
L2, as a decode step's do. (An L2 flush before each call, as ``w4a16_gemm.graph_time_us`` does,
added about 10 us to a 56 us call in an earlier version of this script: the flush's dirty lines
are written back while the next kernel runs.)

    python benchmarks/dense_gemv.py OUT.json [--sections proj,layer,rope,lm_head]
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
# model -> query heads, KV heads, head dim, vocabulary
HEADS = {"llama3-8b": (32, 8, 128, 128256), "smollm2-135m": (9, 3, 64, 49152)}
ROPE_GRID = [(p, bk, w) for p in (2, 4, 8, 16) for bk, w in ((256, 2), (512, 4), (1024, 4), (512, 8))]
LM_HEAD_GRID = [(bn, bk, w) for bn in (2, 4, 8, 16) for bk, w in ((256, 2), (512, 4), (1024, 4), (1024, 8))]
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


# a short K (SmolLM2's 576 and 1536) also takes narrow steps over many rows a program, as the LM head
# does best (64 rows, 64-wide steps: benchmarks/results/gpu_2026-12-02)
SHORT_K_GRID = [(bn, bk, w) for bn in (8, 16, 32, 64) for bk in (64, 128) for w in (2, 4)]
COLD_BYTES = 128 << 20  # the distinct weights of one graph together: more than the H200's 50 MB L2


def time_projection(
    name: str,
    n: int,
    k: int,
    f: dict[str, bool],
    dev: torch.device,
    bw: float,
    copies: int = 8,
    short_k_only: bool = False,
) -> dict[str, Any]:
    """Each launch over ``copies`` distinct weights back to back in one graph (as a decode step
    runs the layers: cold weights, no flush in between), per call; small weights take more copies,
    so that together they exceed the L2 (``COLD_BYTES``), as a step's 30 layers do.
    ``short_k_only``: ``SHORT_K_GRID`` and the default launch alone."""
    from hotloop.kernels import reference
    from hotloop.kernels import rms_norm as rn
    from hotloop.kernels import silu_and_mul as sm
    from hotloop.kernels.dense_gemv import GemvConfig, default_config, dense_gemv

    dt = torch.bfloat16
    silu, norm, res = f.get("silu", False), f.get("norm", False), f.get("res", False)
    rows = 2 * n if silu else n
    copies = max(copies, min(128, -(-COLD_BYTES // (rows * k * 2))))
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
    d = default_config(n, k, silu, norm)
    if short_k_only:
        launches = [(*c, True) for c in SHORT_K_GRID] + [(d.block_n, d.block_k, d.num_warps, d.evict_first)]
    else:
        grid = GRID + (SHORT_K_GRID if k <= 2048 else [])
        launches = [(*c, True) for c in grid] + [(*c, False) for c in NO_EVICT]
    for bn, bk, warps, evict in launches:
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


def time_rope(model: str, dev: torch.device, bw: float, copies: int = 8) -> dict[str, Any]:
    """q/k/v with the input norm, then ``rotary_kv_write`` (two launches), against
    ``dense_gemv_qkv_rope`` (one), per call over ``copies`` distinct weights; decode at position 300."""
    from hotloop.kernels import reference
    from hotloop.kernels.dense_gemv import GemvConfig, dense_gemv, dense_gemv_qkv_rope, rope_default_config
    from hotloop.kernels.rotary_kv_write import rotary_kv_write

    dt = torch.bfloat16
    hidden = MODELS[model][0]
    H, KV, D, _ = HEADS[model]
    rows = (H + 2 * KV) * D
    x = torch.randn(1, hidden, device=dev).to(dt)
    ws = [(torch.randn(rows, hidden, device=dev) / hidden**0.5).to(dt) for _ in range(copies)]
    nw = (torch.rand(hidden, device=dev) + 0.5).to(dt)
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=dev).float() / D))
    ang = torch.tensor([[300.0]], device=dev) * inv[None, :]
    cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
    slots = torch.tensor([300], dtype=torch.int64, device=dev)
    kc = torch.zeros(8, 64, KV, D, dtype=dt, device=dev)
    vc = torch.zeros_like(kc)
    kw: dict[str, Any] = {"norm_weight": nw, "eps": 1e-5, "cos": cos, "sin": sin, "slot_mapping": slots,
                          "k_cache": kc, "v_cache": vc, "num_heads": H, "num_kv_heads": KV}  # fmt: skip
    kr, vr = torch.zeros_like(kc), torch.zeros_like(vc)
    q_ref = reference.fused_qkv_rope(x, ws[0], None, **{**kw, "k_cache": kr, "v_cache": vr})

    def unfused() -> None:
        for w in ws:
            qkv = dense_gemv(x, w, norm_weight=nw, eps=1e-5)
            q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
            rotary_kv_write(q.view(1, H, D), k.view(1, KV, D), v.view(1, KV, D), cos, sin, kc, vc, slots)

    timed = []
    for p, bk, warps in ROPE_GRID:
        cfg = GemvConfig(p, bk, warps)
        q = dense_gemv_qkv_rope(x, ws[0], None, config=cfg, **kw)
        err = float((q.float() - q_ref.float()).abs().max() / q_ref.float().abs().max())

        def fused(cfg: GemvConfig = cfg) -> None:
            for w in ws:
                dense_gemv_qkv_rope(x, w, None, config=cfg, **kw)

        timed.append(
            {"pairs": p, "block_k": bk, "num_warps": warps, "rel_err": err, "us": graph_us(fused, copies)}
        )
    d = rope_default_config(hidden)
    default = next(
        t for t in timed if (t["pairs"], t["block_k"], t["num_warps"]) == (d.block_n, d.block_k, d.num_warps)
    )
    return {
        "floor_us": rows * hidden * 2 / bw * 1e6,
        "qkv_then_rotary_kv_write_us": graph_us(unfused, copies),
        "best": min(timed, key=lambda t: t["us"]),
        "default": default,
        "grid": timed,
    }


def time_lm_head(model: str, dev: torch.device, bw: float, copies: int = 2) -> dict[str, Any]:
    """The LM head at M = 1: cuBLAS then a cast to float32, against ``dense_gemv`` storing float32."""
    from hotloop.kernels.dense_gemv import GemvConfig, dense_gemv, lm_head_config

    dt = torch.bfloat16
    hidden = MODELS[model][0]
    vocab = HEADS[model][3]
    x = torch.randn(1, hidden, device=dev).to(dt)
    ws = [(torch.randn(vocab, hidden, device=dev) / hidden**0.5).to(dt) for _ in range(copies)]
    ref = torch.nn.functional.linear(x, ws[0]).float()

    def cublas() -> None:
        for w in ws:
            torch.nn.functional.linear(x, w).float()

    grid = (
        LM_HEAD_GRID
        if hidden > 2048
        else [
            (bn, bk, w)
            for bn in (2, 4, 8, 16, 32, 64)
            for bk in (64, 128, 256, next_pow2(hidden))
            for w in (2, 4, 8)
            if bn * bk <= 16384 and bn * bk >= 32 * w * 4
        ]
    )
    timed = []
    for bn, bk, warps in grid:
        cfg = GemvConfig(bn, bk, warps)
        got = dense_gemv(x, ws[0], config=cfg, out_dtype=torch.float32)
        err = float((got - ref).abs().max() / ref.abs().max())

        def fused(cfg: GemvConfig = cfg) -> None:
            for w in ws:
                dense_gemv(x, w, config=cfg, out_dtype=torch.float32)

        timed.append(
            {"block_n": bn, "block_k": bk, "num_warps": warps, "rel_err": err, "us": graph_us(fused, copies)}
        )
    d = lm_head_config(hidden)
    default = next(
        (
            t
            for t in timed
            if (t["block_n"], t["block_k"], t["num_warps"]) == (d.block_n, d.block_k, d.num_warps)
        ),
        None,
    )
    return {
        "floor_us": vocab * hidden * 2 / bw * 1e6,
        "cublas_and_cast_us": graph_us(cublas, copies),
        "best": min(timed, key=lambda t: t["us"]),
        "default": default,
        "grid": timed,
    }


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument(
        "--sections", default="proj,layer,rope,lm_head", help="comma-separated: proj,layer,rope,lm_head"
    )
    ap.add_argument("--short-k-only", action="store_true", help="proj: SHORT_K_GRID and the default only")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    args = ap.parse_args()
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        ap.error(f"--models: {unknown} not among {list(MODELS)}")
    sections = set(args.sections.split(","))
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
    for model, (hidden, qkv, ffn) in ((m, MODELS[m]) for m in args.models.split(",")):
        rows = []
        entry: dict[str, Any] = {}
        result["models"][model] = entry
        if "rope" in sections:
            rope = entry["rope"] = time_rope(model, dev, bw)
            b, d = rope["best"], rope["default"]
            print(
                f"{model:13s} qkv+rope floor {rope['floor_us']:6.1f} us  qkv then rotary_kv_write "
                f"{rope['qkv_then_rotary_kv_write_us']:6.1f}  fused default {d['us']:6.1f} "
                f"({d['pairs']},{d['block_k']},{d['num_warps']})  best {b['us']:6.1f} "
                f"({b['pairs']},{b['block_k']},{b['num_warps']}) err {b['rel_err']:.1e}",
                flush=True,
            )
        if "lm_head" in sections:
            head = entry["lm_head"] = time_lm_head(model, dev, bw)
            b, d = head["best"], head["default"]
            dtxt = "-" if d is None else f"{d['us']:6.1f} ({d['block_n']},{d['block_k']},{d['num_warps']})"
            print(
                f"{model:13s} lm_head floor {head['floor_us']:6.1f} us  cuBLAS + cast "
                f"{head['cublas_and_cast_us']:6.1f}  dense_gemv default {dtxt}  best {b['us']:6.1f} "
                f"({b['block_n']},{b['block_k']},{b['num_warps']}) err {b['rel_err']:.1e}",
                flush=True,
            )
        if "proj" not in sections and "layer" not in sections:
            continue
        for name, n, k, f in projections(hidden, qkv, ffn) if "proj" in sections else []:
            row = time_projection(name, n, k, f, dev, bw, short_k_only=args.short_k_only)
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
        entry["projections"] = rows
        if "layer" not in sections:
            continue
        layer = entry["layer"] = time_layers(hidden, qkv, ffn, dev, bw)
        print(
            f"{model:13s} layer: unfused {layer['unfused_us_per_layer']:.1f} us, fused "
            f"{layer['fused_us_per_layer']:.1f} us (PDL {layer['pdl']}; "
            f"{layer['fused_no_pdl_us_per_layer']:.1f} without), "
            f"gate/up by cuBLAS {layer['hybrid_gate_up_cublas_us_per_layer']:.1f}"
            f" us, floor {layer['floor_us_per_layer']:.1f} us",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
