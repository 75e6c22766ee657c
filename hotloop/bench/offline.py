"""``hotloop bench throughput`` and ``hotloop bench latency``: offline benchmarks of the engine itself.

throughput: N requests of random token ids (fixed or random lengths), all queued at once, EOS ignored;
reports output tokens/s and requests/s. latency: one batch of B requests of I prompt tokens and O
output tokens, repeated; reports the prefill time, ms per decode step (p50/p99) and tokens/s. Both
print a summary and write JSON with ``--output-json``. Timings read a host clock after each engine
step, which ends with the sampled ids copied to the host, so they include all GPU work.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

from hotloop.bench.output import check_writable
from hotloop.cli.engine_args import add_engine_args, engine_config_from_args
from hotloop.utils.gc_tuning import settle_after_startup


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default=None, help="model folder, .gguf, or a preset (llama3-8b, qwen2.5-7b, smollm2-135m)"
    )
    p.add_argument("--prompt-seed", type=int, default=0, dest="bench_seed", help="seed of the random prompts")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sampled")
    p.add_argument("--output-json", default=None, help="write the results here")
    add_engine_args(p)


def add_throughput_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "throughput",
        help="offline throughput: N requests at once, output tokens/s",
        description="Queue N requests of random token ids at once (EOS ignored) and time until all finish.",
    )
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in [L*(1-r), L*(1+r)]")
    _common(p)
    p.set_defaults(func=run_throughput)
    return p


def add_latency_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "latency",
        help="batch latency: ms per decode step and tokens/s",
        description="Run one batch of B requests (I prompt tokens, O output tokens) several times.",
    )
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--num-iters-warmup", type=int, default=1)
    _common(p)
    p.set_defaults(func=run_latency)
    return p


def _engine(args: argparse.Namespace) -> Any:
    from hotloop.api.build import build_engine

    t0 = time.perf_counter()
    built = build_engine(args.model, engine_config_from_args(args))
    load_s = time.perf_counter() - t0
    settle_after_startup()  # as ``hotloop serve`` does
    return built, load_s


def _params(args: argparse.Namespace, out_len: int) -> Any:
    from hotloop.messages import GenerationConfig

    return GenerationConfig(max_new_tokens=out_len, ignore_eos=True, temperature=args.temperature)


def _prompt(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def _lengths(rng: random.Random, base: int, ratio: float, n: int) -> list[int]:
    if ratio <= 0:
        return [base] * n
    lo, hi = max(1, int(base * (1 - ratio))), max(1, int(base * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _runner_stats(engine: Any) -> dict[str, Any]:
    from hotloop.models.loader import weight_bytes

    runner = getattr(engine.executor, "runner", None)
    model = getattr(engine.executor, "model", None)
    device = getattr(engine.executor, "device", None)
    return {
        "kv_blocks": engine.num_total_blocks,
        "weight_bytes_on_device": weight_bytes(model, device)
        if model is not None and device is not None
        else None,
        "graph_steps": getattr(runner, "num_graph_steps", None),
        "eager_steps": getattr(runner, "num_eager_steps", None),
        "wait_s": getattr(runner, "wait_s", None),
        "num_scheduler_steps": engine.num_scheduler_steps,
        "full_batch_steps": engine.full_batch_steps,
        "multi_step_launches": engine.num_multi_step_launches,
        "w4a16_launches": _w4a16_launches(),
        "w4a16_cutlass_launches": _w4a16_cutlass_launches(),
    }


def _w4a16_launches() -> list[dict[str, Any]] | None:
    """The W4A16 launches the tuner chose, where a W4A16 model ran in this process (else None)."""
    import sys

    gemm = sys.modules.get("hotloop.kernels.w4a16_gemm")
    return gemm.tuned_launches() if gemm is not None else None


def _w4a16_cutlass_launches() -> list[dict[str, Any]] | None:
    """The CUTLASS W4A16 configurations chosen (``HOTLOOP_W4A16_KERNEL=cutlass``), else None."""
    import sys

    mod = sys.modules.get("hotloop.kernels.w4a16_cutlass")
    return (mod.tuned_launches() or None) if mod is not None else None


def _emit(result: dict[str, Any], path: str | None) -> None:
    print(json.dumps(result, indent=2))
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)


def _check_counts(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Counts that must be >= 1, the warm-up count (>= 0), the range ratio and the results file,
    checked before the model loads."""
    for name in (*names, "input_len", "output_len"):
        value = getattr(args, name)
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} {value}: must be >= 1")
    warmup = getattr(args, "num_iters_warmup", 0)
    if warmup < 0:
        raise ValueError(f"--num-iters-warmup {warmup}: must be >= 0")
    ratio = getattr(args, "range_ratio", 0.0)
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"--range-ratio {ratio}: must lie in [0, 1) (lengths uniform in [L(1-r), L(1+r)])")
    check_writable(args.output_json, "--output-json")


def run_throughput(args: argparse.Namespace) -> int:
    _check_counts(args, ("num_prompts",))
    built, load_s = _engine(args)
    engine = built.engine
    rng = random.Random(args.bench_seed)
    vocab = built.model_config.vocab_size
    ins = _lengths(rng, args.input_len, args.range_ratio, args.num_prompts)
    outs = _lengths(rng, args.output_len, args.range_ratio, args.num_prompts)
    prompts = [_prompt(rng, vocab, n) for n in ins]
    # warm-up: one short request, so kernel compilation stays out of the timing
    engine.add_request("warmup", prompts[0][:16], _params(args, 4))
    while engine.has_unfinished():
        engine.step()
    t0 = time.perf_counter()
    for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        engine.add_request(str(i), p, _params(args, o))
    steps = 0
    generated = 0
    runner = getattr(engine.executor, "runner", None)
    kinds: list[str] = []  # per call: "graph" where it launched only CUDA-graph steps, else "eager"
    walls: list[float] = []
    while engine.has_unfinished():
        e0 = getattr(runner, "num_eager_steps", 0)
        g0 = getattr(runner, "num_graph_steps", 0)
        ts = time.perf_counter()
        for out in engine.step():
            generated += len(out.new_token_ids)
        walls.append(time.perf_counter() - ts)
        graph = getattr(runner, "num_graph_steps", 0) > g0 and getattr(runner, "num_eager_steps", 0) == e0
        kinds.append("graph" if graph else "eager")
        steps += 1
    elapsed = time.perf_counter() - t0
    result = {
        "benchmark": "throughput",
        "model": str(args.model),
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "range_ratio": args.range_ratio,
        "elapsed_s": elapsed,
        "output_tokens": generated,
        "output_tokens_per_s": generated / elapsed,
        "requests_per_s": args.num_prompts / elapsed,
        "total_tokens_per_s": (generated + sum(ins)) / elapsed,
        "steps": steps,
        "load_s": load_s,
        "max_batch_size": args.max_batch_size,
        "eager_mode": args.eager_mode,
        "wall_s_by_step_kind": _wall_by_kind(kinds, walls, bool(getattr(engine, "overlap", False))),
        **_runner_stats(engine),
    }
    _emit(result, args.output_json)
    return 0


def _wall_by_kind(kinds: list[str], walls: list[float], overlap: bool) -> dict[str, float]:
    """Wall time of the ``engine.step()`` calls by the kind of step they waited for: where steps
    overlap, a call launches its step and then collects the one before, so its time is charged to the
    previous call's kind (an approximation of each kind's GPU time while the host keeps ahead)."""
    out = {"eager": 0.0, "graph": 0.0}
    for i, w in enumerate(walls):
        kind = kinds[i - 1] if overlap and i else kinds[i]
        out[kind] += w
    return {k: round(v, 3) for k, v in out.items()}


def run_latency(args: argparse.Namespace) -> int:
    _check_counts(args, ("batch_size", "num_iters"))
    if args.output_len < 2:
        raise ValueError(
            f"--output-len {args.output_len}: the latency benchmark times decode steps, and the first "
            "token comes from the prefill; use --output-len >= 2"
        )
    max_batch = getattr(args, "max_batch_size", None)
    if max_batch is not None and args.batch_size > max_batch:
        raise ValueError(
            f"--batch-size {args.batch_size} exceeds --max-batch-size {max_batch}: the batch never decodes "
            "as one, so no step would be timed; raise --max-batch-size"
        )
    built, load_s = _engine(args)
    engine = built.engine
    rng = random.Random(args.bench_seed)
    vocab = built.model_config.vocab_size
    iters: list[dict[str, Any]] = []
    decode_ms: list[float] = []
    host_ms: list[float] = []
    for it in range(args.num_iters_warmup + args.num_iters):
        prompts = [_prompt(rng, vocab, args.input_len) for _ in range(args.batch_size)]
        for i, p in enumerate(prompts):
            engine.add_request(f"{it}-{i}", p, _params(args, args.output_len))
        step_s: list[float] = []
        t0 = time.perf_counter()
        first_token_s = None
        wait_s: list[float] = []
        full: list[bool] = []  # a pure decode step: every request of the batch got a token
        launched: list[int] = []  # decode steps each call launched (several: multi-step decode)
        runner = getattr(engine.executor, "runner", None)
        while engine.has_unfinished():
            w0 = getattr(runner, "wait_s", 0.0)
            n0 = engine.num_steps
            ts = time.perf_counter()
            outs = engine.step()
            step_s.append(time.perf_counter() - ts)
            launched.append(engine.num_steps - n0)
            wait_s.append(getattr(runner, "wait_s", 0.0) - w0)
            full.append(sum(1 for o in outs if o.new_token_ids) == args.batch_size)
            if first_token_s is None and any(o.new_token_ids for o in outs):
                first_token_s = time.perf_counter() - t0
        total = time.perf_counter() - t0
        if it < args.num_iters_warmup:
            continue
        # decode steps: every sequence got a token, after the step that finished the last prefill
        first_full = full.index(True) if True in full else len(full)
        # With multi-step decode a call mostly waits for the round it collects (the one the call
        # before launched): its time is spread over that round's steps.
        ran = [launched[k - 1] if k and launched[k - 1] else launched[k] for k in range(len(step_s))]
        idx = [k for k in range(first_full + 1, len(step_s)) if full[k] and ran[k]]
        dec = [step_s[k] * 1e3 / ran[k] for k in idx for _ in range(ran[k])]
        decode_ms += dec
        # host time of a decode step: its wall time less the wait for the GPU's sampled ids
        host_ms += [(step_s[k] - wait_s[k]) * 1e3 / ran[k] for k in idx for _ in range(ran[k])]
        iters.append(
            {
                "total_s": total,
                "prefill_s": first_token_s,
                "decode_steps": len(dec),
                "output_tokens_per_s": args.batch_size * args.output_len / total,
            }
        )
    med = statistics.median(decode_ms) if decode_ms else None  # (None: JSON has no NaN)
    if not decode_ms:
        print("warning: no decode step ran with the whole batch, so none was timed", file=sys.stderr)
    result = {
        "benchmark": "latency",
        "model": str(args.model),
        "batch_size": args.batch_size,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "decode_ms_p50": med,
        "decode_ms_p99": _percentile(decode_ms, 99) if decode_ms else None,
        "decode_ms_mean": statistics.fmean(decode_ms) if decode_ms else None,
        "decode_tokens_per_s": args.batch_size * 1e3 / med if med else None,
        "host_ms_per_step_p50": statistics.median(host_ms) if host_ms else None,
        # the mean shows what the median hides: the garbage collector's occasional long pauses
        "host_ms_per_step_mean": statistics.fmean(host_ms) if host_ms else None,
        "output_tokens_per_s": statistics.median(i["output_tokens_per_s"] for i in iters),
        "total_s_p50": statistics.median(i["total_s"] for i in iters),
        "prefill_s_p50": statistics.median(i["prefill_s"] or 0.0 for i in iters),
        "iterations": iters,
        "load_s": load_s,
        "eager_mode": args.eager_mode,
        **_runner_stats(engine),
    }
    _emit(result, args.output_json)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m hotloop.bench.offline {throughput,latency} ...`` (also reachable as ``hotloop bench``)."""
    parser = argparse.ArgumentParser(prog="hotloop-bench-offline")
    sub = parser.add_subparsers(dest="bench_command", required=True)
    add_throughput_parser(sub)
    add_latency_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
