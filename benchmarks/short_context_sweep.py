"""Batch-1 decode speed of each short-context decode graph (at most ``cap`` flash-decoding splits,
``executor/cuda_graph.py``) against the graph for any context (the heuristic's split count), by
context window, on one engine per model: does each cap win inside its range, and lose past it?

    python benchmarks/short_context_sweep.py --out OUT.json [--models smollm2-135m,llama3-8b]
        [--windows 16:48,64:64,128:128,256:256,640:128] [--reps 3]

A window ``I:O`` is one request of ``I`` random tokens and ``O`` new tokens (ignore_eos, 8 steps per
launch), so its decode contexts span I+1 .. I+O. In a window every graph is forced in turn (the
full one, then each cap of bucket 1), ``--reps`` times, alternating. Reported: decode tokens/s
(tokens after the first over the time after the first) per run, and the median per graph.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any


def _run_one(engine: Any, vocab: int, input_len: int, output_len: int, rid: str, rng: random.Random) -> float:
    from hotloop.messages import GenerationConfig

    prompt = [rng.randrange(vocab) for _ in range(input_len)]
    engine.add_request(rid, prompt, GenerationConfig(max_new_tokens=output_len, ignore_eos=True))
    t_first = None
    n = 0
    while engine.has_unfinished():
        for o in engine.step():
            if o.new_token_ids and t_first is None:
                t_first = time.perf_counter()
                n0 = n + len(o.new_token_ids)
            n += len(o.new_token_ids)
    t_end = time.perf_counter()
    assert t_first is not None and n == output_len, (n, output_len)
    return (n - n0) / (t_end - t_first)


def sweep(model: str, windows: list[tuple[int, int]], reps: int) -> dict[str, Any]:
    from hotloop.api.build import build_engine
    from hotloop.config import EngineConfig
    from hotloop.utils.gc_tuning import settle_after_startup

    cfg = EngineConfig(
        load_format="dummy", dtype="bfloat16", session_len=4096, max_batch_size=8, num_scheduler_steps=8
    )
    built = build_engine(model, cfg)
    settle_after_startup()
    engine = built.engine
    graphs = engine.executor.runner.graphs
    limits = dict(graphs.short_limits.get(1, {}))
    if not limits:
        raise SystemExit(f"{model}: no short-context graphs at batch 1 (HOTLOOP_DECODE_SHORT_GRAPHS=0?)")
    vocab = built.model_config.vocab_size
    rng = random.Random(0)
    _run_one(engine, vocab, 64, 64, "warm", rng)
    rows = []
    modes: list[int | None] = [None, *sorted(limits, reverse=True)]
    for input_len, output_len in windows:
        got: dict[str, list[float]] = {str(m or "full"): [] for m in modes}
        for r in range(reps):
            for m in modes:
                graphs.short_limits = {1: {m: 10**9}} if m else {}
                rid = f"{input_len}-{m}-{r}"
                got[str(m or "full")].append(_run_one(engine, vocab, input_len, output_len, rid, rng))
        graphs.short_limits = {1: limits}
        med = {k: statistics.median(v) for k, v in got.items()}
        row = {
            "input_len": input_len,
            "output_len": output_len,
            "contexts": [input_len + 1, input_len + output_len],
            "tokens_per_s": got,
            "median": med,
            "over_full": {k: v / med["full"] for k, v in med.items()},
        }
        print(
            f"{model} contexts {input_len + 1}-{input_len + output_len}: "
            + " ".join(f"{k} {v:.1f} ({row['over_full'][k]:.3f}x)" for k, v in med.items()),
            flush=True,
        )
        rows.append(row)
    return {"model": model, "reps": reps, "limits": limits, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="smollm2-135m,llama3-8b")
    ap.add_argument("--windows", default="16:48,64:64,128:128,256:256,640:128")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    windows = [(int(a), int(b)) for a, b in (w.split(":") for w in args.windows.split(","))]
    result = [sweep(m, windows, args.reps) for m in args.models.split(",")]
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
