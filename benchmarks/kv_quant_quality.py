"""KV cache quantization quality: perplexity and greedy agreement for --quant-policy 0 / 8 / 4.

Runs a real model through the whole engine (paged cache, quantize-on-write, dequantize in
attention) on the CPU or a GPU, three times: float KV (the baseline, in the model's run dtype),
int8 KV and int4 KV. Reports

- perplexity on held-out text (``pipe.get_ppl`` over fixed-length windows of Python's own
  documentation, ``pydoc_data.topics``: technical English the model was not tuned on), scored in
  prefill chunks of each ``--score-chunks`` size: with chunks of 1 token every key is read back from
  the quantized cache, as in decoding (the figure that measures the cache); a prompt prefilled in one
  chunk attends to its own keys unquantized (``paged_prefill_attention``'s ``k_new``), so a whole
  window in one chunk scores as the float cache does,
- greedy agreement with the float-KV output: the share of prompts whose whole continuation is
  identical, and the share of generated positions before the first divergence.

It also records, with prefix caching on, how much a three-turn ``pipe.chat`` reads from the cache,
and that its tokens equal a run with caching off.

    python benchmarks/kv_quant_quality.py --out benchmarks/results/kv_quant_quality_smollm2.json
    python benchmarks/kv_quant_quality.py --model /path/to/qwen2.5-coder-1.5b --windows 8
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import torch

PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "A binary search works by",
    "The three primary colors are",
    "In Python, a list comprehension",
    "The largest planet in the solar system is",
    "To make a cup of tea, first",
    "The theory of evolution was proposed by",
    "A prime number is",
    "The speed of light in a vacuum is",
    "Photosynthesis is the process by which",
    "The French Revolution began in",
    "An operating system is responsible for",
    "The Pythagorean theorem states that",
    "In economics, inflation means",
    "The human heart has four chambers:",
]


def held_out_windows(tokenizer: Any, n: int, length: int) -> list[list[int]]:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics)[-120:])  # the tail of the alphabet
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < n * length:
        raise SystemExit(f"only {len(ids)} tokens of text for {n} windows of {length}")
    return [ids[i * length : (i + 1) * length] for i in range(n)]


def agreement(base: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    exact = sum(a == b for a, b in zip(base, other, strict=True)) / len(base)
    prefix = []
    for a, b in zip(base, other, strict=True):
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        prefix.append(k / max(len(a), 1))
    return {"exact_match": round(exact, 4), "mean_prefix_agreement": round(sum(prefix) / len(prefix), 4)}


def run_policy(model: str | None, policy: int, args: argparse.Namespace) -> dict[str, Any]:
    from hotloop import EngineConfig, GenerationConfig, pipeline

    chunks = [int(c) for c in args.score_chunks.split(",")] if args.score_chunks else [1, args.window_len]
    result: dict[str, Any] = {"quant_policy": policy}
    t0 = time.perf_counter()
    for i, chunk in enumerate(chunks):
        cfg = EngineConfig(
            device=args.device,
            dtype=args.dtype,
            quant_policy=policy,
            cache_max_entry_count=args.blocks,
            max_batch_size=len(PROMPTS),
            max_prefill_token_num=chunk,
        )
        with pipeline(model, backend_config=cfg) as pipe:
            windows = held_out_windows(pipe.tokenizer, args.windows, args.window_len)
            ppls = pipe.get_ppl(windows)
            nll = [math.log(p) for p in ppls]
            ppl = round(math.exp(sum(nll) / len(nll)), 4)
            result[f"perplexity_chunk{chunk}"] = ppl
            result[f"perplexity_per_window_chunk{chunk}"] = [round(p, 3) for p in ppls]
            if i == 0:  # the first chunk size is the headline figure; greedy runs once
                result["perplexity"] = ppl
                result["score_chunk"] = chunk
                gen = GenerationConfig(max_new_tokens=args.max_new, ignore_eos=True)
                outs = pipe(PROMPTS, gen_config=gen, do_preprocess=False)
                k_cache = pipe.engine.executor.kv_caches[0][0]
                result["greedy_tokens"] = [o.token_ids for o in outs]
                result["kv_cache_dtype"] = str(k_cache.dtype)
                result["kv_row_bytes"] = int(k_cache.shape[-1] * k_cache.element_size())
            print(f"  quant_policy={policy}, chunks of {chunk}: ppl {ppl:.4f}", flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def run_chat(model: str | None, args: argparse.Namespace) -> dict[str, Any]:
    from hotloop import EngineConfig, GenerationConfig, pipeline

    turns = ["Name a fruit.", "What color is it?", "Write one sentence about it."]
    gen = GenerationConfig(max_new_tokens=24)
    result: dict[str, Any] = {}
    for caching in (True, False):
        cfg = EngineConfig(
            device=args.device,
            dtype=args.dtype,
            enable_prefix_caching=caching,
            cache_max_entry_count=args.blocks,
            cache_block_seq_len=16,
        )
        with pipeline(model, backend_config=cfg) as pipe:
            session = None
            rows = []
            for t in turns:
                session = pipe.chat(t, session=session, gen_config=gen)
                r = session.response
                assert r is not None
                rows.append(
                    {"prompt_tokens": r.input_token_len, "cached_tokens": r.cached_tokens, "ids": r.token_ids}
                )
            bm = pipe.engine.block_manager
            result["on" if caching else "off"] = {
                "turns": rows,
                "prefix_queries": bm.prefix_queries,
                "prefix_hits": bm.prefix_hits,
            }
    on, off = result["on"]["turns"], result["off"]["turns"]
    result["same_tokens_as_cold"] = all(a["ids"] == b["ids"] for a, b in zip(on, off, strict=True))
    for r in on + off:
        r.pop("ids")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model folder or GGUF (default: the embedded SmolLM2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--windows", type=int, default=8, help="perplexity windows")
    ap.add_argument("--window-len", type=int, default=512, help="tokens per window")
    ap.add_argument("--max-new", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--blocks", type=int, default=256, help="KV blocks (cache_max_entry_count)")
    ap.add_argument(
        "--score-chunks",
        default=None,
        help="prefill chunk sizes to score the perplexity windows in, e.g. '1,512'; the first is the "
        "headline (1: every key read back from the cache, as in decoding). Default: 1 and the window "
        "length (the whole window in one prefill)",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    torch.manual_seed(0)
    runs = {p: run_policy(args.model, p, args) for p in (0, 8, 4)}
    base = runs[0]["greedy_tokens"]
    summary = []
    for p, r in runs.items():
        row = {k: v for k, v in r.items() if k != "greedy_tokens"}
        row["perplexity_delta_pct"] = round(100 * (r["perplexity"] / runs[0]["perplexity"] - 1), 3)
        for key in [k for k in r if k.startswith("perplexity_chunk")]:
            row[key.replace("perplexity_", "perplexity_delta_pct_")] = round(
                100 * (r[key] / runs[0][key] - 1), 3
            )
        row.update(agreement(base, r["greedy_tokens"]))
        summary.append(row)
        print(
            f"quant_policy={p}: ppl {r['perplexity']:.4f} ({row['perplexity_delta_pct']:+.2f}%, chunks of "
            f"{r['score_chunk']}), "
            f"greedy exact {row['exact_match']:.2%}, prefix agreement {row['mean_prefix_agreement']:.2%}, "
            f"KV row {r['kv_row_bytes']} B/head/token"
        )
    chat = run_chat(args.model, args)
    print(
        f"multi-turn chat with prefix caching: {[t['cached_tokens'] for t in chat['on']['turns']]} cached "
        f"tokens per turn, same tokens as cold: {chat['same_tokens_as_cold']}"
    )
    record = {
        "benchmark": "kv_quant_quality",
        "model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF)",
        "device": args.device,
        "dtype": args.dtype,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "text": f"pydoc_data.topics tail, {args.windows} windows x {args.window_len} tokens",
        "score_chunks": args.score_chunks or f"1,{args.window_len}",
        "prompts": len(PROMPTS),
        "max_new_tokens": args.max_new,
        "results": summary,
        "multi_turn_chat": chat,
        "date": time.strftime("%Y-%m-%d"),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
