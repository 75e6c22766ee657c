"""What a kernel boundary costs in the decode graph against a grid-wide barrier inside one kernel.

SmolLM2-135M's batch-1 step is about 150 small kernels, each about 2.5 us (BENCHMARKS.md): the
dependency from one kernel to the next, not bytes, sets the time. A persistent kernel that runs
several phases (e.g. a layer's projections) with a grid barrier between them would replace
boundaries with barriers. This probe times both on chains of ``--phases`` dependent one-row GEMVs
(``y_{p+1} = W_p y_p``, ``N x N`` bf16 weights, SmolLM2's 576 by default), replayed in a CUDA graph:

- ``launches``: one launch per phase, programmatic dependent launch (PDL) on: each program
  requests its weight tile, waits for the launch before, lets the next one start, then reads x;
- ``launches, no PDL``: the same, plain stream order;
- ``barrier``: one launch; between phases every program arrives at a global counter and spins until
  all have (acquire / release atomics); the next phase's weight tile is requested before the spin;
- ``empty``: the same three with no GEMV (x copied through), the bare boundary and barrier.

The barrier needs every program resident at once: the grids here are at most a few programs per SM.
Reported: us per phase (graph time / phases), median of ``--reps`` replays timed with CUDA events.

    PYTHONPATH=$PWD python benchmarks/grid_sync_probe.py --out OUT.json [--n 576] [--phases 120]
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch
import triton
import triton.language as tl

from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl


@triton.jit
def _gemv_phase(w_ptr, x_ptr, y_ptr, N, offs_n, offs_k, WORK: tl.constexpr):
    if WORK:
        w = tl.load(w_ptr + offs_n[:, None] * N + offs_k[None, :], mask=offs_k[None, :] < N, other=0.0)
        x = tl.load(x_ptr + offs_k, mask=offs_k < N, other=0.0)
        y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
        tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptr + offs_n, tl.load(x_ptr + offs_n))


@triton.jit
def _chain_kernel(w_ptr, x_ptr, y_ptr, N, BLOCK_N: tl.constexpr, K_POW2: tl.constexpr,
                  WORK: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, K_POW2)
    w = tl.zeros([BLOCK_N, K_POW2], tl.bfloat16)
    if WORK:  # the weight tile before the wait (weights are not written by the launch before)
        w = tl.load(w_ptr + offs_n[:, None] * N + offs_k[None, :], mask=offs_k[None, :] < N, other=0.0)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    if WORK:
        x = tl.load(x_ptr + offs_k, mask=offs_k < N, other=0.0)
        y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
        tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptr + offs_n, tl.load(x_ptr + offs_n))


@triton.jit
def _persistent_kernel(w_ptr, bufs_ptr, cnt_ptr, N, PHASES: tl.constexpr, BLOCK_N: tl.constexpr,
                       K_POW2: tl.constexpr, WORK: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, K_POW2)
    kmask = offs_k[None, :] < N
    w = tl.zeros([BLOCK_N, K_POW2], tl.bfloat16)
    if WORK:
        w = tl.load(w_ptr + offs_n[:, None] * N + offs_k[None, :], mask=kmask, other=0.0)
    for p in range(PHASES):
        x_ptr = bufs_ptr + (p % 2) * N
        y_ptr = bufs_ptr + ((p + 1) % 2) * N
        if WORK:
            x = tl.load(x_ptr + offs_k, mask=offs_k < N, other=0.0, cache_modifier=".cg")
            y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
            tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty))
            # the next phase's weights, requested before the barrier
            nxt = w_ptr + ((p + 1) % PHASES) * N * N
            w = tl.load(nxt + offs_n[:, None] * N + offs_k[None, :], mask=kmask, other=0.0)
        else:
            tl.store(y_ptr + offs_n, tl.load(x_ptr + offs_n, cache_modifier=".cg"))
        tl.debug_barrier()  # every thread's stores are issued before the release
        tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
        target = (p + 1) * progs
        while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < target:
            pass
        tl.debug_barrier()


def _time_graph(fn: Any, reps: int) -> float:
    """Median ms of one replay of ``fn`` captured in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def run(n: int, phases: int, block_n: int, reps: int) -> list[dict[str, Any]]:
    dev = torch.device("cuda")
    k_pow2 = triton.next_power_of_2(n)
    w = (torch.randn(phases, n, n, device=dev) / n**0.5).to(torch.bfloat16)
    x0 = torch.randn(n, device=dev).to(torch.bfloat16)
    bufs = torch.zeros(2, n, device=dev, dtype=torch.bfloat16)
    cnt = torch.zeros(1, device=dev, dtype=torch.int32)
    grid = (triton.cdiv(n, block_n),)
    use_pdl = pdl(dev)
    rows = []

    def chain(work: bool, with_pdl: bool) -> None:
        bufs[0].copy_(x0)
        for p in range(phases):
            _chain_kernel[grid](w[p], bufs[p % 2], bufs[(p + 1) % 2], n, BLOCK_N=block_n, K_POW2=k_pow2,
                                WORK=work, PDL=with_pdl, num_warps=4,
                                **(launch_kwargs(dev) if with_pdl else {}))  # fmt: skip

    def persistent(work: bool) -> None:
        bufs[0].copy_(x0)
        cnt.zero_()
        _persistent_kernel[grid](w, bufs, cnt, n, PHASES=phases, BLOCK_N=block_n, K_POW2=k_pow2,
                                 WORK=work, num_warps=4)  # fmt: skip

    ref = None
    for work in (True, False):
        cases = [
            ("launches, PDL", lambda work=work: chain(work, use_pdl)),
            ("launches, no PDL", lambda work=work: chain(work, False)),
            ("barrier", lambda work=work: persistent(work)),
        ]
        for name, fn in cases:
            ms = _time_graph(fn, reps)
            fn()
            torch.cuda.synchronize()
            out = bufs[phases % 2].float().clone()
            if work:
                ref = out if ref is None else ref
                err = float((out - ref).abs().max())
            else:
                err = float((out - x0.float()).abs().max())
            row = {"work": "gemv" if work else "empty", "case": name, "programs": grid[0],
                   "us_per_phase": ms * 1000 / phases, "max_err_vs_first": err}  # fmt: skip
            print(f"N={n} programs={grid[0]} {row['work']:5s} {name:17s} {row['us_per_phase']:.3f} us/phase "
                  f"(max diff {err:.3g})", flush=True)  # fmt: skip
            rows.append({"n": n, "block_n": block_n, **row})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", default="576", help="GEMV sizes, comma-separated")
    ap.add_argument("--block-n", default="16,4", help="rows per program, comma-separated")
    ap.add_argument("--phases", type=int, default=120)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    rows = []
    for n in (int(v) for v in args.n.split(",")):
        for bn in (int(v) for v in args.block_n.split(",")):
            rows += run(n, args.phases, bn, args.reps)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
