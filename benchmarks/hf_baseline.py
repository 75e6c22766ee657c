"""The transformers ``generate`` baseline: random bf16 weights at a preset's shapes, EOS ignored.

    PYTHONPATH=$PWD python3 benchmarks/hf_baseline.py --model llama3-8b --batch-size 1 \
        --input-len 128 --output-len 256 --output-json hf.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--output-json", required=True)
    args = ap.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM

    from hotloop.models.resolve import resolve_model_path

    cfg = AutoConfig.from_pretrained(str(resolve_model_path(args.model)))
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, 0.0, 0.02)
    model.generation_config.eos_token_id = None
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (args.batch_size, args.input_len), generator=g).cuda()

    def gen(n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    gen(4)  # warm-up
    total = gen(args.output_len)
    res = {
        "benchmark": "hf_generate",
        "model": args.model,
        "batch_size": args.batch_size,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "total_s": total,
        "output_tokens_per_s": args.batch_size * args.output_len / total,
        "transformers": __import__("transformers").__version__,
    }
    print(json.dumps(res, indent=2))
    with open(args.output_json, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
