"""GGUF -> Hugging Face folder conversion: hotloop reads GGUF itself, once.

This module owns turning one ``.gguf`` file (llama.cpp's format) into a plain Hugging Face layout
folder (``config.json``, ``generation_config.json``, ``model.safetensors``, tokenizer files and a
``hotloop_convert.json`` marker) so that both backends only ever load HF folders.

Choices worth knowing:

- Weights are dequantized with the ``gguf`` package and stored as **float32** safetensors. GGUF
  weights are 4-8 bit approximations; float32 keeps the dequantized values exact (bfloat16 would
  round them a second time) and the default model is small (135M parameters, ~0.5 GB). A loader
  can still cast to bf16/fp16 when it puts the weights on a device.
- llama.cpp permutes the rows of q/k projections of the ``llama`` architecture into its own
  (interleaved) rotary layout; we undo that so the folder matches the original HF checkpoint.
- Gemma GGUFs store RMSNorm weights with the ``+1`` of Gemma's ``(1 + w)`` folded in; we take it
  back out.
- The tokenizer is rebuilt by transformers' own GGUF tokenizer support and saved next to the
  weights, with the chat template taken from the GGUF.
- The folder is written into a temporary sibling and renamed into place, so a crash never leaves
  a half-written folder behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

#: Bump when the folder layout or tensor handling changes: cached folders with another version are redone.
FORMAT_VERSION = 1
MARKER_NAME = "hotloop_convert.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass(frozen=True)
class ArchSpec:
    """How one GGUF ``general.architecture`` maps onto a transformers model class."""

    hf_architecture: str
    model_type: str
    permute_qk: bool = False  # llama.cpp interleaved q/k rows for rotary (llama family only)
    norm_offset: float = 0.0  # added to every *norm.weight (Gemma folds +1 into the GGUF)
    ffn_norm_name: str = "post_attention_layernorm"  # HF name of GGUF's blk.N.ffn_norm


SUPPORTED_ARCHITECTURES: dict[str, ArchSpec] = {
    # Mistral and Mixtral-free Mistral-style models are written by llama.cpp as "llama" too.
    "llama": ArchSpec("LlamaForCausalLM", "llama", permute_qk=True),
    "qwen2": ArchSpec("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ArchSpec("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ArchSpec(
        "Gemma3ForCausalLM", "gemma3_text", norm_offset=-1.0, ffn_norm_name="pre_feedforward_layernorm"
    ),
}

# GGUF per-block tensor stem -> HF module path inside ``model.layers.N``. ``ffn_norm`` is per-arch.
_BLOCK_NAMES: dict[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP_NAMES: dict[str, str] = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Tensors llama.cpp adds that have no HF counterpart (they are recomputed from the config).
_SKIPPED = {"rope_freqs.weight"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z0-9_]+)\.(weight|bias)$")
_TOP_RE = re.compile(r"^([a-z0-9_]+)\.(weight|bias)$")

# Tokens that end a turn in common chat formats; like llama.cpp we stop on any of them that the
# vocabulary holds as a control token, so generation stops on <|im_end|> *and* <|endoftext|>.
_END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
)
_CONTROL_TOKEN_TYPE = 3  # gguf.TokenType.CONTROL


class GGUFConversionError(ValueError):
    """The GGUF file cannot be turned into a Hugging Face folder (unknown arch, odd tensors, ...)."""


# ---------------------------------------------------------------------------------------------
# metadata
# ---------------------------------------------------------------------------------------------


class _Meta:
    """Typed access to a GGUF file's key/value metadata."""

    def __init__(self, reader: Any) -> None:
        self._fields = reader.fields
        self.arch: str = str(self.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        if field is None:
            return default
        value = field.contents()
        return default if value is None else value

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """``{arch}.{suffix}``, e.g. ``llama.block_count``."""
        return self.get(f"{self.arch}.{suffix}", default)

    def require(self, suffix: str) -> Any:
        value = self.arch_get(suffix)
        if value is None:
            raise GGUFConversionError(f"GGUF metadata lacks '{self.arch}.{suffix}'")
        return value


def arch_spec(arch: str) -> ArchSpec:
    """The spec for a GGUF architecture name, or a clear error listing what is supported."""
    spec = SUPPORTED_ARCHITECTURES.get(arch)
    if spec is None:
        raise GGUFConversionError(
            f"GGUF architecture '{arch or '<missing general.architecture>'}' is not supported by hotloop's "
            f"converter; supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    return spec


def _rope_scaling(meta: _Meta) -> dict[str, Any] | None:
    kind = meta.arch_get("rope.scaling.type")
    factor = meta.arch_get("rope.scaling.factor")
    if kind in (None, "none") or not factor:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        scaling: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
        original = meta.arch_get("rope.scaling.original_context_length")
        if original:
            scaling["original_max_position_embeddings"] = int(original)
        return scaling
    raise GGUFConversionError(f"GGUF rope scaling type '{kind}' is not supported")


def build_hf_config(meta: _Meta, spec: ArchSpec, tensor_names: set[str], vocab_size: int) -> dict[str, Any]:
    """The ``config.json`` dict for a GGUF file, from its metadata and which tensors it has."""
    hidden = int(meta.require("embedding_length"))
    heads = int(meta.require("attention.head_count"))
    head_dim = int(meta.arch_get("attention.key_length", hidden // heads))
    rope_dims = meta.arch_get("rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != head_dim:
        # HF Llama/Qwen rotate the whole head; a partial rotary GGUF would convert silently wrong.
        raise GGUFConversionError(
            f"partial rotary (rope dims {rope_dims} != head_dim {head_dim}) is not supported"
        )
    eos = meta.get("tokenizer.ggml.eos_token_id")
    config: dict[str, Any] = {
        "architectures": [spec.hf_architecture],
        "model_type": spec.model_type,
        "hidden_size": hidden,
        "intermediate_size": int(meta.require("feed_forward_length")),
        "num_hidden_layers": int(meta.require("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.arch_get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(meta.arch_get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta.arch_get("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(meta),
        "max_position_embeddings": int(meta.arch_get("context_length", 4096)),
        "vocab_size": vocab_size,
        # No separate output projection in the file means the embedding doubles as the LM head.
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": None if eos is None else int(eos),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
    }
    has_q_bias = "blk.0.attn_q.bias" in tensor_names
    if spec.model_type == "llama":
        config.update(attention_bias=has_q_bias, mlp_bias="blk.0.ffn_up.bias" in tensor_names)
    elif spec.model_type == "qwen2":
        config.update(
            use_sliding_window=False, sliding_window=None, max_window_layers=config["num_hidden_layers"]
        )
    elif spec.model_type == "qwen3":
        config.update(
            attention_bias=has_q_bias,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=config["num_hidden_layers"],
        )
    elif spec.model_type == "gemma3_text":
        config.update(_gemma3_extras(meta, config))
    return config


def _gemma3_extras(meta: _Meta, config: dict[str, Any]) -> dict[str, Any]:
    layers = config["num_hidden_layers"]
    # Gemma 3 alternates 5 sliding-window layers with 1 global layer; llama.cpp hard-codes the same.
    pattern = 6
    # llama.cpp scales queries by 1/sqrt(hidden/heads) for the 62-layer 27B and by 1/sqrt(head_dim)
    # for every other size; HF expresses that as query_pre_attn_scalar.
    scalar = config["hidden_size"] // config["num_attention_heads"] if layers == 62 else config["head_dim"]
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": int(meta.arch_get("attention.sliding_window", 4096)),
        "layer_types": [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)
        ],
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": scalar,
        "final_logit_softcapping": meta.arch_get("final_logit_softcapping"),
        "attn_logit_softcapping": meta.arch_get("attn_logit_softcapping"),
        "attention_bias": False,
    }


def eos_token_ids(meta: _Meta) -> list[int]:
    """Every token id that should end generation: the GGUF's eos/eot/eom plus known end-of-turn tokens."""
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = meta.get(key)
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    tokens = meta.get("tokenizer.ggml.tokens") or []
    types = meta.get("tokenizer.ggml.token_type") or []
    wanted = set(_END_OF_TURN_TOKENS)
    for token_id, token in enumerate(tokens):
        # Only control tokens: a plain-text "</s>" in some vocab must not stop generation.
        is_control = token_id < len(types) and int(types[token_id]) == _CONTROL_TOKEN_TYPE
        if token in wanted and is_control and token_id not in ids:
            ids.append(token_id)
    return ids


# ---------------------------------------------------------------------------------------------
# tensors
# ---------------------------------------------------------------------------------------------


def hf_tensor_name(gguf_name: str, spec: ArchSpec) -> str | None:
    """The HF state-dict key for a GGUF tensor name; None for tensors HF has no use for."""
    if gguf_name in _SKIPPED:
        return None
    match = _BLOCK_RE.match(gguf_name)
    if match:
        layer, stem, kind = match.groups()
        module = spec.ffn_norm_name if stem == "ffn_norm" else _BLOCK_NAMES.get(stem)
        if module is not None:
            return f"model.layers.{layer}.{module}.{kind}"
    match = _TOP_RE.match(gguf_name)
    if match and match.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[match.group(1)]}.{match.group(2)}"
    raise GGUFConversionError(
        f"GGUF tensor '{gguf_name}' has no Hugging Face counterpart for this architecture"
    )


def undo_rope_permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation.

    HF Llama's rotary pairs dimension ``i`` of a head with ``i + head_dim/2`` (rotate_half); llama.cpp
    pairs adjacent dimensions ``2i, 2i+1``. Its converter therefore reorders the rows of each head from
    ``[x_0 .. x_{d/2-1}, y_0 .. y_{d/2-1}]`` to ``[x_0, y_0, x_1, y_1, ...]``. Undoing it: view each head's
    rows as ``(d/2, 2)`` and transpose to ``(2, d/2)``. Works for weights (rows, in) and biases (rows,).
    """
    rows = weight.shape[0]
    if rows % (2 * n_heads):
        raise GGUFConversionError(f"cannot un-permute {rows} rows into {n_heads} heads")
    half = rows // n_heads // 2
    per_head = weight.reshape(n_heads, half, 2, *weight.shape[1:])
    return np.ascontiguousarray(per_head.swapaxes(1, 2).reshape(weight.shape))


def _dequantize(tensor: Any) -> np.ndarray:
    """A GGUF tensor as float32 in torch order (out_features, in_features)."""
    import gguf

    # The reader already exposes data with numpy (= torch) axis order, the reverse of ggml's ne[];
    # dequantize expands the last (byte) axis of quantized blocks back into elements.
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    expected = tuple(int(n) for n in reversed(tensor.shape))
    values = np.asarray(values, dtype=np.float32).reshape(expected)
    # F32 tensors come straight from the read-only memory map; torch wants writable arrays.
    return values if values.flags.writeable else values.copy()


def iter_hf_tensors(
    reader: Any, spec: ArchSpec, config: dict[str, Any], progress: bool = False
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hf_name, float32 array)`` for every tensor of the GGUF file, in file order."""
    from tqdm.auto import tqdm

    for tensor in tqdm(reader.tensors, desc="converting GGUF", unit="tensor", disable=not progress):
        name = hf_tensor_name(tensor.name, spec)
        if name is None:
            logger.debug("skipping GGUF tensor %s (no HF counterpart)", tensor.name)
            continue
        values = _dequantize(tensor)
        if spec.permute_qk and ".self_attn.q_proj." in name:
            values = undo_rope_permute(values, config["num_attention_heads"])
        elif spec.permute_qk and ".self_attn.k_proj." in name:
            values = undo_rope_permute(values, config["num_key_value_heads"])
        if spec.norm_offset and name.endswith("norm.weight"):
            values = values + np.float32(spec.norm_offset)
        yield name, values


# ---------------------------------------------------------------------------------------------
# writing the folder
# ---------------------------------------------------------------------------------------------


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _write_weights(reader: Any, spec: ArchSpec, config: dict[str, Any], folder: Path, progress: bool) -> None:
    import torch
    from safetensors.torch import save_file

    state = {
        name: torch.from_numpy(values) for name, values in iter_hf_tensors(reader, spec, config, progress)
    }
    if config["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})


def _write_tokenizer(gguf_path: Path, folder: Path, meta: _Meta) -> None:
    """Rebuild the tokenizer with transformers' GGUF support and save it with the GGUF's chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    template = meta.get("tokenizer.chat_template")
    if template and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = template
    eos = meta.get("tokenizer.ggml.eos_token_id")
    if eos is not None and tokenizer.eos_token_id != int(eos):
        # Trust the GGUF: it is what llama.cpp stops on.
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(int(eos))
    tokenizer.save_pretrained(str(folder))


def _generation_config(meta: _Meta, config: dict[str, Any]) -> dict[str, Any]:
    eos = eos_token_ids(meta)
    data: dict[str, Any] = {"_from_model_config": False}
    if config.get("bos_token_id") is not None:
        data["bos_token_id"] = config["bos_token_id"]
    if eos:
        data["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if config.get("pad_token_id") is not None:
        data["pad_token_id"] = config["pad_token_id"]
    return data


def source_fingerprint(gguf_path: Path) -> dict[str, Any]:
    """What identifies a GGUF file for caching: absolute path, size and mtime."""
    stat = gguf_path.stat()
    return {
        "source": str(gguf_path.resolve()),
        "source_size": stat.st_size,
        "source_mtime_ns": stat.st_mtime_ns,
    }


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The conversion marker of a folder, or None if it is missing or unreadable."""
    try:
        data = json.loads((folder / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _apply_umask(folder: Path) -> None:
    """mkdtemp makes a 0700 folder and safetensors a 0600 file; give them what mkdir/open would."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)


def _install(tmp: Path, out_dir: Path) -> None:
    """Move the finished temp folder to ``out_dir``, replacing an older conversion there."""
    if out_dir.exists():
        if read_marker(out_dir) is None and any(out_dir.iterdir()):
            raise GGUFConversionError(
                f"{out_dir} exists and is not a hotloop conversion; refusing to replace it"
            )
        # A directory cannot be renamed over a non-empty one: move the old one aside first.
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.replace(out_dir, old / "x")
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)


def convert_gguf(gguf_path: str | Path, out_dir: Path, progress: bool = True) -> Path:
    """Convert one GGUF file into a Hugging Face layout folder at ``out_dir`` and return ``out_dir``.

    Writes ``config.json``, ``generation_config.json`` (all EOS ids), ``model.safetensors`` (float32:
    exact dequantized values, see the module docstring), the tokenizer files (with the GGUF's chat
    template) and ``hotloop_convert.json`` (source path, size, mtime, format version). The folder
    appears atomically: everything is written into a temporary sibling that is renamed at the end.
    An existing conversion at ``out_dir`` is replaced; any other non-empty folder there is an error.
    """
    import gguf

    gguf_path = Path(gguf_path).expanduser()
    out_dir = Path(out_dir).expanduser()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    started = time.perf_counter()
    reader = gguf.GGUFReader(str(gguf_path))
    meta = _Meta(reader)
    spec = arch_spec(meta.arch)
    tensor_names = {t.name for t in reader.tensors}
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise GGUFConversionError(f"{gguf_path} has no token_embd.weight tensor")
    config = build_hf_config(meta, spec, tensor_names, vocab_size=int(embed.shape[-1]))
    logger.info(
        "converting %s (%s, %d tensors) into %s", gguf_path.name, meta.arch, len(reader.tensors), out_dir
    )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", _generation_config(meta, config))
        _write_weights(reader, spec, config, tmp, progress)
        _write_tokenizer(gguf_path, tmp, meta)
        # The marker goes last: a folder with a marker is a complete one.
        marker = {
            "format_version": FORMAT_VERSION,
            **source_fingerprint(gguf_path),
            "architecture": meta.arch,
            "hf_architecture": spec.hf_architecture,
            "created": time.time(),
        }
        _write_json(tmp / MARKER_NAME, marker)
        _apply_umask(tmp)
        _install(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("converted %s in %.1fs", gguf_path.name, time.perf_counter() - started)
    return out_dir
