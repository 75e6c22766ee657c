"""Launch-configuration sweep of the paged attention kernels, float and quantized KV, on the GPU.

    python benchmarks/kv_attention_sweep.py --out results.json [--quick]

Llama-3-8B attention shape (32 query heads, 8 KV heads, head_dim 128, block size 64, bf16), random
cache contents. For each cache format (bf16, int8, int4) and workload it times every configuration
in a CUDA graph (``triton.testing.do_bench_cudagraph``, median; ``--eager-timing``: launch by
launch), checks the default configuration's output against the torch reference
(``kernels/reference.py``, on the same quantized cache; decode: the first 16 sequences) and every
other configuration's against the default's (a fast wrong configuration is reported, never chosen),
and prints the time beside the floor: bytes read / 4,229 GB/s (the H200 copy bandwidth in
../shared/GPU.md) for decode, FLOPs / 783 TFLOP/s for prefill; "of roofline" is floor / time.

Workloads: decode at batch 256 with 1k context (the issue-4 step), decode at batch 128 with 4k
context (the KV-bound run of issue 6) (``--decode-shapes`` for others; ``--splits`` adds the other
context-split counts, each with its default configuration and merge launch), prefill of one
4096-token prompt (``--prefill-lens`` for others); a quantized prefill is also timed with the prompt's
own keys read from ``k_new`` / ``v_new`` (the attention layer's launch). An int8 decode case also
times the CUDA C kernel (``kernels/kv_int8_decode_cuda.py``, config ``"cuda"``) where it applies. A prefill configuration's optional fifth field turns the unmasked loop below the diagonal
off (0) or on (1) (``paged_prefill_attention.DIAG_SPLIT``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from hotloop.kernels import kv_int8_decode_cuda, kv_quant, reference
from hotloop.kernels.paged_decode_attention import decode_config, num_decode_splits, paged_decode_attention
from hotloop.kernels.paged_prefill_attention import paged_prefill_attention, prefill_config

H, KV, D, BS = 32, 8, 128, 64
BANDWIDTH = 4229e9
FLOPS = 783e12


def make_cache(tokens: int, policy: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V caches holding ``tokens`` tokens (random values; quantized on the GPU)."""
    nb = -(-tokens // BS)
    caches = []
    for _ in range(2):
        x = torch.randn(nb, BS, KV, D, generator=gen).to(torch.bfloat16).cuda()
        caches.append(
            kv_quant.from_rows(kv_quant.quantize(x, policy, torch.bfloat16), D, torch.bfloat16)
            if policy
            else x
        )
    return caches[0], caches[1]


def as_float(cache: torch.Tensor, policy: int) -> torch.Tensor:
    """The cache in float32, dequantized (the reference reads the same values the kernels do)."""
    return kv_quant.dequantize_cache(cache, D, torch.bfloat16) if policy else cache.float()


CUDA_VARIANTS: list[str] = []  # --cuda-variants; empty: every variant of kv_int8_decode_cuda.VARIANTS
CUDA_GRIDS: list[str] = ["seq"]  # --cuda-grids: the CUDA int8 kernel's grid orders (HOTLOOP_KV_CUDA_GRID)
ROTATE_BYTES = 256 << 20  # decode: caches read in turn, five times the H200's L2
# --eager-timing: launch by launch with do_bench's L2 flush, as every sweep before the thirteenth
# session (prefill times from then on are in graphs without a flush: compare like with like)
GRAPH_TIMING = True


def bench(fn: Callable[[], Any]) -> float:
    """Median ms of ``fn``: replayed in a CUDA graph, as the engine's decode steps run (a launch from
    Python takes 20-40 us, longer than a small batch's kernel, and timed eagerly it would be that)."""
    import triton.testing

    if GRAPH_TIMING:
        fn()  # compile before capture
        return float(triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-9))


def decode_case(
    batch: int,
    ctx: int,
    policy: int,
    configs: list[tuple[int, ...]],
    gen: torch.Generator,
    splits: list[int] | None = None,
    fuses: tuple[bool, ...] = (False,),
    cross: bool = False,
) -> dict:
    """Every configuration at the default split count, then (``splits``) the default configuration
    of each other split count (a row's ``splits`` field; the merge launch is timed with it). With
    ``cross``, every configuration at every split count. Each run once per ``fuses`` entry: the
    merge launched (False) or done by the last split (True; a row's ``fused`` field)."""
    blocks = -(-ctx // BS)
    k, v = make_cache(batch * blocks * BS, policy, gen)
    perm = torch.randperm(batch * blocks, generator=gen).to(torch.int32)
    tables = perm.view(batch, blocks).cuda()
    seq = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, H, D, generator=gen).to(torch.bfloat16).cuda()
    row = kv_quant.row_bytes(D, policy, 2)
    floor_ms = (2 * batch * ctx * KV * row + 2 * q.numel() * 2) / BANDWIDTH * 1e3
    nsplit = num_decode_splits(batch, KV, policy)
    default = decode_config(policy, D, nsplit)
    ref = paged_decode_attention(q, k, v, tables, seq, D**-0.5, num_splits=nsplit, config=default)
    n = min(16, batch)
    kf, vf = as_float(k, policy), as_float(v, policy)
    truth = reference.paged_attention(q[:n].float(), kf, vf, tables[:n], [1] * n, [ctx] * n, D**-0.5)
    del kf, vf
    default_err = rel(ref[:n], truth)
    print(
        f"  decode B={batch} ctx={ctx} q{policy}: default vs torch reference, relative error {default_err:.2e}"
    )
    # Timed over several caches in turn (ROTATE_BYTES in all, at most 64 caches: batch 1 reads 71 MB
    # of int4, 138 MB of int8), so that a small batch's cache is read from memory as the engine's 32
    # layers read theirs, not from the 50 MB L2 of the last launch.
    rot = max(1, min(64, -(-ROTATE_BYTES // (2 * k.numel() * k.element_size()))))
    pool = [(k, v)] + [make_cache(batch * blocks * BS, policy, gen) for _ in range(rot - 1)]
    rows = []
    all_cfgs = [default] + [c for c in configs if c != default]
    if cross:
        runs = [(cfg, n) for cfg in all_cfgs for n in sorted(set(splits or []) | {nsplit})]
    else:
        runs = [(cfg, nsplit) for cfg in all_cfgs]
        runs += [(decode_config(policy, D, n), n) for n in splits or [] if n != nsplit]
    cuda_runs: list[tuple[tuple[int, ...] | str, int]] = []
    if kv_int8_decode_cuda.why_not(q, k, v, policy, H // KV, 0, False) is None:
        # the CUDA C int8 kernel (config "cuda[-VARIANT]": no config, the launcher's own choice, with
        # HOTLOOP_KV_CUDA_VARIANT unset ("cuda": the auto choice) and set to each of VARIANTS), beside
        # the Triton rows
        cuda_runs = [
            ("cuda" + (f"-{name}" if name else "") + ("" if grid == "seq" else f"@{grid}"), n)
            for name in (
                CUDA_VARIANTS
                or ["", *(v for v in kv_int8_decode_cuda.VARIANTS if v not in kv_int8_decode_cuda.PROBES)]
            )
            for grid in CUDA_GRIDS
            for n in sorted(set(splits or []) | {nsplit})
        ]
    for (label, n), fuse in itertools.product(runs + cuda_runs, fuses):
        if fuse and (n == 1 or isinstance(label, str)):
            continue  # one split: nothing to merge; the CUDA kernels merge in a second launch
        cfg = None if isinstance(label, str) else label
        if isinstance(label, str):  # "cuda[-VARIANT][@GRID]"
            name, _, grid = label[4:].removeprefix("-").partition("@")
            os.environ[kv_int8_decode_cuda.VARIANT_ENV] = name
            os.environ[kv_int8_decode_cuda.GRID_ENV] = grid
        try:
            out = paged_decode_attention(
                q, k, v, tables, seq, D**-0.5, num_splits=n, config=cfg, fuse_merge=fuse
            )

            def timed(cfg: tuple[int, ...] | None = cfg, n: int = n, fuse: bool = fuse) -> None:
                for kc, vc in pool:
                    paged_decode_attention(
                        q, kc, vc, tables, seq, D**-0.5, num_splits=n, config=cfg, fuse_merge=fuse
                    )

            ms = bench(timed) / rot
            rows.append({"config": list(cfg) if cfg else label, "splits": n, "fused": fuse, "ms": ms,
                         "rel_err_vs_default": rel(out, ref)})  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a configuration that does not compile is a result
            rows.append({"config": list(cfg) if cfg else label, "splits": n, "fused": fuse,
                         "error": f"{type(e).__name__}: {str(e)[:120]}"})  # fmt: skip
        r = rows[-1]
        print(f"  decode B={batch} ctx={ctx} q{policy} {label} splits {n}{' fused' if fuse else ''}: "
              + (f"{r['ms']:.4f} ms ({floor_ms / r['ms']:.0%} of roofline)" if "ms" in r else r["error"]),
              flush=True)  # fmt: skip
    os.environ.pop(kv_int8_decode_cuda.VARIANT_ENV, None)
    os.environ.pop(kv_int8_decode_cuda.GRID_ENV, None)
    return {"kind": "decode", "batch": batch, "ctx": ctx, "policy": policy, "floor_ms": floor_ms,
            "caches_in_turn": rot, "default": list(default), "default_splits": nsplit, "default_rel_err_vs_reference": default_err,
            "rows": rows}  # fmt: skip


def prefill_case(qlen: int, policy: int, configs: list[tuple[int, ...]], gen: torch.Generator) -> dict:
    k, v = make_cache(qlen, policy, gen)
    blocks = -(-qlen // BS)
    tables = torch.arange(blocks, dtype=torch.int32).view(1, blocks).cuda()
    seq = torch.tensor([qlen], dtype=torch.int32, device="cuda")
    qs = torch.tensor([0, qlen], dtype=torch.int32, device="cuda")
    q = torch.randn(qlen, H, D, generator=gen).to(torch.bfloat16).cuda()
    floor_ms = (4 * H * D * qlen * qlen / 2) / FLOPS * 1e3  # QK^T and PV, causal half

    def run(cfg):
        return paged_prefill_attention(q, k, v, tables, seq, qs, qlen, D**-0.5, config=cfg)

    default = prefill_config(D, qlen, policy)
    ref = run(default)
    kf, vf = as_float(k, policy), as_float(v, policy)
    truth = reference.paged_attention(q.float(), kf, vf, tables, [qlen], [qlen], D**-0.5)
    default_err = rel(ref, truth)
    del truth, kf, vf
    print(f"  prefill T={qlen} q{policy}: default vs torch reference, relative error {default_err:.2e}")
    rows = []
    for cfg in [default] + [c for c in configs if c != default]:
        try:
            out = run(cfg)
            ms = bench(lambda cfg=cfg: run(cfg))
            rows.append({"config": list(cfg), "ms": ms, "rel_err_vs_default": rel(out, ref)})
        except Exception as e:  # noqa: BLE001
            rows.append({"config": list(cfg), "error": f"{type(e).__name__}: {str(e)[:120]}"})
        r = rows[-1]
        print(f"  prefill T={qlen} q{policy} {cfg}: "
              + (f"{r['ms']:.4f} ms ({floor_ms / r['ms']:.0%} of roofline)" if "ms" in r else r["error"]),
              flush=True)  # fmt: skip
    fresh = None
    if policy:  # this step's keys from k_new / v_new, as the attention layer launches a quantized prefill
        kn = torch.randn(qlen, KV, D, generator=gen).to(torch.bfloat16).cuda()
        vn = torch.randn(qlen, KV, D, generator=gen).to(torch.bfloat16).cuda()

        kf, vf = as_float(k, policy), as_float(v, policy)
        truth = reference.paged_attention(
            q.float(), kf, vf, tables, [qlen], [qlen], D**-0.5, k_new=kn, v_new=vn
        )
        del kf, vf
        fresh = {}
        for prefix in (False, True):  # the cache loop compiled out (no row has a prefix), and kept

            def run_fresh(prefix: bool = prefix) -> torch.Tensor:
                return paged_prefill_attention(
                    q, k, v, tables, seq, qs, qlen, D**-0.5, k_new=kn, v_new=vn, cached_prefix=prefix
                )

            err = rel(run_fresh(), truth)
            ms = bench(run_fresh)
            fresh["with_cache_loop" if prefix else "no_cache_loop"] = {"ms": ms, "rel_err_vs_reference": err}
            print(f"  prefill T={qlen} q{policy} {default} own keys from k_new / v_new, cache loop "
                  f"{'kept' if prefix else 'compiled out'}: {ms:.4f} ms ({floor_ms / ms:.0%} of roofline), "
                  f"relative error {err:.2e}", flush=True)  # fmt: skip
    return {"kind": "prefill", "qlen": qlen, "policy": policy, "floor_ms": floor_ms, "default": list(default),
            "default_rel_err_vs_reference": default_err, "rows": rows, "fresh": fresh}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="default configurations only")
    ap.add_argument("--policies", default="0,8,4")
    ap.add_argument("--small", action="store_true", help="a smaller grid around the defaults")
    ap.add_argument("--decode-configs", help="only these decode configurations: 'BLOCK_N,warps,stages;...'")
    ap.add_argument(
        "--prefill-configs",
        help="only these prefill configurations: 'BLOCK_M,BLOCK_N,warps,stages[,DIAG_SPLIT];...'",
    )
    ap.add_argument("--no-prefill", action="store_true", help="decode cases only")
    ap.add_argument("--no-decode", action="store_true", help="prefill cases only")
    ap.add_argument("--prefill-lens", default="4096", help="prompt lengths of the prefill cases: '1024,4096'")
    ap.add_argument(
        "--decode-shapes", default="256x1024,128x4096", help="decode cases, BATCHxCONTEXT: '16x1024,32x1024'"
    )
    ap.add_argument(
        "--splits", help="also time these split counts (default configuration each): '1,2,4,8,16'"
    )
    ap.add_argument("--eager-timing", action="store_true", help="time launch by launch, not in a CUDA graph")
    ap.add_argument(
        "--fuse-merge",
        choices=("launched", "fused", "both"),
        default="launched",
        help="decode with splits: the merge as its own launch, done by the last split, or both",
    )
    ap.add_argument("--cross", action="store_true", help="decode: every configuration at every split count")
    ap.add_argument(
        "--cuda-variants",
        help="the CUDA int8 kernel's variants to time ('' for auto, rows, vt, vt3, and the read probes probe3, "
        "probe4); default all but the probes",
    )
    ap.add_argument(
        "--heads",
        default=None,
        help="H,KV,D: the attention shape (default 32,8,128, Llama-3-8B; 9,3,64 is SmolLM2-135M)",
    )
    ap.add_argument(
        "--cuda-grids",
        default="seq",
        help="the CUDA int8 kernel's grid orders to time (seq, heads: HOTLOOP_KV_CUDA_GRID); default seq",
    )
    args = ap.parse_args(argv)
    CUDA_GRIDS[:] = args.cuda_grids.split(",")
    # the read probes as variants, for this process only: rows "cuda-probe3" / "cuda-probe4" time the
    # int8 kernel's copies through its ring without the arithmetic (their outputs are zeros)
    kv_int8_decode_cuda.VARIANTS.update(kv_int8_decode_cuda.PROBES)
    global GRAPH_TIMING, H, KV, D
    if args.heads:
        H, KV, D = (int(x) for x in args.heads.split(","))
    GRAPH_TIMING = not args.eager_timing
    if args.cuda_variants is not None:
        CUDA_VARIANTS[:] = args.cuda_variants.split(",")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(0)
    policies = [int(p) for p in args.policies.split(",")]
    dec = list(itertools.product((16, 32, 64, 128), (4, 8), (2, 3, 4)))
    pre = list(itertools.product((64, 128), (32, 64), (4, 8), (2, 3)))
    if args.small:
        dec = list(itertools.product((32, 64), (4, 8), (2, 3)))
        pre = list(itertools.product((64, 128), (32, 64), (4, 8), (2,)))
    if args.quick:
        dec, pre = [], []

    def parse(text: str) -> list[tuple[int, ...]]:
        return [tuple(int(x) for x in c.split(",")) for c in text.split(";") if c.strip()]

    if args.decode_configs is not None:
        dec = parse(args.decode_configs)
    if args.prefill_configs is not None:
        pre = parse(args.prefill_configs)
    splits = [int(x) for x in args.splits.split(",")] if args.splits else None
    results = []
    for policy in policies:
        if not args.no_decode:
            for shape in args.decode_shapes.split(","):
                batch, ctx = (int(x) for x in shape.split("x"))
                fuses = {"launched": (False,), "fused": (True,), "both": (False, True)}[args.fuse_merge]
                results.append(decode_case(batch, ctx, policy, dec, gen, splits, fuses, args.cross))
        if not args.no_prefill:
            for qlen in (int(x) for x in args.prefill_lens.split(",")):
                results.append(prefill_case(qlen, policy, pre, gen))
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    print("best per case (correct outputs only):")
    for r in results:
        ok = [x for x in r["rows"] if "ms" in x and x["rel_err_vs_default"] < 1e-2]
        if r["default_rel_err_vs_reference"] >= 2e-2 or not ok:
            print(f"{r['kind']} q{r['policy']}: the default is wrong (relative error "
                  f"{r['default_rel_err_vs_reference']:.2e} against the reference)")  # fmt: skip
            continue
        best = min(ok, key=lambda x: x["ms"])
        base = r["rows"][0]
        name = f"{r['kind']} q{r['policy']} " + (
            f"B={r['batch']} ctx={r['ctx']}" if r["kind"] == "decode" else f"T={r['qlen']}"
        )
        how = f"{best['config']}" + (f" splits {best['splits']}" if "splits" in best else "")
        how += " fused" if best.get("fused") else ""
        print(f"{name:32s} default {base.get('ms', float('nan')):.4f} ms  best {best['ms']:.4f} ms "
              f"{how}  floor {r['floor_ms']:.4f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
