"""Replay the real scheduler over an offline workload on the CPU, counting blocks only (no model).

    python benchmarks/sched_replay.py --num-blocks 24672 [--input-len 4096 --output-len 1024 ...]

Drives ``engine.scheduler.Scheduler`` and ``engine.block_manager.BlockManager`` exactly as the
engine does for ``hotloop bench throughput`` with ``ignore_eos`` (every request runs to
``--output-len``; one token sampled per step for each row that reaches the end of its known tokens),
and reports the steps, how many of them carried prompt tokens, the preemptions and the prompt tokens
prefilled again after them (recompute), and the mean batch of the decode-only steps. The block
counts of issue 6's KV-bound runs on one H200 (Llama-3-8B shape, blocks of 64 tokens): 12,721 for
fp16 KV, 24,672 for int8 (``benchmarks/results/gpu_2026-12-01/call3``); the step counts this gives
can be checked against those runs' JSON (``steps``) with ``--reserve-sure 0 --reserve-max 0`` (the
scheduler those runs had: no admission reserve). ``--kv-ns`` adds a time estimate from a model of
the step (below).
"""

from __future__ import annotations

import argparse
import json

from hotloop.config import SchedulerConfig
from hotloop.engine.block_manager import BlockManager
from hotloop.engine.request import Request, RequestStatus
from hotloop.engine.scheduler import Scheduler, SchedulerOutput
from hotloop.messages import GenerationConfig

# The time estimate's model (``--kv-ns``): Llama-3-8B shape on one H200, from profile_step.py's
# steps (BENCHMARKS.md, nineteenth session): GEMMs max(weight bytes / bandwidth, 15 GFLOP a token at
# 700 TFLOP/s), prefill attention at 300 TFLOP/s, decode attention ``kv_ns`` per cached token read
# (all layers: 32.7 ns fp16, 20.4 ns int8 at 300-sequence batches), and 2.5 ms of the rest per step.
WEIGHT_S = 15.0e9 / 4229e9
GEMM_FLOP_PER_TOKEN = 15e9
GEMM_RATE = 700e12
ATTN_FLOP_PER_PAIR = 4 * 32 * 128 * 32  # q.k and p.v over 32 heads x 128 dims x 32 layers
ATTN_RATE = 300e12
OTHER_S = 2.5e-3


def step_seconds(out: SchedulerOutput, kv_ns: float) -> float:
    """The model's time for one scheduled step."""
    tokens = out.num_tokens
    gemm = max(WEIGHT_S, tokens * GEMM_FLOP_PER_TOKEN / GEMM_RATE)
    attn = 0.0
    for s in out.scheduled:
        if s.num_tokens == 1:
            attn += (s.start + 1) * kv_ns * 1e-9
        else:  # causal over its own tokens and the cached prefix before it
            attn += ATTN_FLOP_PER_PAIR * s.num_tokens * (s.start + s.num_tokens / 2) / ATTN_RATE
    return gemm + attn + OTHER_S


def replay(
    num_blocks: int,
    block_size: int,
    num_prompts: int,
    input_len: int,
    output_len: int,
    max_batch_size: int,
    max_prefill_token_num: int,
    session_len: int,
    reserve_sure: float = 1.0,
    reserve_max: float = 1.0,
    reserve_min: float = 0.0,
    reserve_decay_steps: int = 1000,
    kv_ns: float | None = None,
) -> dict[str, float]:
    sched = Scheduler(
        SchedulerConfig(
            max_batch_size,
            max_prefill_token_num,
            session_len,
            reserve_sure,
            reserve_max,
            reserve_min,
            reserve_decay_steps,
        ),
        BlockManager(num_blocks, block_size),
    )
    params = GenerationConfig(max_new_tokens=output_len, ignore_eos=True)
    for i in range(num_prompts):
        sched.add(Request(f"r{i}", [1] * input_len, params))
    steps = prompt_steps = prefilled = decode_rows = decode_steps = 0
    seconds = 0.0
    while sched.has_unfinished():
        out = sched.schedule()
        if out.is_empty:
            raise RuntimeError("the scheduler scheduled nothing with requests waiting: the pool is too small")
        steps += 1
        if kv_ns is not None:
            seconds += step_seconds(out, kv_ns)
        prompt_rows = [
            s for s in out.scheduled if s.num_tokens > 1 or s.start < len(s.request.prompt_token_ids)
        ]
        if prompt_rows:
            prompt_steps += 1
        else:
            decode_steps += 1
            decode_rows += len(out.scheduled)
        prefilled += sum(s.num_tokens for s in out.scheduled if s.num_tokens > 1)
        sched.advance(out)
        for s in out.scheduled:  # the engine collects each sampled token
            req = s.request
            if not s.samples:
                continue
            req.output_token_ids.append(0)
            req.num_pending_tokens -= 1
            if len(req.output_token_ids) >= output_len:
                sched.finish(req, RequestStatus.FINISHED_LENGTH)
    first_prefill = num_prompts * input_len
    estimate = (
        {}
        if kv_ns is None
        else {"est_s": round(seconds, 1), "est_tokens_per_s": round(num_prompts * output_len / seconds, 1)}
    )
    return {
        **estimate,
        "steps": steps,
        "steps_with_prompt_tokens": prompt_steps,
        "decode_only_steps": decode_steps,
        "mean_decode_batch": round(decode_rows / max(decode_steps, 1), 1),
        "preemptions": sched.num_preemptions,
        "prefilled_tokens": prefilled,
        "recomputed_tokens": prefilled - first_prefill,
        "recomputed_share_of_prompts": round((prefilled - first_prefill) / first_prefill, 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-blocks", type=int, action="append", required=True, help="repeat for several pools")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=4096)
    ap.add_argument("--output-len", type=int, default=1024)
    ap.add_argument("--max-batch-size", type=int, default=512)
    ap.add_argument("--max-prefill-token-num", type=int, default=16384)
    ap.add_argument("--session-len", type=int, default=5120)
    ap.add_argument(
        "--reserve-sure",
        type=float,
        default=1.0,
        help="the weight of the tokens a request surely produces in admission's reserve (0 with --reserve-max 0: "
        "the scheduler before the nineteenth session)",
    )
    ap.add_argument("--reserve-max", type=float, default=1.0, help="the admission reserve after a preemption")
    ap.add_argument("--reserve-min", type=float, default=0.0)
    ap.add_argument("--reserve-decay-steps", type=int, default=1000)
    ap.add_argument(
        "--kv-ns",
        type=float,
        help="estimate the run's time: decode attention ns per cached token read, all layers "
        "(32.7 fp16, 20.4 int8: the nineteenth session's H200 profile)",
    )
    args = ap.parse_args(argv)
    for nb in args.num_blocks:
        r = replay(
            nb,
            args.block_size,
            args.num_prompts,
            args.input_len,
            args.output_len,
            args.max_batch_size,
            args.max_prefill_token_num,
            args.session_len,
            args.reserve_sure,
            args.reserve_max,
            args.reserve_min,
            args.reserve_decay_steps,
            args.kv_ns,
        )
        print(json.dumps({"num_blocks": nb, **r}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
