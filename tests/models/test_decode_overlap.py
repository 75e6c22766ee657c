"""``models/decode_overlap.py``: a decode step run as two micro-batches gives each row what the whole batch
gives it, writes the same KV cache, and is taken only where ``HOTLOOP_DECODE_OVERLAP`` says.

On the CPU the two micro-batches run in order (no streams); the GPU test runs them on two streams,
eagerly and inside a captured CUDA graph, against the same step run whole."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import test_parity as tp
import torch
from test_parity import CONFIGS, PagedRunner, _hf_model
from transformers import LlamaConfig, MistralConfig, Qwen3Config

from hotloop.layers.attention import AttentionMetadata
from hotloop.models import decode_overlap as overlap
from hotloop.models.loader import load_model

# GQA, MHA with q/k norm and biases, a sliding window
OVERLAP_CONFIGS = ["llama-gqa", "qwen3-qknorm-bias-mha", "mistral-window5"]


def _decode_meta(runner: PagedRunner, seqs: list[str], device: str = "cpu") -> AttentionMetadata:
    """A decode-only step of one new token for each of ``seqs`` (the runner's cache state advanced),
    with the device tensors a GPU step carries."""
    slots, seq_lens = [], []
    for s in seqs:
        pos = runner.lens.get(s, 0)
        table = runner.tables.setdefault(s, [])
        while len(table) * tp.BLOCK_SIZE <= pos:
            table.append(runner.free.pop())
        slots.append(table[pos // tp.BLOCK_SIZE] * tp.BLOCK_SIZE + pos % tp.BLOCK_SIZE)
        runner.lens[s] = pos + 1
        seq_lens.append(pos + 1)
    width = max(len(runner.tables[s]) for s in seqs)
    tables = torch.zeros(len(seqs), width, dtype=torch.int32)
    for row, s in enumerate(seqs):
        tables[row, : len(runner.tables[s])] = torch.tensor(runner.tables[s], dtype=torch.int32)
    n = len(seqs)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=tables.to(device),
        query_lens=[1] * n,
        seq_lens=seq_lens,
        seq_lens_t=torch.tensor(seq_lens, dtype=torch.int32, device=device) if device != "cpu" else None,
        query_start_t=torch.arange(n + 1, dtype=torch.int32, device=device) if device != "cpu" else None,
        max_query_len=1,
        decode_only=True,
        graph=device != "cpu",
    )


def _prefilled(model: Any, n: int) -> tuple[PagedRunner, list[str], list[int]]:
    """A runner holding ``n`` sequences of different lengths (2-6 tokens), and each one's next token."""
    runner = PagedRunner(model)
    gen = torch.Generator().manual_seed(1)
    vocab = model.args.vocab_size
    seqs = [f"s{i}" for i in range(n)]
    for i, s in enumerate(seqs):
        prompt = torch.randint(0, vocab, (2 + (3 * i) % 5,), generator=gen).tolist()
        runner.step([(s, prompt)])
    nxt = torch.randint(0, vocab, (n,), generator=gen).tolist()
    return runner, seqs, nxt


def _step(
    model: Any, runner: PagedRunner, seqs: list[str], ids: list[int], device: str = "cpu"
) -> torch.Tensor:
    meta = _decode_meta(runner, seqs, device)
    positions = torch.tensor([runner.lens[s] - 1 for s in seqs], device=device)
    with torch.no_grad():
        hidden = model(torch.tensor(ids, device=device), positions, runner.kv_caches, meta)
        return model.compute_logits(hidden)


@pytest.mark.parametrize("name", OVERLAP_CONFIGS)
@pytest.mark.parametrize("n", [2, 5, 20])
def test_two_micro_batches_match_the_whole_batch_cpu(
    name: str, n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf = _hf_model(CONFIGS[name]())
    hf.save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, torch.float32, "cpu")
    runner, seqs, nxt = _prefilled(model, n)
    twin = copy.deepcopy(runner)

    monkeypatch.delenv(overlap.ENV, raising=False)
    whole = _step(model, runner, seqs, nxt)

    calls: list[int] = []
    real = overlap.decode_overlapped

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(overlap, "decode_overlapped", spy)
    monkeypatch.setenv(overlap.ENV, "2")
    split = _step(model, twin, seqs, nxt)
    assert calls == [{2: 1, 5: 2, 20: 8}[n]]  # half, rounded down to a multiple of 8 from 16 rows
    torch.testing.assert_close(split, whole, atol=1e-5, rtol=1e-5)
    for (k1, v1), (k2, v2) in zip(runner.kv_caches, twin.kv_caches, strict=True):
        # the same slots written (the rest hold the runner's random values), within a GEMM's rounding
        torch.testing.assert_close(k1, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1, v2, atol=1e-5, rtol=1e-5)

    # the next step reads the cache this one wrote: still the same
    nxt2 = split.argmax(-1).tolist()
    monkeypatch.delenv(overlap.ENV)
    again_whole = _step(model, runner, seqs, nxt2)
    monkeypatch.setenv(overlap.ENV, "2")
    again_split = _step(model, twin, seqs, nxt2)
    torch.testing.assert_close(again_split, again_whole, atol=1e-5, rtol=1e-5)


def _meta(n: int, decode_only: bool = True, graph: bool = False) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=torch.arange(n),
        block_tables=torch.arange(2 * n, dtype=torch.int32).view(n, 2),
        query_lens=[1] * n,
        seq_lens=list(range(3, 3 + n)),
        seq_lens_t=torch.arange(3, 3 + n, dtype=torch.int32),
        query_start_t=torch.arange(n + 1, dtype=torch.int32),
        max_query_len=1,
        decode_only=decode_only,
        graph=graph,
        graph_max_splits=4,
    )


def test_decode_split_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    h = torch.zeros(256, 4)
    monkeypatch.delenv(overlap.ENV, raising=False)
    assert overlap.decode_split(_meta(256), h) is None  # off by default
    monkeypatch.setenv(overlap.ENV, "0")
    assert overlap.decode_split(_meta(256), h) is None
    monkeypatch.setenv(overlap.ENV, "1")
    assert overlap.decode_split(_meta(256), h) == 128
    assert overlap.decode_split(_meta(127), torch.zeros(127, 4)) is None  # under the default minimum
    assert overlap.decode_split(_meta(256, decode_only=False), h) is None
    monkeypatch.setenv(overlap.ENV, "8")
    assert overlap.decode_split(_meta(8), torch.zeros(8, 4)) == 4
    assert overlap.decode_split(_meta(9), torch.zeros(9, 4)) == 4
    assert overlap.decode_split(_meta(40), torch.zeros(40, 4)) == 16  # a multiple of 8
    assert overlap.decode_split(_meta(200), torch.zeros(200, 4)) == 96
    assert overlap.decode_split(_meta(7), torch.zeros(7, 4)) is None
    for bad in ("yes", "-3", "1.5"):
        monkeypatch.setenv(overlap.ENV, bad)
        with pytest.raises(ValueError, match=overlap.ENV):
            overlap.decode_split(_meta(256), h)


def test_rows_slices_a_decode_batch() -> None:
    meta = _meta(6, graph=True)
    part = meta.rows(2, 5)
    assert part.slot_mapping.tolist() == [2, 3, 4]
    assert part.block_tables.tolist() == [[4, 5], [6, 7], [8, 9]]
    assert part.query_lens == [1, 1, 1] and part.seq_lens == [5, 6, 7]
    assert part.seq_lens_t is not None and part.seq_lens_t.tolist() == [5, 6, 7]
    assert part.query_start_t is not None and part.query_start_t.tolist() == [0, 1, 2, 3]
    assert part.decode_only and part.graph and part.graph_max_splits == 4 and part.max_query_len == 1
    assert part.slot_mapping.data_ptr() == meta.slot_mapping[2:].data_ptr()  # views, no copies
    for lo, hi in ((3, 3), (-1, 2), (4, 7)):
        with pytest.raises(ValueError, match="rows"):
            meta.rows(lo, hi)
    with pytest.raises(ValueError, match="decode-only"):
        _meta(6, decode_only=False).rows(0, 3)


def test_decode_overlapped_checks_its_arguments(tmp_path: Path) -> None:
    hf = _hf_model(CONFIGS["llama-gqa"]())
    hf.save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, torch.float32, "cpu")
    runner, seqs, _ = _prefilled(model, 4)
    meta = _decode_meta(runner, seqs)
    layers = list(model.model.layers)
    h = torch.zeros(4, model.args.hidden_size)
    cs = (torch.zeros(4, 8), torch.zeros(4, 8))
    for bad in (0, 4):
        with pytest.raises(ValueError, match="split"):
            overlap.decode_overlapped(layers, h, cs, runner.kv_caches, meta, bad)
    with pytest.raises(ValueError, match="KV caches"):
        overlap.decode_overlapped(layers, h, cs, runner.kv_caches[:1], meta, 2)


# head dim 64 (the GPU kernels' tested sizes): GQA, MHA with q/k norm and biases, a sliding window
_GPU_SHAPE: dict[str, Any] = dict(tp.SMALL, hidden_size=256, intermediate_size=384)
GPU_CONFIGS: dict[str, Any] = {
    "llama-gqa-hd64": lambda: LlamaConfig(**_GPU_SHAPE),
    "qwen3-qknorm-bias-mha-hd64": lambda: Qwen3Config(
        **dict(_GPU_SHAPE, num_key_value_heads=4, head_dim=64), attention_bias=True
    ),
    "mistral-window5-hd64": lambda: MistralConfig(**_GPU_SHAPE, sliding_window=5),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("name", list(GPU_CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_streams_match_the_whole_batch_gpu(
    name: str, dtype: torch.dtype, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eagerly and replayed from a CUDA graph, the two-stream step gives the whole step's logits
    (within the rounding of a GEMM over half the rows) and writes the same cache (pages of 16)."""
    monkeypatch.setattr(tp, "BLOCK_SIZE", 16)
    monkeypatch.setattr(tp, "NUM_BLOCKS", 64)
    hf = _hf_model(GPU_CONFIGS[name]())
    hf.save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, dtype, "cuda")
    monkeypatch.delenv(overlap.ENV, raising=False)
    n = 20
    runner, seqs, nxt = _prefilled_gpu(model, n, dtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-2

    base = copy.deepcopy(runner)
    whole = _step(model, copy.deepcopy(base), seqs, nxt, "cuda")
    ref = copy.deepcopy(base)
    _step(model, ref, seqs, nxt, "cuda")

    monkeypatch.setenv(overlap.ENV, "2")
    eager = copy.deepcopy(base)
    got = _step(model, eager, seqs, nxt, "cuda")
    torch.cuda.synchronize()
    torch.testing.assert_close(got, whole, atol=tol, rtol=tol)
    _same_cache(eager, ref, tol)

    # captured: the graph records both streams; a replay over a fresh copy of the cache
    graphed = copy.deepcopy(base)
    meta = _decode_meta(graphed, seqs, "cuda")
    ids = torch.tensor(nxt, device="cuda")
    positions = torch.tensor([graphed.lens[s] - 1 for s in seqs], device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        model(ids, positions, copy.deepcopy(base).kv_caches, meta)  # warm-up on a throwaway cache
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            logits = model.compute_logits(model(ids, positions, graphed.kv_caches, meta))
    torch.cuda.current_stream().wait_stream(stream)
    for src, dst in zip(base.kv_caches, graphed.kv_caches, strict=True):  # undo the capture's writes
        dst[0].copy_(src[0])
        dst[1].copy_(src[1])
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(logits, whole, atol=tol, rtol=tol)
    _same_cache(graphed, ref, tol)


def _prefilled_gpu(model: Any, n: int, dtype: torch.dtype) -> tuple[PagedRunner, list[str], list[int]]:
    """``_prefilled`` with the runner's cache on the GPU in ``dtype`` (the prompts' steps run there)."""
    runner = PagedRunner(model)
    runner.kv_caches = [(k.to("cuda", dtype) * 0.02, v.to("cuda", dtype) * 0.02) for k, v in runner.kv_caches]
    gen = torch.Generator().manual_seed(1)
    vocab = model.args.vocab_size
    seqs = [f"s{i}" for i in range(n)]
    for i, s in enumerate(seqs):  # the prompts' K/V written by decode steps of one sequence at a time
        prompt = torch.randint(0, vocab, (2 + (3 * i) % 5,), generator=gen).tolist()
        for tok in prompt:
            _step(model, runner, [s], [tok], "cuda")
    nxt = torch.randint(0, vocab, (n,), generator=gen).tolist()
    return runner, seqs, nxt


def _same_cache(a: PagedRunner, b: PagedRunner, tol: float) -> None:
    for (k1, v1), (k2, v2) in zip(a.kv_caches, b.kv_caches, strict=True):
        torch.testing.assert_close(k1, k2, atol=tol, rtol=tol)
        torch.testing.assert_close(v1, v2, atol=tol, rtol=tol)
