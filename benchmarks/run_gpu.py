"""The issue-4 table on one GPU, in one call: hotloop's offline benchmarks, the transformers baseline on
the same workloads, the ceilings measured now and the floors they imply.

    PYTHONPATH=$PWD python3 benchmarks/run_gpu.py --out $OUT            # the whole table
    PYTHONPATH=$PWD python3 benchmarks/run_gpu.py --out $OUT --quick    # small sizes (smoke test)
    PYTHONPATH=$PWD python3 benchmarks/run_gpu.py --out $OUT --gpus 2   # rows spread over two GPUs

With ``--gpus N`` the rows run in N lanes, one per GPU (``CUDA_VISIBLE_DEVICES``), longest first onto
the least-loaded lane (``EST_S``), so that the whole table fits one 10-minute device call on two
GPUs. The ceilings are measured once, on the first GPU, before the rows start.

Each run is its own process (the engine takes most of the GPU's memory for KV blocks). Prints a table
last and writes ``gpu_table.json`` (plus each run's JSON and log) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Llama-3-8B bf16: weights read per decode step (all but the embedding table), KV bytes per token.
LLAMA3_8B_WEIGHT_BYTES = 15.0e9
LLAMA3_8B_AWQ_WEIGHT_BYTES = 4.65e9  # int4 g128 + fp16 scales/zeros, bf16 lm_head (GPU.md)
LLAMA3_8B_KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
LLAMA3_8B_FLOP_PER_TOKEN = 16e9
SMOLLM2_WEIGHT_BYTES = 0.27e9
ENV = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"}


def measure_ceilings() -> dict[str, float]:
    import torch

    x = torch.randn(2**30 // 2, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")

    def timed(fn: Any, n: int) -> float:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(n):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return sorted(times)[len(times) // 2]

    t_copy = timed(lambda: y.copy_(x), 20)
    t_mm = timed(lambda: a @ b, 20)
    out = {"copy_GBps": 2 * x.numel() * 2 / t_copy / 1e9, "bf16_matmul_TFLOPs": 2 * 8192**3 / t_mm / 1e12}
    return out


# Seconds each row took on an H200 (2026-11-30, dummy weights, compile caches cold), for --gpus.
EST_S = {
    "llama3_awq_offline": 195, "llama3_offline": 140, "llama3_offline_b256": 140, "llama3_awq_bs1": 100,
    "llama3_awq_bs1_host_emb": 100, "hf_llama3_bs1": 90, "hf_llama3_b64": 90, "llama3_b256_1k": 75,
    "llama3_bs1": 45, "hf_smollm2_bs1": 40, "smollm2_bs1": 30, "llama3_bs1_ms8": 45, "smollm2_bs1_ms8": 30,
    "llama3_b256_1k_k1": 75, "llama3_offline_k1": 140,
}  # fmt: skip


def lanes(names: list[str], n: int) -> list[list[str]]:
    """``names`` over ``n`` lanes: longest first (``EST_S``), each onto the lane with the least work."""
    work = [0] * n
    out: list[list[str]] = [[] for _ in range(n)]
    for name in sorted(names, key=lambda x: -EST_S.get(x, 60)):
        i = work.index(min(work))
        out[i].append(name)
        work[i] += EST_S.get(name, 60)
    return out


def run(name: str, cmd: list[str], out: Path, timeout: int, gpu: int | None = None) -> dict[str, Any] | None:
    js = out / f"{name}.json"
    log = out / f"{name}.log"
    env = ENV if gpu is None else {**ENV, "CUDA_VISIBLE_DEVICES": str(gpu)}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = -9
    took = time.perf_counter() - t0
    print(f"[{name}] rc={rc} in {took:.0f} s" + ("" if gpu is None else f" on GPU {gpu}"), flush=True)
    if rc != 0 or not js.exists():
        print(log.read_text()[-3000:], flush=True)
        return None
    res = json.loads(js.read_text())
    keys = ("decode_tokens_per_s", "output_tokens_per_s", "decode_ms_p50", "host_ms_per_step_p50")
    # each row's figures as it ends, so that a run cut short still reports the rows it finished
    print(
        f"[{name}] " + ", ".join(f"{k} {res[k]:.3f}" for k in keys if isinstance(res.get(k), float)),
        flush=True,
    )
    return res


def hotloop_cmd(kind: str, model: str, out: Path, name: str, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "hotloop.bench.offline", kind, "--model", model, "--load-format", "dummy",
        "--dtype", "bfloat16", "--output-json", str(out / f"{name}.json"), *args,
    ]  # fmt: skip


def hf_cmd(model: str, out: Path, name: str, batch: int, inp: int, outp: int) -> list[str]:
    return [
        sys.executable, str(Path(__file__).with_name("hf_baseline.py")), "--model", model,
        "--batch-size", str(batch), "--input-len", str(inp), "--output-len", str(outp),
        "--output-json", str(out / f"{name}.json"),
    ]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the whole script")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--only", default=None, help="comma-separated row names")
    ap.add_argument("--skip", default=None, help="comma-separated row names to leave out")
    ap.add_argument("--gpus", type=int, default=1, help="run the rows in this many lanes, one per GPU")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    q = args.quick
    import torch

    ceil = measure_ceilings()
    torch.cuda.empty_cache()
    bw = ceil["copy_GBps"] * 1e9
    fl = ceil["bf16_matmul_TFLOPs"] * 1e12
    print(
        f"ceilings now: copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul {ceil['bf16_matmul_TFLOPs']:.0f} TFLOP/s"
    )
    gp = ["--session-len", "2048", "--max-batch-size", "8"]
    n_req = 64 if q else 1000
    b256_ctx = 1024
    b256_out = 96  # the timed steps run from context 1,025 to 1,119: the median step reads 1,024 + 48
    rows: dict[str, Any] = {}
    plan = {
        "llama3_bs1": (hotloop_cmd("latency", "llama3-8b", out, "llama3_bs1", "--batch-size", "1", "--input-len", "128",
                                   "--output-len", "128" if q else "512", "--num-iters", "2" if q else "3", *gp), 300),
        "smollm2_bs1": (hotloop_cmd("latency", "smollm2-135m", out, "smollm2_bs1", "--batch-size", "1", "--input-len",
                                    "128", "--output-len", "512", "--num-iters", "3", *gp), 200),
        "llama3_b256_1k": (hotloop_cmd("latency", "llama3-8b", out, "llama3_b256_1k", "--batch-size", "256",
                                       "--input-len", str(b256_ctx), "--output-len", str(b256_out),
                                       "--num-iters", "1", "--session-len", "2048", "--max-batch-size", "256",
                                       "--max-prefill-token-num", "16384"), 300),
        # multi-step decode (--num-scheduler-steps 8): eight decode steps per launch and host round trip
        "llama3_bs1_ms8": (hotloop_cmd("latency", "llama3-8b", out, "llama3_bs1_ms8", "--batch-size", "1",
                                       "--input-len", "128", "--output-len", "128" if q else "512", "--num-iters",
                                       "2" if q else "3", "--num-scheduler-steps", "8", *gp), 300),
        "smollm2_bs1_ms8": (hotloop_cmd("latency", "smollm2-135m", out, "smollm2_bs1_ms8", "--batch-size", "1",
                                        "--input-len", "128", "--output-len", "512", "--num-iters", "3",
                                        "--num-scheduler-steps", "8", *gp), 200),
        # one decode step per launch throughout (the batch of 256 is full, so by default it runs rounds
        # of up to 8 decode steps per launch: --full-batch-steps 8)
        "llama3_b256_1k_k1": (hotloop_cmd("latency", "llama3-8b", out, "llama3_b256_1k_k1", "--batch-size", "256",
                                          "--input-len", str(b256_ctx), "--output-len", str(b256_out),
                                          "--num-iters", "1", "--session-len", "2048", "--max-batch-size", "256",
                                          "--max-prefill-token-num", "16384", "--full-batch-steps", "1"), 300),
        "llama3_awq_bs1": (hotloop_cmd("latency", "llama3-8b", out, "llama3_awq_bs1", "--model-format", "awq",
                                       "--batch-size", "1", "--input-len", "128", "--output-len", "128" if q else "512",
                                       "--num-iters", "2" if q else "3", *gp), 300),
        # the same with the embedding table in pinned host memory (issue 5's weight-memory row)
        "llama3_awq_bs1_host_emb": (hotloop_cmd("latency", "llama3-8b", out, "llama3_awq_bs1_host_emb",
                                                "--model-format", "awq", "--embeddings-on-host", "--batch-size", "1",
                                                "--input-len", "128", "--output-len", "128" if q else "512",
                                                "--num-iters", "2" if q else "3", *gp), 300),
        # 384 sequences per step: 1000 equal requests run in three waves (256 takes four; 2026-11-30
        # H200: 384 10,198 tokens/s, 320 9,789, 448 9,329 on one host; 256 9,617 on another). The KV cache
        # holds 384 x 2048.
        "llama3_offline": (hotloop_cmd("throughput", "llama3-8b", out, "llama3_offline", "--num-prompts", str(n_req),
                                       "--input-len", "1024", "--output-len", "256" if q else "1024",
                                       "--session-len", "2048", "--max-batch-size", "384",
                                       "--max-prefill-token-num", "16384"), 500),
        # the same at 256 sequences per step (this row's setting before 2026-11-30)
        "llama3_offline_b256": (hotloop_cmd("throughput", "llama3-8b", out, "llama3_offline_b256", "--num-prompts",
                                            str(n_req), "--input-len", "1024", "--output-len", "256" if q else "1024",
                                            "--session-len", "2048", "--max-batch-size", "256",
                                            "--max-prefill-token-num", "16384"), 500),
        # the same with one decode step per launch throughout (by default a full batch runs rounds of up
        # to 8: --full-batch-steps 8)
        "llama3_offline_k1": (hotloop_cmd("throughput", "llama3-8b", out, "llama3_offline_k1", "--num-prompts",
                                          str(n_req), "--input-len", "1024", "--output-len", "256" if q else "1024",
                                          "--session-len", "2048", "--max-batch-size", "384",
                                          "--max-prefill-token-num", "16384", "--full-batch-steps", "1"), 500),
        # issue 5: the offline row with W4A16 weights (target: no lower than bf16's)
        "llama3_awq_offline": (hotloop_cmd("throughput", "llama3-8b", out, "llama3_awq_offline", "--model-format",
                                           "awq", "--num-prompts", str(n_req), "--input-len", "1024",
                                           "--output-len", "256" if q else "1024", "--session-len", "2048",
                                           "--max-batch-size", "384", "--max-prefill-token-num", "16384"), 500),
    }  # fmt: skip
    if not args.skip_hf:
        plan["hf_llama3_bs1"] = (hf_cmd("llama3-8b", out, "hf_llama3_bs1", 1, 128, 64 if q else 256), 300)
        plan["hf_smollm2_bs1"] = (hf_cmd("smollm2-135m", out, "hf_smollm2_bs1", 1, 128, 512), 200)
        plan["hf_llama3_b64"] = (hf_cmd("llama3-8b", out, "hf_llama3_b64", 64, 512, 64 if q else 256), 300)
    plan["llama3_offline"] = plan.pop("llama3_offline")  # the longest run goes last
    only = set(args.only.split(",")) if args.only else None
    skip = set(args.skip.split(",")) if args.skip else set()
    unknown = ((only or set()) | skip) - set(plan)
    if unknown:
        ap.error(f"--only / --skip: unknown rows {sorted(unknown)}; rows: {', '.join(plan)}")
    if not 1 <= args.gpus <= max(1, torch.cuda.device_count()):
        ap.error(f"--gpus {args.gpus}: this machine has {torch.cuda.device_count()} GPU(s)")
    names = [n for n in plan if (only is None or n in only) and n not in skip]
    if args.gpus <= 1:
        for name in names:
            rows[name] = run(name, plan[name][0], out, plan[name][1])
    else:

        def lane(gpu: int, lane_names: list[str]) -> None:
            for name in lane_names:
                rows[name] = run(name, plan[name][0], out, plan[name][1], gpu=gpu)

        threads = [
            threading.Thread(target=lane, args=(i, ns)) for i, ns in enumerate(lanes(names, args.gpus))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def get(name: str, key: str) -> float | None:
        r = rows.get(name)
        return None if r is None else r.get(key)

    floor_bs1 = LLAMA3_8B_WEIGHT_BYTES / bw  # s per step
    # the floor of the step the row reports (the median): its context is the input plus half the output
    # (before 2026-12-06 this said + 16, the median of the 32-token output the row first had)
    kv256 = 256 * (b256_ctx + b256_out // 2) * LLAMA3_8B_KV_BYTES_PER_TOKEN
    floor_b256 = max((LLAMA3_8B_WEIGHT_BYTES + kv256) / bw, 256 * LLAMA3_8B_FLOP_PER_TOKEN / fl)
    # the issue's own constants (GPU.md's H200 ceilings), whatever this run's card measured
    floor_b256_issue = max((LLAMA3_8B_WEIGHT_BYTES + kv256) / 4229e9, 256 * LLAMA3_8B_FLOP_PER_TOKEN / 783e12)
    table = [
        ("Llama-3-8B bs1 128/512 tok/s", get("llama3_bs1", "decode_tokens_per_s"), 1 / floor_bs1, ">= 254",
         get("hf_llama3_bs1", "output_tokens_per_s"), 200),
        ("  the same, --num-scheduler-steps 8", get("llama3_bs1_ms8", "decode_tokens_per_s"), 1 / floor_bs1,
         ">= 254", None, None),
        ("Llama-3-8B W4A16 bs1 128/512 tok/s", get("llama3_awq_bs1", "decode_tokens_per_s"),
         1 / (LLAMA3_8B_AWQ_WEIGHT_BYTES / bw), ">= 700", None, 253),
        ("  the same, --embeddings-on-host", get("llama3_awq_bs1_host_emb", "decode_tokens_per_s"),
         1 / (LLAMA3_8B_AWQ_WEIGHT_BYTES / bw), ">= 700", None, None),
        ("SmolLM2-135M bs1 128/512 tok/s", get("smollm2_bs1", "decode_tokens_per_s"), 1 / (SMOLLM2_WEIGHT_BYTES / bw),
         ">= 2500", get("hf_smollm2_bs1", "output_tokens_per_s"), 586),
        ("  the same, --num-scheduler-steps 8", get("smollm2_bs1_ms8", "decode_tokens_per_s"),
         1 / (SMOLLM2_WEIGHT_BYTES / bw), ">= 2500", None, None),
        (f"Llama-3-8B offline {n_req}x1024/{256 if q else 1024} out tok/s", get("llama3_offline", "output_tokens_per_s"),
         None, ">= 10000", get("hf_llama3_b64", "output_tokens_per_s"), 8235),
        ("  the same, --max-batch-size 256", get("llama3_offline_b256", "output_tokens_per_s"), None, ">= 10000",
         None, None),
        ("  the same, one step a launch (--full-batch-steps 1)", get("llama3_offline_k1", "output_tokens_per_s"),
         None, ">= 10000", None, None),
        ("  the same, W4A16 weights", get("llama3_awq_offline", "output_tokens_per_s"), None, ">= bf16's",
         None, None),
        ("Llama-3-8B decode step b256 1k ctx ms", get("llama3_b256_1k", "decode_ms_p50"), floor_b256 * 1e3,
         f"<= {1.3 * floor_b256 * 1e3:.1f}", None, None),
        ("  the same, floor at the issue's 4,229 GB/s", get("llama3_b256_1k", "decode_ms_p50"),
         floor_b256_issue * 1e3, f"<= {1.3 * floor_b256_issue * 1e3:.1f}", None, None),
        ("  the same, one step a launch (--full-batch-steps 1)", get("llama3_b256_1k_k1", "decode_ms_p50"),
         floor_b256 * 1e3, f"<= {1.3 * floor_b256 * 1e3:.1f}", None, None),
        ("host ms per decode step b256", get("llama3_b256_1k", "host_ms_per_step_p50"), None, "<= 1", None, None),
        ("  the same, one step a launch (--full-batch-steps 1)", get("llama3_b256_1k_k1", "host_ms_per_step_p50"),
         None, "<= 1", None, None),
    ]  # fmt: skip
    result = {"ceilings": ceil, "runs": rows, "table": [dict(zip(
        ("row", "hotloop", "floor", "target", "transformers", "vllm"), t, strict=True)) for t in table]}  # fmt: skip
    (out / "gpu_table.json").write_text(json.dumps(result, indent=2))

    def fmt(x: float | None, nd: int = 1) -> str:
        return "-" if x is None else f"{x:,.{nd}f}"

    print(
        f"\n{'workload':46} {'hotloop':>10} {'floor':>10} {'of floor':>9} {'target':>10} {'HF':>8} {'vLLM':>7}"
    )
    for label, val, floor, target, hf, vllm in table:
        frac = "-"
        if val is not None and floor:
            frac = f"{(val / floor if target.startswith('>=') else floor / val):.0%}"  # rates vs times
        print(
            f"{label:46} {fmt(val):>10} {fmt(floor):>10} {frac:>9} {target:>10} {fmt(hf):>8} {fmt(vllm, 0):>7}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
