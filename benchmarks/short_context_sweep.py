"""Small-batch decode speed of each short-context decode graph (at most ``cap`` flash-decoding splits,
``executor/cuda_graph.py``) against the graph for any context (the heuristic's split count), by
context window, on one engine per model: does each cap win inside its range, and lose past it?

    python benchmarks/short_context_sweep.py --out OUT.json [--models smollm2-135m,llama3-8b]
        [--windows 16:48,64:64,128:128,256:256,640:128] [--reps 3] [--batches 1] [--quant-policy 0]

A window ``I:O`` is ``--batches`` requests at once (each batch size in turn, one engine each) of
``I`` random tokens and ``O`` new tokens (ignore_eos, 8 steps per launch), so its decode contexts
span I+1 .. I+O. In a window every graph of the batch's bucket is forced in turn (the full one,
then each cap), ``--reps`` times, alternating. ``--buckets`` sets the buckets that get short-context
graphs (``cuda_graph.SHORT_BUCKETS``) for the measurement; ``--quant-policy 8`` runs over an int8
KV cache. Reported: decode tokens/s
(tokens after the first over the time after the first) per run, and the median per graph.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any


def _run_one(
    engine: Any, vocab: int, input_len: int, output_len: int, rid: str, rng: random.Random, batch: int = 1
) -> float:
    """``batch`` requests at once; decode tokens/s over all of them, from the step that gave every
    request its first token to the end."""
    from hotloop.messages import GenerationConfig

    for i in range(batch):
        prompt = [rng.randrange(vocab) for _ in range(input_len)]
        engine.add_request(f"{rid}-{i}", prompt, GenerationConfig(max_new_tokens=output_len, ignore_eos=True))
    started: set[str] = set()
    t_first = None
    n = n0 = 0
    while engine.has_unfinished():
        for o in engine.step():
            if o.new_token_ids:
                started.add(o.request_id)
            n += len(o.new_token_ids)
        if t_first is None and len(started) == batch:
            t_first, n0 = time.perf_counter(), n
    t_end = time.perf_counter()
    assert t_first is not None and n == batch * output_len, (n, batch, output_len)
    return (n - n0) / (t_end - t_first)


def sweep(
    model: str, windows: list[tuple[int, int]], reps: int, batch: int = 1, quant_policy: int = 0
) -> dict[str, Any]:
    from hotloop.api.build import build_engine
    from hotloop.config import EngineConfig
    from hotloop.utils.gc_tuning import settle_after_startup

    cfg = EngineConfig(
        load_format="dummy", dtype="bfloat16", session_len=4096, max_batch_size=8, num_scheduler_steps=8,
        quant_policy=quant_policy,
    )  # fmt: skip
    built = build_engine(model, cfg)
    settle_after_startup()
    engine = built.engine
    graphs = engine.executor.runner.graphs
    bucket = graphs.bucket_for(batch)
    limits = dict(graphs.short_limits.get(bucket, {}))
    if not limits:
        raise SystemExit(
            f"{model}: no short-context graphs at batch {batch} (HOTLOOP_DECODE_SHORT_GRAPHS=0?)"
        )
    vocab = built.model_config.vocab_size
    rng = random.Random(0)
    _run_one(engine, vocab, 64, 64, "warm", rng)
    rows = []
    modes: list[int | None] = [None, *sorted(limits, reverse=True)]
    for input_len, output_len in windows:
        got: dict[str, list[float]] = {str(m or "full"): [] for m in modes}
        for r in range(reps):
            for m in modes:
                graphs.short_limits = {bucket: {m: 10**9}} if m else {}
                rid = f"{input_len}-{m}-{r}"
                got[str(m or "full")].append(_run_one(engine, vocab, input_len, output_len, rid, rng, batch))
        graphs.short_limits = {bucket: limits}
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
            f"{model} kv{quant_policy or 16} batch {batch} contexts {input_len + 1}-{input_len + output_len}: "
            + " ".join(f"{k} {v:.1f} ({row['over_full'][k]:.3f}x)" for k, v in med.items()),
            flush=True,
        )
        rows.append(row)
    del engine, built
    return {
        "model": model,
        "quant_policy": quant_policy,
        "batch": batch,
        "reps": reps,
        "limits": limits,
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="smollm2-135m,llama3-8b")
    ap.add_argument("--windows", default="16:48,64:64,128:128,256:256,640:128")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", default="1", help="batch sizes, comma-separated (all rows share a length)")
    ap.add_argument("--quant-policy", type=int, default=0, choices=(0, 8), help="KV cache: 16-bit or int8")
    ap.add_argument("--buckets", default=None, help="SHORT_BUCKETS for this run, comma-separated")
    args = ap.parse_args()
    if args.buckets:
        from hotloop.executor import cuda_graph

        cuda_graph.SHORT_BUCKETS = tuple(int(b) for b in args.buckets.split(","))
    windows = [(int(a), int(b)) for a, b in (w.split(":") for w in args.windows.split(","))]
    result = [
        sweep(m, windows, args.reps, int(b), args.quant_policy)
        for m in args.models.split(",")
        for b in args.batches.split(",")
    ]
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
