"""The serving stack without a GPU: the real server, engine, scheduler and overlap logic, with an
executor whose steps take the time a cost model gives them. It separates what the host adds to
TTFT and TPOT (HTTP, scheduling, detokenization, the one-step latency of overlapped scheduling)
from what the GPU's step times impose.

    PYTHONPATH=$PWD python benchmarks/sim_serve.py --out sim.json                 # issue-3 workload
    PYTHONPATH=$PWD python benchmarks/sim_serve.py --decode-ms 6 --prefill-us-per-token 25

Cost model of one step (defaults fitted to the Llama-3-8B H200 profile of 2026-11-29,
``benchmarks/results/gpu_2026-11-29b/profile_step.json``: decode 4.97 / 6.37 / 16.8 ms at batch
1 / 32 / 256 with 1k context, prefill 7.5 / 26.4 ms for 128 / 1024 tokens, 34.4 ms for 32 decodes
plus 1024 prefill tokens): ``decode_ms`` per step, ``decode_us_per_seq`` per sequence in it (its KV
read at about 1k tokens of context), ``prefill_us_per_token`` per prompt token computed in it. The executor models one GPU
stream: a launched step starts when the previous one ends, ``collect`` waits for its end.
The "ideal" figures printed beside the measured ones come from replaying the same arrivals through
the same scheduler and cost model with no host time at all (a discrete-event simulation in virtual
time), so the difference is the host's.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotloop.bench.datasets import arrival_gaps
from hotloop.config import CacheConfig, ModelConfig, SchedulerConfig
from hotloop.engine.block_manager import BlockManager
from hotloop.engine.engine import Engine
from hotloop.engine.outputs import SampledToken
from hotloop.engine.request import Request, RequestStatus
from hotloop.engine.scheduler import Scheduler, SchedulerOutput
from hotloop.messages import GenerationConfig


@dataclass(frozen=True)
class CostModel:
    decode_ms: float = 4.9
    decode_us_per_seq: float = 45.0  # at about 1k tokens of context (KV read)
    prefill_us_per_token: float = 25.0
    host_launch_ms: float = 0.0  # host time to launch a step with prefill (eager attention between pieces)

    def step_s(self, out: SchedulerOutput) -> float:
        seqs = len(out.scheduled)
        prefill = sum(s.num_tokens for s in out.scheduled if s.num_tokens > 1)
        return (
            self.decode_ms * 1e3 + self.decode_us_per_seq * seqs + self.prefill_us_per_token * prefill
        ) / 1e6


class SimExecutor:
    """Steps cost ``CostModel`` time on one modelled GPU stream; sampled ids are drawn from a pool."""

    def __init__(self, cost: CostModel, vocab: int) -> None:
        self.cost = cost
        rng = random.Random(0)
        self.pool = [rng.randrange(3, vocab) for _ in range(1 << 16)]
        self.k = 0
        self.gpu_free_at = 0.0
        self.busy_s = 0.0

    def launch(self, out: SchedulerOutput) -> tuple[float, list[int]]:
        if self.cost.host_launch_ms and any(s.num_tokens > 1 for s in out.scheduled):
            time.sleep(self.cost.host_launch_ms / 1e3)  # the host is busy launching; the GPU may run dry
        now = time.perf_counter()
        d = self.cost.step_s(out)
        self.busy_s += d
        self.gpu_free_at = max(now, self.gpu_free_at) + d
        n = sum(1 for s in out.scheduled if s.samples)
        if self.k + n > len(self.pool):
            self.k = 0
        self.k += n
        return self.gpu_free_at, self.pool[self.k - n : self.k]

    def collect(self, handle: tuple[float, list[int]]) -> list[SampledToken]:
        end, ids = handle
        wait = end - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        return [SampledToken(t) for t in ids]

    def execute(self, out: SchedulerOutput) -> list[SampledToken]:
        return self.collect(self.launch(out))

    def estimate_s(self, out: SchedulerOutput) -> float:
        return self.cost.step_s(out)

    def score(self, request: Any, start: int, num_tokens: int) -> list[float]:
        raise RuntimeError("the simulated executor runs no model")


@dataclass(frozen=True)
class SimBuilt:
    engine: Engine
    model_path: Path
    model_config: ModelConfig
    backend: str
    device: str
    tokenizer: Any


def ideal(
    cost: CostModel,
    sched_cfg: SchedulerConfig,
    cache: CacheConfig,
    num: int,
    rate: float,
    inp: int,
    outp: int,
) -> dict[str, float]:
    """The same arrivals through the same scheduler in virtual time, no host time: each step starts
    when the previous ends; a token sampled by a step is out when the step ends."""
    sch = Scheduler(sched_cfg, BlockManager(cache.num_blocks, cache.block_size))
    gaps = arrival_gaps(num, rate, 0)
    arrivals = []
    t = 0.0
    for g in gaps:
        t += g
        arrivals.append(t)
    params = GenerationConfig(max_new_tokens=outp, ignore_eos=True)
    now, nxt = 0.0, 0
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    start: dict[str, float] = {}
    done = 0
    while done < num:
        while nxt < num and arrivals[nxt] <= now:
            rid = str(nxt)
            sch.add(Request(rid, [1] * inp, params))
            start[rid] = arrivals[nxt]
            nxt += 1
        out = sch.schedule()
        if out.is_empty:
            now = arrivals[nxt]
            continue
        now += cost.step_s(out)
        sch.advance(out)
        for s in out.scheduled:
            if not s.samples:
                continue
            r = s.request
            r.num_pending_tokens -= 1
            r.output_token_ids.append(5)
            first.setdefault(r.request_id, now)
            last[r.request_id] = now
            if r.num_output_tokens >= outp:
                sch.finish(r, RequestStatus.FINISHED_LENGTH)
                done += 1
    ttft = [first[r] - start[r] for r in start]
    tpot = [(last[r] - first[r]) / (outp - 1) for r in start]
    return {"median_ttft_ms": statistics.median(ttft) * 1e3, "median_tpot_ms": statistics.median(tpot) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=500)
    ap.add_argument("--request-rate", type=float, default=16.0)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--decode-ms", type=float, default=CostModel.decode_ms)
    ap.add_argument("--decode-us-per-seq", type=float, default=CostModel.decode_us_per_seq)
    ap.add_argument("--prefill-us-per-token", type=float, default=CostModel.prefill_us_per_token)
    ap.add_argument(
        "--host-launch-ms", type=float, default=0.0, help="host launch time of a step with prefill"
    )
    ap.add_argument("--max-prefill-token-num", type=int, default=8192)
    ap.add_argument("--no-overlap", action="store_true")
    ap.add_argument("--jit-schedule", action="store_true", help="the engine's just-in-time scheduling")
    ap.add_argument("--port", type=int, default=23555)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import uvicorn
    from transformers import AutoTokenizer

    from hotloop.models.resolve import resolve_model_path
    from hotloop.serve.api_server import ServerArgs, create_app

    cost = CostModel(args.decode_ms, args.decode_us_per_seq, args.prefill_us_per_token, args.host_launch_ms)
    path = resolve_model_path(None)
    tok = AutoTokenizer.from_pretrained(str(path))
    session = args.input_len + args.output_len + 64
    bs = 64
    cache = CacheConfig(block_size=bs, num_blocks=256 * (session // bs + 2))
    sched_cfg = SchedulerConfig(256, args.max_prefill_token_num, session)
    mc = ModelConfig(
        path=str(path),
        architecture="LlamaForCausalLM",
        hf_config=None,
        num_layers=32,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=len(tok),
        max_position_embeddings=session,
        dtype="bfloat16",
        eos_token_ids=(tok.eos_token_id,),
    )
    ex = SimExecutor(cost, len(tok))
    engine = Engine(
        ex, tok, mc, cache, sched_cfg, overlap=not args.no_overlap, jit_schedule=args.jit_schedule
    )
    app = create_app(SimBuilt(engine, path, mc, "sim", "sim", tok), ServerArgs())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    result_file = Path(args.out or "sim_client.json").with_suffix(".client.json")
    client = [
        sys.executable, "-m", "hotloop", "bench", "serve", "--port", str(args.port),
        "--random-token-ids", str(len(tok) - 1), "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--request-rate", str(args.request_rate),
        "--num-prompts", str(args.num_prompts), "--ignore-eos", "--seed", "0",
        "--result-file", str(result_file), "--disable-tqdm",
    ]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(client, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    server.should_exit = True
    got = json.loads(result_file.read_text())
    ref = ideal(cost, sched_cfg, cache, args.num_prompts, args.request_rate, args.input_len, args.output_len)
    result = {
        "cost_model": cost.__dict__,
        "overlap": not args.no_overlap,
        "jit_schedule": args.jit_schedule,
        "max_prefill_token_num": args.max_prefill_token_num,
        "measured": {k: got[k] for k in ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")},
        "ideal_no_host": ref,
        "gpu_busy_fraction": ex.busy_s / wall,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
