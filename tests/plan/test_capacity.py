"""Capacity planner: the brief's worked example, KV bytes from the architecture, and agreement with
the engine's own block sizing."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hotloop.cli import plan as plan_cli
from hotloop.config import ModelConfig
from hotloop.executor.kv_cache import block_bytes
from hotloop.plan.capacity import GIB, PlanInput, kv_bytes_per_token, plan, sweep, weight_bytes
from hotloop.plan.presets import PRESETS, load_shape


def test_brief_worked_example_table() -> None:
    """The brief: ~16 / ~30 / ~60 / ~120 concurrent 32k requests on an 80 GB GPU."""
    shape = PRESETS["brief-20b"]
    assert kv_bytes_per_token(shape, 16) == 64 * 1024
    assert 19.5e9 < shape.num_params < 20.5e9
    base = PlanInput(gpu_mem_gib=80, session_len=32768)
    rows = {(p.inputs.weight_format, p.inputs.kv_bits): p for p in sweep(shape, base)}
    assert 36 < rows["bf16", 16].weight_bytes / GIB < 40
    assert 10 < rows["awq", 16].weight_bytes / GIB < 12
    assert rows["bf16", 16].max_sequences in range(15, 19)
    assert rows["awq", 16].max_sequences in range(28, 32)
    assert rows["awq", 8].max_sequences in range(56, 62)
    cached = plan(shape, PlanInput(weight_format="awq", kv_bits=8, prefix_hit_rate=0.5))
    assert cached.max_sequences in range(110, 125)


def test_kv_bytes_per_token_formula() -> None:
    s = PRESETS["llama-3-8b"]
    assert kv_bytes_per_token(s, 16) == 32 * 8 * 128 * 2 * 2
    assert kv_bytes_per_token(s, 8) == 2 * 32 * 8 * (128 + 4)
    assert kv_bytes_per_token(s, 4) == 2 * 32 * 8 * (64 + 4)
    assert kv_bytes_per_token(s, 16, tp=2) * 2 == kv_bytes_per_token(s, 16)
    three = PRESETS["smollm2-135m"]  # 3 KV heads: one per rank at tp 3, a copy of one at tp 6
    assert kv_bytes_per_token(three, 16, tp=3) == kv_bytes_per_token(three, 16, tp=6) == 2 * 30 * 1 * 64 * 2
    for tp in (2, 4):  # a rank cannot hold a part of a head
        with pytest.raises(ValueError, match=f"tp={tp} \\(--tp\\) must divide the model's 3 KV heads"):
            kv_bytes_per_token(three, 16, tp=tp)
    with pytest.raises(ValueError, match="tp=3 .* 8 KV heads"):  # the review's case: 8 heads, tp 3
        kv_bytes_per_token(s, 16, tp=3)
    odd = dataclasses.replace(s, head_dim=12)
    assert kv_bytes_per_token(odd, 16) == 2 * 32 * 8 * 12 * 2
    with pytest.raises(ValueError, match="--kv-bits 4: quant_policy=4 needs head_dim to be a multiple of 8"):
        kv_bytes_per_token(odd, 4)
    assert weight_bytes(s, "awq") < weight_bytes(s, "bf16") / 2.5


def test_prefix_sharing_and_limits() -> None:
    s = PRESETS["llama-3-8b"]
    cold = plan(s, PlanInput(session_len=4096))
    warm = plan(s, PlanInput(session_len=4096, prefix_hit_rate=0.75))
    assert warm.shared_blocks == 48 and warm.blocks_per_sequence == 16
    assert warm.max_sequences == (warm.num_blocks - 48) // 16 > 3 * cold.max_sequences
    tiny = plan(s, PlanInput(gpu_mem_gib=16, session_len=4096))
    assert tiny.max_sequences == 0  # the weights do not leave room for one sequence
    with pytest.raises(ValueError, match="kv_bits"):
        PlanInput(kv_bits=2)
    for field, flag in (("session_len", "--session-len"), ("block_size", "--block-size"), ("tp", "--tp"),
                        ("gpus_per_node", "--gpus-per-node")):  # fmt: skip
        with pytest.raises(ValueError, match=f"{field}=0 \\({flag}\\) must be >= 1"):
            PlanInput(**{field: 0})
    with pytest.raises(ValueError, match="--prefix-hit-rate"):
        PlanInput(prefix_hit_rate=1.5)
    with pytest.raises(ValueError, match="--mem-util"):
        PlanInput(mem_util=0.0)


def test_planner_blocks_use_the_engines_block_bytes(tmp_path: Path) -> None:
    cfg = dict(
        architectures=["Qwen3ForCausalLM"],
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_hidden_layers=3,
        intermediate_size=128,
        vocab_size=384,
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = load_shape(str(tmp_path))
    mc = ModelConfig(str(tmp_path), "Qwen3ForCausalLM", None, 3, 2, 32, 384, 256, "bfloat16")
    for bits, policy in ((16, 0), (8, 8), (4, 4)):
        assert kv_bytes_per_token(shape, bits) * 64 == block_bytes(mc, 64, torch.bfloat16, policy)


def test_cli_sweep_json_and_target(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    plan_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["plan", "internlm2.5-20b", "--sweep", "--session-len", "16384", "--target", "200", "--json"]
    )
    assert args.func(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 6 and rows[0]["kv_bytes_per_token"] == 196608
    args = parser.parse_args(["plan", "llama-3-70b", "--session-len", "16384", "--target", "200"])
    assert args.func(args) == 3  # bf16 weights and fp16 KV: 200 do not fit on one node
    assert "no" in capsys.readouterr().out
    with pytest.raises(ValueError, match="neither a preset"):
        load_shape("no-such-model")


def test_engine_rule_takes_the_fraction_of_memory_free_after_weights() -> None:
    shape = load_shape("llama3-8b")
    p = plan(shape, PlanInput(gpu_mem_gib=140.0, cache_max_entry_count=0.5, session_len=2048))
    free = 140.0 * GIB - p.weight_bytes
    assert p.kv_budget_bytes == int(free * 0.5)
    assert p.num_blocks == p.kv_budget_bytes // (p.kv_bytes_per_token * 64)
    with pytest.raises(ValueError, match="cache_max_entry_count"):
        PlanInput(cache_max_entry_count=1.5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_measure_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from hotloop.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["plan", "smollm2-135m", "--measure"])
    assert e.value.code == 1
    assert "starts the engine on a GPU" in capsys.readouterr().err


def test_embeddings_on_host_leave_the_untied_table_off_the_gpu() -> None:
    llama, smol = PRESETS["llama-3-8b"], PRESETS["smollm2-135m"]
    table = llama.vocab_size * llama.hidden_size * 2
    assert weight_bytes(llama, "awq") - weight_bytes(llama, "awq", embeddings_on_host=True) == table
    # the W4A16 8B shape: 5.73 GB of weights on the GPU, 4.68 GB with the table on the host
    assert 5.7e9 < weight_bytes(llama, "awq") < 5.8e9
    assert weight_bytes(llama, "awq", embeddings_on_host=True) < 5.5e9
    assert weight_bytes(smol, "bf16", embeddings_on_host=True) == weight_bytes(smol, "bf16")  # tied: stays
    base = PlanInput(weight_format="awq", session_len=4096)
    more = plan(llama, PlanInput(weight_format="awq", session_len=4096, embeddings_on_host=True))
    assert more.num_blocks > plan(llama, base).num_blocks


def test_session_len_past_the_models_positions_is_warned(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A --session-len beyond max_position_embeddings gets the engine's warning (presets and
    config.json alike); one within it gets none."""
    parser = argparse.ArgumentParser()
    plan_cli.add_parser(parser.add_subparsers(dest="command"))

    def run(*argv: str) -> str:
        args = parser.parse_args(["plan", *argv])
        assert args.func(args) == 0
        return capsys.readouterr().err

    err = run("llama3-8b", "--session-len", "16384")
    assert "--session-len 16384 exceeds llama-3-8b's max_position_embeddings=8192" in err
    assert "max_position_embeddings" not in run("llama3-8b", "--session-len", "8192")
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
           "vocab_size": 100, "max_position_embeddings": 512}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_shape(str(tmp_path)).max_positions == 512
    assert "max_position_embeddings=512" in run(str(tmp_path), "--session-len", "1024")
