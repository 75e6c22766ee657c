"""Which of the host calls a decode step makes wait for the GPU: each is timed on the host while the
GPU is busy (``torch.cuda._sleep`` queued ahead of it), against the same call on an idle GPU. A call
that takes about the queued time returns only after the GPU drained its queue: it blocks the host.

    python benchmarks/host_block_probe.py --busy-ms 50

Probes the patterns of ``executor/gpu_runner.py`` / ``gpu_inputs.py``: a gather of sampled ids into a
persistent buffer (``index_select(out=)``), the same without ``out=``, ``index_copy_``, copies from
pinned memory, a pinned allocation and a CUDA event record.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy-ms", type=float, default=50.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    # cycles per ms of torch.cuda._sleep on this GPU
    t0 = time.perf_counter()
    torch.cuda._sleep(10_000_000)
    torch.cuda.synchronize()
    cycles_per_ms = 10_000_000 / ((time.perf_counter() - t0) * 1e3)
    b = 256
    values = torch.randint(0, 1000, (b,), device=dev)
    ids = torch.zeros(1024, dtype=torch.long, device=dev)
    gathered = torch.empty(b, dtype=torch.long, device=dev)
    idx_h = torch.randperm(b).pin_memory()
    idx_d = torch.empty(b, dtype=torch.long, device=dev)
    dst = torch.arange(b, device=dev) * 2

    def staged_index() -> torch.Tensor:
        idx_d.copy_(idx_h, non_blocking=True)
        return idx_d

    probes: dict[str, Callable[[], object]] = {
        "index_select(out=) staged index": lambda: torch.index_select(
            values, 0, staged_index(), out=gathered
        ),
        "index_select staged index": lambda: values.index_select(0, staged_index()),
        "index_copy_": lambda: ids.index_copy_(0, dst, values),
        "copy_ from pinned (non_blocking)": lambda: idx_d.copy_(idx_h, non_blocking=True),
        "empty(pin_memory=True) + copy_ to it": lambda: torch.empty(
            b, dtype=torch.long, pin_memory=True
        ).copy_(values, non_blocking=True),
        "torch.tensor(list, device=cuda)": lambda: torch.tensor(list(range(b)), device=dev),
        "Event.record": lambda: torch.cuda.Event().record(),
    }
    result = {}
    for name, fn in probes.items():
        fn()  # warm
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        idle = time.perf_counter() - t0
        torch.cuda.synchronize()
        torch.cuda._sleep(int(args.busy_ms * cycles_per_ms))
        t0 = time.perf_counter()
        fn()
        busy = time.perf_counter() - t0
        torch.cuda.synchronize()
        result[name] = {"idle_ms": idle * 1e3, "busy_ms": busy * 1e3, "blocks": busy * 1e3 > args.busy_ms / 2}
        print(
            f"{name:40} idle {idle * 1e3:8.3f} ms   GPU busy {busy * 1e3:8.3f} ms   blocks: {result[name]['blocks']}"
        )
    # A deep queue: graphs of many small kernels replayed back to back, as a multi-step round queues
    # them; then the same calls again (does a kernel launch wait for queue space?)
    nodes, per_us = 300, 50
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        for _ in range(nodes):
            torch.cuda._sleep(int(per_us * cycles_per_ms / 1000))
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    deep = {}
    for replays in (1, 4, 12, 24):
        row = {}
        for name in ("index_select(out=) staged index", "copy_ from pinned (non_blocking)", "Event.record"):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(replays):
                g.replay()
            queued = time.perf_counter() - t0
            t0 = time.perf_counter()
            probes[name]()
            row[name] = (time.perf_counter() - t0) * 1e3
            row["queue_ms"] = queued * 1e3
        torch.cuda.synchronize()
        deep[replays] = row
        print(f"{replays:3} graphs of {nodes} kernels queued ({replays * nodes * per_us / 1e3:.0f} ms of work): "
              + ", ".join(f"{k} {v:.3f} ms" for k, v in row.items()))  # fmt: skip
    result["deep_queue"] = deep  # type: ignore[assignment]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"busy_ms": args.busy_ms, "probes": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
