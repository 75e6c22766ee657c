"""W4A16 GEMM vs bf16 ``torch.matmul`` at Llama-3-8B layer shapes on one GPU.

For M in (1, 16, 64, 256, 2048) and each projection shape, checks and times the Triton W4A16
kernel -- the ``auto`` launch (tuned on first use, see ``kernels/w4a16_gemm.py``) and each path's
static launch (``gemv`` where M <= 4, ``splitk``, ``tiled``, ``dequant``) -- against ``x @ W`` with a dense
bf16 weight, and names per shape the smallest M at which int4 stops winning.

Times are GPU times: ``w4a16_gemm.graph_time_us`` captures 8 calls in a CUDA graph, each after a
write that flushes the L2 cache (a decode step does not find its weights in L2 either), and
subtracts the same graph without the calls; best of 3 replays. ``eager_us`` is the median
CUDA-event time of single eager calls of ``auto`` (L2 flushed, the GPU kept busy while the host
queues the call); where it exceeds the GPU time, the difference is host launch overhead, which a
CUDA graph (as in decode) removes. Then a decode projection: the four GEMMs of 8 distinct layers
at M = 1 captured in one graph and replayed, per layer, int4 against bf16. The tuner's timings of
every candidate launch are in the JSON (``tuning``). Random int4 weights: the speed does not
depend on the values.

``--jobs N`` first compiles every launch the run will use in N worker processes (Triton's cache is
shared), which saves most of the wall time of a cold run.

    python benchmarks/awq_gemm.py OUT.json [--jobs 12]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
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
LAYERS_IN_GRAPH = 8
DEVICE = "cuda"


def _weights(k: int, n: int, dtype: torch.dtype, dev: torch.device, seed: int = 0):  # type: ignore[no-untyped-def]
    from hotloop.kernels.w4a16_layout import pack_int4

    gen = torch.Generator(device=dev).manual_seed(seed)
    qweight = pack_int4(torch.randint(0, 16, (k, n), device=dev, generator=gen, dtype=torch.int32))
    qzeros = pack_int4(torch.randint(0, 16, (k // GROUP, n), device=dev, generator=gen, dtype=torch.int32))
    scales = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.01 + 1e-3).to(dtype)
    return qweight, qzeros, scales


def _launches(m: int, k: int, n: int, dev: torch.device) -> list[Any]:
    """Every launch the run will use at (m, k, n): the static paths and the tuner's candidates."""
    from hotloop.kernels import w4a16_gemm as g

    paths = ["splitk", "tiled", "dequant"] + (["gemv"] if m <= g.GEMV_MAX_M else [])
    cfgs = [g.choose_config(m, n, k, GROUP, dev, p) for p in paths]
    cfgs += [g.fit_config(t, m, n, k, GROUP, dev, w) for t, w in g.candidates(m)]
    return cfgs


def _compile_part(part: int, parts: int, dtype: torch.dtype) -> None:
    """Compile (by running once) this worker's share of the distinct launches."""
    from hotloop.kernels import w4a16_gemm as g

    dev = torch.device(DEVICE)
    items: dict[str, tuple[str, int, Any]] = {}
    for name, (k, n) in SHAPES.items():
        for m in M_VALUES:
            for cfg in _launches(m, k, n, dev):
                # split_k is a run-time argument: one compile serves every split
                key = f"{cfg.kind}{cfg.block_m if cfg.kind == 'dot' else m}{cfg.block_n}{cfg.block_k}"
                key += f"{cfg.num_warps}{cfg.num_stages}{cfg.swap_ab}{cfg.unpack}{cfg.split_k > 1}{m == 1}"
                items.setdefault(key, (name, m, cfg))
    mine = sorted(items.values(), key=lambda t: (t[0], t[1]))[part::parts]
    cache: dict[str, Any] = {}
    for name, m, cfg in mine:
        k, n = SHAPES[name]
        if name not in cache:
            cache.clear()
            cache[name] = _weights(k, n, dtype, dev)
        qweight, qzeros, scales = cache[name]
        x = torch.randn(m, k, device=dev).to(dtype)
        try:
            g.w4a16_gemm(x, qweight, qzeros, scales, GROUP, config=cfg)
        except Exception as e:  # reported again by the main run
            print(f"compile {name} m={m} {cfg}: {type(e).__name__}: {e}"[:300], flush=True)
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _precompile(jobs: int, dtype_name: str) -> None:
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "-", "--compile-part", f"{i}/{jobs}", "--dtype", dtype_name]
        )
        for i in range(jobs)
    ]
    for p in procs:
        p.wait()
    print(f"precompiled in {jobs} processes: {time.time() - t0:.0f} s", flush=True)


class EagerTimer:
    """Median CUDA-event time of single eager calls, L2 flushed before each; a short GPU spin after
    the flush lets the host queue the call before the start event is reached (as far as it can)."""

    def __init__(self, reps: int) -> None:
        self.reps = reps
        self.flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=DEVICE)

    def __call__(self, fn) -> float:  # type: ignore[no-untyped-def]
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.reps):
            self.flush.zero_()
            torch.cuda._sleep(200_000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        return statistics.median(times)


def _short(cfg: Any) -> str:
    """A launch in a few characters: kind, tile, split, warps, stages, swapped operands."""
    tile = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}"
    return (
        f"{cfg.kind}:{tile}/s{cfg.split_k}/w{cfg.num_warps}/st{cfg.num_stages}"
        + ("/swap" if cfg.swap_ab else "")
        + (f"/{cfg.unpack}" if cfg.kind == "gemv" and cfg.unpack in ("mask", "half2") else "")
    )


def _decode_graph(dtype: torch.dtype) -> dict[str, float]:
    """Per-layer time of the four GEMMs at M = 1 for LAYERS_IN_GRAPH distinct layers in one graph
    (weights 8x larger than L2, so they stream from memory as in decode)."""
    from hotloop.kernels.w4a16_gemm import w4a16_gemm

    dev = torch.device("cuda")
    layers_q, layers_d = [], []
    for i in range(LAYERS_IN_GRAPH):
        layers_q.append({name: _weights(k, n, dtype, dev, seed=i) for name, (k, n) in SHAPES.items()})
        layers_d.append(
            {name: torch.randn(n, k, device=dev, dtype=dtype) * 0.02 for name, (k, n) in SHAPES.items()}
        )
    xs = {name: torch.randn(1, k, device=dev, dtype=dtype) for name, (k, n) in SHAPES.items()}

    def run_q() -> None:
        for layer in layers_q:
            for name, (qw, qz, sc) in layer.items():
                w4a16_gemm(xs[name], qw, qz, sc, GROUP)

    def run_d() -> None:
        for layer in layers_d:
            for name, w in layer.items():
                torch.matmul(xs[name], w.t())

    out: dict[str, float] = {}
    for key, fn in (("w4a16", run_q), ("bf16", run_d)):
        times = graph_replay_us(fn)
        out[f"{key}_us_per_layer"] = round(statistics.median(times) / LAYERS_IN_GRAPH, 2)
    return out


def graph_replay_us(fn: Any, replays: int = 5) -> list[float]:
    """``fn`` run once eagerly (it tunes and compiles, and makes the split-K counters, outside the
    capture), captured in a CUDA graph, replayed once to warm up, then timed over ``replays`` replays
    (CUDA events, us each)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="JSON results file ('-' with --compile-part)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--reps", type=int, default=20, help="eager calls per eager measurement")
    ap.add_argument("--jobs", type=int, default=0, help="compile everything first in N processes")
    ap.add_argument("--compile-only", action="store_true", help="with --jobs: compile, then exit")
    ap.add_argument("--compile-part", default="", help=argparse.SUPPRESS)
    ap.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph decode projection")
    default_m = ",".join(map(str, M_VALUES))
    ap.add_argument("--m", default="", help=f"comma-separated M values (default: {default_m})")
    args = ap.parse_args()
    m_values = tuple(int(v) for v in args.m.split(",")) if args.m else M_VALUES
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("awq_gemm.py needs a CUDA GPU")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    dtype = getattr(torch, args.dtype)
    if args.compile_part:
        part, parts = map(int, args.compile_part.split("/"))
        _compile_part(part, parts, dtype)
        return
    if args.jobs:
        _precompile(args.jobs, args.dtype)
    if args.compile_only:
        return

    import triton

    from hotloop.kernels import reference
    from hotloop.kernels import w4a16_gemm as g

    dev = torch.device(DEVICE)
    eager = EagerTimer(args.reps)
    gpu_time = partial(g.graph_time_us, device=dev)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    report: dict[str, Any] = {
        "benchmark": "awq_gemm",
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "host": platform.platform(),
        "dtype": args.dtype,
        "group_size": GROUP,
        "timing": "GPU time: graph of 8 calls, L2 flushed before each, less the flushes, best of 3",
        "rows": rows,
    }

    def save() -> None:
        report["tuning"] = {
            f"{key[3]}x{key[4]} m<={key[2]} {str(key[1]).removeprefix('torch.')}": [
                {"cfg": str(c), "us": round(t, 2)} for c, t in sorted(v, key=lambda ct: ct[1])
            ]
            for key, v in g.tuning_log.items()
        }
        out_path.write_text(json.dumps(report, indent=2) + "\n")

    header = (
        f"{'shape':<14}{'M':>6}{'bf16 us':>9}{'w4a16':>8}{'eager':>8}{'gemv':>8}{'splitk':>8}{'tiled':>8}{'dequant':>8}"
        f"{'speedup':>8}{'TB/s':>6}  auto launch"
    )
    lines = [header]
    print(header, flush=True)
    for name, (k, n) in SHAPES.items():
        qweight, qzeros, scales = _weights(k, n, dtype, dev)
        w_dense = reference.w4a16_dequantize(qweight, qzeros, scales, GROUP).t().contiguous()  # [n, k]
        weight_bytes = k * n // 2 + scales.numel() * scales.element_size() + qzeros.numel() * 4
        for m in m_values:
            x = torch.randn(m, k, device=dev).to(dtype)
            want = x.float() @ w_dense.float().t()
            w_t = w_dense.t()
            times: dict[str, float] = {"bf16": gpu_time(partial(torch.matmul, x, w_t))}
            errors: dict[str, float] = {}
            paths = ["auto", "splitk", "tiled", "dequant"] + (["gemv"] if m <= g.GEMV_MAX_M else [])
            for path in paths:
                key = "w4a16" if path == "auto" else path
                try:
                    got = g.w4a16_gemm(x, qweight, qzeros, scales, GROUP, path=path).float()  # auto: tunes
                    errors[key] = float((got - want).abs().max() / want.abs().max())
                    times[key] = gpu_time(partial(g.w4a16_gemm, x, qweight, qzeros, scales, GROUP, path=path))
                except Exception as e:
                    print(f"{name} m={m} {path} failed: {type(e).__name__}: {e}"[:300], flush=True)
            times["eager"] = eager(partial(g.w4a16_gemm, x, qweight, qzeros, scales, GROUP))
            auto = g.plan(x, qweight, qzeros, scales, GROUP)
            row = {
                "shape": name,
                "k": k,
                "n": n,
                "m": m,
                "us": {key: round(v, 2) for key, v in times.items()},
                "speedup_vs_bf16": round(times["bf16"] / max(times["w4a16"], 1e-3), 3)
                if "w4a16" in times
                else None,
                "w4a16_weight_tbps": round(weight_bytes / (max(times["w4a16"], 1e-3) * 1e-6) / 1e12, 3)
                if "w4a16" in times
                else None,
                "auto_config": str(auto),
                "max_rel_err": errors,
            }
            rows.append(row)
            us = row["us"]
            bad = any(v > 2e-2 for v in errors.values())
            nan = float("nan")
            line = (
                f"{name:<14}{m:>6}{us['bf16']:>9.1f}{us.get('w4a16', nan):>8.1f}{us.get('eager', nan):>8.1f}"
                f"{us.get('gemv', nan):>8.1f}{us.get('splitk', nan):>8.1f}{us.get('tiled', nan):>8.1f}"
                f"{us.get('dequant', nan):>8.1f}{row['speedup_vs_bf16'] or nan:>8.2f}{row['w4a16_weight_tbps'] or nan:>6.2f}  {_short(auto)}"
                + ("  (check failed!)" if bad else "")
            )
            lines.append(line)
            print(line, flush=True)
            save()
        torch.cuda.empty_cache()

    crossover = {}
    for name in SHAPES:
        losing = [r["m"] for r in rows if r["shape"] == name and (r["speedup_vs_bf16"] or 0) < 1.0]
        crossover[name] = min(losing) if losing else None
    report["int4_stops_winning_at_m"] = crossover
    m1 = {r["shape"]: r["us"] for r in rows if r["m"] == 1}
    report["decode_m1_sum_us"] = {
        key: round(sum(m1[s].get(key, float("nan")) for s in SHAPES), 1) for key in ("bf16", "w4a16")
    }
    if not args.no_graph:
        try:
            report["decode_graph"] = _decode_graph(dtype)
        except Exception as e:
            report["decode_graph"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    report["table"] = lines
    save()
    print("\ntuner: candidates per (N x K, M bucket), fastest first (GPU us)")
    for key, entries in g.tuning_log.items():
        ranked = sorted(entries, key=lambda ct: ct[1])
        print(
            f"  {key[3]}x{key[4]} m<={min(key[2], 4096)}: "
            + "  ".join(f"{t:.1f} {_short(c)}" for c, t in ranked)
        )
    print("\n" + "\n".join(lines))
    print("smallest M where int4 stops winning:", crossover)
    print("M=1 sum of the four GEMMs (GPU us):", report["decode_m1_sum_us"])
    print("decode graph, four GEMMs per layer:", report.get("decode_graph"))


if __name__ == "__main__":
    main()
