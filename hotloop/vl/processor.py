"""Per-model multimodal processors: images -> pixel tensors, and placeholder tokens -> image tokens.

A prompt names where each image goes with the model's placeholder token (``<image>`` for LLaVA).
``VLProcessor.expand`` swaps each placeholder for the tokens the image's embeddings will fill, as
the model's transformers processor does, and returns one ``ImageInput`` per image.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hotloop.messages import RequestError
from hotloop.vl.clip_preprocess import ClipImageConfig, preprocess_clip
from hotloop.vl.image import DEFAULT_POLICY, ImageFetchPolicy, load_image
from hotloop.vl.inputs import ImageInput, pixel_hash
from hotloop.vl.internvl_preprocess import TileConfig, preprocess_tiles
from hotloop.vl.llava_next_preprocess import (
    IMAGE_SIZE_KEY,
    LlavaNextImageConfig,
    num_image_tokens,
    preprocess_llava_next,
)
from hotloop.vl.mrope import GRID_KEY
from hotloop.vl.qwen2_vl_preprocess import ImageShapeError, Qwen2VLImageConfig, preprocess_qwen2_vl


class VLProcessor(abc.ABC):
    """Base class: subclasses define ``preprocess`` and ``image_token_ids``."""

    name = "vl"

    def __init__(self, image_token_id: int, placeholder: str, marker: str | None = None) -> None:
        self.image_token_id = image_token_id
        self.placeholder = placeholder
        # The text that shows a prompt already places its images (the image token; the placeholder
        # may wrap it, as Qwen2-VL's <|vision_start|><|image_pad|><|vision_end|> does).
        self.marker = marker or placeholder

    @abc.abstractmethod
    def preprocess(self, image: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """A ``PIL.Image`` -> (pixel values, extra facts for the encoder)."""
        raise NotImplementedError

    @abc.abstractmethod
    def image_token_ids(self, pixel_values: torch.Tensor, extra: dict[str, Any]) -> tuple[list[int], int]:
        """The tokens that replace one placeholder, and the offset of the embedding span in them
        (the span runs to the end unless a subclass wraps it in start/end tokens)."""
        raise NotImplementedError

    def hash_salt(self, extra: dict[str, Any]) -> str:
        """What joins the pixels in an image's content hash: the processor's name, plus any fact
        outside the pixels that changes the embeddings (LLaVA-NeXT: the original image size)."""
        return self.name

    def expand(
        self,
        token_ids: Sequence[int],
        images: Sequence[Any],
        policy: ImageFetchPolicy = DEFAULT_POLICY,
        max_tokens: int | None = None,
    ) -> tuple[list[int], list[ImageInput]]:
        """Replace the i-th placeholder token with image i's tokens; load and preprocess the images.

        ``max_tokens`` (the most a request may hold): once the images expanded so far and the rest of
        the prompt pass it, the request is refused before the remaining images are fetched and
        decoded (a request of 2,000 images would otherwise load all of them first). A failing image
        is named by its index in the request."""
        slots = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        if len(slots) != len(images):
            raise RequestError(
                f"the prompt has {len(slots)} image placeholder(s) ({self.placeholder!r}) "
                f"but {len(images)} image(s) were given",
                param="images",
            )
        ids: list[int] = []
        inputs: list[ImageInput] = []
        prev = 0
        for slot, image in zip(slots, images, strict=True):
            ids.extend(token_ids[prev:slot])
            try:
                pixels, extra = self.preprocess(load_image(image, policy))
            except RequestError as e:
                raise type(e)(f"image {len(inputs)} of {len(images)}: {e}", e.param) from None
            tokens, span_start = self.image_token_ids(pixels, extra)
            span_len = sum(1 for t in tokens[span_start:] if t == self.image_token_id)
            inputs.append(
                ImageInput(
                    pixels, len(ids) + span_start, span_len, pixel_hash(pixels, self.hash_salt(extra)), extra
                )
            )
            ids.extend(tokens)
            prev = slot + 1
            if max_tokens is not None and len(ids) + len(token_ids) - prev >= max_tokens:
                raise RequestError(
                    f"the prompt reaches {len(ids) + len(token_ids) - prev} tokens with the first "
                    f"{len(inputs)} of its {len(images)} image(s), which leaves no room to generate within "
                    f"{max_tokens} tokens; send fewer or smaller images or a shorter prompt",
                    param="messages",
                )
        ids.extend(token_ids[prev:])
        return ids, inputs


class LlavaProcessor(VLProcessor):
    """LLaVA 1.5 (llava-hf): CLIP preprocessing, one token per kept vision feature."""

    name = "llava"

    def __init__(self, hf_config: Any, image_config: ClipImageConfig, placeholder: str) -> None:
        super().__init__(int(hf_config.image_token_id), placeholder)
        vc = hf_config.vision_config
        self.image_config = image_config
        side = int(vc.image_size) // int(vc.patch_size)
        keep_cls = getattr(hf_config, "vision_feature_select_strategy", "default") == "full"
        self.num_tokens = side * side + int(keep_cls)
        height, width = image_config.output_size
        if (height, width) != (int(vc.image_size), int(vc.image_size)):
            raise ValueError(
                f"the image processor makes {height}x{width} images but the vision tower takes "
                f"{vc.image_size}x{vc.image_size}"
            )

    def preprocess(self, image: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        return preprocess_clip(image, self.image_config), {}

    def image_token_ids(self, pixel_values: torch.Tensor, extra: dict[str, Any]) -> tuple[list[int], int]:
        return [self.image_token_id] * self.num_tokens, 0


class LlavaNextProcessor(VLProcessor):
    """LLaVA-NeXT / LLaVA-1.6 (llava-hf): "anyres" tiles (``hotloop/vl/llava_next_preprocess.py``);
    the token count depends on the image size (``extra["image_size"]``, which the encoder needs too)."""

    name = "llava_next"

    def __init__(self, hf_config: Any, image_config: LlavaNextImageConfig, placeholder: str) -> None:
        super().__init__(int(hf_config.image_token_id), placeholder)
        vc = hf_config.vision_config
        if getattr(hf_config, "vision_feature_select_strategy", "default") != "default":
            raise ValueError("LLaVA-NeXT supports only vision_feature_select_strategy='default'")
        tower = int(vc.image_size)
        if image_config.tile_size != tower or image_config.clip.output_size != (tower, tower):
            raise ValueError(
                f"the image processor makes {image_config.tile_size}-pixel tiles cropped to "
                f"{image_config.clip.output_size} but the vision tower takes {tower}x{tower}"
            )
        pinpoints = tuple((int(h), int(w)) for h, w in getattr(hf_config, "image_grid_pinpoints", None) or ())
        if pinpoints and pinpoints != image_config.grid_pinpoints:
            raise ValueError(
                f"the image processor's image_grid_pinpoints {[list(p) for p in image_config.grid_pinpoints]} "
                f"differ from the model's {[list(p) for p in pinpoints]}"
            )
        self.image_config = image_config
        self.side = tower // int(vc.patch_size)

    def preprocess(self, image: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        tiles, size = preprocess_llava_next(image, self.image_config)
        return tiles, {IMAGE_SIZE_KEY: size}

    def image_token_ids(self, pixel_values: torch.Tensor, extra: dict[str, Any]) -> tuple[list[int], int]:
        height, width = extra[IMAGE_SIZE_KEY]
        cfg = self.image_config
        n = num_image_tokens(height, width, cfg.grid_pinpoints, cfg.tile_size, self.side, self.side**2)
        return [self.image_token_id] * n, 0

    def hash_salt(self, extra: dict[str, Any]) -> str:
        height, width = extra[IMAGE_SIZE_KEY]
        return f"{self.name}:{height}x{width}"


class InternVLProcessor(VLProcessor):
    """InternVL: dynamic tiling; each image becomes ``<img>`` + context tokens for every tile + ``</img>``."""

    name = "internvl"

    def __init__(
        self, hf_config: Any, tile_config: TileConfig, placeholder: str, start_id: int, end_id: int
    ) -> None:
        super().__init__(int(hf_config.image_token_id), placeholder)
        vc = hf_config.vision_config
        size = vc.image_size if isinstance(vc.image_size, (list, tuple)) else [vc.image_size] * 2
        patch = vc.patch_size if isinstance(vc.patch_size, (list, tuple)) else [vc.patch_size] * 2
        if (tile_config.tile_height, tile_config.tile_width) != (int(size[0]), int(size[1])):
            raise ValueError(
                f"the image processor makes {tile_config.tile_height}x{tile_config.tile_width} tiles "
                f"but the vision tower takes {size[0]}x{size[1]}"
            )
        patches = (int(size[0]) // int(patch[0])) * (int(size[1]) // int(patch[1]))
        self.tokens_per_tile = round(patches * float(hf_config.downsample_ratio) ** 2)
        self.tile_config = tile_config
        self.start_id, self.end_id = start_id, end_id

    def preprocess(self, image: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        tiles = preprocess_tiles(image, self.tile_config)
        return tiles, {"num_tiles": int(tiles.shape[0])}

    def image_token_ids(self, pixel_values: torch.Tensor, extra: dict[str, Any]) -> tuple[list[int], int]:
        n = self.tokens_per_tile * int(pixel_values.shape[0])
        return [self.start_id] + [self.image_token_id] * n + [self.end_id], 1


class Qwen2VLProcessor(VLProcessor):
    """Qwen2-VL / Qwen2.5-VL: native-resolution patches; ``<|image_pad|>`` becomes one token per
    merged block. Prompts hold ``<|vision_start|><|image_pad|><|vision_end|>`` per image. Each image
    carries its M-RoPE grid (``extra["mrope_grid"]``), from which the runner derives positions."""

    name = "qwen2_vl"

    def __init__(
        self, hf_config: Any, image_config: Qwen2VLImageConfig, placeholder: str, marker: str | None = None
    ) -> None:
        super().__init__(int(hf_config.image_token_id), placeholder, marker)
        vc = hf_config.vision_config
        tower = (
            int(vc.patch_size),
            int(getattr(vc, "temporal_patch_size", 2)),
            int(getattr(vc, "spatial_merge_size", 2)),
        )
        ours = (image_config.patch_size, image_config.temporal_patch_size, image_config.merge_size)
        if ours != tower:
            raise ValueError(
                f"the image processor's (patch_size, temporal_patch_size, merge_size) = {ours} differ "
                f"from the vision tower's {tower}"
            )
        self.image_config = image_config

    def preprocess(self, image: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        try:
            patches = preprocess_qwen2_vl(image, self.image_config)
        except ImageShapeError as e:
            raise RequestError(str(e), param="images") from None
        t, h, w = (int(n) for n in patches.shape[:3])
        m = self.image_config.merge_size
        return patches, {GRID_KEY: (t, h, w), "image_grid_thw": (t, h * m, w * m)}

    def image_token_ids(self, pixel_values: torch.Tensor, extra: dict[str, Any]) -> tuple[list[int], int]:
        t, h, w = extra[GRID_KEY]
        return [self.image_token_id] * (t * h * w), 0


def _token_id(tokenizer: Any, attr: str, default: str) -> int:
    token = getattr(tokenizer, attr, None) or default
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == getattr(tokenizer, "unk_token_id", None):
        raise ValueError(f"the tokenizer has no {token!r} token ({attr})")
    return int(token_id)


def read_image_processor_config(model_path: str | Path) -> dict[str, Any]:
    """The image processor's settings: ``preprocessor_config.json``, else the ``image_processor``
    entry of ``processor_config.json`` (transformers 5 saves it there)."""
    path = Path(model_path)
    pre = path / "preprocessor_config.json"
    if pre.is_file():
        data: dict[str, Any] = json.loads(pre.read_text())
        return data
    proc = path / "processor_config.json"
    if proc.is_file():
        inner = json.loads(proc.read_text()).get("image_processor")
        if isinstance(inner, dict):
            return inner
    raise FileNotFoundError(f"{path} has no preprocessor_config.json (the image processor's settings)")


QWEN2_VL_ARCHITECTURES = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")


def build_vl_processor(model_path: str | Path, hf_config: Any, tokenizer: Any) -> VLProcessor | None:
    """The processor for a vision-language model, or None for a text-only architecture."""
    archs = getattr(hf_config, "architectures", None) or []
    arch = archs[0] if archs else ""
    if arch == "LlavaForConditionalGeneration":
        token_id = int(hf_config.image_token_id)
        placeholder = tokenizer.convert_ids_to_tokens(token_id)
        image_config = ClipImageConfig.from_dict(read_image_processor_config(model_path))
        return LlavaProcessor(hf_config, image_config, placeholder)
    if arch == "LlavaNextForConditionalGeneration":
        placeholder = tokenizer.convert_ids_to_tokens(int(hf_config.image_token_id))
        next_config = LlavaNextImageConfig.from_dict(read_image_processor_config(model_path))
        return LlavaNextProcessor(hf_config, next_config, placeholder)
    if arch == "InternVLForConditionalGeneration":
        placeholder = tokenizer.convert_ids_to_tokens(int(hf_config.image_token_id))
        tiles = TileConfig.from_dict(read_image_processor_config(model_path))
        start = _token_id(tokenizer, "start_image_token", "<img>")
        end = _token_id(tokenizer, "end_image_token", "</img>")
        return InternVLProcessor(hf_config, tiles, placeholder, start, end)
    if arch in QWEN2_VL_ARCHITECTURES:
        pieces = (hf_config.vision_start_token_id, hf_config.image_token_id, hf_config.vision_end_token_id)
        placeholder = "".join(tokenizer.convert_ids_to_tokens(int(i)) for i in pieces)
        marker = tokenizer.convert_ids_to_tokens(int(hf_config.image_token_id))
        qwen_config = Qwen2VLImageConfig.from_dict(read_image_processor_config(model_path))
        return Qwen2VLProcessor(hf_config, qwen_config, placeholder, marker)
    return None
