"""Which turbo model class serves which Hugging Face architecture; classes are imported on first use."""

from __future__ import annotations

import importlib

from torch import nn

# architectures[0] in config.json -> (module, class)
_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("hotloop.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("hotloop.models.llama", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("hotloop.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("hotloop.models.qwen3", "Qwen3ForCausalLM"),
    "InternLM2ForCausalLM": ("hotloop.models.internlm2", "InternLM2ForCausalLM"),
    "LlavaForConditionalGeneration": ("hotloop.models.llava", "LlavaForConditionalGeneration"),
    "LlavaNextForConditionalGeneration": ("hotloop.models.llava_next", "LlavaNextForConditionalGeneration"),
    "InternVLForConditionalGeneration": ("hotloop.models.internvl", "InternVLForConditionalGeneration"),
    "Qwen2VLForConditionalGeneration": ("hotloop.models.qwen2_vl", "Qwen2VLForConditionalGeneration"),
    "Qwen2_5_VLForConditionalGeneration": ("hotloop.models.qwen2_vl", "Qwen2_5_VLForConditionalGeneration"),
}

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_MODELS)


class UnsupportedModelError(ValueError):
    """The architecture is not in the turbo model zoo (the only backend built so far)."""


def is_supported(architecture: str) -> bool:
    return architecture in _MODELS


def get_model_class(architecture: str) -> type[nn.Module]:
    """The class for ``architecture`` (``config.architectures[0]``), or ``UnsupportedModelError``."""
    entry = _MODELS.get(architecture)
    if entry is None:
        raise UnsupportedModelError(
            f"architecture {architecture!r} is not supported by the turbo backend; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)} (the pytorch backend, for any transformers "
            "model, is not built yet)"
        )
    module, name = entry
    cls: type[nn.Module] = getattr(importlib.import_module(module), name)
    return cls


def resolve_architecture(architecture: str) -> type[nn.Module]:
    """Same as ``get_model_class``; the name ``hotloop.api.build`` uses to check support up front."""
    return get_model_class(architecture)
