"""CPU orientation benchmark: one ``pipe()`` call over 64 prompts vs transformers ``generate``.

Both run the embedded default model (SmolLM2-135M-Instruct, float32) on the same chat-templated
prompts, greedy, a fixed number of new tokens (EOS ignored) so both do the same work.
transformers runs the 64 prompts as one left-padded batch (its fastest mode here).

    python benchmarks/cpu_pipeline.py --out benchmarks/results/cpu_pipeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

QUESTIONS = [
    "What is a {}?",
    "Explain {} in one paragraph.",
    "Write a short poem about {}.",
    "Give three facts about {}.",
]
TOPICS = [
    "river", "volcano", "compiler", "neuron", "glacier", "violin", "satellite", "bridge",
    "forest", "database", "comet", "harbor", "library", "desert", "engine", "garden",
]  # fmt: skip


def prompts(n: int) -> list[str]:
    return [
        QUESTIONS[i % len(QUESTIONS)].format(TOPICS[(i // len(QUESTIONS)) % len(TOPICS)]) for i in range(n)
    ]


def run_hotloop(texts: list[str], max_new: int) -> dict:
    from hotloop import EngineConfig, GenerationConfig, pipeline

    pipe = pipeline(backend_config=EngineConfig(device="cpu", max_batch_size=len(texts)))
    gen = GenerationConfig(max_new_tokens=max_new, ignore_eos=True)
    pipe(texts[:2], gen_config=GenerationConfig(max_new_tokens=4))  # warm-up
    t0 = time.perf_counter()
    out = pipe(texts, gen_config=gen)
    dt = time.perf_counter() - t0
    n_out = sum(r.generate_token_len for r in out)
    ids = [pipe.encode(t) for t in texts]
    path = pipe.built.model_path
    pipe.close()
    return {
        "seconds": dt,
        "output_tokens": n_out,
        "tokens_per_s": n_out / dt,
        "prompt_ids": ids,
        "path": str(path),
    }


def run_transformers(path: str, ids: list[list[int]], max_new: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    width = max(map(len, ids))
    pad = 2
    batch = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    kw = dict(max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False, pad_token_id=pad)
    with torch.no_grad():
        model.generate(
            batch[:2], attention_mask=mask[:2], max_new_tokens=4, do_sample=False, pad_token_id=pad
        )
        t0 = time.perf_counter()
        g = model.generate(batch, attention_mask=mask, **kw)
        dt = time.perf_counter() - t0
    n_out = (g.shape[1] - width) * len(ids)
    return {"seconds": dt, "output_tokens": n_out, "tokens_per_s": n_out / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="JSON result file")
    args = ap.parse_args()
    texts = prompts(args.num_prompts)
    ours = run_hotloop(texts, args.max_new_tokens)
    theirs = run_transformers(ours.pop("path"), ours.pop("prompt_ids"), args.max_new_tokens)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "benchmark": "cpu_pipeline",
        "model": "SmolLM2-135M-Instruct (default, float32)",
        "num_prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "git_commit": commit,
        "date": time.strftime("%Y-%m-%d"),
        "hotloop": ours,
        "transformers_generate_batched": theirs,
        "speedup": ours["tokens_per_s"] / theirs["tokens_per_s"],
    }
    print(f"{'engine':<32}{'seconds':>10}{'out tokens':>12}{'tokens/s':>10}")
    for name, r in (("hotloop pipe()", ours), ("transformers generate (batch)", theirs)):
        print(f"{name:<32}{r['seconds']:>10.1f}{r['output_tokens']:>12}{r['tokens_per_s']:>10.1f}")
    print(f"speedup: {result['speedup']:.2f}x")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
