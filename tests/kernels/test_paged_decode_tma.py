"""The TMA decode kernel (``kernels/paged_decode_tma.py``) against ``reference.paged_attention``.

GPU: head dims 64/128/256, GQA ratios 1/4/8, block sizes 64 and 128, fp16 and bf16, contexts over
many blocks and padding rows, every launch configuration of the probe; the engine's dispatch
(``HOTLOOP_DECODE_TMA=1`` inside a decode graph's launch) gives the pointer-load kernel's output.
CPU: the same kernel through Triton's interpreter in fp16 (the interpreter's bf16 dots are not
exact), and the rules of ``why_not``. Every cache poisons the rows past each sequence's end with NaN,
which a TMA tile reads and must not let through.
"""

from __future__ import annotations

import random

import pytest
import torch
from kernel_checks import TOL, interpret, rel_err

from hotloop.kernels import paged_decode_tma, reference


def _case(
    lens: list[int], h: int, kv: int, d: int, bs: int, dtype: torch.dtype, device: str, config=None
) -> None:
    seed = random.randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    nb = sum(need) + 2
    k = torch.randn(nb, bs, kv, d, generator=g).to(dtype)
    v = torch.randn(nb, bs, kv, d, generator=g).to(dtype)
    perm = torch.randperm(nb, generator=g).tolist()
    tables = torch.zeros(len(lens), max(need) + 1, dtype=torch.int32)
    at = 0
    for i, n in enumerate(need):
        tables[i, : need[i]] = torch.tensor(perm[at : at + n], dtype=torch.int32)
        at += n
    q = torch.randn(len(lens), h, d, generator=g).to(dtype)
    scale = d**-0.5
    ref = reference.paged_attention(q.float(), k.float(), v.float(), tables, [1] * len(lens), lens, scale)
    for i, n in enumerate(lens):  # past each end: NaN in the last page, and in every unused page
        if n:
            last = int(tables[i, (n - 1) // bs])
            k[last, (n - 1) % bs + 1 :] = float("nan")
            v[last, (n - 1) % bs + 1 :] = float("nan")
    used = {int(tables[i, j]) for i, n in enumerate(need) for j in range(n)}
    for blk in set(range(nb)) - used:
        k[blk] = float("nan")
        v[blk] = float("nan")
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    q, k, v, tables = q.to(device), k.to(device), v.to(device), tables.to(device)
    out = torch.full_like(q, float("nan"))  # every element must be written
    paged_decode_tma.decode_tma(q, k, v, tables, seq, scale, out, config)
    live = seq > 0
    assert rel_err(out[live].cpu(), ref[live.cpu()]) < TOL[dtype]
    assert (out[~live] == 0).all()


# -- CPU, through the interpreter ---------------------------------------------------------------
@interpret
@pytest.mark.parametrize("h,kv,d", [(2, 2, 16), (8, 2, 32)])
@pytest.mark.parametrize("config", [(16, 4, 2), (32, 4, 3)])
def test_decode_tma_interpreted(h: int, kv: int, d: int, config: tuple[int, int, int]) -> None:
    _case([1, 0, 37, 70, 32], h, kv, d, 32, torch.float16, "cpu", config)


def test_why_not_names_each_limit() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # (on the CPU the interpreter stands in for a GPU)
    q = torch.zeros(2, 8, 128, dtype=torch.bfloat16, device=dev)
    k = torch.zeros(4, 64, 2, 128, dtype=torch.bfloat16, device=dev)
    if paged_decode_tma._descriptor_class() is None:
        assert "descriptor" in (paged_decode_tma.why_not(q, k, 1, None) or "")
        return
    assert "splits" in (paged_decode_tma.why_not(q, k, 2, None) or "")
    assert "window" in (paged_decode_tma.why_not(q, k, 1, 128) or "")
    assert "16-bit" in (paged_decode_tma.why_not(q.float(), k.float(), 1, None) or "")
    assert "head dim" in (paged_decode_tma.why_not(q[..., :96], k[..., :96], 1, None) or "")
    assert "block size" in (paged_decode_tma.why_not(q, k[:, :16], 1, None) or "")
    assert "BLOCK_N 32" in (paged_decode_tma.why_not(q, k[:, :16], 1, None, 32) or "")
    assert "contiguous" in (paged_decode_tma.why_not(q, k[:, :32], 1, None, 32) or "")
    assert paged_decode_tma.why_not(q, k[:, :32].contiguous(), 1, None, 32) is None
    assert paged_decode_tma.why_not(q, k, 1, None) is None
    assert paged_decode_tma.default_config(256)[0] == 32 and paged_decode_tma.default_config(128)[0] == 64


def test_env_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(paged_decode_tma.ENV, raising=False)
    assert not paged_decode_tma.enabled()
    monkeypatch.setenv(paged_decode_tma.ENV, "1")
    assert paged_decode_tma.enabled()
    monkeypatch.setenv(paged_decode_tma.ENV, "yes")
    with pytest.raises(ValueError, match="HOTLOOP_DECODE_TMA"):
        paged_decode_tma.enabled()


# -- GPU ----------------------------------------------------------------------------------------
GRID = [
    pytest.param(64, 32, 32, 64, torch.float16, id="d64-g1-bs64-fp16"),
    pytest.param(128, 32, 8, 64, torch.bfloat16, id="d128-g4-bs64-bf16"),
    pytest.param(128, 64, 8, 128, torch.bfloat16, id="d128-g8-bs128-bf16"),
    pytest.param(128, 32, 8, 64, torch.float16, id="d128-g4-bs64-fp16"),
    pytest.param(256, 16, 2, 64, torch.bfloat16, id="d256-g8-bs64-bf16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("d,h,kv,bs,dtype", GRID)
def test_decode_tma_gpu(d: int, h: int, kv: int, bs: int, dtype: torch.dtype) -> None:
    lens = [1, 0, 17, 300, 1031, 64 * 40 + 5]
    _case(lens, h, kv, d, bs, dtype, "cuda")
    for config in ((32, 4, 4), (64, 4, 2), (64, 8, 3)):
        if bs % config[0] == 0 and not (d == 256 and config[0] == 64):
            _case(lens, h, kv, d, bs, dtype, "cuda", config)


@pytest.mark.gpu
def test_dispatch_in_a_graph_launch_matches_the_pointer_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """``graph_plan`` launches with the switch on go through the TMA kernel (its output differs from
    the pointer-load kernel's only by rounding), and without it or outside a graph's plan do not."""
    from hotloop.kernels import paged_decode_attention as mod

    calls: list[int] = []
    real = paged_decode_tma.decode_tma

    def spy(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(paged_decode_tma, "decode_tma", spy)
    g = torch.Generator().manual_seed(3)
    B, H, KV, D, BS = 256, 32, 8, 128, 64
    lens = [1 + (i * 37) % 1100 for i in range(B)]
    need = [-(-n // BS) for n in lens]
    nb = sum(need)
    k = torch.randn(nb, BS, KV, D, generator=g).to(torch.bfloat16).cuda()
    v = torch.randn(nb, BS, KV, D, generator=g).to(torch.bfloat16).cuda()
    tables = torch.zeros(B, max(need), dtype=torch.int32)
    at = 0
    for i, n in enumerate(need):
        tables[i, :n] = torch.arange(at, at + n, dtype=torch.int32)
        at += n
    tables = tables.cuda()
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(B, H, D, generator=g).to(torch.bfloat16).cuda()
    monkeypatch.delenv(paged_decode_tma.ENV, raising=False)
    base = mod.paged_decode_attention(q, k, v, tables, seq, D**-0.5, graph_plan=True)
    assert not calls
    monkeypatch.setenv(paged_decode_tma.ENV, "1")
    plain = mod.paged_decode_attention(q, k, v, tables, seq, D**-0.5)  # not a graph's launch
    assert not calls
    tma = mod.paged_decode_attention(q, k, v, tables, seq, D**-0.5, graph_plan=True)
    assert calls == [1]
    assert rel_err(tma, base) < 4e-3 and torch.equal(plain, base)
