"""Where the GPU time of the latency benchmark's own decode steps goes, kernel by kernel and gap by gap.

    python benchmarks/step_kernels.py --model llama3-8b --load-format dummy --dtype bfloat16 \
        --batch-size 256 --input-len 1024 --output-len 160 --session-len 2048 --max-batch-size 256 \
        --max-prefill-token-num 16384 --out steps.json

``profile_step.py`` times a hand-made step through the runner; this script profiles the steps that
``hotloop bench latency`` times (the engine's loop: the scheduler, multi-step rounds, the sampler and
the device-side advance between steps). It runs one batch as the benchmark does, waits for every
first token, settles, times ``--steps`` decode steps plainly (wall time per decode step, as the
benchmark reports it), then records the same number of steps under torch.profiler (CUDA activity
only) and reads the trace's kernel and copy intervals. It reports, per decode step:

- the wall time (plain and profiled);
- the device time of every kernel name (the top ``--top``), and their sum;
- the GPU's busy time (the union of the intervals) and its idle time, split into gaps under 20 us
  (launch-to-launch gaps inside a graph or a stream) and longer ones (the device waiting for the host).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

from host_profile import start_batch  # benchmarks/host_profile.py (this script's folder is on the path)

from hotloop.bench.offline import add_latency_parser

LONG_GAP_US = 20.0


def _steps(engine: Any, n: int) -> tuple[list[float], int, int]:
    """Run until ``n`` decode steps have launched; wall ms per decode step, the steps counted and the
    requests that finished meanwhile (any: some counted steps ran a smaller batch)."""
    wall: list[float] = []
    done = finished = 0
    while done < n and engine.has_unfinished():
        n0 = engine.num_steps
        t0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t0
        finished += sum(1 for o in outs if o.finished)
        k = engine.num_steps - n0
        if k:
            wall += [dt * 1e3 / k] * k
            done += k
    return wall, done, finished


def trace_intervals(path: str) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every kernel, copy and set on the device in a chrome trace."""
    with open(path) as f:
        trace = json.load(f)
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        out.append((ts, ts + dur, str(e.get("name", "?"))))
    return sorted(out)


def summarize(iv: list[tuple[float, float, str]], steps: int, top: int) -> dict[str, Any]:
    """Per decode step: kernel time by name, busy time (union) and idle gaps, short and long."""
    if not iv or steps <= 0:
        return {"error": "no device intervals in the trace"}
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s, e, name in iv:
        per[name][0] += e - s
        per[name][1] += 1
    busy, short_gap, long_gap, n_long = 0.0, 0.0, 0.0, 0
    cur_s, cur_e = iv[0][0], iv[0][1]
    for s, e, _ in iv[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            gap = s - cur_e
            if gap < LONG_GAP_US:
                short_gap += gap
            else:
                long_gap += gap
                n_long += 1
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = max(e for _, e, _ in iv) - iv[0][0]
    total = sum(v[0] for v in per.values())
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "span_ms_per_step": span / steps / 1e3,
        "busy_ms_per_step": busy / steps / 1e3,
        "kernel_sum_ms_per_step": total / steps / 1e3,
        "short_gaps_ms_per_step": short_gap / steps / 1e3,
        "long_gaps_ms_per_step": long_gap / steps / 1e3,
        "long_gaps": n_long,
        "launches_per_step": len(iv) / steps,
        "top": [
            {"name": k[:100], "ms_per_step": v[0] / steps / 1e3, "calls_per_step": v[1] / steps}
            for k, v in rows
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="step_kernels")
    sub = parser.add_subparsers(dest="cmd")
    p = add_latency_parser(sub)
    p.add_argument("--steps", type=int, default=32, help="decode steps timed, then profiled")
    p.add_argument("--top", type=int, default=25, help="kernel names listed")
    p.add_argument("--out", default=None, help="write the JSON here as well")
    args = parser.parse_args(["latency", *(argv if argv is not None else sys.argv[1:])])
    # The prompts are prefilled over several steps (--max-prefill-token-num), so the first requests
    # run ahead of the last by that many tokens and finish first: the output length leaves room for
    # the settling steps, both windows and the prefill's stagger, and the result says if a request
    # finished inside a window anyway (``finished_in_windows``).
    if args.output_len < 2 * args.steps + 24:
        parser.error(
            f"--output-len {args.output_len} must be at least 2 * --steps + 24 = {2 * args.steps + 24}"
            " (more where the prompts take several prefill steps)"
        )
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    engine, load_s = start_batch(args)
    _steps(engine, 16)  # settle
    wall, _, fin_timed = _steps(engine, args.steps)
    sync()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
            pwall, n, fin_profiled = _steps(engine, args.steps)
            sync()
        prof.export_chrome_trace(path)
        iv = trace_intervals(path)
    while engine.has_unfinished():
        engine.step()
    result = {
        "batch_size": args.batch_size,
        "input_len": args.input_len,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "steps": len(wall),
        # requests that finished during the timed / profiled windows (not 0: smaller batches counted)
        "finished_in_windows": [fin_timed, fin_profiled],
        "step_ms_p50": statistics.median(wall),
        "step_ms_mean": statistics.fmean(wall),
        "profiled_steps": n,
        # (biased low: the window starts after a synchronize, so its first call collects a round that
        # has already finished; the trace's span per step is the profiled steps' measure)
        "profiled_step_ms_mean": statistics.fmean(pwall) if pwall else None,
        "trace": summarize(iv, n, args.top),
        "load_s": load_s,
    }
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    print(report(result))
    return 0


def report(result: dict[str, Any]) -> str:
    """A short text table of ``main``'s result (the JSON has it all)."""
    t = result["trace"]
    lines = [
        f"{result['device']}: batch {result['batch_size']}, wall ms/step p50 {result['step_ms_p50']:.3f} "
        f"(mean {result['step_ms_mean']:.3f})"
    ]
    if any(result["finished_in_windows"]):
        lines.append(
            f"warning: {result['finished_in_windows']} requests finished in the timed / profiled windows, so "
            "some steps ran a smaller batch: raise --output-len"
        )
    if "error" in t:
        return "\n".join([*lines, t["error"]])
    lines.append(
        f"per step: span {t['span_ms_per_step']:.3f}, busy {t['busy_ms_per_step']:.3f}, kernels "
        f"{t['kernel_sum_ms_per_step']:.3f}, gaps <{LONG_GAP_US:.0f}us {t['short_gaps_ms_per_step']:.3f}, "
        f"longer {t['long_gaps_ms_per_step']:.3f} ({t['long_gaps']} in all), {t['launches_per_step']:.1f} launches"
    )
    lines += [f"  {r['ms_per_step']:7.3f} ms {r['calls_per_step']:6.1f}x  {r['name']}" for r in t["top"]]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
