"""An AutoAWQ checkpoint's quantization settings and the W4A16 layers built for them.

``awq_config_of`` reads a model's ``quantization_config`` (config.json, or AutoAWQ's own
``quant_config.json`` beside it) into an ``AWQConfig``, refusing what the W4A16 kernels cannot run
by field name; ``use_awq_linears`` swaps a built model's linear layers to the W4A16 method, keeping
``modules_to_not_convert`` dense. The loader (``models/loader.py``) calls both before it streams
the weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from hotloop.layers.linear import AWQLinearMethod, Linear, set_quant_method


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object (a model folder's config files); ``ValueError`` else."""
    try:
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): replace the file"
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}): fix or re-download it"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


@dataclass(frozen=True, slots=True)
class AWQConfig:
    """The part of an AutoAWQ ``quantization_config`` that serving needs."""

    group_size: int
    modules_to_not_convert: tuple[str, ...] = ()


# AutoAWQ's own file, written beside config.json by versions before transformers read AWQ configs
AUTOAWQ_CONFIG_FILE = "quant_config.json"
AWQ_SUPPORTED = "only bits=4, version='gemm', zero_point=true is supported (AutoAWQ's GEMM layout)"


def quantization_config_of(
    hf_config: Any, model_path: str | Path | None = None
) -> tuple[dict[str, Any], str]:
    """The checkpoint's quantization settings and where they were read (empty when it has none):
    config.json's ``quantization_config``, else AutoAWQ's ``quant_config.json`` (AWQ by definition)."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is not None and not isinstance(qc, dict):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else dict(vars(qc))
    if qc:
        return dict(qc), "config.json quantization_config"
    file = Path(model_path) / AUTOAWQ_CONFIG_FILE if model_path is not None else None
    if file is not None and file.is_file():
        return {"quant_method": "awq", **read_json_object(file)}, AUTOAWQ_CONFIG_FILE
    return {}, "config.json"


def awq_config_of(
    hf_config: Any, model_format: str | None, dummy: bool = False, model_path: str | Path | None = None
) -> AWQConfig | None:
    """The checkpoint's AWQ settings, or None for an unquantized model.

    Reads AutoAWQ's key names (``w_bit``, ``q_group_size``) as well as transformers' (``bits``,
    ``group_size``); with ``model_path``, a folder whose config.json has no quantization_config may
    carry AutoAWQ's ``quant_config.json``. ``model_format='awq'`` insists on AWQ (random weights with
    ``dummy`` may omit the config: group 128); any other format refuses a quantization_config.
    Anything but 4-bit zero-point GEMM raises ``ValueError`` naming the field.
    """
    qc, source = quantization_config_of(hf_config, model_path)
    method = str(qc.get("quant_method") or "").lower()
    if model_format not in (None, "awq") and method:
        raise ValueError(f"model_format={model_format!r}, but {source} declares quant_method={method!r}")
    if method and method != "awq":
        raise ValueError(f"{source} quant_method={method!r} is not supported (only 'awq')")
    if not method:
        if model_format != "awq":
            return None
        if not dummy:
            raise ValueError(
                "model_format='awq' needs config.json to carry an AWQ quantization_config "
                f"(or AutoAWQ's {AUTOAWQ_CONFIG_FILE} beside it)"
            )
        return AWQConfig(group_size=128)
    bits = qc.get("bits", qc.get("w_bit", 4))
    version = str(qc.get("version") or "gemm").lower()
    zero_point = qc.get("zero_point", True)
    found = {"bits": bits, "version": version, "zero_point": zero_point}
    for key, wanted in (("bits", 4), ("version", "gemm"), ("zero_point", True)):
        if found[key] != wanted:
            raise ValueError(f"{source} {key}={found[key]!r} is not supported: {AWQ_SUPPORTED}")
    group = qc.get("group_size", qc.get("q_group_size", 128))
    if isinstance(group, bool) or not isinstance(group, int) or group <= 0 or group % 16:
        raise ValueError(
            f"{source} group_size={group!r} is not supported: it must be a positive multiple of 16 "
            "(AutoAWQ's 64 or 128; per-channel -1 is not supported)"
        )
    skip = qc.get("modules_to_not_convert") or ()
    return AWQConfig(
        group_size=group, modules_to_not_convert=(skip,) if isinstance(skip, str) else tuple(skip)
    )


def use_awq_linears(model: nn.Module, awq: AWQConfig) -> None:
    """Swap every linear layer (except ``modules_to_not_convert``) to the W4A16 AWQ method.

    Keys match by substring of a layer's name, as in transformers and AutoAWQ, under hotloop's
    names and a fused layer's checkpoint members (``q_proj`` of ``qkv_proj``). A fused layer is one
    matmul, so the keys must keep all of its members unquantized or none.
    """
    keys = set(awq.modules_to_not_convert)
    canonical = getattr(model, "canonical_name", None)  # a VLM: transformers' names -> ours
    if canonical is not None:
        keys |= {canonical(k) for k in keys}
    mapping = _packed_modules_mapping(model)
    for name, module in model.named_modules():
        if not isinstance(module, Linear):
            continue
        whole = any(k in name for k in keys)
        members = [name[: -len(fused)] + part for part, fused in mapping if name.endswith("." + fused)]
        kept = [m for m in members if whole or any(k in m for k in keys)]
        if kept and len(kept) < len(members):
            rest = [m for m in members if m not in kept]
            raise ValueError(
                f"quantization_config modules_to_not_convert keeps {kept} unquantized but not {rest}: "
                f"hotloop runs them as one fused layer ({name}), so list all of them or none"
            )
        if whole or kept:
            continue
        try:
            set_quant_method(module, AWQLinearMethod(awq.group_size))
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None


def _packed_modules_mapping(model: nn.Module) -> list[tuple[str, str]]:
    """(checkpoint part, fused layer) pairs of the model and the decoders inside it (a VLM's)."""
    pairs: dict[tuple[str, str], None] = {}
    for module in model.modules():
        for part, (fused, _shard) in getattr(module, "packed_modules_mapping", {}).items():
            pairs[(part, fused)] = None
    return list(pairs)
