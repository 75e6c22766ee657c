"""Launches of the paged attention kernels for Nsight Compute: decode at batch 128 with 4k context
(bf16, int8 and int4 caches: the KV-bound offline run's shape, issue 6) and the 4,096-token int8
prefill with and without the prompt's own keys from ``k_new`` / ``v_new``.

    ncu --clock-control none --launch-skip 5 -k regex:'_decode_kernel|_prefill_kernel' \\
        --section SpeedOfLight ... python3 benchmarks/ncu_attention.py

Two rounds of five launches (default launch configurations); the first round compiles and warms up,
so ``--launch-skip 5`` profiles the second (``bash benchmarks/gpu_check.sh OUT ncuattn``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_attention_sweep import BS, KV, D, H, make_cache  # noqa: E402

from hotloop.kernels.paged_decode_attention import paged_decode_attention  # noqa: E402
from hotloop.kernels.paged_prefill_attention import paged_prefill_attention  # noqa: E402


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    batch, ctx, qlen = 128, 4096, 4096
    blocks = ctx // BS
    tables = torch.randperm(batch * blocks, generator=gen).to(torch.int32).view(batch, blocks).cuda()
    seq = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, H, D, generator=gen).to(torch.bfloat16).cuda()
    caches = {p: make_cache(batch * blocks * BS, p, gen) for p in (0, 8, 4)}
    qp = torch.randn(qlen, H, D, generator=gen).to(torch.bfloat16).cuda()
    kn = torch.randn(qlen, KV, D, generator=gen).to(torch.bfloat16).cuda()
    vn = torch.randn(qlen, KV, D, generator=gen).to(torch.bfloat16).cuda()
    ptab = tables[:1, : qlen // BS].contiguous()
    pseq = torch.tensor([qlen], dtype=torch.int32, device="cuda")
    qs = torch.tensor([0, qlen], dtype=torch.int32, device="cuda")
    k8, v8 = caches[8]
    for _ in range(2):
        for p in (0, 8, 4):
            k, v = caches[p]
            paged_decode_attention(q, k, v, tables, seq, D**-0.5)
        paged_prefill_attention(qp, k8, v8, ptab, pseq, qs, qlen, D**-0.5)
        paged_prefill_attention(qp, k8, v8, ptab, pseq, qs, qlen, D**-0.5, k_new=kn, v_new=vn)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
