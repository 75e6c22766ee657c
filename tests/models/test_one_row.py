"""The one-row decode path (``LlamaDecoderLayer.forward_one_row``): the norms, SiLU and residual adds
fused into the projections for a batch of one row, against transformers.

On the CPU the path is forced on (``ops.one_row_fusion``) and runs the torch reference of each fused
projection; on the GPU it is taken by itself at batch 1 and runs ``kernels/dense_gemv.py``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_parity import ATOL, CONFIGS, RTOL, PagedRunner, _hf_logits, _hf_model

from hotloop.kernels import ops
from hotloop.layers.linear import QKVLinear
from hotloop.models import llama
from hotloop.models.loader import load_model

# bias everywhere, q/k norm, windows, ties, MHA and GQA
ONE_ROW_CONFIGS = [
    "llama-gqa",
    "llama-3heads-1kv-hd32-bias",
    "mistral-window5",
    "qwen2-bias-tied-window-off",
    "qwen3-qknorm-bias-mha",
]


def _count_calls(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[int]:
    """Count calls of the method ``cls.name`` (the counter is ``[n]``)."""
    calls = [0]
    real = getattr(cls, name)

    def spy(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, spy)
    return calls


def _count_one_row(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count ``forward_one_row`` calls (one per layer per one-row step)."""
    return _count_calls(monkeypatch, llama.LlamaDecoderLayer, "forward_one_row")


def _count_rope(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count ``QKVLinear.forward_rope`` calls (the rope fusion taken)."""
    return _count_calls(monkeypatch, QKVLinear, "forward_rope")


def _decode_one_by_one(model: Any, tokens: list[int], prefill: int) -> torch.Tensor:
    """Prefill ``tokens[:prefill]`` in one step, then feed the rest one token per step; the logits
    of every position."""
    runner = PagedRunner(model)
    parts = [runner.step([("s", tokens[:prefill])])["s"][1]]
    for i in range(prefill, len(tokens)):
        parts.append(runner.step([("s", tokens[i : i + 1])])["s"][1])
    return torch.cat(parts)


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("name", ONE_ROW_CONFIGS)
def test_one_row_path_matches_transformers_cpu(
    name: str, rope: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rope``: the rotary embedding and the KV write fused into the q/k/v projection too (not for
    q/k-norm models: Qwen3 keeps the separate rotary)."""
    config = CONFIGS[name]()
    hf = _hf_model(config)
    hf.save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, torch.float32, "cpu")
    assert type(model).__name__ == json.loads((tmp_path / "config.json").read_text())["architectures"][0]
    tokens = torch.randint(0, config.vocab_size, (19,), generator=torch.Generator().manual_seed(3)).tolist()
    unfused = _decode_one_by_one(model, tokens, prefill=7)

    calls = _count_one_row(monkeypatch)
    monkeypatch.setattr(ops, "one_row_fusion", lambda x: x.shape[0] == 1)
    monkeypatch.setitem(ops._state, "one_row_rope", rope)
    rope_calls = _count_rope(monkeypatch)
    fused = _decode_one_by_one(model, tokens, prefill=7)
    assert calls[0] == 12 * model.args.num_layers  # every decode step, every layer; not the prefill
    assert rope_calls[0] == (calls[0] if rope and not model.args.qk_norm else 0)

    want = _hf_logits(hf, tokens)
    err = (fused - want).abs().max().item()
    assert torch.allclose(fused, want, atol=ATOL, rtol=RTOL), f"max abs err {err:.2e}"
    assert want.std() > 0.3
    # the same arithmetic as the unfused layer, in the same order: the same bits on the CPU
    assert torch.equal(fused, unfused)


@pytest.mark.parametrize("policy", [8, 4])
def test_one_row_rope_into_a_quantized_cache_cpu(
    policy: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an int8 / int4 KV cache the rope fusion quantizes k and v as it writes them: the same
    logits, bit for bit, as the unfused layer writing the same cache (CPU: the torch reference)."""
    from hotloop.kernels import kv_quant

    hf = _hf_model(CONFIGS["llama-gqa"]())
    hf.save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, torch.float32, "cpu")
    args = model.args
    tokens = torch.randint(0, args.vocab_size, (12,), generator=torch.Generator().manual_seed(5)).tolist()

    def run() -> torch.Tensor:
        runner = PagedRunner(model)
        nb, bs = runner.kv_caches[0][0].shape[:2]
        row = kv_quant.row_bytes(args.head_dim, policy, 4)
        shape = (nb, bs, args.num_kv_heads, row)
        runner.kv_caches = [
            (torch.zeros(shape, dtype=torch.uint8), torch.zeros(shape, dtype=torch.uint8))
            for _ in range(args.num_layers)
        ]
        parts = [runner.step([("s", tokens[:5])])["s"][1]]
        for i in range(5, len(tokens)):
            parts.append(runner.step([("s", tokens[i : i + 1])])["s"][1])
        return torch.cat(parts)

    unfused = run()
    monkeypatch.setattr(ops, "one_row_fusion", lambda x: x.shape[0] == 1)
    monkeypatch.setitem(ops._state, "one_row_rope", True)
    monkeypatch.setitem(ops._state, "one_row_rope_quant", True)
    rope_calls = _count_rope(monkeypatch)
    fused = run()
    assert rope_calls[0] == 7 * args.num_layers
    assert torch.equal(fused, unfused)  # the torch reference of the fusion: the same arithmetic

    if torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return
    # the Triton kernel itself, under the interpreter: its sums run in another order, so a code can
    # land one step away; the logits stay within the quantization's noise
    from hotloop.kernels import dense_gemv

    monkeypatch.setattr(ops, "fused_qkv_rope", dense_gemv.dense_gemv_qkv_rope)
    rope_calls[0] = 0
    kernel = run()
    assert rope_calls[0] == 7 * args.num_layers
    err = (kernel - unfused).abs().max().item()
    assert err < 1e-3 * unfused.abs().max().item(), err  # (1.7e-6 against logits of 4 when written)


def test_one_row_path_needs_dense_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose projections are not all dense (AWQ on a GPU) keeps the unfused layer."""
    hf = _hf_model(CONFIGS["llama-gqa"]())
    hf.save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, torch.float32, "cpu")
    assert model.model.dense()
    del model.model.layers[1].mlp.down_proj._parameters["weight"]  # as an AWQ layer on a GPU
    model.model._dense = None
    assert not model.model.dense()


@pytest.mark.gpu
@pytest.mark.parametrize("more", [False, True])
@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("arch", ["llama_gqa_llama3rope", "qwen2_bias", "qwen3_qknorm"])
def test_one_row_path_greedy_parity_gpu(
    arch: str,
    eager: bool,
    more: bool,
    make_tiny_model: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One request at a time on the GPU in bf16 (CUDA graphs or eager): every decode step takes the
    one-row path, and the tokens equal transformers' up to its first near-tie. ``more``: also the
    rotary embedding and KV write in the q/k/v GEMV (``HOTLOOP_ONE_ROW_ROPE``), the split merge
    in the decode kernel (``HOTLOOP_DECODE_FUSED_MERGE``) and the LM head through ``dense_gemv``
    (``HOTLOOP_ONE_ROW_LM_HEAD``)."""
    from hotloop.kernels import paged_decode_attention as dec

    monkeypatch.setitem(ops._state, "one_row_rope", more)
    monkeypatch.setitem(ops._state, "one_row_lm_head", more)
    monkeypatch.setattr(dec, "FUSE_MERGE", more)
    rope_calls = _count_rope(monkeypatch)
    sys.path.insert(0, str(Path(__file__).parents[1] / "api"))  # when this file runs on its own
    from test_engine_parity import MAX_NEW, VARIANTS, make_prompts, run_engine
    from test_gpu_parity import check_parity, hf_greedy_with_margins

    from hotloop.config import EngineConfig

    path = make_tiny_model(arch)
    prompts = make_prompts(seed=11, n=3)
    expected = hf_greedy_with_margins(path, prompts, MAX_NEW)
    calls = _count_one_row(monkeypatch)
    # a small KV cache, as the other GPU engine tests: several run at once on one GPU
    cfg = EngineConfig(
        device="cuda",
        dtype="bfloat16",
        max_batch_size=1,
        full_batch_steps=1,
        eager_mode=eager,
        **VARIANTS["plain"],
    )
    got, _stats = run_engine(path, cfg, prompts, MAX_NEW)
    assert calls[0] > 0  # (graph replays do not call it: capture and eager steps do)
    assert (rope_calls[0] > 0) == (more and arch != "qwen3_qknorm")  # Qwen3's q/k norm keeps the rotary
    if more:
        from hotloop.kernels import counters

        torch.cuda.synchronize()
        assert int(counters.buffer(torch.device("cuda"), "decode_merge").abs().sum()) == 0
    check_parity(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("policy", [8, 4])
def test_one_row_rope_quantized_cache_gpu(
    policy: int, make_tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One request at a time with an int8 / int4 KV cache: the rope fusion (quantizing k and v in
    the q/k/v GEMV) runs, and the tokens follow those of the unfused path. The two may round a
    rotated value differently (fma contraction), so a code can move by one step and a near-tie
    can flip: the test asks for long common prefixes, which a wrong cache write would not give."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "api"))
    from test_engine_parity import MAX_NEW, VARIANTS, make_prompts, run_engine

    from hotloop.config import EngineConfig

    path = make_tiny_model("llama_gqa_llama3rope")
    prompts = make_prompts(seed=13, n=3)
    cfg = EngineConfig(
        device="cuda",
        dtype="bfloat16",
        max_batch_size=1,
        full_batch_steps=1,
        quant_policy=policy,
        **VARIANTS["plain"],
    )
    runs = []
    rope_calls = _count_rope(monkeypatch)
    monkeypatch.setitem(ops._state, "one_row_rope_quant", True)
    for rope in (False, True):
        monkeypatch.setitem(ops._state, "one_row_rope", rope)
        got, _stats = run_engine(path, cfg, prompts, MAX_NEW)
        runs.append(got)
    assert rope_calls[0] > 0
    common = 0
    for a, b in zip(runs[0], runs[1], strict=True):
        n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        common += n
    assert common >= len(prompts) * MAX_NEW * 3 // 4, runs


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("arch", ["llama_gqa_llama3rope", "qwen2_bias", "mistral_window"])
def test_one_row_merge_in_the_o_projection_gpu(
    arch: str, eager: bool, make_tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HOTLOOP_ONE_ROW_MERGE``: the decode splits merge in the o projection's GEMV (no merge launch).
    One request at a time on the GPU in bf16 (CUDA graphs or eager): the merged projection runs in
    every decode step's layers, and the tokens equal transformers' up to its first near-tie. The
    prompts run past three 64-token decode tiles, so several splits hold keys and their weighting
    matters (a prompt within one tile leaves every split but the first empty)."""
    from hotloop.kernels import paged_decode_attention as dec
    from hotloop.layers.linear import Linear

    monkeypatch.setitem(ops._state, "one_row_rope", True)
    monkeypatch.setitem(ops._state, "one_row_merge", True)
    monkeypatch.setattr(dec, "FUSE_MERGE", False)
    merged = _count_calls(monkeypatch, Linear, "forward_merged")
    sys.path.insert(0, str(Path(__file__).parents[1] / "api"))
    from test_engine_parity import MAX_NEW, VARIANTS, run_engine
    from test_gpu_parity import check_parity, hf_greedy_with_margins

    from hotloop.config import EngineConfig

    path = make_tiny_model(arch)
    rng = torch.Generator().manual_seed(17)
    prompts = [torch.randint(3, 300, (n,), generator=rng).tolist() for n in (150, 201, 230)]
    expected = hf_greedy_with_margins(path, prompts, MAX_NEW)
    cfg = EngineConfig(
        device="cuda",
        dtype="bfloat16",
        max_batch_size=1,
        full_batch_steps=1,
        eager_mode=eager,
        **VARIANTS["plain"],
    )
    got, _stats = run_engine(path, cfg, prompts, MAX_NEW)
    assert merged[0] > 0  # (graph replays do not call it: capture and eager steps do)
    check_parity(got, expected)
