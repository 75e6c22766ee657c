"""Greedy parity with transformers on the GPU in bf16 (skipped without a GPU).

Tolerance rule: hotloop's tokens must equal transformers' bf16 tokens up to the first step where
bf16 rounding may decide the token; after it either continuation is correct and the sequences may
part. Two such steps are recognised: one where transformers' own bf16 top-2 logits are within bf16
noise (gap below ``NOISE`` times the top logit's magnitude, with an absolute floor), and the step
where transformers in float32 first picks another token than transformers in bf16, if hotloop
picks the float32 token there (the float32 model's top two were closer than bf16 tells apart,
though bf16's gap looked safe). A real case: a tiny Qwen2 whose float32 gap was 0.005 at logits of
1.55, and whose bf16 gap came out as two bf16 steps, 0.016; hotloop followed float32.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from launch_spies import spy_int8_decode_launches
from test_engine_parity import MAX_NEW, VARIANTS, make_prompts, run_engine, run_engine_built
from tiny_archs import TINY_ARCHS, TINY_VOCAB

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig

NOISE = 2**-7  # bf16 has 8 significant bits
# A fixed KV cache (blocks) where a test would otherwise take its default share of free memory: the
# GPU tests run in parallel workers on one card, and a cache sized on free memory can find it taken
# by another worker before it allocates (an out-of-memory error in the forty-seventh session's run)
GPU_TEST_BLOCKS = 4096


def _hf_greedy(path: Path, prompts: list[list[int]], max_new: int, dtype: torch.dtype) -> list[Any]:
    """transformers' greedy generation on CUDA: per prompt, (new tokens, per-step scores)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).cuda().eval()
    model.generation_config.eos_token_id = None
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], device="cuda")
            g = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=0,
                output_scores=True,
                return_dict_in_generate=True,
            )
            out.append((g.sequences[0, len(p) :].tolist(), g.scores))
    return out


class Expected(NamedTuple):
    """transformers' greedy run of one prompt: bf16 tokens, the first near-tie step of the bf16 run
    (or max_new), float32 tokens, and the first step where the two runs part (or max_new)."""

    tokens: list[int]
    tie: int
    tokens32: list[int]
    parted: int


def hf_greedy_with_margins(path: Path, prompts: list[list[int]], max_new: int) -> list[Expected]:
    """``Expected`` per prompt (see the module docstring for how it is used)."""
    bf16 = _hf_greedy(path, prompts, max_new, torch.bfloat16)
    fp32 = _hf_greedy(path, prompts, max_new, torch.float32)
    out = []
    for (tokens, scores), (tokens32, _) in zip(bf16, fp32, strict=True):
        tie = max_new
        for step, s in enumerate(scores):
            top2 = s[0].float().topk(2).values
            if (top2[0] - top2[1]).item() < max(NOISE * top2[0].abs().item(), 1e-2):
                tie = step
                break
        parted = next((i for i, (a, b) in enumerate(zip(tokens, tokens32, strict=True)) if a != b), max_new)
        out.append(Expected(tokens, tie, tokens32, parted))
    return out


def check_parity(got: list[list[int]], expected: list[Expected]) -> int:
    """Assert the module docstring's rule for every prompt: hotloop's tokens equal transformers' bf16
    tokens up to the bf16 run's first near-tie, or part from them exactly where the float32 run does,
    with the float32 run's token. Returns how many tokens were compared (per prompt, up to the first
    difference or the near-tie, whichever comes first)."""
    compared = 0
    for i, (g, x) in enumerate(zip(got, expected, strict=True)):
        first_diff = next(
            (k for k, (a, b) in enumerate(zip(g, x.tokens, strict=True)) if a != b), len(x.tokens)
        )
        follows_fp32 = first_diff == x.parted < len(g) and g[first_diff] == x.tokens32[first_diff]
        assert first_diff >= x.tie or follows_fp32, (
            f"prompt {i}: hotloop {g} != transformers bf16 {x.tokens} at step {first_diff} (first near-tie "
            f"at {x.tie}; float32 {x.tokens32} parts at {x.parted})"
        )
        compared += min(first_diff, x.tie)
    return compared


@pytest.mark.gpu
@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("eager", [False, True])
def test_greedy_parity_bf16_gpu(
    arch: str, variant: str, eager: bool, make_tiny_model: Callable[[str], Path]
) -> None:
    path = make_tiny_model(arch)
    prompts = make_prompts(seed=sum(map(ord, arch)))
    expected = hf_greedy_with_margins(path, prompts, MAX_NEW)
    cfg = EngineConfig(
        device="cuda", dtype="bfloat16", max_batch_size=8, eager_mode=eager, **VARIANTS[variant]
    )
    got, _stats = run_engine(path, cfg, prompts, MAX_NEW)
    compared = check_parity(got, expected)
    assert compared >= len(prompts) * MAX_NEW // 2, "too many near-ties: the test would check little"


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [8192, 300])
def test_exact_piecewise_steps_parity_gpu(
    chunk: int, make_tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill and mixed steps from 17 tokens whose count rounded up to 16 is below their bucket run
    their pieces eagerly over those rows (``HOTLOOP_PIECEWISE_EAGER_FROM``, piecewise_graph.py)
    between replayed attention launches: greedy tokens still follow transformers' (the near-tie
    rule), whole prompts or in 300-token chunks (below 256 tokens every bucket is a multiple of 16,
    so no step there runs exact)."""
    from hotloop.executor.piecewise_graph import EAGER_ENV

    monkeypatch.setenv(EAGER_ENV, "17")
    path = make_tiny_model("llama_gqa_llama3rope")
    rng = random.Random(23)
    prompts = [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randrange(90, 220))] for _ in range(8)]
    expected = hf_greedy_with_margins(path, prompts, MAX_NEW)
    cfg = EngineConfig(
        device="cuda",
        dtype="bfloat16",
        max_batch_size=8,
        cache_block_seq_len=16,
        max_prefill_token_num=chunk,
        cache_max_entry_count=GPU_TEST_BLOCKS,
    )
    built = build_engine(str(path), cfg)
    pw = built.engine.executor.runner.piecewise
    assert pw is not None and pw.eager_from == 17
    before = pw.num_exact_steps
    got, _stats = run_engine_built(built, prompts, MAX_NEW)
    assert pw.num_exact_steps > before
    compared = check_parity(got, expected)
    assert compared >= len(prompts) * MAX_NEW // 2, "too many near-ties: the test would check little"


@pytest.mark.gpu
def test_wide_graphs_greedy_equals_eager(make_tiny_model: Callable[[str], Path]) -> None:
    """Above 16 rows the decode graphs keep bf16 logits and take the argmax on them (no float32
    cast): 28 greedy requests (up to about 28 at once: one joins every 2/3 step, each runs 30
    steps) give eager mode's tokens exactly."""
    path = make_tiny_model("llama_gqa_llama3rope")
    prompts = make_prompts(seed=11, n=28)
    runs = []
    for eager in (True, False):
        cfg = EngineConfig(
            device="cuda",
            dtype="bfloat16",
            max_batch_size=32,
            eager_mode=eager,
            cache_max_entry_count=GPU_TEST_BLOCKS,
        )
        got, _stats = run_engine(path, cfg, prompts, 30)
        runs.append(got)
    assert runs[0] == runs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("policy", [8, 4])
def test_quantized_kv_graphs_equal_eager(policy: int, make_tiny_model: Callable[[str], Path]) -> None:
    """With an int8 / int4 KV cache the decode CUDA graphs replay the same kernels as eager mode:
    the tokens are identical (the kernels' accuracy is checked against the reference in
    tests/kernels/test_kv_quant_kernels.py)."""
    path = make_tiny_model("llama_gqa_llama3rope")
    prompts = make_prompts(seed=5)
    runs = []
    for eager in (True, False):
        cfg = EngineConfig(
            device="cuda",
            dtype="bfloat16",
            max_batch_size=8,
            eager_mode=eager,
            quant_policy=policy,
            **VARIANTS["chunked"],
        )
        got, _stats = run_engine(path, cfg, prompts, MAX_NEW)
        runs.append(got)
    assert runs[0] == runs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("batch", [8, 1])
def test_int8_fused_write_keeps_tokens(
    eager: bool, batch: int, make_tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HOTLOOP_KV_CUDA_FUSED_WRITE=1``: the CUDA int8 decode kernel rotates q and writes the step's
    k / v itself (no rotary_kv_write launch in decode steps). Head dim 128 so that the kernel takes
    the decode steps; the tokens equal those of the two-launch path, eager and in CUDA graphs. At
    batch 1 (the one-row path) the q/k/v GEMV rotates and hands k / v over
    (``dense_gemv_qkv_rope_staged``), and the kernel only quantizes and writes them; the path it is
    compared with there is the rope GEMV that writes the int8 cache itself
    (``ops.one_row_rope_quant``): the same projection, so the same bits to quantize."""
    from hotloop.kernels import decode_merge_write, kv_int8_decode_cuda, ops

    if batch == 1:
        from hotloop.kernels import counters

        monkeypatch.setitem(ops._state, "one_row_rope_quant", True)
        # its arrival counters made now: a buffer first asked for inside the graph capture would not
        # exist (counters.counters), and the captured step would take the plain GEMV instead
        counters.counters(torch.device("cuda"), "rope_quant", 1)

    path = make_tiny_model("llama_hd128")
    prompts = make_prompts(seed=11)
    # the comparison path at batch 1 is the rope GEMV's own int8 write, not the (default) merge write
    monkeypatch.setenv(decode_merge_write.ENV, "0")
    launches = spy_int8_decode_launches(monkeypatch)
    runs = []
    for fused in ("0", "1"):
        monkeypatch.setenv(kv_int8_decode_cuda.FUSED_ENV, fused)
        launches.clear()
        cfg = EngineConfig(
            device="cuda",
            dtype="bfloat16",
            max_batch_size=batch,
            eager_mode=eager,
            quant_policy=8,
            **VARIANTS["chunked"],
        )
        got, _stats = run_engine(path, cfg, prompts, MAX_NEW)
        runs.append(got)
        fused_ws = [a["fused"] for ok, a in launches if ok and a["fused"] is not None]
        if fused == "1":
            assert fused_ws, "no decode step took the fused kernel"
            if batch == 1:
                assert any(w.rotated for w in fused_ws), "no batch-1 step took the staged q/k/v GEMV"
        else:
            assert not fused_ws
    assert runs[0] == runs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize(
    "arch,policy,merged",
    [("llama_hd128", 8, True), ("llama_hd128", 4, False), ("mistral_window_hd128", 8, False)],
)
def test_int8_merge_write_keeps_tokens(
    eager: bool,
    arch: str,
    policy: int,
    merged: bool,
    make_tiny_model: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The merge write at batch 1 (the default; ``HOTLOOP_KV_MERGE_WRITE=0`` turns it off): the q/k/v
    GEMV rotates and hands k / v over, the CUDA int8 decode kernel attends over the older context
    and the split merge quantizes, writes and attends to the step's token (``decode_merge_write.py``):
    the same tokens as the separate write (``rotary_kv_write``'s launch), eager and in CUDA graphs,
    and the decode steps took that path. An int4 cache and a sliding window (which the merge's
    kernel would ignore) keep the separate write, with the same tokens either way."""
    from hotloop.kernels import decode_merge_write

    path = make_tiny_model(arch)
    prompts = make_prompts(seed=13)
    launches = spy_int8_decode_launches(monkeypatch)
    runs = []
    for on in ("0", "1"):
        monkeypatch.setenv(decode_merge_write.ENV, on)
        launches.clear()
        cfg = EngineConfig(
            device="cuda", dtype="bfloat16", max_batch_size=1, full_batch_steps=1, eager_mode=eager, quant_policy=policy,
            **VARIANTS["chunked"],
        )  # fmt: skip
        got, _stats = run_engine(path, cfg, prompts, MAX_NEW)
        runs.append(got)
        excluded = [a for ok, a in launches if ok and a["exclude_newest"]]
        if on == "1" and merged:
            assert excluded, "no decode step took the merge write"
        else:
            assert not excluded
    assert runs[0] == runs[1]


@pytest.mark.gpu
def test_jit_schedule_measures_steps_and_keeps_tokens(make_tiny_model: Callable[[str], Path]) -> None:
    """``jit_schedule``: the runner learns each step kind's device time from CUDA events, and the
    tokens are the same as without it."""
    path = make_tiny_model("llama_gqa_llama3rope")
    prompts = make_prompts(seed=9)
    runs = []
    for jit in (False, True):
        cfg = EngineConfig(
            device="cuda", dtype="bfloat16", max_batch_size=8, jit_schedule=jit, **VARIANTS["chunked"]
        )
        built = build_engine(str(path), cfg)
        got, _stats = run_engine_built(built, prompts, MAX_NEW)
        runs.append(got)
        runner = built.engine.executor.runner  # type: ignore[attr-defined]
        if jit:
            # (whether the engine waits depends on the tiny model's step time against the host's
            # launch time: the virtual-clock test in tests/engine covers the waiting itself)
            assert runner.step_time_s and all(0 < s < 1 for s in runner.step_time_s.values())
            assert built.engine.jit_schedule and built.engine.executor.estimate_s is not None
        else:
            assert not runner.step_time_s and built.engine.jit_wait_s == 0
    assert runs[0] == runs[1]


@pytest.mark.gpu
def test_embeddings_on_host_same_tokens(make_tiny_model: Callable[[str], Path]) -> None:
    """``--embeddings-on-host``: the untied table is in pinned host memory, read inside the decode
    CUDA graphs and the piecewise prefill graphs, and the tokens are those of the table on the GPU."""
    path = make_tiny_model("llama_mha_odd")  # untied embeddings
    prompts = make_prompts(seed=11)
    runs = []
    for host in (False, True):
        cfg = EngineConfig(
            device="cuda", dtype="bfloat16", max_batch_size=8, embeddings_on_host=host, **VARIANTS["chunked"]
        )
        built = build_engine(str(path), cfg)
        table = built.engine.executor.model.model.embed_tokens.weight  # type: ignore[attr-defined]
        assert (table.device.type == "cpu" and table.is_pinned()) == host
        got, _stats = run_engine_built(built, prompts, MAX_NEW)
        runs.append(got)
    assert runs[0] == runs[1]
