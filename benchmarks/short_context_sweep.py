"""Batch-1 decode speed of the short-context decode graph (at most ``SHORT_SPLITS`` flash-decoding
splits) against the graph for any context (the heuristic's split count), by context length, on one
engine per model (``executor/cuda_graph.py``): where should ``HOTLOOP_DECODE_SHORT_CONTEXT`` lie?

    python benchmarks/short_context_sweep.py --out OUT.json [--models smollm2-135m,llama3-8b]
        [--inputs 128,512,896,1408] [--output-len 128] [--reps 2]

Each (input length, graph) pair runs ``--reps`` times, alternating; a run is one request of
``input`` random tokens and ``--output-len`` new tokens (ignore_eos, 8 steps per launch), so its
contexts span input+1 .. input+output. Reported: decode tokens/s (tokens after the first over the
time after the first), per run, and the median per pair.
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


def sweep(model: str, inputs: list[int], output_len: int, reps: int) -> dict[str, Any]:
    from hotloop.api.build import build_engine
    from hotloop.config import EngineConfig
    from hotloop.executor.cuda_graph import SHORT_SPLITS
    from hotloop.utils.gc_tuning import settle_after_startup

    cfg = EngineConfig(
        load_format="dummy", dtype="bfloat16", session_len=4096, max_batch_size=8, num_scheduler_steps=8
    )
    built = build_engine(model, cfg)
    settle_after_startup()
    engine = built.engine
    graphs = engine.executor.runner.graphs
    if 1 not in graphs.short_buckets:
        raise SystemExit(f"{model}: no short-context graph at batch 1 (HOTLOOP_DECODE_SHORT_CONTEXT=0?)")
    vocab = built.model_config.vocab_size
    rng = random.Random(0)
    _run_one(engine, vocab, 64, 64, "warm", rng)
    rows = []
    for input_len in inputs:
        got: dict[str, list[float]] = {"short": [], "full": []}
        for r in range(reps):
            for name in ("short", "full"):
                graphs.short_context = 10**9 if name == "short" else 0
                got[name].append(
                    _run_one(engine, vocab, input_len, output_len, f"{input_len}-{name}-{r}", rng)
                )
        row = {
            "input_len": input_len,
            "contexts": [input_len + 1, input_len + output_len],
            "short_splits": SHORT_SPLITS,
            "short_tokens_per_s": got["short"],
            "full_tokens_per_s": got["full"],
            "short_median": statistics.median(got["short"]),
            "full_median": statistics.median(got["full"]),
        }
        row["short_over_full"] = row["short_median"] / row["full_median"]
        print(
            f"{model} input {input_len} (contexts {row['contexts'][0]}-{row['contexts'][1]}): "
            f"short {row['short_median']:.1f} full {row['full_median']:.1f} tokens/s "
            f"({row['short_over_full']:.3f}x)",
            flush=True,
        )
        rows.append(row)
    return {"model": model, "output_len": output_len, "reps": reps, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="smollm2-135m,llama3-8b")
    ap.add_argument("--inputs", default="128,512,896,1408")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    inputs = [int(x) for x in args.inputs.split(",")]
    result = [sweep(m, inputs, args.output_len, args.reps) for m in args.models.split(",")]
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
