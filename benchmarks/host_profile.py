"""Where the host time of a decode step goes, on the machine that runs the model (the GPU host).

    python benchmarks/host_profile.py --model llama3-8b --load-format dummy --batch-size 256 \
        --input-len 1024 --output-len 96 --session-len 2048 --max-batch-size 256 --out prof.txt

Runs one batch as ``hotloop bench latency`` does, waits until every request has its first token,
then times ``--steps`` decode steps (``engine.step()``'s wall time less the runner's wait for the
GPU, as the latency benchmark reports it; with ``--num-scheduler-steps`` a call's time over the
decode steps it launched) three times: plain, with per-phase timers (``phase_timer.py``: where the
plain step's host time goes, without a profiler's inflation), and under cProfile. The profile's
tables (by own time and by cumulative time) go to ``--out``; the runner's wait for the GPU shows
there as ``Event.synchronize``, so what is left above it is host work.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import statistics
import sys
import time
from typing import Any

from phase_timer import PhaseTimer  # benchmarks/phase_timer.py (this script's folder is on the path)

from hotloop.bench.offline import _engine, _params, _prompt, add_latency_parser


def _steps(engine: Any, n: int, timer: Any = None) -> tuple[list[float], list[float]]:
    runner = getattr(engine.executor, "runner", None)
    wall: list[float] = []
    host: list[float] = []
    done = 0
    while done < n:
        if not engine.has_unfinished():
            break
        w0 = getattr(runner, "wait_s", 0.0)
        n0 = engine.num_steps
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        k = engine.num_steps - n0  # decode steps this call launched (more than one: multi-step decode)
        if not k:
            continue
        if timer is not None:
            timer.mark(k)
        wall += [dt * 1e3 / k] * k
        host += [(dt - (getattr(runner, "wait_s", 0.0) - w0)) * 1e3 / k] * k
        done += k
    return wall, host


def start_batch(args: argparse.Namespace) -> tuple[Any, float]:
    """Build the engine of ``hotloop bench latency``'s arguments, add its batch of random prompts and
    step until every request has its first token; the engine and its load time in seconds."""
    built, load_s = _engine(args)
    engine = built.engine
    rng = random.Random(args.bench_seed)
    vocab = built.model_config.vocab_size
    for i in range(args.batch_size):
        engine.add_request(f"r{i}", _prompt(rng, vocab, args.input_len), _params(args, args.output_len))
    seen: set[str] = set()
    while len(seen) < args.batch_size:  # prefill: until every request has its first token
        for o in engine.step():
            if o.new_token_ids:
                seen.add(o.request_id)
    return engine, load_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="host_profile")
    sub = parser.add_subparsers(dest="cmd")
    p = add_latency_parser(sub)
    p.add_argument("--steps", type=int, default=40, help="decode steps timed per phase")
    p.add_argument("--out", default=None, help="write the profile tables here")
    args = parser.parse_args(["latency", *(argv if argv is not None else sys.argv[1:])])
    if args.output_len < 3 * args.steps + 8:
        parser.error(
            f"--output-len {args.output_len} must be at least 3 * --steps + 8 = {3 * args.steps + 8}"
        )
    engine, load_s = start_batch(args)
    _steps(engine, 4)  # a few decode steps to settle
    wall, host = _steps(engine, args.steps)
    timer = PhaseTimer.attach(engine)
    twall, thost = _steps(engine, args.steps, timer)
    prof = cProfile.Profile()
    prof.enable()
    pwall, phost = _steps(engine, args.steps)
    prof.disable()
    while engine.has_unfinished():
        engine.step()
    buf = io.StringIO()
    for key in ("tottime", "cumulative"):
        buf.write(f"\n==== sorted by {key} ({len(pwall)} decode steps at batch {args.batch_size}) ====\n")
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(45)
    result = {
        "batch_size": args.batch_size,
        "steps": len(wall),
        "step_ms_p50": statistics.median(wall),
        "host_ms_p50": statistics.median(host),
        "host_ms_mean": statistics.fmean(host),
        "timed_host_ms_p50": statistics.median(thost),
        "phases": timer.report(),
        "profiled_step_ms_p50": statistics.median(pwall),
        "profiled_host_ms_p50": statistics.median(phost),
        "load_s": load_s,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n" + buf.getvalue())
    else:
        print(buf.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
