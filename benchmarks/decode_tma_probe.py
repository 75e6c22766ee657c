"""How close issue 4's batch-256 decode attention is to what the H200 can read, and whether TMA loads
or one block-table entry per tile read the paged bf16 cache faster than the engine's kernel.

    PYTHONPATH=$PWD python3 benchmarks/decode_tma_probe.py --out $OUT/tma.json

Llama-3-8B attention (32 query heads, 8 KV heads, head dim 128, block size 64, bf16), batch 256 at
1k context by default (one layer of issue 4's step: 1.07 GB of K and V). Each case is timed in a
CUDA graph (median, ``triton.testing.do_bench_cudagraph``), several caches read in turn so that no
launch finds its cache in L2, and printed beside the bytes-over-bandwidth floor at GPU.md's 4,229 GB/s:

- ``read``: a plain stream over the same K and V bytes (one sum per program), the read ceiling;
- ``engine``: ``paged_decode_attention`` as the engine launches it (its default configuration), and
  the other configurations given;
- ``page``: the engine kernel's float loop with one block-table entry per tile (the tile lies in one
  page, rows at a constant stride), as the quantized caches already do;
- ``tma``: K and V tiles through Hopper's tensor memory accelerator (a host ``TensorDescriptor`` over
  the cache as ``[blocks * block_size, kv_heads * head_dim]`` rows), pipelined by Triton.

Every variant's output is checked against the engine kernel's (relative error printed and kept).
None of the three is used by the engine. Measured on an H100 (forty-third session,
``benchmarks/results/gpu_2026-12-07b``): the engine's kernel reads at 3,025 GB/s, 98% of the plain
read's best 3,095 GB/s, and neither the one-page loop nor TMA tiles are faster (3,035 and 3,029 GB/s
at best). The TMA kernel ran in the engine's decode graphs as an opt-in switch
(``HOTLOOP_DECODE_TMA=1``, ``kernels/paged_decode_tma.py`` at commit e93fc00) and was removed after
it: the batch-256 step took 19.98 ms with it against 19.81 ms without.
After that run the probe's page and TMA kernels became one kernel (``_probe_kernel``, a constexpr
``TMA``, a tile's attention through the engine's ``_float_tile``): the same loads and arithmetic as
measured, except that the page path's stages now come through its loop's ``tl.range`` as the TMA
path's did (it was measured with the launch's ``num_stages``); checked on the CPU through the
interpreter, not yet re-run on a GPU.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from hotloop.kernels.paged_decode_attention import _float_tile, decode_config, paged_decode_attention

H, KV, D, BS = 32, 8, 128, 64
G = H // KV
BANDWIDTH = 4229e9
_LOG2E = 1.4426950408889634


@triton.jit
def _read_kernel(k_ptr, v_ptr, out_ptr, n_per_prog, BLOCK: tl.constexpr):
    """Program p sums elements [p * n_per_prog, (p + 1) * n_per_prog) of K and of V."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * n_per_prog
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, n_per_prog, BLOCK):
        offs = base + i + tl.arange(0, BLOCK)
        acc += tl.load(k_ptr + offs).to(tl.float32)
        acc += tl.load(v_ptr + offs).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def read_probe(
    k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, progs: int, block: int, warps: int
) -> None:
    n = k.numel()
    assert n % (progs * block) == 0, (n, progs, block)
    _read_kernel[(progs,)](k, v, out, n // progs, BLOCK=block, num_warps=warps)


@triton.jit
def _probe_kernel(
    q_ptr, k_src, v_src, tables_ptr, seq_ptr, out_ptr, scale_log2,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_bt, stride_ob, stride_oh,
    G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """One split, heads-first grid (KV, B); a tile of ``BLOCK_N`` (dividing ``BS``) keys lies in one
    page, its rows addressed from one block-table entry. ``TMA``: ``k_src`` / ``v_src`` are tensor
    descriptors over the caches as ``[NB * BS, KV * D]`` rows (boxes ``[BLOCK_N, D]``), else pointers
    to the caches with the given strides. The tile's attention is the engine's ``_float_tile``."""
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    seq_len = tl.load(seq_ptr + b)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    mask_g = offs_g < G
    heads = kvh * G + offs_g
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=mask_g[:, None], other=0.0
    )
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    table = tables_ptr + b * stride_bt
    offs_t = tl.arange(0, BLOCK_N)
    for n0 in tl.range(0, seq_len, BLOCK_N, num_stages=STAGES):
        mask_n = n0 + offs_t < seq_len
        if TMA:
            row = tl.load(table + n0 // BS) * BS + n0 % BS
            k = k_src.load([row, kvh * D])
            # rows past the end may hold anything, NaN included (p is 0 there, but 0 * NaN is not)
            v = tl.where(mask_n[:, None], v_src.load([row, kvh * D]), 0.0)
        else:
            page = tl.load(table + n0 // BS).to(tl.int64)
            rows = page * stride_kb + (n0 % BS + offs_t) * stride_kt + kvh * stride_kh
            k = tl.load(k_src + rows[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
            v = tl.load(v_src + rows[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        m_i, l_i, acc = _float_tile(q, k, v, mask_n, m_i, l_i, acc, scale_log2)
    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=mask_g[:, None])  # fmt: skip


def _probe(q, k_src, v_src, k, tables, seq, scale, out, block_n: int, warps: int, stages: int, tma: bool):
    if BS % block_n:
        raise ValueError(f"BLOCK_N {block_n} must divide the block size {BS} (a tile lies in one page)")
    B = q.shape[0]
    _probe_kernel[(KV, B)](
        q, k_src, v_src, tables, seq, out, scale * _LOG2E, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        k.stride(2), tables.stride(0), out.stride(0), out.stride(1), G=G, D=D, BS=BS, BLOCK_G=16,
        BLOCK_N=block_n, STAGES=stages, TMA=tma, num_warps=warps,
    )  # fmt: skip
    return out


def page_decode(q, k, v, tables, seq, scale, out, block_n: int, warps: int, stages: int) -> torch.Tensor:
    return _probe(q, k, v, k, tables, seq, scale, out, block_n, warps, stages, False)


def make_descs(k: torch.Tensor, v: torch.Tensor, block_n: int) -> tuple[Any, Any]:
    from triton.tools.tensor_descriptor import TensorDescriptor

    nb = k.shape[0]
    return tuple(TensorDescriptor.from_tensor(c.view(nb * BS, KV * D), [block_n, D]) for c in (k, v))  # type: ignore[return-value]


def tma_decode(q, k, v, tables, seq, scale, out, block_n: int, warps: int, stages: int) -> torch.Tensor:
    """(A descriptor holds its tensor and is cheap to build: one per launch, at capture time.)"""
    dk, dv = make_descs(k, v, block_n)
    return _probe(q, dk, dv, k, tables, seq, scale, out, block_n, warps, stages, True)


def bench(fn: Callable[[], Any]) -> float:
    import triton.testing

    fn()
    return float(triton.testing.do_bench_cudagraph(fn, rep=80, return_mode="median"))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-9))


def parse_cfgs(text: str, flag: str) -> list[tuple[int, int, int]]:
    """``'BLOCK_N,warps,stages;...'`` (empty: none); a malformed entry names ``flag`` and the entry."""
    out = []
    for part in text.split(";"):
        if not part.strip():
            continue
        try:
            a, b, c = (int(x) for x in part.split(","))
        except ValueError:
            raise SystemExit(f"{flag}: {part!r} is not BLOCK_N,warps,stages (three integers)") from None
        if a < 16 or a & (a - 1) or b not in (1, 2, 4, 8, 16) or c < 1:
            raise SystemExit(
                f"{flag}: {part!r}: BLOCK_N a power of two >= 16, warps 1-16 (a power of two), stages >= 1"
            )
        out.append((a, b, c))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument(
        "--caches", type=int, default=3, help="caches read in turn (each 1.07 GB at the default size)"
    )
    ap.add_argument("--engine-configs", default="64,4,2;64,8,3;32,4,4;64,4,4;128,8,2")
    ap.add_argument("--page-configs", default="64,4,3;64,4,2;32,4,4;64,8,3")
    ap.add_argument("--tma-configs", default="64,4,3;64,4,2;64,4,4;32,4,4;64,8,3;32,4,6")
    ap.add_argument(
        "--contiguous", action="store_true", help="each sequence's pages in order (default: shuffled)"
    )
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    B, ctx = args.batch, args.ctx
    blocks = -(-ctx // BS)
    nb = B * blocks
    caches = []
    for _ in range(args.caches):
        k = torch.randn(nb, BS, KV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(nb, BS, KV, D, device="cuda", dtype=torch.bfloat16)
        caches.append((k, v))
    perm = (
        torch.arange(nb, dtype=torch.int32)
        if args.contiguous
        else torch.randperm(nb, generator=gen).to(torch.int32)
    )
    tables = perm.view(B, blocks).cuda()
    seq = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(B, H, D, generator=gen).to(torch.bfloat16).cuda()
    scale = D**-0.5
    nbytes = 2 * B * ctx * KV * D * 2
    floor_ms = nbytes / BANDWIDTH * 1e3
    dev = torch.cuda.get_device_name()
    print(f"{dev}: batch {B} x {ctx} tokens, {nbytes / 1e9:.3f} GB of K and V a launch, floor {floor_ms:.4f} ms "
          f"at 4,229 GB/s; {args.caches} caches in turn", flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []

    def record(
        kind: str, cfg: Any, fn: Callable[[int], Any], out: torch.Tensor | None, ref: torch.Tensor | None
    ):
        try:
            if out is not None:
                fn(0)
                err = rel(out, ref) if ref is not None else None
            else:
                err = None
            ms = bench(lambda: [fn(i) for i in range(len(caches))]) / len(caches)
            row = {"kind": kind, "config": cfg, "ms": ms, "GBps": nbytes / ms / 1e6, "of_floor": floor_ms / ms,
                   "rel_err_vs_engine": err}  # fmt: skip
            print(f"  {kind:7s} {str(cfg):18s} {ms:.4f} ms  {nbytes / ms / 1e6:7.0f} GB/s  {floor_ms / ms:6.1%} "
                  f"of floor" + (f"  rel err {err:.2e}" if err is not None else ""), flush=True)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a configuration that does not compile is a result
            row = {"kind": kind, "config": cfg, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"  {kind:7s} {str(cfg):18s} error {row['error']}", flush=True)
        rows.append(row)

    sums = torch.empty(1 << 16, device="cuda", dtype=torch.float32)
    for progs, block, warps in ((1024, 4096, 8), (2048, 2048, 4), (4096, 2048, 8), (512, 8192, 8)):
        n = caches[0][0].numel()
        if n % (progs * block):
            continue
        record("read", [progs, block, warps],
               lambda i, p=progs, bl=block, w=warps: read_probe(caches[i][0], caches[i][1], sums, p, bl, w), None, None)  # fmt: skip

    ref = paged_decode_attention(q, *caches[0], tables, seq, scale)
    default = list(decode_config(0, D, 1))
    outs = torch.empty_like(q)
    record(
        "engine",
        default,
        lambda i: paged_decode_attention(q, *caches[i], tables, seq, scale, out=outs),
        outs,
        ref,
    )
    for cfg in parse_cfgs(args.engine_configs, "--engine-configs"):
        if list(cfg) == default:
            continue
        record("engine", list(cfg),
               lambda i, c=cfg: paged_decode_attention(q, *caches[i], tables, seq, scale, out=outs, config=c), outs, ref)  # fmt: skip
    for bn, w, st in parse_cfgs(args.page_configs, "--page-configs"):
        record("page", [bn, w, st],
               lambda i, bn=bn, w=w, st=st: page_decode(q, *caches[i], tables, seq, scale, outs, bn, w, st), outs, ref)  # fmt: skip
    for bn, w, st in parse_cfgs(args.tma_configs, "--tma-configs"):
        record("tma", [bn, w, st],
               lambda i, bn=bn, w=w, st=st: tma_decode(q, *caches[i], tables, seq, scale, outs, bn, w, st), outs, ref)  # fmt: skip
    result = {"device": dev, "batch": B, "ctx": ctx, "bytes": nbytes, "floor_ms": floor_ms,
              "contiguous_pages": args.contiguous, "caches": args.caches, "rows": rows}  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
