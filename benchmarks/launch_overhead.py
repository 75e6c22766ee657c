"""Host time of the attention layer's own launch code per layer of a mixed step, kernels stubbed out
(CPU, no GPU needed): rotary + KV write, decode attention for 32 rows and prefill attention for 256
tokens, at the Llama-3-8B head shape. Triton's own launch cost is not included (the kernels are
replaced by no-ops), so this measures only hotloop's Python around the launches.

    PYTHONPATH=$PWD python benchmarks/launch_overhead.py
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

import hotloop.kernels.paged_decode_attention as dec
import hotloop.kernels.paged_prefill_attention as pre
import hotloop.kernels.rotary_kv_write as rot


class _NoLaunch:
    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: None


def main() -> int:
    dec._decode_kernel = _NoLaunch()  # type: ignore[assignment]
    dec._merge_kernel = _NoLaunch()  # type: ignore[assignment]
    pre._prefill_kernel = _NoLaunch()  # type: ignore[assignment]
    for name in dir(rot):
        if name.startswith("_") and name.endswith("_kernel"):
            setattr(rot, name, _NoLaunch())
    dt = torch.bfloat16
    H, KV, D, BS, NB, decodes, prefill = 32, 8, 128, 64, 64, 32, 256
    kc = torch.zeros(NB, BS, KV, D, dtype=dt)
    vc = torch.zeros_like(kc)
    T = decodes + prefill
    q = torch.zeros(T, H, D, dtype=dt)
    k = torch.zeros(T, KV, D, dtype=dt)
    v = torch.zeros_like(k)
    cos = torch.zeros(T, D // 2)
    sin = torch.zeros_like(cos)
    slots = torch.zeros(T, dtype=torch.int64)
    tables = torch.zeros(decodes + 1, 40, dtype=torch.int32)
    lens = torch.full((decodes + 1,), 1000, dtype=torch.int32)
    starts = torch.tensor([0, prefill], dtype=torch.int32)
    out = torch.empty_like(q)

    def layer() -> None:
        rot.rotary_kv_write(q, k, v, cos, sin, kc, vc, slots)
        dec.paged_decode_attention(
            q[:decodes], kc, vc, tables[:decodes], lens[:decodes], 0.1, None, out=out[:decodes]
        )
        pre.paged_prefill_attention(
            q[decodes:],
            kc,
            vc,
            tables[decodes:],
            lens[decodes:],
            starts,
            prefill,
            0.1,
            None,
            out=out[decodes:],
        )

    for _ in range(200):
        layer()
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        layer()
        times.append(time.perf_counter() - t0)
    us = statistics.median(times) * 1e6
    print(f"launch code per layer (kernels stubbed): {us:.1f} us; x32 layers = {us * 32 / 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
