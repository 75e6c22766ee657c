"""Two micro-batches on two streams (``models/decode_overlap.py``) against the whole batch: the decode CUDA
graph's step at batch B and 1k context, Llama-3-8B shape, dummy weights, in one process.

    PYTHONPATH=$PWD python3 benchmarks/decode_overlap.py --out $OUT/overlap.json [--batches 256,128]

The engine is built with the defaults (its decode graphs captured whole, ``HOTLOOP_DECODE_OVERLAP``
unset). For each batch the script then captures that bucket's graph again per variant:

- ``overlap``: ``HOTLOOP_DECODE_OVERLAP=1`` (halves of B/2 rows);
- ``overlap_prio``: the same with the attention stream at the highest stream priority;
- ``overlap_carve{N}``: the same with cuBLAS told to leave N SMs free
  (``torch._C._set_sm_carveout_experimental``, read when the GEMMs are captured).

Then it replays the variants in turn (``--rounds`` rounds of ``--iters`` replays each, CUDA events: GPU
time of one replay, the LM head and argmax included, of the step the runner's ``execute`` staged), and
prints each variant's median against the floor (max of weight + KV bytes over the copy rate
measured now, FLOPs over the matmul rate measured now) and against the whole-batch graph. Each
variant's logits are compared with the whole batch's on the same step (max |diff| and greedy
agreement).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)

from profile_step import (  # noqa: E402
    AWQ_WEIGHT_BYTES,
    FLOP_PER_TOKEN,
    WEIGHT_BYTES,
    kv_bytes_per_token,
    make_step,
    release,
)
from run_gpu import measure_ceilings  # noqa: E402

from hotloop.api.build import build_engine  # noqa: E402
from hotloop.config import EngineConfig  # noqa: E402
from hotloop.engine.scheduler import SchedulerOutput  # noqa: E402
from hotloop.executor.cuda_graph import DecodeGraphs  # noqa: E402
from hotloop.models import decode_overlap as overlap  # noqa: E402


def capture_bucket(base: DecodeGraphs, bucket: int, env: dict[str, str], setup: Any = None) -> DecodeGraphs:
    """A ``DecodeGraphs`` holding ``bucket``'s graph alone, captured with ``env`` set (and ``setup()``
    run before, its return value called after)."""
    g = DecodeGraphs.__new__(DecodeGraphs)
    g.model, g.kv_caches, g.buffers = base.model, base.kv_caches, base.buffers
    g.buckets = [bucket]
    g.graphs, g.logits, g.greedy, g.short_limits, g.pool = {}, {}, {}, {}, None
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    undo = setup() if setup is not None else None
    try:
        g._capture(progress=False)
    finally:
        if undo is not None:
            undo()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return g


def high_priority_side() -> Any:
    dev = torch.cuda.current_device()
    prev = overlap._Streams._side.get(dev)
    lo, hi = torch.cuda.Stream.priority_range()
    overlap._Streams._side[dev] = torch.cuda.Stream(device=dev, priority=hi)

    def undo() -> None:
        if prev is None:
            overlap._Streams._side.pop(dev, None)
        else:
            overlap._Streams._side[dev] = prev

    return undo


def carveout(n: int) -> Any:
    def setup() -> Any:
        prev = torch._C._get_sm_carveout_experimental()
        torch._C._set_sm_carveout_experimental(n)
        return lambda: torch._C._set_sm_carveout_experimental(prev)

    return setup


def time_replays(g: DecodeGraphs, bucket: int, iters: int) -> list[float]:
    """GPU time of ``iters`` replays of ``bucket``'s graph, one at a time (the inputs the last
    ``execute`` staged: the same step again, rewriting the same K/V slots with the same values)."""
    times = []
    g.run(bucket, None)
    torch.cuda.synchronize()
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.run(bucket, None)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def halves_check(
    runner: Any, base: DecodeGraphs, out: Any, split: int, logits: torch.Tensor
) -> dict[str, Any]:
    """The two-stream graph's logits of each half against the whole-batch graph run on that half's rows
    alone (the same requests, so the same tokens and K/V): each half's chain is meant to be that of a
    batch of its size, so where the half's bucket is its own size the two agree up to the attention
    plan's rounding, and a wrong row order, rotary table or KV slot shows as a large difference."""
    res: dict[str, Any] = {}
    runner.graphs = base
    for lo, hi in ((0, split), (split, logits.shape[0])):
        sub = SchedulerOutput()
        sub.scheduled = list(out.scheduled[lo:hi])
        runner.execute(sub)
        torch.cuda.synchronize()
        b = base.bucket_for(hi - lo)
        ref = base.logits[base.key_for(b, None)][: hi - lo].float()
        got = logits[lo:hi]
        res[f"rows_{lo}_{hi}"] = {
            "bucket": b,
            "max_abs_diff": float((got - ref).abs().max()),
            "greedy_agree": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
        }
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="overlap.json")
    ap.add_argument("--batches", default="256,128")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--carveouts", default="16,32", help="SMs left free by cuBLAS in the carveout variants")
    ap.add_argument("--no-prio", action="store_true")
    ap.add_argument("--model-format", default="hf", choices=("hf", "awq"), help="awq: random int4 weights")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    ceil = measure_ceilings()
    print(f"card {torch.cuda.get_device_name()}; ceilings now: copy {ceil['copy_GBps']:.0f} GB/s, "
          f"bf16 matmul {ceil['bf16_matmul_TFLOPs']:.0f} TFLOP/s", flush=True)  # fmt: skip
    built = build_engine(
        "llama3-8b",
        EngineConfig(
            load_format="dummy",
            max_batch_size=max(batches),
            session_len=args.ctx + 256,
            max_prefill_token_num=2048,  # (no prompt runs here: fewer piecewise graphs to capture)
            disable_overlap_schedule=True,
            model_format=args.model_format,
        ),
    )
    engine = built.engine
    runner = engine.executor.runner
    base: DecodeGraphs = runner.graphs
    results: dict[str, Any] = {"ceilings": ceil, "card": torch.cuda.get_device_name(), "batches": {}}
    rid = [0]
    for batch in batches:
        bucket = base.bucket_for(batch)
        variants: dict[str, DecodeGraphs] = {"whole": base}
        variants["overlap"] = capture_bucket(base, bucket, {overlap.ENV: "1"})
        if not args.no_prio:
            variants["overlap_prio"] = capture_bucket(base, bucket, {overlap.ENV: "1"}, high_priority_side)
        for n in (int(c) for c in args.carveouts.split(",") if c):
            variants[f"overlap_carve{n}"] = capture_bucket(base, bucket, {overlap.ENV: "1"}, carveout(n))
        out = make_step(engine, [], batch, args.ctx, rid)
        # the logits of the same step, per variant (the step rewrites the same slots with the same K/V)
        ref_logits = None
        agree: dict[str, Any] = {}
        times: dict[str, list[float]] = {k: [] for k in variants}
        for name, g in variants.items():
            runner.graphs = g
            runner.execute(out)
            torch.cuda.synchronize()
            lg = g.logits[g.key_for(bucket, None)][:batch].float()
            if ref_logits is None:
                ref_logits = lg.clone()
            elif name == "overlap":
                split = bucket // 2 if bucket < 16 else max(8, bucket // 2 - (bucket // 2) % 8)
                if split < batch:
                    halves = halves_check(runner, base, out, split, lg.clone())
                    print(
                        f"batch {batch}: overlap halves against whole graphs of their rows: {halves}",
                        flush=True,
                    )
                    agree["overlap_halves"] = halves
                agree[name] = {
                    "max_abs_diff": float((lg - ref_logits).abs().max()),
                    "greedy_agree": float((lg.argmax(-1) == ref_logits.argmax(-1)).float().mean()),
                }
            else:
                agree[name] = {
                    "max_abs_diff": float((lg - ref_logits).abs().max()),
                    "greedy_agree": float((lg.argmax(-1) == ref_logits.argmax(-1)).float().mean()),
                }
        for _ in range(args.rounds):
            for name, g in variants.items():
                times[name] += time_replays(g, bucket, args.iters)
        runner.graphs = base
        release(engine, out)
        weight_bytes = WEIGHT_BYTES if args.model_format == "hf" else AWQ_WEIGHT_BYTES
        floor = 1e3 * max(
            (weight_bytes + kv_bytes_per_token(0) * batch * args.ctx) / (ceil["copy_GBps"] * 1e9),
            (FLOP_PER_TOKEN * batch + 4 * 32 * 4096 * batch * args.ctx) / (ceil["bf16_matmul_TFLOPs"] * 1e12),
        )
        whole = statistics.median(times["whole"])
        rows = {}
        for name, t in times.items():
            med = statistics.median(t)
            rows[name] = {"ms_p50": med, "ms_min": min(t), "of_floor": med / floor, "vs_whole": med / whole}
            if name in agree:
                rows[name].update(agree[name])
            extra = ""
            if name in agree:
                extra = f"  logits max|diff| {agree[name]['max_abs_diff']:.3g}, greedy agree {agree[name]['greedy_agree']:.3f}"
            print(f"batch {batch} @ {args.ctx}: {name:18s} {med:7.3f} ms (min {min(t):7.3f}), "
                  f"{med / floor:5.3f}x the floor of {floor:.2f} ms, {med / whole:5.3f}x whole{extra}",
                  flush=True)  # fmt: skip
        results["batches"][str(batch)] = {
            "floor_ms": floor,
            "rows": rows,
            "halves": agree.get("overlap_halves"),
        }
        best = min(rows, key=lambda k: rows[k]["ms_p50"])
        print(f"batch {batch}: fastest {best}", flush=True)
        results["batches"][str(batch)]["fastest"] = best
        for name, g in variants.items():  # free the extra graphs before the next batch
            if name != "whole":
                g.graphs.clear()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
