"""AutoAWQ GEMM checkpoints made elsewhere: the quantization_config variants real ones carry load
and give the logits of their dequantized weights as plain weights; the rest are refused by name.

The checkpoints are written here from the documented layout, with nothing from ``hotloop``:
``qweight`` int32 ``[in, out / 8]``, ``qzeros`` int32 ``[in / g, out / 8]``, ``scales`` fp16
``[in / g, out]``; nibble ``i`` of a word (bits ``4i .. 4i+3``) holds column ``ORDER[i]`` of its eight.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from hotloop.layers.attention import AttentionMetadata
from hotloop.layers.linear import AWQLinearMethod, UnquantizedLinearMethod
from hotloop.models.loader import MissingWeightsError, load_model

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HIDDEN, INTER, LAYERS, VOCAB = 128, 256, 2, 256
CONFIG: dict[str, Any] = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=INTER,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    torch_dtype="float16",
)
GEMM = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm"}
IDS = [5, 17, 42, 99, 3, 250, 7, 64, 128, 31]


def pack(values: np.ndarray) -> np.ndarray:
    """Integers in [0, 15] ``[R, C]`` -> int32 words ``[R, C / 8]``."""
    v = values.astype(np.uint32).reshape(values.shape[0], -1, 8)
    word = np.zeros(v.shape[:2], dtype=np.uint32)
    for nibble, column in enumerate(ORDER):
        word |= v[:, :, column] << np.uint32(4 * nibble)
    return word.view(np.int32)


def awq_tensors(
    rng: np.random.Generator, out_features: int, in_features: int, group: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Random AutoAWQ tensors of one layer and their dequantized weight ``[out, in]`` (float32,
    exact: a 4-bit difference times an fp16 scale)."""
    q = rng.integers(0, 16, (in_features, out_features))
    z = rng.integers(0, 16, (in_features // group, out_features))
    s = rng.uniform(0.002, 0.02, (in_features // group, out_features)).astype(np.float16)
    w = (q - np.repeat(z, group, axis=0)) * np.repeat(s.astype(np.float64), group, axis=0)
    tensors = {
        "qweight": torch.from_numpy(pack(q)),
        "qzeros": torch.from_numpy(pack(z)),
        "scales": torch.from_numpy(s),
    }
    return tensors, torch.from_numpy(np.ascontiguousarray(w.T, dtype=np.float32))


def write_pair(
    root: Path,
    group: int,
    quant: dict[str, Any] | None,
    dense_modules: tuple[str, ...] = (),
    tied: bool = False,
    quant_config_json: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    """A tiny Llama as an AutoAWQ checkpoint (linears in ``dense_modules`` stored fp16) and the same
    model with the dequantized weights as a plain checkpoint. Embeddings, norms (and the LM head
    unless ``tied``) are fp16 in both."""
    rng = np.random.default_rng(group)
    shapes = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (64, HIDDEN), "v_proj": (64, HIDDEN)}
    shapes |= {"o_proj": (HIDDEN, HIDDEN), "gate_proj": (INTER, HIDDEN), "up_proj": (INTER, HIDDEN)}
    shapes["down_proj"] = (HIDDEN, INTER)
    gen = torch.Generator().manual_seed(group)
    awq: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    for name in ["model.embed_tokens.weight"] + ([] if tied else ["lm_head.weight"]):
        awq[name] = dense[name] = torch.randn(VOCAB, HIDDEN, generator=gen).half()
    norms = ["model.norm.weight"] + [
        f"model.layers.{i}.{norm}.weight"
        for i in range(LAYERS)
        for norm in ("input_layernorm", "post_attention_layernorm")
    ]
    for name in norms:
        awq[name] = dense[name] = (1 + 0.1 * torch.randn(HIDDEN, generator=gen)).half()
    for i in range(LAYERS):
        for proj, (n, k) in shapes.items():
            module = f"model.layers.{i}.{'mlp' if proj in LINEARS[4:] else 'self_attn'}.{proj}"
            if any(key in module for key in dense_modules):
                awq[module + ".weight"] = dense[module + ".weight"] = (
                    0.05 * torch.randn(n, k, generator=gen)
                ).half()
                continue
            tensors, w = awq_tensors(rng, n, k, group)
            awq.update({f"{module}.{leaf}": t for leaf, t in tensors.items()})
            dense[module + ".weight"] = w
    config = dict(CONFIG, tie_word_embeddings=tied)
    folders = []
    for kind, state, qc in (("awq", awq, quant), ("dense", dense, None)):
        folder = root / kind
        folder.mkdir(parents=True)
        save_file(state, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(config | ({"quantization_config": qc} if qc else {})))
        folders.append(folder)
    if quant_config_json is not None:
        (folders[0] / "quant_config.json").write_text(json.dumps(quant_config_json))
    return folders[0], folders[1]


def logits(model: Any, args: Any, ids: list[int] = IDS) -> torch.Tensor:
    """Full-prompt logits ``[T, vocab]`` through the model on a scratch paged cache."""
    T = len(ids)
    dtype = next(model.parameters()).dtype
    shape = (1, T, args.num_kv_heads, args.head_dim)
    caches = [
        (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(args.num_layers)
    ]
    meta = AttentionMetadata(torch.arange(T), torch.zeros(1, 1, dtype=torch.int32), [T], [T])
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(T), caches, meta))


def assert_same_logits(awq_dir: Path, dense_dir: Path, dtype: torch.dtype, **kw: Any) -> Any:
    model: Any = load_model(awq_dir, dtype, "cpu", **kw)
    reference: Any = load_model(dense_dir, dtype, "cpu")
    got, want = logits(model, model.args), logits(reference, reference.args)
    assert got.isfinite().all() and torch.equal(got, want)
    return model


def method_of(model: Any, layer: int, proj: str) -> type:
    part = "mlp" if proj in ("gate_up_proj", "down_proj") else "self_attn"
    return type(getattr(getattr(model.model.layers[layer], part), proj).quant_method)


@pytest.mark.parametrize(
    "quant,group,dtype,tied",
    [
        # transformers' key names, group 128, a bf16 model of an fp16 checkpoint (scales, embeddings, head)
        ({**GEMM, "group_size": 128}, 128, torch.bfloat16, False),
        # AutoAWQ's own key names and upper-case version, tied embeddings, the head named as kept
        (
            {
                "quant_method": "awq",
                "w_bit": 4,
                "q_group_size": 64,
                "zero_point": True,
                "version": "GEMM",
                "modules_to_not_convert": ["lm_head"],
            },
            64,
            torch.bfloat16,
            True,
        ),  # fmt: skip
        ({**GEMM, "modules_to_not_convert": None}, 64, torch.float32, False),
    ],
)
def test_checkpoint_gives_the_logits_of_its_dequantized_weights(
    tmp_path: Path, quant: dict[str, Any], group: int, dtype: torch.dtype, tied: bool
) -> None:
    awq_dir, dense_dir = write_pair(tmp_path, group, quant, tied=tied)
    model = assert_same_logits(awq_dir, dense_dir, dtype)
    assert method_of(model, 1, "gate_up_proj") is AWQLinearMethod
    assert model.lm_head.tied == tied


def test_modules_to_not_convert_keeps_a_layers_mlp_dense(tmp_path: Path) -> None:
    quant = {**GEMM, "modules_to_not_convert": ["model.layers.1.mlp"]}
    awq_dir, dense_dir = write_pair(tmp_path, 64, quant, dense_modules=("model.layers.1.mlp",))
    model = assert_same_logits(awq_dir, dense_dir, torch.bfloat16)
    assert method_of(model, 1, "gate_up_proj") is UnquantizedLinearMethod
    assert method_of(model, 1, "down_proj") is UnquantizedLinearMethod
    assert method_of(model, 0, "gate_up_proj") is AWQLinearMethod
    assert method_of(model, 1, "qkv_proj") is AWQLinearMethod


def test_autoawq_quant_config_json_beside_a_config_without_one(tmp_path: Path) -> None:
    """Older AutoAWQ wrote its settings only to quant_config.json (no quant_method in it)."""
    legacy = {"zero_point": True, "q_group_size": 64, "w_bit": 4, "version": "GEMM"}
    awq_dir, dense_dir = write_pair(tmp_path, 64, None, quant_config_json=legacy)
    assert_same_logits(awq_dir, dense_dir, torch.float32)
    assert_same_logits(awq_dir, dense_dir, torch.float32, model_format="awq")
    with pytest.raises(
        ValueError, match=r"model_format='hf', but quant_config.json declares quant_method='awq'"
    ):
        load_model(awq_dir, torch.float32, "cpu", model_format="hf")


def test_vision_language_checkpoint_quantizes_only_its_decoder(tmp_path: Path) -> None:
    """A LLaVA AutoAWQ checkpoint (fp16 vision tower and projector, one decoder MLP kept dense,
    named as transformers >= 4.52 names it) equals its dequantized twin."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=30,
        patch_size=6, projection_dim=32,
    )  # fmt: skip
    text = LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    hf = LlavaForConditionalGeneration(
        LlavaConfig(vision_config=vision, text_config=text, image_token_index=255)
    )
    hf.half().save_pretrained(tmp_path / "src")
    state = load_file(str(tmp_path / "src" / "model.safetensors"))
    rng = np.random.default_rng(0)
    awq, dense = dict(state), dict(state)
    for name, t in state.items():
        module = name.removesuffix(".weight")
        if (
            "language_model" not in name
            or module.rsplit(".", 1)[-1] not in LINEARS
            or "layers.1.mlp." in name
        ):
            continue
        tensors, dense[name] = awq_tensors(rng, t.shape[0], t.shape[1], 64)
        del awq[name]
        awq.update({f"{module}.{leaf}": q for leaf, q in tensors.items()})
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    keep = ["vision_tower", "multi_modal_projector", "model.language_model.layers.1.mlp"]
    for kind, tensors, qc in (("awq", awq, {**GEMM, "modules_to_not_convert": keep}), ("dense", dense, None)):
        folder = tmp_path / kind
        folder.mkdir()
        save_file(tensors, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(config | ({"quantization_config": qc} if qc else {})))
    models: list[Any] = [load_model(tmp_path / kind, torch.bfloat16, "cpu") for kind in ("awq", "dense")]
    decoder = models[0].language_model
    assert method_of(decoder, 0, "down_proj") is AWQLinearMethod
    assert method_of(decoder, 1, "gate_up_proj") is UnquantizedLinearMethod
    got, want = (logits(m, m.language_model.args) for m in models)
    assert got.isfinite().all() and torch.equal(got, want)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"version": "marlin"}, r"version='marlin' is not supported: only bits=4, version='gemm'"),
        ({"version": "exllama"}, r"version='exllama' is not supported"),
        ({"version": "GEMV"}, r"version='gemv' is not supported"),
        ({"zero_point": False}, r"zero_point=False is not supported: .*zero_point=true"),
        ({"bits": 8}, r"bits=8 is not supported: only bits=4"),
        ({"bits": None, "w_bit": 3}, r"bits=3 is not supported"),
        ({"group_size": -1}, r"group_size=-1 is not supported: it must be a positive multiple of 16"),
        ({"group_size": 96}, r"qkv_proj: AWQ group_size=96 does not divide in_features=128"),
        ({"quant_method": "gptq"}, r"quant_method='gptq' is not supported \(only 'awq'\)"),
        (
            {"modules_to_not_convert": ["layers.1.mlp.gate_proj"]},
            r"keeps \['model.layers.1.mlp.gate_proj'\] unquantized but not \['model.layers.1.mlp.up_proj'\]",
        ),
    ],
)
def test_unsupported_configs_are_refused_by_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    quant = {k: v for k, v in {**GEMM, **change}.items() if v is not None}
    awq_dir, _ = write_pair(tmp_path, 64, quant)
    with pytest.raises(ValueError, match=message) as err:
        load_model(awq_dir, torch.float32, "cpu")
    assert not isinstance(err.value, MissingWeightsError)


def test_format_mismatches_name_what_was_found(tmp_path: Path) -> None:
    awq_dir, _ = write_pair(tmp_path, 64, GEMM)
    with pytest.raises(ValueError, match=r"model_format='hf', but config.json quantization_config declares"):
        load_model(awq_dir, torch.float32, "cpu", model_format="hf")
    config = json.loads((awq_dir / "config.json").read_text())
    gptq = config | {"quantization_config": {**GEMM, "quant_method": "gptq"}}
    (awq_dir / "config.json").write_text(json.dumps(gptq))
    with pytest.raises(ValueError, match=r"quant_method='gptq' is not supported"):  # not random AWQ weights
        load_model(awq_dir, torch.float32, "cpu", model_format="awq", load_format="dummy")
    del config["quantization_config"]
    (awq_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        MissingWeightsError, match=r"holds AWQ tensors \(\*.qweight\) but no quantization_config"
    ):
        load_model(awq_dir, torch.float32, "cpu")


def test_tensors_that_disagree_with_the_config_are_named(tmp_path: Path) -> None:
    # a layer stored unquantized that modules_to_not_convert does not name
    awq_dir, _ = write_pair(tmp_path / "a", 64, GEMM, dense_modules=("layers.0.mlp.down_proj",))
    with pytest.raises(
        MissingWeightsError, match=r"(?s)down_proj.qweight.*list them in .*modules_to_not_convert"
    ):
        load_model(awq_dir, torch.float32, "cpu")
    # a missing qzeros is listed, alone
    awq_dir, _ = write_pair(tmp_path / "b", 64, GEMM)
    state = load_file(str(awq_dir / "model.safetensors"))
    del state["model.layers.1.self_attn.k_proj.qzeros"]
    save_file(state, str(awq_dir / "model.safetensors"))
    with pytest.raises(
        MissingWeightsError, match=r"1 parameter\(s\).*:\n  model.layers.1.self_attn.qkv_proj.qzeros\[k\]$"
    ):
        load_model(awq_dir, torch.float32, "cpu")
