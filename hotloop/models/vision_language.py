"""What every vision-language model here shares: a vision part plus one of our decoders.

Subclasses build their vision part (``vision_tower`` and ``multi_modal_projector``; Qwen2-VL's
``visual``) and define ``encode_images``; this base owns ``language_model`` (a Llama-family decoder),
the runner's contract (``forward`` with ``inputs_embeds``, ``compute_logits``, ``embed_input_ids``)
and weight loading: checkpoint names are canonicalised (``canonical_name``), text tensors go to the
decoder's own loader, the rest are copied.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import torch
from torch import nn

from hotloop.layers.attention import AttentionMetadata
from hotloop.models.llama import KVCache, LlamaForCausalLM
from hotloop.models.registry import get_model_class

# text_config.model_type -> the architecture that serves it
TEXT_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def text_model_class(text_config: Any) -> type[LlamaForCausalLM]:
    model_type = str(getattr(text_config, "model_type", "llama"))
    arch = TEXT_ARCHITECTURES.get(model_type)
    if arch is None:
        raise ValueError(
            f"a {model_type!r} language model is not supported in a vision-language model; "
            f"supported: {sorted(TEXT_ARCHITECTURES)}"
        )
    return cast(type[LlamaForCausalLM], get_model_class(arch))


def canonical_name(name: str) -> str:
    """transformers' layouts -> ours: ``vision_tower.*``, ``multi_modal_projector.*``,
    ``language_model.model.*``, ``language_model.lm_head.*``."""
    if name.startswith("model."):  # transformers >= 4.52: model.{vision_tower,language_model,...}
        name = name[len("model.") :]
        if name.startswith("language_model.") and not name.startswith("language_model.model."):
            name = "language_model.model." + name[len("language_model.") :]
    if name.startswith("lm_head."):
        name = "language_model." + name
    return name


class VisionLanguageModel(nn.Module, abc.ABC):
    language_model: LlamaForCausalLM

    def __init__(self, hf_config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = hf_config
        self.image_token_id = int(hf_config.image_token_id)
        self.language_model = self.build_language_model(hf_config.text_config, dtype)

    def build_language_model(self, text_config: Any, dtype: torch.dtype) -> LlamaForCausalLM:
        """The decoder for ``text_config``: the text zoo's class for its ``model_type`` (Qwen2-VL
        overrides this for its M-RoPE decoder)."""
        return text_model_class(text_config)(text_config, dtype)

    # -- the runner's contract -------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.language_model.model(input_ids, positions, kv_caches, meta, inputs_embeds=inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        return self.language_model.compute_logits(hidden, float32)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.model.embed_tokens(input_ids)

    @abc.abstractmethod
    def encode_images(self, pixel_values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each image's pixels -> its ``[num_image_tokens, hidden]`` embeddings."""
        raise NotImplementedError

    # -- weights -----------------------------------------------------------------------------------
    def canonical_name(self, name: str) -> str:
        return canonical_name(name)

    def skips_weight(self, name: str) -> bool:
        """Checkpoint tensors this model does not use (e.g. vision layers past the feature layer)."""
        return name.endswith("position_ids")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Streams the checkpoint: text tensors go on to the decoder's loader one at a time."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        saw_head = False

        def text_weights() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal saw_head
            for ckpt_name, tensor in weights:
                name = self.canonical_name(ckpt_name)
                if name.startswith("language_model."):
                    saw_head |= name == "language_model.lm_head.weight"
                    yield name[len("language_model.") :], tensor
                elif not self.skips_weight(name):
                    self._load_vision_weight(params, ckpt_name, name, tensor)
                    loaded.add(name)

        loaded |= {"language_model." + k for k in self.language_model.load_weights(text_weights())}
        head = self.language_model.lm_head
        if not head.tied and not saw_head and self._ties_embeddings():
            # transformers 5 ties through the top-level config and then saves no LM head
            head.weight.data.copy_(self.language_model.model.embed_tokens.weight.data)
            loaded.add("language_model.lm_head.weight")
        return loaded

    def _load_vision_weight(
        self, params: dict[str, nn.Parameter], ckpt_name: str, name: str, tensor: torch.Tensor
    ) -> None:
        param = params.get(name)
        if param is None:
            raise ValueError(f"checkpoint tensor {ckpt_name!r} matches no {type(self).__name__} parameter")
        if param.shape != tensor.shape:
            raise ValueError(
                f"checkpoint tensor {ckpt_name!r} has shape {tuple(tensor.shape)}, "
                f"parameter {name!r} has {tuple(param.shape)}"
            )
        param.data.copy_(tensor)

    def _ties_embeddings(self) -> bool:
        return bool(getattr(self.config, "tie_word_embeddings", False)) or bool(
            getattr(self.config.text_config, "tie_word_embeddings", False)
        )
