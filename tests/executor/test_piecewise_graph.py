"""Piecewise prefill graphs: the pieces (run without capture on the CPU) equal the whole model.

``GpuModelRunner`` with ``PiecewiseGraphs(capture=False)`` runs prefill and mixed steps piece by
piece over padded static buffers, with attention in between; its greedy tokens must equal the plain
CPU runner's over prefill, chunked prefill, mixed and decode steps. On the GPU the same pieces are
captured (covered by tests/api/test_gpu_parity.py with graphs on).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.executor.gpu_runner import GpuModelRunner
from hotloop.executor.piecewise_graph import (
    EAGER_ENV,
    PiecewiseGraphs,
    eager_from_env,
    supports,
    token_buckets,
)
from hotloop.messages import GenerationConfig


def _generate(engine: Any, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    params = GenerationConfig(max_new_tokens=max_new, ignore_eos=True)
    out: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    step = 0
    while step < 2 or engine.has_unfinished():
        for i, p in enumerate(prompts):
            if i // 2 == step:  # two requests join per step: mixed prefill + decode steps
                engine.add_request(str(i), p, params)
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
        step += 1
    return [out[str(i)] for i in range(len(prompts))]


def _reference_and_engine(
    path: Path, prompts: list[list[int]], max_new: int, **cfg: Any
) -> tuple[list[list[int]], Any]:
    """The plain CPU runner's tokens for ``prompts``, and a second engine built the same way (float32
    on the CPU, batch 4, 128 cache blocks; ``cfg`` adds or overrides ``EngineConfig`` fields)."""
    config = EngineConfig(
        **{"device": "cpu", "dtype": "float32", "max_batch_size": 4, "cache_max_entry_count": 128, **cfg}
    )
    expected = _generate(build_engine(str(path), config).engine, prompts, max_new)
    return expected, build_engine(str(path), config)


def _piecewise_runner(built: Any, block: int, max_tokens: int, session: int, **kwargs: Any) -> GpuModelRunner:
    """Swap ``built``'s runner for a ``GpuModelRunner`` whose steps run uncaptured piecewise graphs
    over ``max_tokens`` static rows (``kwargs`` go to ``PiecewiseGraphs``)."""
    ex: Any = built.engine.executor
    runner = GpuModelRunner(
        ex.model, ex.kv_caches, block, ex.device, 4, max_tokens, session, use_cuda_graph=False
    )
    runner.piecewise = PiecewiseGraphs(
        ex.model, ex.kv_caches, runner.buffers.input_ids, max_tokens, capture=False, **kwargs
    )
    ex.runner = runner
    return runner


def test_token_buckets_pad_by_at_most_an_eighth() -> None:
    b = token_buckets(8448)
    assert b[0] == 16 and b[-1] == 8448 and b == sorted(set(b))
    for n in range(1, 8449, 7):
        pad = next(x for x in b if x >= n)
        assert pad - n < max(16, n // 8 + 16), (n, pad)
    assert next(x for x in b if x >= 1040) == 1152  # the serving mix: 1,024 prompt tokens + 16 decodes


@pytest.mark.parametrize(
    "arch", ["llama_gqa_llama3rope", "qwen3_qknorm", "mistral_window", "qwen2_mixed_window"]
)
def test_pieces_equal_the_model(
    arch: str, make_tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_tiny_model(arch)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(2, 30))] for _ in range(6)]
    expected, built = _reference_and_engine(path, prompts, 6, cache_block_seq_len=4, max_prefill_token_num=16)
    assert supports(built.engine.executor.model)
    import hotloop.executor.piecewise_graph as piecewise_graph

    packed: list[bool] = []  # per stored layer: one copy of the fused output, or the three slices'
    find = piecewise_graph.packed_qkv

    def spy_packed(q: Any, k: Any, v: Any) -> Any:
        found = find(q, k, v)
        packed.append(found is not None)
        return found

    monkeypatch.setattr(piecewise_graph, "packed_qkv", spy_packed)
    runner = _piecewise_runner(built, 4, 20, 128)
    got = _generate(built.engine, prompts, 6)
    assert runner.num_piecewise_steps > 3
    assert got == expected
    assert built.engine.num_free_blocks == built.engine.num_total_blocks
    # q/k-normed models store the three slices; the others their fused projection's output whole
    assert packed and all(p == (arch != "qwen3_qknorm") for p in packed), (arch, packed)


def test_exact_steps_equal_the_model(make_tiny_model: Callable[[str], Path]) -> None:
    """``eager_from``: steps of at least that many tokens run the pieces over their own rows rounded
    up to a multiple of 16, where that is below their bucket (no padding to it); the tokens still
    equal the plain runner's, and the other steps keep the padded path."""
    path = make_tiny_model("llama_gqa_llama3rope")
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(90, 200))] for _ in range(6)]
    expected, built = _reference_and_engine(
        path, prompts, 4, session_len=256, cache_block_seq_len=16, max_prefill_token_num=400
    )
    pw = _piecewise_runner(built, 16, 404, 256, eager_from=17).piecewise
    assert pw is not None
    assert pw.exact_rows(16) is None and pw.exact_rows(17) is None  # 32 rows: its bucket
    assert pw.buckets[15:18] == [256, 288, 320] and pw.exact_rows(260) == 272 and pw.exact_rows(280) is None
    seen: list[tuple[int, int | None, set[int]]] = []  # per step: tokens, exact rows, rows the pieces ran
    run, piece = pw.run, pw._piece

    def spy_run(n: int, pos: Any, meta: Any) -> Any:
        seen.append((n, pw.exact_rows(n), set()))
        return run(n, pos, meta)

    def spy_piece(i: int, tp: int) -> None:
        seen[-1][2].add(tp)
        piece(i, tp)

    pw.run = spy_run  # type: ignore[method-assign, assignment]
    pw._piece = spy_piece  # type: ignore[method-assign]
    got = _generate(built.engine, prompts, 4)
    assert got == expected
    assert built.engine.num_free_blocks == built.engine.num_total_blocks
    for n, rows, ran in seen:
        bucket = pw.bucket_for(n)
        assert bucket is not None
        want = -(-n // 16) * 16
        assert rows == (want if n >= 17 and want < bucket else None), (n, rows)
        assert ran == {rows if rows is not None else bucket}, (n, rows, ran)  # what the pieces ran over
    assert pw.num_exact_steps == sum(r is not None for _, r, _ in seen) > 0, seen
    assert any(r is None for _, r, _ in seen), seen


def test_eager_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EAGER_ENV, raising=False)
    assert eager_from_env() == "auto"  # the default: a threshold measured after the capture
    for raw, want in (
        ("", "auto"),
        ("none", None),
        ("auto", "auto"),
        ("AUTO", "auto"),
        ("off", None),
        ("0", None),
        ("512", 512),
    ):
        monkeypatch.setenv(EAGER_ENV, raw)
        assert eager_from_env() == want, raw
    for bad in ("-3", "many", "1.5"):
        monkeypatch.setenv(EAGER_ENV, bad)
        with pytest.raises(ValueError, match=EAGER_ENV):
            eager_from_env()
    with pytest.raises(ValueError, match="eager_from"):
        PiecewiseGraphs(None, [], None, 16, capture=False, eager_from=0)  # type: ignore[arg-type]


def test_packed_qkv_finds_the_fused_output_and_nothing_else() -> None:
    """``packed_qkv``: q, k and v split from one projection output are copied as that one tensor;
    slices from elsewhere, out of order, or of another layout are not (the three copies then)."""
    import torch

    from hotloop.executor.piecewise_graph import packed_qkv

    qkv = torch.randn(5, 8 + 2 * 4)
    q, k, v = qkv.split([8, 4, 4], dim=1)
    whole = packed_qkv(q, k, v)
    assert whole is not None and whole.data_ptr() == qkv.data_ptr() and torch.equal(whole, qkv)
    big = torch.randn(9, 16)  # the first rows of a larger output (a static buffer's view)
    q2, k2, v2 = big[:3].split([8, 4, 4], dim=1)
    got = packed_qkv(q2, k2, v2)
    assert got is not None and torch.equal(got, big[:3])
    assert packed_qkv(q, v, k) is None  # out of order
    assert packed_qkv(q.clone(), k, v) is None  # q normed into a tensor of its own
    assert packed_qkv(q, k.clone(), v.clone()) is None
    wide = torch.randn(5, 20)  # a fourth slice after v: the row is wider than q + 2 kv
    assert packed_qkv(*wide[:, :16].split([8, 4, 4], dim=1)) is None
    assert packed_qkv(q, k, v.to(torch.float64)) is None
