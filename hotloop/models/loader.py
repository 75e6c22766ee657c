"""Building a turbo model from a Hugging Face folder: config, streamed safetensors, dummy weights.

Also ``model_config_from_path``, which reads the same config into the engine's ``ModelConfig``
(shared by both backends, so it does not require the architecture to be in the turbo zoo).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import nn

from hotloop.config import DTYPE_ALIASES, DTYPES, ModelConfig
from hotloop.kernels.w4a16_layout import pack_int4, unpack_int4
from hotloop.layers.embedding import LMHead, VocabEmbedding
from hotloop.layers.linear import Linear, shard_key
from hotloop.layers.norm import RMSNorm
from hotloop.models.awq_config import AWQConfig, awq_config_of, read_json_object, use_awq_linears
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


def load_hf_config(model_path: str | Path) -> Any:
    """The model's Hugging Face config (``AutoConfig``, never remote code; ``RawConfig`` as fallback)."""
    path = Path(model_path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"model_path={str(path)!r} has no config.json")
    raw = read_json_object(config_file)
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
    model_format: str | None = None,
    embeddings_on_host: bool = False,
) -> nn.Module:
    """Build the turbo model for the folder's architecture and load its weights, in eval mode.

    ``load_format='dummy'`` needs only config.json: weights are drawn from N(0, 0.02) (norm
    weights are ones). An AutoAWQ checkpoint (``quantization_config.quant_method == 'awq'``, or
    ``model_format='awq'``) gets W4A16 linear layers. Raises ``UnsupportedModelError`` for an
    architecture outside the zoo and ``MissingWeightsError`` when the checkpoint lacks a tensor the
    model needs. ``embeddings_on_host`` keeps the token-embedding table in pinned host memory on a
    GPU (``layers/embedding.py``), unless the LM head shares it.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format={load_format!r} must be one of {LOAD_FORMATS}")
    path = Path(model_path)
    hf_config = load_hf_config(path)
    awq = awq_config_of(hf_config, model_format, dummy=load_format == "dummy", model_path=path)
    cls = get_model_class(architecture_of(hf_config))
    device = torch.device(device)
    with torch.device(device):
        model = cls(hf_config, dtype)
        if awq is not None:
            use_awq_linears(model, awq)
    if awq is not None and device.type == "cuda":
        torch.cuda.empty_cache()  # give back the dense weights the swap dropped
    if load_format == "dummy":
        init_dummy_weights(model)
    else:
        weights = iter_safetensors(safetensors_files(path))
        if awq is not None and _remaps_rows(model):
            weights = _awq_rows_round_trip(model, weights)
        loaded = cast(Any, model).load_weights(weights)
        missing = missing_weights(model, loaded)
        if missing:
            shown = "\n  ".join(missing[:20]) + ("\n  ..." if len(missing) > 20 else "")
            raise MissingWeightsError(
                f"{path}: {len(missing)} parameter(s) not found in the checkpoint:\n  {shown}"
                + _awq_hint(model, path, missing, awq)
            )
    for module in model.modules():
        finish = getattr(getattr(module, "quant_method", None), "process_weights_after_loading", None)
        if finish is not None:
            finish(module)
    if awq is not None and device.type == "cuda":
        torch.cuda.empty_cache()  # (HOTLOOP_W4A16_KERNEL=cutlass: the conversion's temporaries)
    kind = str(dtype).removeprefix("torch.")
    if awq is not None:
        kind = f"W4A16 AWQ g{awq.group_size}" + (", dequantized to " + kind if device.type == "cpu" else "")
    if embeddings_on_host:
        offload_embeddings(model, device)
    logger.info("weights take %s on %s (%s)", format_bytes(weight_bytes(model, device)), device, kind)
    host = weight_bytes(model) - weight_bytes(model, device)
    if host:
        logger.info("and %s in pinned host memory (--embeddings-on-host)", format_bytes(host))
    return model.eval()


def offload_embeddings(model: nn.Module, device: torch.device) -> None:
    """Move every token-embedding table that the LM head does not share into pinned host memory
    (a no-op off the GPU, where weights are in host memory already)."""
    if device.type != "cuda":
        logger.info(
            "--embeddings-on-host: the model is on %s; its weights are in host memory already", device
        )
        return
    head_weights = {id(m.weight) for m in model.modules() if isinstance(m, LMHead)}
    for name, module in model.named_modules():
        if not isinstance(module, VocabEmbedding):
            continue
        if id(module.weight) in head_weights:
            logger.warning("--embeddings-on-host: %s stays on the GPU: the LM head shares its weight", name)
            continue
        size = module.weight.numel() * module.weight.element_size()
        module.offload_to_host()
        logger.info(
            "%s (%s) is in pinned host memory; the GPU reads only looked-up rows", name, format_bytes(size)
        )
    torch.cuda.empty_cache()


def _awq_hint(model: nn.Module, path: Path, missing: list[str], awq: AWQConfig | None) -> str:
    """Why the checkpoint and the layers built for it disagree on AWQ, when that explains ``missing``."""
    linears = {name for name, m in model.named_modules() if isinstance(m, Linear)}
    leaves = {
        leaf for module, _, leaf in (m.split("[")[0].rpartition(".") for m in missing) if module in linears
    }
    if awq is None and "weight" in leaves and _holds_awq_tensors(path):
        return (
            "\nthe checkpoint holds AWQ tensors (*.qweight) but no quantization_config: add AutoAWQ's "
            "(quant_method 'awq', bits 4, group_size, zero_point true, version 'gemm') to config.json"
        )
    if awq is not None and "qweight" in leaves:
        return (
            "\nif the checkpoint stores these layers unquantized (*.weight), list them in "
            "quantization_config modules_to_not_convert"
        )
    if awq is not None and "weight" in leaves:
        return (
            "\nif the checkpoint quantizes these layers (*.qweight), take them out of "
            "quantization_config modules_to_not_convert"
        )
    return ""


def _holds_awq_tensors(path: Path) -> bool:
    from safetensors import safe_open

    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            if any(name.endswith(".qweight") for name in f.keys()):
                return True
    return False


def _remaps_rows(model: nn.Module) -> bool:
    """Whether the model rewrites checkpoint tensors (InternLM2's packed wqkv), not just renames."""
    from hotloop.models.llama import LlamaForCausalLM

    remap = getattr(type(model), "remap_weights", None)  # a VLM has none: its decoders only rename
    return remap is not None and remap is not LlamaForCausalLM.remap_weights


def _awq_rows_round_trip(
    model: nn.Module, weights: Iterator[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Run AWQ tensors through the model's row-wise remap: unpack to ``[out, ...]`` rows, remap,
    pack back into the AutoAWQ layout the layers load."""

    def to_rows(items: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in items:
            suffix = name.rsplit(".", 1)[-1]
            if suffix in ("qweight", "qzeros"):
                t = unpack_int4(t).t()
            elif suffix == "scales":
                t = t.t()
            yield name, t

    for name, t in cast(Any, model).remap_weights(to_rows(weights)):
        suffix = name.rsplit(".", 1)[-1]
        if suffix in ("qweight", "qzeros"):
            t = pack_int4(t.t().contiguous())
        elif suffix == "scales":
            t = t.t().contiguous()
        yield name, t


def weight_bytes(model: nn.Module, device: torch.device | str | None = None) -> int:
    """Bytes held by the model's parameters (a tied weight counted once); with ``device``, only
    those on that device type (host-resident embeddings are not on the GPU)."""
    kind = None if device is None else torch.device(device).type
    return sum(p.numel() * p.element_size() for p in model.parameters() if kind in (None, p.device.type))


def format_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def safetensors_files(path: Path) -> list[Path]:
    """The shards named by ``model.safetensors.index.json``, else every ``*.safetensors`` in the folder."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(read_json_object(index)["weight_map"].values()))
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
        elif param.dtype == torch.int32:  # packed int4 words (AWQ): any bits are valid
            param.random_(generator=gen)
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
        ids += _token_ids(read_json_object(gen_file).get("eos_token_id"))
    text_config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    ids += _token_ids(getattr(hf_config, "eos_token_id", None) or getattr(text_config, "eos_token_id", None))
    return tuple(dict.fromkeys(ids))


def model_config_from_path(model_path: str | Path, dtype_str: str = "auto") -> ModelConfig:
    """Read a Hugging Face folder into ``ModelConfig`` (dtype names as in ``hotloop.config.DTYPES``)."""
    hf_config = load_hf_config(model_path)
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    if getattr(text, "num_attention_heads", None) is None:
        from hotloop.models.registry import resolve_architecture

        # a model without attention heads (a Mamba): an architecture we do not serve says so
        resolve_architecture(architecture_of(hf_config))
        raise ValueError(f"{model_path}: config.json has no num_attention_heads")
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
