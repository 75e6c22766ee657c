"""Registry and loader: unsupported architectures, missing weights, dummy weights, ModelConfig."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from hotloop.config import ModelConfig
from hotloop.layers.attention import AttentionMetadata
from hotloop.models.loader import MissingWeightsError, load_model, model_config_from_path
from hotloop.models.registry import SUPPORTED_ARCHITECTURES, UnsupportedModelError, get_model_class

TINY: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _save(config: Any, path: Path) -> None:
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)


def test_registry_lists_the_zoo() -> None:
    assert set(SUPPORTED_ARCHITECTURES) == {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "InternLM2ForCausalLM",
        "LlavaForConditionalGeneration",
        "LlavaNextForConditionalGeneration",
        "InternVLForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
    }
    for arch in SUPPORTED_ARCHITECTURES:
        assert get_model_class(arch).__name__ == arch


def test_unknown_architecture_names_supported_ones(tmp_path: Path) -> None:
    with pytest.raises(
        UnsupportedModelError, match="'GPT2LMHeadModel'.*LlamaForCausalLM.*InternLM2ForCausalLM"
    ):
        get_model_class("GPT2LMHeadModel")
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["FancyNewForCausalLM"], "model_type": "fancy_new", "hidden_size": 8})
    )
    with pytest.raises(ValueError, match="FancyNewForCausalLM.*supported: LlamaForCausalLM"):
        load_model(tmp_path, torch.float32, "cpu")


def test_missing_weight_is_listed(tmp_path: Path) -> None:
    _save(LlamaConfig(**TINY), tmp_path)
    file = tmp_path / "model.safetensors"
    state = load_file(str(file))
    del state["model.layers.1.self_attn.k_proj.weight"]
    del state["model.norm.weight"]
    save_file(state, str(file))
    with pytest.raises(MissingWeightsError) as err:
        load_model(tmp_path, torch.float32, "cpu")
    msg = str(err.value)
    assert "2 parameter(s)" in msg
    assert "model.layers.1.self_attn.qkv_proj.weight[k]" in msg and "model.norm.weight" in msg
    assert "qkv_proj.weight[q]" not in msg


def test_wrong_shape_names_the_tensor(tmp_path: Path) -> None:
    _save(LlamaConfig(**TINY), tmp_path)
    file = tmp_path / "model.safetensors"
    state = load_file(str(file))
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(state, str(file))
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.up_proj.weight'.*shard 1"):
        load_model(tmp_path, torch.float32, "cpu")


def test_dummy_weights_need_no_files(tmp_path: Path) -> None:
    LlamaConfig(**TINY, architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, torch.bfloat16, "cpu", load_format="dummy")
    assert not model.training
    assert model.model.norm.weight.eq(1).all()
    w = model.model.layers[0].self_attn.qkv_proj.weight
    assert w.dtype == torch.bfloat16 and 0.01 < w.float().std() < 0.03
    kv = [(torch.zeros(4, 4, 2, 8, dtype=torch.bfloat16), torch.zeros(4, 4, 2, 8, dtype=torch.bfloat16))] * 2
    meta = AttentionMetadata(torch.arange(3), torch.tensor([[0]], dtype=torch.int32), [3], [3])
    with torch.inference_mode():
        hidden = model(torch.tensor([1, 2, 3]), torch.arange(3), kv, meta)
    assert hidden.shape == (3, 32) and torch.isfinite(model.compute_logits(hidden)).all()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(tmp_path, torch.float32, "cpu")
    with pytest.raises(ValueError, match="load_format"):
        load_model(tmp_path, torch.float32, "cpu", load_format="pt")


def test_model_config_from_path(tmp_path: Path) -> None:
    Qwen2Config(**TINY, architectures=["Qwen2ForCausalLM"], dtype="bfloat16", eos_token_id=7).save_pretrained(
        tmp_path
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 7]}))
    mc = model_config_from_path(tmp_path, "auto")
    assert isinstance(mc, ModelConfig)
    assert (mc.architecture, mc.num_layers, mc.num_kv_heads, mc.head_dim) == ("Qwen2ForCausalLM", 2, 2, 8)
    assert (mc.vocab_size, mc.max_position_embeddings, mc.dtype) == (128, 64, "bfloat16")
    assert mc.eos_token_ids == (9, 7)
    assert model_config_from_path(tmp_path, "fp32").dtype == "float32"
    with pytest.raises(ValueError, match="dtype='int8'"):
        model_config_from_path(tmp_path, "int8")


def test_internlm2_config_is_read_without_remote_code(tmp_path: Path) -> None:
    config = {
        "architectures": ["InternLM2ForCausalLM"],
        "model_type": "internlm2",
        "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config"},
        "vocab_size": 100,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "max_position_embeddings": 256,
        "rope_theta": 1e6,
        "rope_scaling": {"type": "dynamic", "factor": 2.0},
        "bias": False,
        "torch_dtype": "float16",
        "eos_token_id": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 92542]}))
    mc = model_config_from_path(tmp_path)
    assert (mc.architecture, mc.num_layers, mc.num_kv_heads, mc.head_dim, mc.dtype) == (
        "InternLM2ForCausalLM",
        3,
        1,
        8,
        "float16",
    )
    assert mc.eos_token_ids == (2, 92542)
    model: Any = load_model(tmp_path, torch.float32, "cpu", load_format="dummy")
    assert model.model.rotary_emb.cfg.rope_type == "dynamic" and model.model.rotary_emb.cfg.theta == 1e6


def test_embeddings_on_host_is_a_no_op_on_the_cpu(tmp_path: Path) -> None:
    LlamaConfig(**TINY, architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    model: Any = load_model(tmp_path, torch.float32, "cpu", load_format="dummy", embeddings_on_host=True)
    assert model.model.embed_tokens.weight.device.type == "cpu"
    assert not model.model.embed_tokens.weight.is_pinned()  # nothing moved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("tied", [False, True])
def test_embeddings_on_host_same_outputs_on_the_gpu(tmp_path: Path, tied: bool) -> None:
    from hotloop.models.loader import weight_bytes

    LlamaConfig(**TINY, architectures=["LlamaForCausalLM"], tie_word_embeddings=tied).save_pretrained(
        tmp_path
    )
    models: list[Any] = [
        load_model(tmp_path, torch.bfloat16, "cuda", load_format="dummy", embeddings_on_host=host)
        for host in (False, True)
    ]
    emb = models[1].model.embed_tokens.weight
    assert (emb.device.type == "cuda") == tied  # a weight the LM head shares stays on the GPU
    table = TINY["vocab_size"] * TINY["hidden_size"] * 2
    assert weight_bytes(models[0], "cuda") - weight_bytes(models[1], "cuda") == (0 if tied else table)
    outs = []
    for model in models:
        kv = [
            tuple(torch.zeros(4, 4, 2, 8, dtype=torch.bfloat16, device="cuda") for _ in "kv")
            for _ in range(2)
        ]
        meta = AttentionMetadata(
            torch.arange(3, device="cuda"), torch.tensor([[0]], dtype=torch.int32, device="cuda"), [3], [3]
        )
        with torch.inference_mode():
            outs.append(
                model.compute_logits(
                    model(torch.tensor([1, 2, 127], device="cuda"), torch.arange(3, device="cuda"), kv, meta)
                )
            )
    assert torch.equal(outs[0], outs[1])
