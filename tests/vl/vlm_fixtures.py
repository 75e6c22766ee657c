"""Fixtures for vision-language tests (imported by tests/vl/conftest.py and tests/models/test_vlm_*.py):
real images (drawn with PIL, and PyPI llama-models' JPEG) and tiny random LLaVA, LLaVA-NeXT, InternVL
and Qwen2(.5)-VL checkpoints saved by transformers with a processor alongside."""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.messages import GenerationConfig
from hotloop.vl import build_vl_processor

IMAGE_TOKEN = "<image>"
PASTA = "resources/pasta.jpeg"


def drawn_image(width: int, height: int, seed: int, mode: str = "RGB") -> Any:
    """A PIL image with shapes and a gradient, so resizing and cropping matter."""
    from PIL import Image, ImageDraw

    g = torch.Generator().manual_seed(seed)
    img = Image.new("RGB", (width, height))
    px = img.load()
    assert px is not None
    for y in range(height):
        for x in range(width):
            px[x, y] = (
                x * 255 // max(width - 1, 1),
                y * 255 // max(height - 1, 1),
                (x * y + seed * 37) % 256,
            )
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = (
            int(torch.randint(0, width, (1,), generator=g)),
            int(torch.randint(0, height, (1,), generator=g)),
        )
        x1, y1 = x0 + width // 3, y0 + height // 4
        color = tuple(int(c) for c in torch.randint(0, 256, (3,), generator=g))
        draw.ellipse((x0, y0, x1, y1), fill=color)
    if mode == "RGBA":
        img = img.convert("RGBA")
        img.putalpha(Image.linear_gradient("L").resize((width, height)))
    elif mode != "RGB":
        img = img.convert(mode)
    return img


def _pasta_bytes() -> bytes | None:
    spec = importlib.util.find_spec("llama_models")  # installed with --no-deps: only its files are read
    if spec is not None and spec.submodule_search_locations:
        f = Path(list(spec.submodule_search_locations)[0]) / PASTA
        if f.is_file():
            return f.read_bytes()
    dirs = [os.environ.get("HOTLOOP_TEST_WHEELS", ""), str(Path.home() / ".cache" / "hotloop-wheels"), "/tmp"]
    for d in filter(None, dirs):
        for wheel in sorted(Path(d).rglob("llama_models-*.whl")) if Path(d).is_dir() else []:
            with zipfile.ZipFile(wheel) as z:
                for name in z.namelist():
                    if name.endswith(PASTA):
                        return z.read(name)
    return None


@pytest.fixture(scope="session")
def pasta_image() -> Any:
    """``resources/pasta.jpeg`` from PyPI llama-models (``pip install --no-deps llama-models`` or
    ``pip download --no-deps llama-models -d $HOTLOOP_TEST_WHEELS``); skips when absent."""
    data = _pasta_bytes()
    if data is None:
        pytest.skip("llama-models (resources/pasta.jpeg) is not available")
    from PIL import Image

    return Image.open(io.BytesIO(data))


@pytest.fixture(scope="session")
def images(pasta_image: Any) -> list[Any]:
    """Real and drawn images of several sizes, aspect ratios and modes."""
    return [
        pasta_image,
        drawn_image(48, 36, 1),
        drawn_image(30, 80, 2),
        drawn_image(97, 41, 3, "RGBA"),
        drawn_image(20, 25, 4, "L"),  # smaller than the crop after resize? no: resized up first
    ]


LLAVA_VARIANTS: dict[str, dict[str, Any]] = {
    "default": dict(vision_feature_layer=-2, vision_feature_select_strategy="default"),
    "full_multilayer": dict(vision_feature_layer=[-3, -1], vision_feature_select_strategy="full"),
}


@pytest.fixture(scope="session")
def make_tiny_llava(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path
) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def make(variant: str) -> Path:
        if variant in made:
            return made[variant]
        from transformers import (
            AutoTokenizer,
            CLIPImageProcessor,
            CLIPVisionConfig,
            LlamaConfig,
            LlavaConfig,
            LlavaForConditionalGeneration,
            LlavaProcessor,
        )

        spec = LLAVA_VARIANTS[variant]
        vision = CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            image_size=30,
            patch_size=6,
            projection_dim=32,
        )
        tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
        tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
        image_token_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
        text = LlamaConfig(
            vocab_size=len(tok) + 15,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            rms_norm_eps=1e-6,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token_id, **spec)
        torch.manual_seed(4321)
        model = LlavaForConditionalGeneration(cfg).to(torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0, 0.08)
        out = tmp_path_factory.mktemp(f"llava-{variant}")
        model.save_pretrained(str(out))
        image_processor = CLIPImageProcessor(
            size={"shortest_edge": 34}, crop_size={"height": 30, "width": 30}
        )
        processor = LlavaProcessor(
            image_processor=image_processor,
            tokenizer=tok,
            patch_size=6,
            vision_feature_select_strategy=spec["vision_feature_select_strategy"],
            num_additional_image_tokens=1,
        )
        processor.save_pretrained(str(out))
        made[variant] = out
        return out

    return make


@functools.lru_cache(maxsize=6)
def _hf_processor_and_model(path: str, model_class: str) -> tuple[Any, Any]:
    """transformers' processor and ``model_class`` for a tiny folder, loaded once per session."""
    import transformers

    model = getattr(transformers, model_class).from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return transformers.AutoProcessor.from_pretrained(path), model


def _hf_processor_greedy(
    model_class: str, path: Path, prompts: list[tuple[str, list[Any]]], max_new: int
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy tokens) from transformers for each (text, images), one at a time, through
    the folder's own processor."""
    processor, model = _hf_processor_and_model(str(path), model_class)
    outs = []
    with torch.no_grad():
        for text, imgs in prompts:
            inputs = processor(text=text, images=imgs or None, return_tensors="pt")
            g = model.generate(**inputs, max_new_tokens=max_new, do_sample=False, pad_token_id=0)
            ids = inputs["input_ids"][0].tolist()
            outs.append((ids, g[0, len(ids) :].tolist()))
    return outs


def hf_llava_greedy(
    path: Path, prompts: list[tuple[str, list[Any]]], max_new: int
) -> list[tuple[list[int], list[int]]]:
    return _hf_processor_greedy("LlavaForConditionalGeneration", path, prompts, max_new)


LLAVA_NEXT_VARIANTS: dict[str, dict[str, Any]] = {
    # 16-pixel tiles of 4x4 patches (16 features a tile); grids of 2x2, 2x4 or 4x2 tiles
    "default": dict(
        vision_feature_layer=-2,
        image_grid_pinpoints=[[32, 32], [32, 64], [64, 32]],
        shortest_edge=16,
    ),
    # two feature layers; tiles resized to 18 pixels and centre-cropped back; a 3x1 grid too
    "multilayer": dict(
        vision_feature_layer=[-3, -1],
        image_grid_pinpoints=[[32, 32], [32, 64], [64, 32], [48, 16]],
        shortest_edge=18,
    ),
}


@pytest.fixture(scope="session")
def make_tiny_llava_next(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path
) -> Callable[[str], Path]:
    """A tiny random LLaVA-NeXT (``LLAVA_NEXT_VARIANTS`` keys): CLIP tower on 16-pixel tiles, Llama
    decoder, a ``LlavaNextProcessor`` with the PIL image processor saved alongside."""
    made: dict[str, Path] = {}

    def make(variant: str) -> Path:
        if variant in made:
            return made[variant]
        from transformers import (
            AutoTokenizer,
            CLIPVisionConfig,
            LlamaConfig,
            LlavaNextConfig,
            LlavaNextForConditionalGeneration,
            LlavaNextProcessor,
        )
        from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

        spec = dict(LLAVA_NEXT_VARIANTS[variant])
        shortest_edge = spec.pop("shortest_edge")
        vision = CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            image_size=16,
            patch_size=4,
            projection_dim=32,
        )
        tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
        tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
        text = LlamaConfig(
            vocab_size=len(tok) + 15,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            rms_norm_eps=1e-6,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        cfg = LlavaNextConfig(
            vision_config=vision,
            text_config=text,
            image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
            vision_feature_select_strategy="default",
            **spec,
        )
        torch.manual_seed(8642)
        model = LlavaNextForConditionalGeneration(cfg).to(torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0, 0.08)
            model.model.image_newline.normal_(0, 0.3)
        out = tmp_path_factory.mktemp(f"llava-next-{variant}")
        model.save_pretrained(str(out))
        image_processor = LlavaNextImageProcessorPil(
            size={"shortest_edge": shortest_edge},
            crop_size={"height": 16, "width": 16},
            image_grid_pinpoints=spec["image_grid_pinpoints"],
        )
        processor = LlavaNextProcessor(
            image_processor=image_processor,
            tokenizer=tok,
            patch_size=4,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
        )
        processor.save_pretrained(str(out))
        made[variant] = out
        return out

    return make


def hf_llava_next_greedy(
    path: Path, prompts: list[tuple[str, list[Any]]], max_new: int
) -> list[tuple[list[int], list[int]]]:
    return _hf_processor_greedy("LlavaNextForConditionalGeneration", path, prompts, max_new)


INTERNVL_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>", "<video>"]
INTERNVL_VARIANTS: dict[str, dict[str, Any]] = {
    "layernorm": dict(),
    "rmsnorm_qknorm": dict(
        norm_type="rms_norm", use_qk_norm=True, use_mean_pooling=False, attention_bias=True
    ),
}


@pytest.fixture(scope="session")
def make_tiny_internvl(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path
) -> Callable[[str], Path]:
    """A tiny random InternVL (InternViT 28x28 tiles of 7x7 patches -> 4 tokens a tile, Qwen2 decoder),
    with a GotOcr2 image processor (up to 6 tiles) and a tokenizer with InternVL's image tokens."""
    made: dict[str, Path] = {}

    def make(variant: str) -> Path:
        if variant in made:
            return made[variant]
        from transformers import (
            AutoTokenizer,
            GotOcr2ImageProcessor,
            InternVLConfig,
            InternVLForConditionalGeneration,
            InternVLVisionConfig,
            Qwen2Config,
        )

        tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
        tok.add_special_tokens({"additional_special_tokens": INTERNVL_TOKENS})
        vision = InternVLVisionConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=[28, 28],
            patch_size=[7, 7],
            **INTERNVL_VARIANTS[variant],
        )
        text = Qwen2Config(
            vocab_size=len(tok) + 12,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        cfg = InternVLConfig(
            vision_config=vision,
            text_config=text,
            image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
            image_seq_length=4,
        )
        torch.manual_seed(2468)
        model = InternVLForConditionalGeneration(cfg).to(torch.float32)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() > 1:
                    p.normal_(0, 0.08)
                elif "lambda" in name:
                    p.uniform_(0.5, 1.5)
        out = tmp_path_factory.mktemp(f"internvl-{variant}")
        model.save_pretrained(str(out))
        tok.save_pretrained(str(out))
        GotOcr2ImageProcessor(size={"height": 28, "width": 28}, max_patches=6).save_pretrained(str(out))
        made[variant] = out
        return out

    return make


def hf_internvl_greedy(
    path: Path, prompts: list[tuple[str, list[Any]]], max_new: int
) -> list[tuple[list[int], torch.Tensor | None, list[int]]]:
    """(prompt ids, pixel values, greedy tokens) from transformers for each (text, images). The
    ``<IMG_CONTEXT>`` placeholders are expanded as transformers' InternVLProcessor does (that class
    needs torchvision, so the expansion is spelled out here)."""
    from transformers import AutoTokenizer, GotOcr2ImageProcessor, InternVLForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(str(path))
    image_processor = GotOcr2ImageProcessor.from_pretrained(str(path))
    model = InternVLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    per_tile = model.config.image_seq_length
    outs = []
    with torch.no_grad():
        for text, imgs in prompts:
            pixel_values = None
            if imgs:
                feats = image_processor(images=imgs, crop_to_patches=True, return_tensors="pt")
                pixel_values = feats["pixel_values"]
                parts = text.split("<IMG_CONTEXT>")
                assert len(parts) == len(imgs) + 1
                text = parts[0]
                for n, part in zip(feats["num_patches"], parts[1:], strict=True):
                    text += "<img>" + "<IMG_CONTEXT>" * (per_tile * int(n)) + "</img>" + part
            ids = torch.tensor([tok.encode(text)])
            extra = {} if pixel_values is None else {"pixel_values": pixel_values}
            g = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                **extra,
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=0,
            )
            outs.append((ids[0].tolist(), pixel_values, g[0, ids.shape[1] :].tolist()))
    return outs


QWEN2_VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN2_VL_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
# 4-pixel patches merged 2x2: 8-pixel blocks, 4 to 30 image tokens
QWEN2_VL_PROCESSOR = dict(
    min_pixels=8 * 8 * 4, max_pixels=8 * 8 * 30, patch_size=4, merge_size=2, temporal_patch_size=2
)
QWEN2_VL_VISION: dict[str, dict[str, Any]] = {
    "qwen2_vl": dict(
        depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, hidden_act="quick_gelu"
    ),
    "qwen2_5_vl": dict(  # 2x2-block windows, full attention in block 1 of 3
        depth=3,
        hidden_size=32,
        intermediate_size=48,
        out_hidden_size=64,
        num_heads=2,
        hidden_act="silu",
        window_size=16,
        fullatt_block_indexes=[1],
    ),
}


@pytest.fixture(scope="session")
def make_tiny_qwen2_vl(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path
) -> Callable[[str], Path]:
    """A tiny random Qwen2-VL or Qwen2.5-VL (``QWEN2_VL_VISION`` keys) with a Qwen2 M-RoPE decoder
    (head_dim 16, ``mrope_section`` [2, 3, 3]), its image processor and a tokenizer with the vision
    tokens. Small rope thetas (here and in the ViT) make every rotary section matter."""
    made: dict[str, Path] = {}

    def make(variant: str) -> Path:
        if variant in made:
            return made[variant]
        from transformers import (
            AutoTokenizer,
            Qwen2_5_VLConfig,
            Qwen2_5_VLForConditionalGeneration,
            Qwen2VLConfig,
            Qwen2VLForConditionalGeneration,
        )
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        config_cls, model_cls = {
            "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
            "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
        }[variant]
        tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
        tok.add_special_tokens({"additional_special_tokens": QWEN2_VL_TOKENS})
        ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN2_VL_TOKENS}
        text = dict(
            vocab_size=len(tok) + 12,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 50.0, "mrope_section": [2, 3, 3]},
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        vision = dict(
            QWEN2_VL_VISION[variant],
            patch_size=4,
            temporal_patch_size=2,
            spatial_merge_size=2,
            rope_parameters={"rope_type": "axial", "rope_theta": 30.0},
        )
        cfg = config_cls(
            vision_config=vision,
            text_config=text,
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=variant == "qwen2_5_vl",  # as the 3B release
        )
        torch.manual_seed(1357)
        model = model_cls(cfg).to(torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0, 0.08)
        out = tmp_path_factory.mktemp(variant)
        model.save_pretrained(str(out))
        tok.save_pretrained(str(out))
        Qwen2VLImageProcessorPil(**QWEN2_VL_PROCESSOR).save_pretrained(str(out))
        made[variant] = out
        return out

    return make


def qwen2_vl_expand(path: Path, text: str, imgs: list[Any]) -> tuple[list[int], dict[str, torch.Tensor]]:
    """Prompt ids and model inputs as transformers' Qwen2VLProcessor makes them (the class needs
    torchvision for its video processor, so its image-token expansion is called on a stand-in)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer, Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = AutoTokenizer.from_pretrained(str(path))
    inputs: dict[str, torch.Tensor] = {}
    if imgs:
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(path))
        feats = image_processor(images=imgs, return_tensors="pt")
        inputs = {"pixel_values": feats["pixel_values"], "image_grid_thw": feats["image_grid_thw"]}
        stand_in = SimpleNamespace(image_processor=image_processor, image_token="<|image_pad|>")
        parts = text.split("<|image_pad|>")
        assert len(parts) == len(imgs) + 1
        text = parts[0]
        for i, part in enumerate(parts[1:]):
            text += Qwen2VLProcessor.replace_image_token(stand_in, dict(feats), i) + part  # type: ignore[arg-type]
    return tok.encode(text), inputs


def qwen2_vl_inputs(path: Path, text: str, imgs: list[Any], image_token_id: int) -> dict[str, torch.Tensor]:
    """transformers' model inputs for one prompt (on the CPU, pixel values in float32): ``qwen2_vl_expand``
    plus the attention mask and the ``mm_token_type_ids`` (1 on image tokens) Qwen2VLProcessor adds."""
    ids, extra = qwen2_vl_expand(path, text, imgs)
    input_ids = torch.tensor([ids])
    return dict(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        mm_token_type_ids=(input_ids == image_token_id).int(),
        **extra,
    )


@functools.lru_cache(maxsize=4)
def hf_qwen2_vl_model(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Any:
    """transformers' Qwen2(.5)-VL for a tiny folder, on ``device`` in ``dtype``, loaded once per session."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None
    return model


def hf_qwen2_vl_greedy(
    path: Path, prompts: list[tuple[str, list[Any]]], max_new: int
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy tokens) from transformers' ``generate`` for each (text, images), one at a time."""
    model = hf_qwen2_vl_model(str(path))
    outs = []
    with torch.no_grad():
        for text, imgs in prompts:
            inputs = qwen2_vl_inputs(path, text, imgs, model.config.image_token_id)
            ids = inputs["input_ids"][0].tolist()
            g = model.generate(**inputs, max_new_tokens=max_new, do_sample=False, pad_token_id=0)
            outs.append((ids, g[0, len(ids) :].tolist()))
    return outs


def run_vl_engine(
    path: Path, cfg: EngineConfig, prompts: list[tuple[str, list[Any]]], max_new: int
) -> list[tuple[list[int], list[int]]]:
    """Serve (text, images) prompts in one continuous batch (one arrives per step); -> (prompt ids,
    greedy tokens) per prompt. Checks that every KV block is free afterwards."""
    built = build_engine(str(path), cfg)
    vl = build_vl_processor(path, built.model_config.hf_config, built.tokenizer)
    assert vl is not None
    engine = built.engine
    params = GenerationConfig(max_new_tokens=max_new, ignore_eos=True)
    prompt_ids: dict[str, list[int]] = {}
    outputs = []
    for i, (text, imgs) in enumerate(prompts):  # arrive one step apart: mixed prefill/decode batches
        ids, mm = vl.expand(built.tokenizer.encode(text), imgs)
        prompt_ids[str(i)] = ids
        engine.add_request(str(i), ids, params, mm_inputs=mm)
        outputs += engine.step()
    results: dict[str, list[int]] = {}
    while engine.has_unfinished():
        outputs += engine.step()
    assert engine.num_free_blocks == engine.num_total_blocks
    for o in outputs:
        results.setdefault(o.request_id, []).extend(o.new_token_ids)
    return [(prompt_ids[str(i)], results.get(str(i), [])) for i in range(len(prompts))]
