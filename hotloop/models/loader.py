"""Building a turbo model from a Hugging Face folder: config, streamed safetensors, dummy weights.

Also ``model_config_from_path``, which reads the same config into the engine's ``ModelConfig``
(shared by both backends, so it does not require the architecture to be in the turbo zoo).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import nn

from hotloop.config import DTYPE_ALIASES, DTYPES, ModelConfig
from hotloop.layers.linear import shard_key
from hotloop.layers.norm import RMSNorm
from hotloop.models.registry import get_model_class
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

LOAD_FORMATS = ("auto", "dummy")
# Architectures whose transformers config class is remote code: config.json is read as plain attributes.
REMOTE_CODE_MODEL_TYPES = {"internlm2"}
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DUMMY_STD = 0.02


class MissingWeightsError(ValueError):
    """The checkpoint lacks tensors that the model needs; the message lists them."""


class RawConfig(SimpleNamespace):
    """A ``config.json`` read as attributes (for configs whose transformers class is remote code)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def get_text_config(self) -> RawConfig:
        return self


def _read_json(path: Path) -> dict[str, Any]:
    with path.open() as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def load_hf_config(model_path: str | Path) -> Any:
    """The model's Hugging Face config (``AutoConfig``, never remote code; ``RawConfig`` as fallback)."""
    path = Path(model_path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"model_path={str(path)!r} has no config.json")
    raw = _read_json(config_file)
    if raw.get("model_type") in REMOTE_CODE_MODEL_TYPES:
        return RawConfig(**raw)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, KeyError) as e:
        logger.info("transformers cannot build the config of %s (%s); reading config.json as is", path, e)
        return RawConfig(**raw)


def architecture_of(hf_config: Any) -> str:
    archs = getattr(hf_config, "architectures", None)
    if not archs:
        raise ValueError("config.json has no 'architectures' entry; cannot pick a model class")
    return str(archs[0])


def load_model(
    model_path: str | Path,
    dtype: torch.dtype,
    device: torch.device | str,
    load_format: str = "auto",
) -> nn.Module:
    """Build the turbo model for the folder's architecture and load its weights, in eval mode.

    ``load_format='dummy'`` needs only config.json: weights are drawn from N(0, 0.02) (norm
    weights are ones). Raises ``UnsupportedModelError`` for an architecture outside the zoo and
    ``MissingWeightsError`` when the checkpoint lacks a tensor the model needs.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format={load_format!r} must be one of {LOAD_FORMATS}")
    path = Path(model_path)
    hf_config = load_hf_config(path)
    cls = get_model_class(architecture_of(hf_config))
    device = torch.device(device)
    with torch.device(device):
        model = cls(hf_config, dtype)
    if load_format == "dummy":
        init_dummy_weights(model)
    else:
        loaded = cast(Any, model).load_weights(iter_safetensors(safetensors_files(path)))
        missing = missing_weights(model, loaded)
        if missing:
            shown = "\n  ".join(missing[:20]) + ("\n  ..." if len(missing) > 20 else "")
            raise MissingWeightsError(
                f"{path}: {len(missing)} parameter(s) not found in the checkpoint:\n  {shown}"
            )
    return model.eval()


def safetensors_files(path: Path) -> list[Path]:
    """The shards named by ``model.safetensors.index.json``, else every ``*.safetensors`` in the folder."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(_read_json(index)["weight_map"].values()))
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path} (load_format='dummy' needs none)")
    return files


def iter_safetensors(files: Iterable[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream ``(name, tensor)`` one tensor at a time (CPU), file by file."""
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def missing_weights(model: nn.Module, loaded: set[str]) -> list[str]:
    """Parameters (or shards of fused ones, ``name[shard]``) that ``load_weights`` did not fill."""
    missing: list[str] = []
    for name, param in model.named_parameters():
        if name in loaded:
            continue
        shards = getattr(param, "shard_ids", ())
        keys = [shard_key(name, s) for s in shards] if shards else [name]
        missing.extend(k for k in keys if k not in loaded)
    return missing


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights for benchmarks and tests without a checkpoint (deterministic for ``seed``)."""
    norm_weights = {id(m.weight) for m in model.modules() if isinstance(m, RMSNorm)}
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for param in model.parameters():
        if id(param) in norm_weights:
            param.fill_(1.0)
        elif param.is_floating_point():
            param.normal_(0.0, DUMMY_STD, generator=gen)


def resolve_dtype(dtype_str: str, hf_config: Any) -> str:
    """'auto' -> the config's ``dtype``/``torch_dtype`` (float32 when it names none); aliases accepted."""
    name = DTYPE_ALIASES.get(dtype_str, dtype_str)
    if name not in DTYPES:
        raise ValueError(f"dtype={dtype_str!r} is not one of {DTYPES}")
    if name != "auto":
        return name
    value = getattr(hf_config, "dtype", None) or vars(hf_config).get("torch_dtype")
    if value is None:
        return "float32"
    text = str(value).removeprefix("torch.")
    text = DTYPE_ALIASES.get(text, text)
    if text not in TORCH_DTYPES:
        raise ValueError(f"the model config's dtype {value!r} is not one of {tuple(TORCH_DTYPES)}")
    return text


def _token_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def eos_token_ids(model_path: str | Path, hf_config: Any) -> tuple[int, ...]:
    """EOS ids of generation_config.json, then of the model config, without repeats."""
    ids: list[int] = []
    gen_file = Path(model_path) / "generation_config.json"
    if gen_file.is_file():
        ids += _token_ids(_read_json(gen_file).get("eos_token_id"))
    text_config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    ids += _token_ids(getattr(hf_config, "eos_token_id", None) or getattr(text_config, "eos_token_id", None))
    return tuple(dict.fromkeys(ids))


def model_config_from_path(model_path: str | Path, dtype_str: str = "auto") -> ModelConfig:
    """Read a Hugging Face folder into ``ModelConfig`` (dtype names as in ``hotloop.config.DTYPES``)."""
    hf_config = load_hf_config(model_path)
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    num_heads = int(text.num_attention_heads)
    return ModelConfig(
        path=str(model_path),
        architecture=architecture_of(hf_config),
        hf_config=hf_config,
        num_layers=int(text.num_hidden_layers),
        num_kv_heads=int(getattr(text, "num_key_value_heads", None) or num_heads),
        head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // num_heads),
        vocab_size=int(text.vocab_size),
        max_position_embeddings=int(getattr(text, "max_position_embeddings", None) or 2048),
        dtype=resolve_dtype(dtype_str, hf_config),
        eos_token_ids=eos_token_ids(model_path, hf_config),
    )
