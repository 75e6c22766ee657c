"""The W4A16 one-row GEMVs asking L2 for the next linear's weights (issue 5, batch-1 decode).

Llama-3-8B shapes, bf16, M = 1. Eight distinct layers' four projections (q/k/v, o, gate/up, down)
in one CUDA graph, as in a decode step; each GEMV with the CUDA C variant that is fastest alone
(cold L2, early loads on: the engine's default). Each chain is timed with every GEMV handing the
next one's first ``budget`` MiB of ``qweight`` to ``w4a16_cuda.gemv(prefetch=...)``, issued first
(``late`` 0) or after each block's arithmetic (``late`` 1), and with no prefetch (the baseline of the
same run). ``gaps`` adds two small launches between GEMVs (as the engine's norm, rotary and
attention launches sit there), where the prefetched bytes can arrive while DRAM is otherwise idle.

Also checks that every prefetching chain's outputs equal the plain chain's, bit for bit.

Floor: the chain's bytes (weights, zero points, scales) over the bandwidth in GPU.md (4.0 TB/s
measured for plain streams on these hosts), per layer.

    python benchmarks/w4a16_prefetch.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

import torch
from awq_gemm import GROUP, SHAPES, graph_replay_us  # (benchmarks/ is on the path when this script runs)

from hotloop.kernels import w4a16_cuda
from hotloop.kernels.w4a16_gemm import graph_time_us
from hotloop.kernels.w4a16_layout import pack_int4

LAYERS = 8
BUDGETS_MB = (0, 4, 8, 16, 32, 64)
BANDWIDTH = 4.0e12


def _layers(dev: torch.device, dtype: torch.dtype) -> list[dict]:
    out = []
    for i in range(LAYERS):
        layer = {}
        for name, (k, n) in SHAPES.items():
            gen = torch.Generator(device=dev).manual_seed(100 + i)
            qw = pack_int4(torch.randint(0, 16, (k, n), device=dev, generator=gen, dtype=torch.int32))
            qz = pack_int4(
                torch.randint(0, 16, (k // GROUP, n), device=dev, generator=gen, dtype=torch.int32)
            )
            sc = (torch.rand(k // GROUP, n, device=dev, generator=gen) * 0.01 + 1e-3).to(dtype)
            layer[name] = (qw, qz, sc)
        out.append(layer)
    return out


def main() -> None:
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    os.environ[w4a16_cuda.EARLY_ENV] = "1"
    layers = _layers(dev, dtype)
    xs = {name: torch.randn(1, k, device=dev).to(dtype) for name, (k, n) in SHAPES.items()}
    rows: list[dict] = []
    choice = {}
    for name, (k, n) in SHAPES.items():
        qw, qz, sc = layers[0][name]
        times = {}
        for v in w4a16_cuda.VARIANTS:
            if w4a16_cuda.fits(1, n, k, GROUP, dtype, *v) is None:
                times[v] = graph_time_us(partial(w4a16_cuda.gemv, xs[name], qw, qz, sc, GROUP, *v), dev)
        choice[name] = min(times, key=lambda v: times[v])
        rows.append({"shape": name, "variants_us": {str(v): round(t, 2) for v, t in times.items()},
                     "choice": list(choice[name])})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    chain = [(layer[name], name) for layer in layers for name in SHAPES]
    outs = [torch.empty(1, SHAPES[name][1], device=dev, dtype=dtype) for _, name in chain]
    gap_a = torch.randn(1, 4096, device=dev, dtype=dtype)
    gap_b = torch.empty_like(gap_a)
    chain_bytes = sum(t.numel() * t.element_size() for (w, _name) in chain for t in w) / LAYERS

    def run(budget: int, gaps: bool) -> None:
        for i, ((qw, qz, sc), name) in enumerate(chain):
            nxt = chain[i + 1][0][0].reshape(-1) if i + 1 < len(chain) else None
            pf = nxt[: budget // 4] if (nxt is not None and budget) else None
            w4a16_cuda.gemv(xs[name], qw, qz, sc, GROUP, *choice[name], out=outs[i], prefetch=pf)
            if gaps:
                torch.mul(gap_a, 1.0001, out=gap_b)
                torch.add(gap_b, gap_a, out=gap_a)

    want = None
    for gaps in (False, True):
        for late in ("0", "1"):
            for mb in BUDGETS_MB:
                if mb == 0 and late == "1":
                    continue
                os.environ[w4a16_cuda.PREFETCH_LATE_ENV] = late  # read at each launch, kept by the graph
                times = graph_replay_us(partial(run, mb << 20, gaps), replays=7)
                got = torch.cat([o.view(-1) for o in outs])
                if want is None:
                    want = got.clone()
                same = bool(torch.equal(got, want))
                row = {"gaps": gaps, "late": late == "1", "budget_mb": mb,
                       "us_per_layer": round(min(times) / LAYERS, 2),
                       "median_us_per_layer": round(sorted(times)[len(times) // 2] / LAYERS, 2),
                       "floor_us_per_layer": round(chain_bytes / BANDWIDTH * 1e6, 2),
                       "same_outputs": same}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
                if not same:
                    raise SystemExit("a prefetching chain changed the outputs")
    with open(sys.argv[1], "w") as f:
        json.dump({"device": torch.cuda.get_device_name(dev), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
