"""Where one engine step's GPU time goes: prefill, mixed and decode steps of the Llama-3-8B shape.

    PYTHONPATH=$PWD python3 benchmarks/profile_step.py --out $OUT/profile.json

Builds the model with dummy weights, hands the runner hand-made steps (no scheduler), times each
with CUDA events (median of repeats, after warm-up) and profiles one repeat with torch.profiler,
grouping GPU kernel time by kernel name. Prints, per step kind: ms, the floor (max of FLOPs over
the matmul rate and bytes over the bandwidth from GPU.md) and the top kernels.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from typing import Any

import torch

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.engine.request import Request
from hotloop.engine.scheduler import ScheduledRequest, SchedulerOutput
from hotloop.kernels import kv_quant
from hotloop.messages import GenerationConfig

BW = 4229e9
FLOPS = 783e12
WEIGHT_BYTES = 15.0e9
AWQ_WEIGHT_BYTES = 4.65e9  # W4A16, group 128, bf16 lm_head (GPU.md)
FLOP_PER_TOKEN = 16e9


def kv_bytes_per_token(policy: int) -> int:
    """Cache bytes one token takes over the 32 layers' K and V (8 KV heads of 128, bf16 scales)."""
    return 32 * 8 * 2 * kv_quant.row_bytes(128, policy, 2)


PROFILE_HOST = (
    "prefill 1x128",
    "mixed 32 decodes@1k + 1x256",
    "mixed 16 decodes@1k + 1x256",
    "mixed 16 decodes@1k + 1x512",
    "mixed 16 decodes@1k + 1x1024",  # (1,040 rows: eager pieces over them with HOTLOOP_PIECEWISE_EAGER_FROM)
    "decode 256@1k (graph)",
)


def make_step(engine: Any, prefills: list[int], decodes: int, ctx: int, rid: list[int]) -> SchedulerOutput:
    """``prefills``: prompt lengths computed from scratch; ``decodes``: requests at ``ctx`` tokens
    decoding one more (their earlier K/V is whatever the pool holds: timing does not depend on it)."""
    bm = engine.block_manager
    out = SchedulerOutput()
    params = GenerationConfig(max_new_tokens=4, ignore_eos=True)
    g = torch.Generator().manual_seed(len(rid))
    for _ in range(decodes):  # decodes first, as the scheduler orders a mixed step
        rid[0] += 1
        r = Request(f"d{rid[0]}", torch.randint(0, 128000, (ctx + 1,), generator=g).tolist(), params)
        bm.allocate(r, ctx + 1)
        r.num_computed_tokens = ctx
        out.scheduled.append(ScheduledRequest.of(r, 1))
    for n in prefills:
        rid[0] += 1
        r = Request(f"p{rid[0]}", torch.randint(0, 128000, (n,), generator=g).tolist(), params)
        bm.allocate(r, n)
        out.scheduled.append(ScheduledRequest.of(r, n))
    return out


def release(engine: Any, out: SchedulerOutput) -> None:
    for s in out.scheduled:
        engine.block_manager.free(s.request)


def time_step(runner: Any, out: SchedulerOutput, iters: int) -> list[float]:
    for _ in range(2):
        runner.execute(out)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        runner.execute(out)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def host_profile(runner: Any, out: SchedulerOutput, top: int = 25) -> tuple[float, str]:
    """Host time of launching the step (``launch`` does not wait for the GPU), median of 5, and a
    cProfile of one launch, sorted by own time."""
    import cProfile
    import io
    import pstats
    import time

    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h = runner.launch(out)
        times.append((time.perf_counter() - t0) * 1e3)
        runner.collect(h)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    h = runner.launch(out)
    prof.disable()
    runner.collect(h)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return statistics.median(times), buf.getvalue()


def kernel_table(runner: Any, out: SchedulerOutput, top: int = 12) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.execute(out)
        torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.key_averages():
        t = e.self_device_time_total
        if t and not e.self_cpu_time_total:  # device-side rows: kernels and copies
            per[e.key][0] += t
            per[e.key][1] += e.count
    total = sum(v[0] for v in per.values()) or 1.0
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])[:top]
    return [
        {"kernel": k[:90], "ms": v[0] / 1e3, "calls": int(v[1]), "share": v[0] / total} for k, v in rows
    ] + [
        {
            "kernel": "TOTAL (profiled)",
            "ms": total / 1e3,
            "calls": sum(int(v[1]) for v in per.values()),
            "share": 1.0,
        }
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="profile.json")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--quant-policy", type=int, choices=(0, 4, 8), default=0, help="KV cache policy")
    ap.add_argument("--cases", default=None, help="comma-separated substrings: run only matching cases")
    ap.add_argument("--model-format", default="hf", choices=("hf", "awq"), help="awq: random int4 weights")
    ap.add_argument("--session-len", type=int, default=4096, help="5120 for the kvbound cases")
    ap.add_argument("--max-batch-size", type=int, default=256, help="512 for the kvbound cases")
    ap.add_argument("--max-prefill-token-num", type=int, default=8192, help="16896 for the kvbound cases")
    args = ap.parse_args()
    weight_bytes = WEIGHT_BYTES if args.model_format == "hf" else AWQ_WEIGHT_BYTES
    built = build_engine(
        "llama3-8b",
        EngineConfig(
            load_format="dummy",
            max_batch_size=args.max_batch_size,
            session_len=args.session_len,
            max_prefill_token_num=args.max_prefill_token_num,
            disable_overlap_schedule=True,
            quant_policy=args.quant_policy,
            model_format=args.model_format,
        ),
    )
    engine = built.engine
    runner = engine.executor.runner
    rid = [0]
    cases = {
        "prefill 1x1024": ([1024], 0, 0),
        "prefill 1x128": ([128], 0, 0),
        # the GEMMs' row tiles: a 1,024-token prompt plus 16 decodes is 1,040 rows, one row past
        # eight 128-row tiles; 1,008 + 16 is exactly 1,024
        "prefill 1x1040": ([1040], 0, 0),
        "prefill 1x1008": ([1008], 0, 0),
        "prefill 4x1024": ([1024] * 4, 0, 0),
        "prefill 8x1024": ([1024] * 8, 0, 0),
        "mixed 32 decodes@1k + 1x1024": ([1024], 32, 1024),
        "mixed 32 decodes@1k + 1x256": ([256], 32, 1024),
        # the issue-3 serving mix: ~16 running decodes, one arriving 1,024-token prompt, chunked or not
        "mixed 16 decodes@1k + 1x1024": ([1024], 16, 1024),
        # two prompts arriving together: 2,064 rows, padded to the 2,304 bucket
        "mixed 16 decodes@1k + 2x1024": ([1024] * 2, 16, 1024),
        "mixed 16 decodes@1k + 1x1008": ([1008], 16, 1024),
        "mixed 16 decodes@1k + 1x600": ([600], 16, 1024),  # 616 tokens: 624 rows eagerly, or the 640 bucket
        "mixed 16 decodes@1k + 1x512": ([512], 16, 1024),
        "mixed 16 decodes@1k + 1x384": ([384], 16, 1024),
        "mixed 16 decodes@1k + 1x256": ([256], 16, 1024),
        "mixed 16 decodes@1k + 1x128": ([128], 16, 1024),
        "decode 16@1k (graph)": ([], 16, 1024),
        "decode 32@1k (graph)": ([], 32, 1024),
        "decode 256@1k (graph)": ([], 256, 1024),
        "decode 1@128 (graph)": ([], 1, 128),
        "decode 1@384 (graph)": ([], 1, 384),  # issue 6's batch-1 run, mid-way (128 in / 512 out)
        # issue 6's KV-bound run (4096 in / 1024 out, 16,384-token prefill budget): the steady
        # decode of the running sequences (about 160 fit with fp16 KV, 300 with int8), and a step
        # that also admits four new prompts
        "kvbound decode 160@4608 (graph)": ([], 160, 4608),
        "kvbound decode 300@4608 (graph)": ([], 300, 4608),
        "kvbound mixed 160@4608 + 4x4096": ([4096] * 4, 160, 4608),
        "kvbound mixed 300@4608 + 4x4096": ([4096] * 4, 300, 4608),
    }
    if args.cases:
        want = args.cases.split(",")
        cases = {k: v for k, v in cases.items() if any(w in k for w in want)}
    results = {}
    bm = engine.block_manager
    for name, (pf, dec, ctx) in cases.items():
        need = dec * bm.blocks_for(ctx + 1) + sum(bm.blocks_for(n) for n in pf)
        if need > bm.num_free_blocks or dec + len(pf) > args.max_batch_size:
            print(f"{name:34s} skipped: {need} blocks ({bm.num_free_blocks} free), {dec + len(pf)} rows")
            continue
        out = make_step(engine, pf, dec, ctx, rid)
        ms = time_step(runner, out, args.iters)
        tokens = sum(pf) + dec
        attn_flop = sum(4 * 32 * 4096 * n * n / 2 for n in pf) + 4 * 32 * 4096 * dec * ctx
        floor_ms = 1e3 * max(
            (FLOP_PER_TOKEN * tokens + attn_flop) / FLOPS,
            (weight_bytes + kv_bytes_per_token(args.quant_policy) * dec * ctx) / BW,
        )
        med = statistics.median(ms)
        results[name] = {
            "ms_p50": med,
            "ms_min": min(ms),
            "tokens": tokens,
            "floor_ms": floor_ms,
            "of_floor": floor_ms / med,
            "graph_steps": runner.num_graph_steps,
            "exact_steps_so_far": getattr(runner.piecewise, "num_exact_steps", None),  # (a running total)
            "kernels": kernel_table(runner, out),
        }
        if name in PROFILE_HOST:
            host_ms, text = host_profile(runner, out)
            results[name]["host_launch_ms"] = host_ms
            results[name]["host_profile"] = text
            print(f"   host launch {host_ms:.2f} ms; cProfile of one launch:\n{text[-6000:]}")
        release(engine, out)
        print(f"{name:34s} {med:8.2f} ms   floor {floor_ms:6.2f} ms ({floor_ms / med:5.0%})", flush=True)
        for k in results[name]["kernels"][:8]:
            print(f"      {k['ms']:7.3f} ms {k['calls']:5d}x {k['share']:5.0%}  {k['kernel']}")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
