"""Replay the real scheduler over an offline workload on the CPU, counting blocks only (no model).

    python benchmarks/sched_replay.py --num-blocks 24672 [--input-len 4096 --output-len 1024 ...]

Drives ``engine.scheduler.Scheduler`` and ``engine.block_manager.BlockManager`` exactly as the
engine does for ``hotloop bench throughput`` with ``ignore_eos`` (every request runs to
``--output-len``; one token sampled per step for each row that reaches the end of its known tokens),
and reports the steps, how many of them carried prompt tokens, the preemptions and the prompt tokens
prefilled again after them (recompute), and the mean batch of the decode-only steps. The block
counts of issue 6's KV-bound runs on one H200 (Llama-3-8B shape, blocks of 64 tokens): 12,721 for
fp16 KV, 24,672 for int8 (``benchmarks/results/gpu_2026-12-01/call3``); the step counts this gives
can be checked against those runs' JSON (``steps``).
"""

from __future__ import annotations

import argparse
import json

from hotloop.config import SchedulerConfig
from hotloop.engine.block_manager import BlockManager
from hotloop.engine.request import Request, RequestStatus
from hotloop.engine.scheduler import Scheduler
from hotloop.messages import GenerationConfig


def replay(
    num_blocks: int,
    block_size: int,
    num_prompts: int,
    input_len: int,
    output_len: int,
    max_batch_size: int,
    max_prefill_token_num: int,
    session_len: int,
) -> dict[str, float]:
    sched = Scheduler(
        SchedulerConfig(max_batch_size, max_prefill_token_num, session_len),
        BlockManager(num_blocks, block_size),
    )
    params = GenerationConfig(max_new_tokens=output_len, ignore_eos=True)
    for i in range(num_prompts):
        sched.add(Request(f"r{i}", [1] * input_len, params))
    steps = prompt_steps = prefilled = decode_rows = decode_steps = 0
    while sched.has_unfinished():
        out = sched.schedule()
        if out.is_empty:
            raise RuntimeError("the scheduler scheduled nothing with requests waiting: the pool is too small")
        steps += 1
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
    return {
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
        )
        print(json.dumps({"num_blocks": nb, **r}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
