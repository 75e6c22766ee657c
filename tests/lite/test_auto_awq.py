"""``hotloop lite auto_awq`` end to end on tiny random models, and serving AutoAWQ checkpoints."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from awq_reference import dequantize, pack, rtn
from safetensors.torch import load_file, save_file

from hotloop.layers.attention import AttentionMetadata
from hotloop.lite import AWQOptions, auto_awq, calibrate
from hotloop.models.loader import load_model

TINY_CALIB = dict(calib_samples=4, calib_seqlen=32, batch_size=2, clip_tokens=64, device="cpu")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _logits(model: Any, ids: list[int]) -> torch.Tensor:
    """Full-prompt logits ``[T, vocab]`` through hotloop's own model on a scratch paged cache."""
    args = model.args
    T = len(ids)
    p = next(model.parameters())
    shape = (1, T, args.num_kv_heads, args.head_dim)
    caches = [
        (
            torch.zeros(shape, dtype=p.dtype, device=p.device),
            torch.zeros(shape, dtype=p.dtype, device=p.device),
        )
        for _ in range(args.num_layers)
    ]
    meta = AttentionMetadata(
        torch.arange(T, device=p.device), torch.zeros(1, 1, dtype=torch.int32, device=p.device), [T], [T]
    )
    with torch.no_grad():
        h = model(torch.tensor(ids, device=p.device), torch.arange(T, device=p.device), caches, meta)
        return model.compute_logits(h).float().cpu()


IDS = [5, 17, 42, 99, 3, 250, 7, 64, 128, 31, 77, 300]


def test_tiny_mha_awq_search_end_to_end(make_tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    src = make_tiny_model("llama_mha_odd")  # hidden 48, MHA: v_proj -> o_proj is scaled too
    out = auto_awq(str(src), tmp_path / "awq", AWQOptions(w_group_size=16, search_scale=True, **TINY_CALIB))
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 16,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    tensors = load_file(str(out / "model.safetensors"))
    for name in LINEARS:
        base = (
            f"model.layers.0.{'mlp' if name in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{name}"
        )
        assert tensors[base + ".qweight"].dtype == torch.int32
        assert tensors[base + ".scales"].dtype == torch.float16
        assert base + ".weight" not in tensors
    assert tensors["model.layers.0.self_attn.q_proj.qweight"].shape == (48, 48 // 8)
    assert tensors["model.layers.0.mlp.down_proj.qzeros"].shape == (128 // 16, 48 // 8)
    search = json.loads((out / "awq_search.json").read_text())["groups"]
    assert any("v_proj -> o_proj" in g["group"] for g in search)

    fp = load_model(src, torch.float32, "cpu")
    q = load_model(out, torch.float32, "cpu")
    a, b = _logits(fp, IDS), _logits(q, IDS)
    cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)
    assert cos > 0.95  # random weights: int4 g16 noise, not a quality claim (see test_default_model_awq)


def test_group_size_must_divide_every_layer(make_tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    src = make_tiny_model("llama_gqa_llama3rope")  # hidden 64, intermediate 128
    with pytest.raises(
        ValueError, match=r"--w-group-size 128 does not divide in_features=64.*use --w-group-size 64"
    ):
        auto_awq(str(src), tmp_path / "x", AWQOptions(method="rtn", w_group_size=128))


def test_calibrate_saves_channel_stats(make_tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    src = make_tiny_model("qwen3_qknorm")
    file = calibrate(str(src), tmp_path / "stats", AWQOptions(**TINY_CALIB))
    stats = torch.load(file)["stats"]
    assert set(stats) == {
        f"model.layers.{i}.{m}"
        for i in range(2)
        for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
    }
    s = stats["model.layers.1.mlp.down_proj"]
    assert s["absmean"].shape == (128,) and bool((s["absmax"] >= s["absmean"]).all())


def _relay_internlm2(state: dict[str, torch.Tensor], heads: int, kv: int, d: int) -> dict[str, torch.Tensor]:
    """A Llama state dict in InternLM2's layout (wqkv packed per KV-head group, renamed)."""
    g = heads // kv
    renames = {
        "model.embed_tokens.": "model.tok_embeddings.",
        ".self_attn.o_proj.": ".attention.wo.",
        ".mlp.gate_proj.": ".feed_forward.w1.",
        ".mlp.up_proj.": ".feed_forward.w3.",
        ".mlp.down_proj.": ".feed_forward.w2.",
        ".input_layernorm.": ".attention_norm.",
        ".post_attention_layernorm.": ".ffn_norm.",
    }
    out = {}
    for name, t in state.items():
        if ".k_proj." in name or ".v_proj." in name:
            continue
        if ".q_proj." in name:
            k, v = state[name.replace("q_proj", "k_proj")], state[name.replace("q_proj", "v_proj")]
            rest = t.shape[1:]
            parts = [t.reshape(kv, g, d, *rest), k.reshape(kv, 1, d, *rest), v.reshape(kv, 1, d, *rest)]
            out[name.replace(".self_attn.q_proj.", ".attention.wqkv.")] = torch.cat(parts, 1).reshape(
                -1, *rest
            )
            continue
        for old, new in renames.items():
            name = name.replace(old, new)
        out["output.weight" if name == "lm_head.weight" else name] = t.contiguous()
    return out


def test_internlm2_packed_wqkv_quantizes_like_llama(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    heads, kv, d, hidden = 4, 2, 16, 64
    cfg = LlamaConfig(
        vocab_size=384, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv, attention_bias=True,
        max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(7)
    hf = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.08)
    llama_dir, ilm_dir = tmp_path / "llama", tmp_path / "internlm2"
    hf.save_pretrained(str(llama_dir))
    ilm_dir.mkdir()
    save_file(_relay_internlm2(dict(hf.state_dict()), heads, kv, d), str(ilm_dir / "model.safetensors"))
    (ilm_dir / "config.json").write_text(json.dumps({
        "architectures": ["InternLM2ForCausalLM"], "model_type": "internlm2", "vocab_size": 384,
        "hidden_size": hidden, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": heads, "num_key_value_heads": kv, "hidden_act": "silu",
        "max_position_embeddings": 256, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": 10000.0,
        "bias": True, "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2,
    }))  # fmt: skip
    for folder in (llama_dir, ilm_dir):
        for f in tiny_tokenizer_dir.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
    opts = AWQOptions(w_group_size=32, **TINY_CALIB)
    q_llama = auto_awq(str(llama_dir), tmp_path / "q_llama", opts)
    q_ilm = auto_awq(str(ilm_dir), tmp_path / "q_ilm", opts)
    tensors = load_file(str(q_ilm / "model.safetensors"))
    assert tensors["model.layers.0.attention.wqkv.qweight"].shape == (hidden, (heads + 2 * kv) * d // 8)
    assert tensors["model.layers.0.attention.wqkv.bias"].shape == ((heads + 2 * kv) * d,)
    a = _logits(load_model(q_llama, torch.float32, "cpu"), IDS)
    b = _logits(load_model(q_ilm, torch.float32, "cpu"), IDS)
    torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


def test_serves_an_autoawq_checkpoint_made_elsewhere(
    make_tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """A checkpoint packed by the tests' own reference (as AutoAWQ would) loads and matches
    transformers running the same dequantized weights."""
    from transformers import AutoModelForCausalLM

    src = make_tiny_model("qwen2_bias")
    hf = AutoModelForCausalLM.from_pretrained(str(src), torch_dtype=torch.float32)
    group = 32
    state: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, t in hf.state_dict().items():
            module = name.rsplit(".", 1)[0]
            if name.endswith(".weight") and module.rsplit(".", 1)[-1] in LINEARS:
                q, z, s = rtn(t, group)
                state[module + ".qweight"] = torch.from_numpy(pack(q))
                state[module + ".qzeros"] = torch.from_numpy(pack(z))
                state[module + ".scales"] = torch.from_numpy(s)
                t.copy_(dequantize(q, z, s, group).t())  # transformers runs the dequantized weights
            elif name != "lm_head.weight":  # tied
                state[name] = t.half()
                t.copy_(t.half().float())
    out = tmp_path / "external"
    out.mkdir()
    save_file(state, str(out / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group,
                                     "zero_point": True, "version": "GEMM"}  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    model = load_model(out, torch.float32, "cpu")
    assert type(model.model.layers[0].self_attn.qkv_proj.quant_method).__name__ == "AWQLinearMethod"
    with torch.no_grad():
        want = hf(torch.tensor([IDS])).logits[0]
    np.testing.assert_allclose(_logits(model, IDS).numpy(), want.numpy(), rtol=1e-3, atol=1e-3)


def test_awq_format_errors(make_tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    src = make_tiny_model("llama_gqa_llama3rope")
    with pytest.raises(ValueError, match="needs config.json to carry an AWQ quantization_config"):
        load_model(src, torch.float32, "cpu", model_format="awq")
    out = tmp_path / "gemv"
    out.mkdir()
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemv"}
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="only bits=4, version='gemm'"):
        load_model(out, torch.float32, "cpu")
    # random int4 weights for speed work: --model-format awq --load-format dummy
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}
    (out / "config.json").write_text(json.dumps(config))
    dummy = load_model(out, torch.float32, "cpu", load_format="dummy", model_format="awq")
    assert _logits(dummy, IDS[:4]).isfinite().all()


@pytest.mark.gpu
def test_quantize_and_serve_on_gpu(make_tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    """Calibration on CUDA, then the checkpoint served by the Triton W4A16 kernels matches the CPU
    (dequantized) path."""
    src = make_tiny_model("llama_gqa_llama3rope")
    opts = AWQOptions(w_group_size=32, search_scale=True, **{**TINY_CALIB, "device": "cuda"})
    out = auto_awq(str(src), tmp_path / "awq", opts)
    cpu = _logits(load_model(out, torch.float32, "cpu"), IDS)
    gpu_model = load_model(out, torch.float16, "cuda")
    assert gpu_model.model.layers[0].mlp.down_proj.qweight.is_cuda  # packed, not dequantized
    gpu = _logits(gpu_model, IDS)
    torch.testing.assert_close(gpu, cpu, rtol=2e-2, atol=2e-2)
