"""Probe: does a prompt's prefill on one CUDA stream leave room for decode steps on another?

    PYTHONPATH=$PWD python3 benchmarks/overlap_probe.py --out probe.json

Issue 3's serving mix (Llama-3-8B shape, dummy weights): about 16 requests decoding at 1k context
while 1,024-token prompts arrive 16 times a second. Today each prompt rides in one mixed step (its
1,024 rows plus the 16 decodes), which is bound by the tensor cores, while a decode step is bound by
the memory's bandwidth. This script asks whether the two kinds overlap on the GPU when they run on
two streams (NanoFlow's intra-device parallelism): it launches the prompt's prefill step on stream A
and ``K`` replays of the batch-16 decode graph on stream B, both held behind one spin kernel so that
they start together, and reports:

- the prefill's own time (its first token, TTFT's GPU part) under the overlap;
- when the K-th decode replay ends (the makespan);
- the sequential baseline on the same host: the mixed step (prompt + 16 decodes) followed by K - 1
  decode steps, which gives every request the same tokens.

With and without stream priorities (the prefill's stream high, the decode's low). A timing probe only:
the two steps share the runner's input buffers, graph pools and cuBLAS workspace, so their values
are garbage while they overlap (the amount of work is not: GEMM times do not depend on values, and
the decode graph's sequence lengths stay at about 1k). Nothing here is an engine path.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch

# benchmarks/profile_step.py (this script's folder is on the path)
from profile_step import make_step, release, time_step

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig

SPIN_CYCLES = 40_000_000  # about 20 ms at 2 GHz: covers the host's launch of both streams' work


def _ms(a: torch.cuda.Event, b: torch.cuda.Event) -> float:
    return a.elapsed_time(b)


def run_once(runner: Any, graphs: Any, prefill: Any, k: int, ctx: int, prio: bool) -> dict[str, Any]:
    """One overlapped launch: the prefill step on stream A, ``k`` decode replays on stream B."""
    lo, hi = torch.cuda.Stream.priority_range() if prio else (0, 0)  # (lowest, highest)
    sa = torch.cuda.Stream(priority=hi)
    sb = torch.cuda.Stream(priority=lo)
    torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(sa):
        torch.cuda._sleep(SPIN_CYCLES)
        e0.record(sa)
    sb.wait_stream(sa)
    ends: list[torch.cuda.Event] = []

    h, ea = None, None
    if prefill is not None:
        with torch.cuda.stream(sa):
            h = runner.launch(prefill)
            ea = torch.cuda.Event(enable_timing=True)
            ea.record(sa)
    with torch.cuda.stream(sb):
        for _ in range(k):
            graphs.run(16, ctx)
            e = torch.cuda.Event(enable_timing=True)
            e.record(sb)
            ends.append(e)
    torch.cuda.synchronize()
    if h is not None:
        runner.collect(h)
    prefill_ms = _ms(e0, ea) if ea is not None else 0.0
    decode_end = [_ms(e0, e) for e in ends]
    return {
        "prefill_ms": prefill_ms,
        "decode_end_ms": decode_end,
        "makespan_ms": max([prefill_ms, *decode_end]),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="overlap_probe.json")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--ks", default="1,2,3,4,5,6", help="decode replays on stream B")
    ap.add_argument("--prompt", type=int, default=1024)
    args = ap.parse_args()
    built = build_engine(
        "llama3-8b",
        EngineConfig(
            load_format="dummy",
            max_batch_size=256,
            session_len=4096,
            max_prefill_token_num=8192,
            disable_overlap_schedule=True,
        ),
    )
    engine = built.engine
    runner = engine.executor.runner
    graphs = runner.graphs
    ctx = 1024
    rid = [0]
    dec = make_step(engine, [], 16, ctx, rid)
    d_ms = statistics.median(
        time_step(runner, dec, args.iters)
    )  # also leaves the decode graph's buffers at 16 x 1k
    mixed = make_step(engine, [args.prompt], 16, ctx, rid)
    mixed_ms = statistics.median(time_step(runner, mixed, args.iters))
    release(engine, mixed)
    pre = make_step(engine, [args.prompt], 0, 0, rid)
    prefill_ms = statistics.median(time_step(runner, pre, args.iters))
    runner.execute(dec)  # the decode graph's buffers back at 16 x 1k
    replay = []
    for _ in range(args.iters):  # the decode graph alone, replayed on a side stream as below
        replay.append(run_once(runner, graphs, None, 4, ctx + 1, False)["makespan_ms"] / 4)
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "decode16_ms": d_ms,
        "decode16_replay_ms": statistics.median(replay),
        "mixed_ms": mixed_ms,
        "prefill_ms": prefill_ms,
        "cases": [],
    }
    print(
        f"{res['device']}: decode 16@1k {d_ms:.2f} ms (replay alone {res['decode16_replay_ms']:.2f}), "
        f"mixed 16 + {args.prompt} {mixed_ms:.2f}, prefill {args.prompt} {prefill_ms:.2f}",
        flush=True,
    )
    print(
        " prio  K | prefill ms (TTFT part) | last decode ends | makespan | sequential (mixed + (K-1) d) | gain"
    )
    for prio in (False, True):
        for k in (int(x) for x in args.ks.split(",")):
            runs = [run_once(runner, graphs, pre, k, ctx + 1, prio) for _ in range(args.iters)]
            p = statistics.median(r["prefill_ms"] for r in runs)
            last = statistics.median(r["decode_end_ms"][-1] for r in runs)
            span = statistics.median(r["makespan_ms"] for r in runs)
            seq = mixed_ms + (k - 1) * d_ms
            res["cases"].append(
                {
                    "priority": prio,
                    "k": k,
                    "prefill_ms": p,
                    "last_decode_ms": last,
                    "makespan_ms": span,
                    "sequential_ms": seq,
                }
            )
            print(
                f" {prio!s:5s} {k:2d} | {p:8.2f} | {last:8.2f} | {span:8.2f} | {seq:8.2f} | {seq / span:5.2f}x",
                flush=True,
            )
    release(engine, pre)
    release(engine, dec)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
