"""AWQ accuracy table: unquantized vs round-to-nearest int4 vs AWQ (fixed ratio, and --search-scale).

For each variant: perplexity on held-out text (the last 10% of the calibration corpus, never used
for calibration) and greedy agreement with the unquantized model over N prompts x T new tokens.
Every model runs through the serving path (``hotloop.pipeline``) on the CPU in float32, so the only
difference between rows is the weight quantization.

    python benchmarks/awq_accuracy.py --out benchmarks/results/awq_accuracy_smollm2.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import hotloop
from hotloop.config import EngineConfig
from hotloop.lite import AWQOptions, auto_awq, awq
from hotloop.lite.calib_data import load_text, token_windows
from hotloop.messages import GenerationConfig
from hotloop.models.resolve import resolve_model_path


def evaluate(
    path: str, ppl_windows: torch.Tensor, prompts: list[list[int]], new_tokens: int
) -> dict[str, Any]:
    cfg = EngineConfig(device="cpu", dtype="float32", cache_max_entry_count=256, cache_block_seq_len=64)
    t0 = time.perf_counter()
    with hotloop.pipeline(path, cfg) as pipe:
        ppls = pipe.get_ppl(ppl_windows.tolist())
        gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, ignore_eos=True)
        outs = pipe([pipe.tokenizer.decode(p) for p in prompts], gen_config=gen, do_preprocess=False)
    nll = sum(math.log(p) for p in ppls) / len(ppls)
    return {
        "ppl": math.exp(nll),
        "tokens": [list(o.token_ids) for o in outs],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict[str, float]:
    same = [
        sum(a == b for a, b in zip(r, g, strict=False)) / max(1, len(r))
        for r, g in zip(ref, got, strict=True)
    ]
    prefix = []
    for r, g in zip(ref, got, strict=True):
        n = 0
        while n < min(len(r), len(g)) and r[n] == g[n]:
            n += 1
        prefix.append(n)
    return {"token_match": sum(same) / len(same), "mean_identical_prefix": sum(prefix) / len(prefix)}


@contextlib.contextmanager
def _ablation(name: str) -> Iterator[None]:
    """For the ``--ablations`` rows: switch one AWQ step off while ``name`` is quantized."""
    saved = (awq.search_clip, awq.search_scale)
    if name.startswith("awq_noclip"):
        awq.search_clip = lambda w, x, g, bits: torch.ones(w.shape[0], w.shape[1] // g, device=w.device)
    elif name.startswith("clip_only"):
        awq.search_scale = lambda group, x, g, bits, search: (
            torch.ones(x.shape[-1], device=x.device),
            awq.NO_SCALING,
            float("nan"),
        )
    try:
        yield
    finally:
        awq.search_clip, awq.search_scale = saved


def report_header(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "benchmark": "awq_accuracy",
        "model": args.model or "SmolLM2-135M-Instruct (embedded default)",
        "host": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "heldout": f"pydoc last 10%: {args.ppl_windows} x {args.ppl_seqlen} tokens (ppl), "
        f"{args.prompts} prompts x 32 tokens -> {args.new_tokens} greedy tokens",
        "dtype": "float32 everywhere (quantized weights dequantized at load on the CPU)",
    }


def _write(out: str, header: dict[str, Any], results: dict[str, Any]) -> None:
    base = results["unquantized"]["ppl"]
    for row in results.values():
        row["ppl_increase"] = row["ppl"] - base
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({**header, "results": results}, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder or .gguf (default: embedded SmolLM2-135M)")
    ap.add_argument("--work-dir", default="/tmp/awq_accuracy")
    ap.add_argument("--out", required=True, help="JSON results file")
    ap.add_argument("--group-size", type=int, default=64, help="SmolLM2's hidden 576 needs 64 (not 128)")
    ap.add_argument("--calib-samples", type=int, default=128)
    ap.add_argument("--calib-seqlen", type=int, default=512)
    ap.add_argument("--search-calib-samples", type=int, default=None, help="fewer samples for --search-scale")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--ppl-windows", type=int, default=16)
    ap.add_argument("--ppl-seqlen", type=int, default=512)
    ap.add_argument("--skip-search", action="store_true")
    ap.add_argument(
        "--ablations",
        action="store_true",
        help="instead of RTN / AWQ / AWQ search: AWQ (fixed ratio) without the clip search, and the clip "
        "search without the scaling (diagnostics: which AWQ step moves perplexity)",
    )
    ap.add_argument(
        "--only", default=None, help="comma-separated rows to run besides 'unquantized' (e.g. awq_g128)"
    )
    args = ap.parse_args()

    torch.manual_seed(0)
    src = str(resolve_model_path(args.model))
    work = Path(args.work_dir)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    heldout = load_text("pydoc", "heldout")
    ppl_windows = token_windows(tok, heldout, args.ppl_windows, args.ppl_seqlen)
    prompts = token_windows(tok, heldout, args.prompts, 32).tolist()

    g = args.group_size
    variants: dict[str, AWQOptions | None] = {
        "unquantized": None,
        f"rtn_g{g}": AWQOptions(method="rtn", w_group_size=g),
        f"awq_g{g}": AWQOptions(
            calib_samples=args.calib_samples, calib_seqlen=args.calib_seqlen, w_group_size=g
        ),
    }
    if args.ablations:
        awq_opts = variants.pop(f"awq_g{g}")
        del variants[f"rtn_g{g}"]
        variants[f"awq_noclip_g{g}"] = awq_opts
        variants[f"clip_only_g{g}"] = awq_opts
    elif not args.skip_search:
        n = args.search_calib_samples or args.calib_samples
        variants[f"awq_search_g{g}"] = AWQOptions(
            calib_samples=n, calib_seqlen=args.calib_seqlen, w_group_size=g, search_scale=True
        )
    if args.only:
        keep = {"unquantized", *args.only.split(",")}
        unknown = keep - set(variants)
        if unknown:
            raise SystemExit(f"--only: no rows {sorted(unknown)}; rows are {sorted(variants)}")
        variants = {k: v for k, v in variants.items() if k in keep}
    results: dict[str, Any] = {}
    ref_tokens: list[list[int]] | None = None
    for name, opts in variants.items():
        row: dict[str, Any] = {}
        path = src
        if opts is not None:
            t0 = time.perf_counter()
            with _ablation(name):
                path = str(auto_awq(src, work / name, opts))
            row["quantize_seconds"] = round(time.perf_counter() - t0, 1)
            row["options"] = {k: getattr(opts, k) for k in opts.__dataclass_fields__}
            row["weight_file_bytes"] = sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
        ev = evaluate(path, ppl_windows, prompts, args.new_tokens)
        tokens = ev.pop("tokens")
        row.update(ev)
        if ref_tokens is None:
            ref_tokens = tokens
        else:
            row.update(agreement(ref_tokens, tokens))
        results[name] = row
        print(name, json.dumps(row), flush=True)
        _write(args.out, report_header(args), results)  # partial results survive an interruption

    _write(args.out, report_header(args), results)
    print(f"\n{'variant':<22}{'ppl':>9}{'+ppl':>8}{'match':>8}{'prefix':>8}")
    for name, row in results.items():
        print(
            f"{name:<22}{row['ppl']:>9.3f}{row['ppl_increase']:>8.3f}"
            f"{row.get('token_match', 1.0):>8.3f}{row.get('mean_identical_prefix', args.new_tokens):>8.1f}"
        )


if __name__ == "__main__":
    main()
