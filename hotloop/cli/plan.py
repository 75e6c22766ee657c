"""``hotloop plan``: predict weight bytes, KV bytes per token, blocks and concurrency before buying a GPU."""

from __future__ import annotations

import argparse
import json
import sys

from hotloop.plan.capacity import GIB, KV_POLICIES, WEIGHT_FORMATS, Plan, PlanInput, plan, sweep
from hotloop.plan.presets import PRESETS, ModelShape, load_shape


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="capacity planner: what fits on a GPU (weights, KV bytes, blocks, concurrent sequences)",
        description="Predict weight bytes, KV bytes per token, KV blocks and the most concurrent "
        "full-length sequences for a model on a GPU. Memory is in GiB (2**30 bytes).",
    )
    p.add_argument(
        "model", help=f"a folder with config.json, a config.json, or a preset: {', '.join(PRESETS)}"
    )
    p.add_argument("--gpu-mem", type=float, default=80.0, help="GPU memory in GiB (default: 80)")
    p.add_argument("--weight-format", choices=WEIGHT_FORMATS, default="bf16", help="bf16 or awq (W4A16)")
    p.add_argument(
        "--kv-bits",
        type=int,
        choices=KV_POLICIES,
        default=16,
        help="KV cache bits: 16 (no quantization), 8 (--quant-policy 8), 4 (--quant-policy 4)",
    )
    p.add_argument(
        "--session-len",
        type=int,
        default=None,
        help="tokens per sequence (default: the model's max_position_embeddings, as the engine's "
        f"--session-len; {DEFAULT_SESSION_LEN} where the model does not say)",
    )
    p.add_argument(
        "--prefix-hit-rate",
        type=float,
        default=0.0,
        help="share of each sequence that is a common cached prefix, stored once (default: 0)",
    )
    p.add_argument(
        "--mem-util", type=float, default=0.9, help="share of GPU memory the engine may use (default: 0.9)"
    )
    p.add_argument(
        "--overhead", type=float, default=0.0, help="GiB kept for activations and CUDA graphs (default: 0)"
    )
    p.add_argument("--block-size", type=int, default=64, help="tokens per KV block (default: 64)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per model replica (default: 1)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs in a node (default: 8)")
    p.add_argument("--target", type=int, default=None, help="concurrent sequences needed per node")
    p.add_argument("--sweep", action="store_true", help="every weight format x KV policy")
    p.add_argument(
        "--embeddings-on-host",
        action="store_true",
        help="the engine's --embeddings-on-host: an untied token-embedding table stays in host memory",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--measure",
        action="store_true",
        help="also start the engine (dummy weights, on the GPU) for each row and print the predicted "
        "block count beside the allocated one; MODEL must then be an engine preset or a model folder",
    )
    p.add_argument(
        "--cache-max-entry-count",
        type=float,
        default=0.8,
        help="with --measure: the engine's KV share of the memory free after the weights (default: 0.8)",
    )
    p.set_defaults(func=run)


DEFAULT_SESSION_LEN = 32768


def inputs_from_args(args: argparse.Namespace, shape: ModelShape | None = None) -> PlanInput:
    if not 0.0 < args.cache_max_entry_count <= 1.0:
        raise ValueError(f"--cache-max-entry-count {args.cache_max_entry_count}: must lie in (0, 1]")
    if args.target is not None and args.target < 1:
        raise ValueError(f"--target {args.target}: must be >= 1 (concurrent sequences per node)")
    return PlanInput(
        gpu_mem_gib=args.gpu_mem,
        weight_format=args.weight_format,
        kv_bits=args.kv_bits,
        session_len=args.session_len
        if args.session_len is not None
        else (shape.max_positions if shape is not None and shape.max_positions else DEFAULT_SESSION_LEN),
        prefix_hit_rate=args.prefix_hit_rate,
        mem_util=args.mem_util,
        overhead_gib=args.overhead,
        block_size=args.block_size,
        tp=args.tp,
        gpus_per_node=args.gpus_per_node,
        embeddings_on_host=args.embeddings_on_host,
    )


def format_table(plans: list[Plan], target: int | None = None) -> str:
    first = plans[0]
    i = first.inputs
    lines = [
        f"model {first.model}: {first.num_params / 1e9:.2f}B parameters; {i.gpu_mem_gib:g} GiB GPU x "
        f"{i.mem_util:g} usable, overhead {i.overhead_gib:g} GiB; session {i.session_len} tokens; "
        f"block {i.block_size}; tp {i.tp}; {i.gpus_per_node} GPUs per node",
        "",
        f"{'weights':>7} {'KV':>4} {'prefix':>6} {'weights GiB':>11} {'KV B/token':>10} {'KV GiB':>7} "
        f"{'blocks':>8} {'GiB/seq':>8} {'seqs/replica':>12} {'seqs/node':>9}" + ("  fits" if target else ""),
    ]
    for p in plans:
        i = p.inputs
        kv = "fp16" if i.kv_bits == 16 else f"int{i.kv_bits}"
        row = (
            f"{i.weight_format:>7} {kv:>4} {i.prefix_hit_rate:>6.0%} {p.weight_bytes / GIB:>11.2f} "
            f"{p.kv_bytes_per_token:>10} {p.kv_budget_bytes / GIB:>7.2f} {p.num_blocks:>8} "
            f"{p.effective_bytes_per_sequence / GIB:>8.3f} {p.max_sequences:>12} {p.max_sequences_per_node:>9}"
        )
        if target:
            row += "  " + ("yes" if p.max_sequences_per_node >= target else "no")
        lines.append(row)
    lines.append("")
    lines.append(
        "GiB/seq: KV of one full-length sequence over its replica's GPUs, after prefix deduplication; "
        "seqs: full-length sequences held at once"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    shape = load_shape(args.model)
    base = inputs_from_args(args, shape)
    plans = sweep(shape, base) if args.sweep else [plan(shape, base)]
    if args.measure:
        return run_measure(args, shape, [p.inputs for p in plans])
    if args.json:
        print(json.dumps([p.as_dict() for p in plans], indent=2))
    else:
        print(format_table(plans, args.target))
    if shape.max_positions is not None and base.session_len > shape.max_positions:
        # (the engine takes such a session_len with the same warning: hotloop/api/build.py)
        print(
            f"warning: --session-len {base.session_len} exceeds {shape.name}'s max_position_embeddings="
            f"{shape.max_positions}: positions past {shape.max_positions} are beyond what the model was "
            "trained on; plan with a --session-len within it, or a model with a longer context",
            file=sys.stderr,
        )
    for p in plans:
        if p.weight_bytes > p.inputs.gpu_mem_gib * GIB * (
            p.inputs.mem_util if p.inputs.cache_max_entry_count is None else 1.0
        ):
            print(
                f"warning: {p.inputs.weight_format} weights take {p.weight_bytes / GIB:.2f} GiB per GPU, more than "
                f"the {p.inputs.gpu_mem_gib:g} GiB GPU can give them: raise --tp or use --weight-format awq",
                file=sys.stderr,
            )
    if args.target is not None and not any(p.max_sequences_per_node >= args.target for p in plans):
        return 3
    return 0


def run_measure(args: argparse.Namespace, shape: ModelShape, inputs: list[PlanInput]) -> int:
    from hotloop.plan.measure import measure

    rows = []
    for i in inputs:
        m = measure(args.model, shape, i, args.cache_max_entry_count)
        rows.append(m.as_dict())
        kv = "fp16" if i.kv_bits == 16 else f"int{i.kv_bits}"
        print(
            f"{i.weight_format:>5} {kv:>4}: predicted {m.predicted.num_blocks} blocks, allocated "
            f"{m.allocated_blocks} ({m.error:+.2%}); weights predicted {m.predicted.weight_bytes / GIB:.2f} GiB, "
            f"on the GPU {m.weight_bytes_on_gpu / GIB:.2f} GiB",
            flush=True,
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0 if all(abs(r["error"]) <= 0.02 for r in rows) else 4
