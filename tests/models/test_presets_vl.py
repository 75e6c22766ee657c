"""The ``llava-1.5-7b`` dummy-weight preset: it resolves to a folder whose config has LLaVA-1.5-7B's
shapes, whose tokenizer has ``<image>`` at 32000 and a chat template, and whose processor gives 576
image tokens for a 336x336 image, as transformers' LlavaProcessor does on the same folder."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hotloop.models.loader import load_hf_config, model_config_from_path
from hotloop.models.presets import PRESETS, Preset, is_preset, preset_dir, write_preset
from hotloop.models.resolve import resolve_model_path
from hotloop.vl import build_vl_processor

NAME = "llava-1.5-7b"
LLAVA_15_7B_PARAMS = 7_063_427_072  # llava-hf/llava-1.5-7b-hf


def _image(width: int, height: int, seed: int = 0) -> Any:
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


@pytest.fixture(scope="module")
def folder() -> Path:
    return resolve_model_path(NAME)


def test_preset_resolves(folder: Path) -> None:
    assert is_preset(NAME) and is_preset("LLaVA-1.5-7B")
    assert folder == preset_dir("LLaVA-1.5-7B")
    for f in ("config.json", "tokenizer.json", "preprocessor_config.json", "processor_config.json"):
        assert (folder / f).is_file(), f
    mc = model_config_from_path(folder)
    assert mc.architecture == "LlavaForConditionalGeneration"
    assert (mc.num_layers, mc.num_kv_heads, mc.head_dim, mc.vocab_size) == (32, 32, 128, 32064)
    assert mc.dtype == "bfloat16" and mc.eos_token_ids == (2,)
    hf = load_hf_config(folder)
    vc, tc = hf.vision_config, hf.text_config
    assert hf.image_token_id == 32000
    assert (hf.vision_feature_layer, hf.vision_feature_select_strategy, hf.projector_hidden_act) == (
        -2,
        "default",
        "gelu",
    )
    assert (vc.hidden_size, vc.num_hidden_layers, vc.num_attention_heads, vc.intermediate_size) == (
        1024,
        24,
        16,
        4096,
    )
    assert (vc.image_size, vc.patch_size, vc.hidden_act) == (336, 14, "quick_gelu")
    assert (tc.hidden_size, tc.intermediate_size, tc.num_hidden_layers, tc.num_attention_heads) == (
        4096,
        11008,
        32,
        32,
    )


def test_preset_has_llava_15_7b_parameters(folder: Path) -> None:
    """Built on the meta device: transformers' model has llava-1.5-7b-hf's parameter count, and
    ours the same less the CLIP layer after the feature layer and the post-layernorm it skips."""
    from transformers import LlavaForConditionalGeneration as HFLlava

    from hotloop.models.registry import get_model_class

    hf_config = load_hf_config(folder)
    with torch.device("meta"):
        theirs = HFLlava(hf_config)
        ours = get_model_class("LlavaForConditionalGeneration")(hf_config, torch.bfloat16)
    n_theirs = sum(p.numel() for p in theirs.parameters())
    assert n_theirs == LLAVA_15_7B_PARAMS
    last = f"encoder.layers.{hf_config.vision_config.num_hidden_layers - 1}."
    unused = sum(  # (the tower's path differs between transformers versions)
        p.numel()
        for name, p in theirs.named_parameters()
        if "vision_tower." in name and (last in name or "post_layernorm." in name)
    )
    assert sum(p.numel() for p in ours.parameters()) == n_theirs - unused


def test_preset_tokenizer(folder: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    assert len(tok) == 32064
    assert tok.convert_tokens_to_ids(["<unk>", "<s>", "</s>", "<image>", "<pad>"]) == [0, 1, 2, 32000, 32001]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 32001)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "<image>\nWhat is it?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<s>USER: <image>\nWhat is it? ASSISTANT:"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and ids.count(32000) == 1
    assert tok.decode(ids) == text


@pytest.mark.parametrize("size", [(336, 336), (500, 300)])
def test_preset_processor_gives_576_image_tokens(folder: Path, size: tuple[int, int]) -> None:
    from transformers import AutoProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    vl = build_vl_processor(folder, load_hf_config(folder), tok)
    assert vl is not None and vl.placeholder == "<image>"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "<image>\nDescribe it."}], add_generation_prompt=True, tokenize=False
    )
    image = _image(*size)
    ids, mm = vl.expand(tok.encode(text, add_special_tokens=False), [image])
    assert len(mm) == 1 and mm[0].length == 576 and ids.count(32000) == 576
    assert tuple(mm[0].pixel_values.shape) == (3, 336, 336)
    assert ids[mm[0].offset : mm[0].end] == [32000] * 576

    import transformers

    processor = AutoProcessor.from_pretrained(str(folder))
    pil = getattr(transformers, "CLIPImageProcessorPil", None)
    if pil is not None:  # the torchvision backend resizes slightly differently
        processor.image_processor = pil.from_pretrained(str(folder))
    theirs = processor(text=text, images=image, return_tensors="pt")
    assert theirs["input_ids"][0].tolist() == ids
    torch.testing.assert_close(theirs["pixel_values"][0], mm[0].pixel_values, atol=1e-6, rtol=0)


def test_shrunken_preset_serves_images_with_dummy_weights(tmp_path: Path) -> None:
    """``write_preset`` with the preset's files and tiny shapes: ``load_format='dummy'`` serves a
    336x336 image request (576 image tokens) end to end on the CPU."""
    from hotloop import pipeline
    from hotloop.config import EngineConfig
    from hotloop.messages import GenerationConfig

    base = PRESETS[NAME]
    cfg = copy.deepcopy(base.config)
    cfg["vision_config"].update(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    cfg["text_config"].update(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
    )
    cfg["text_config"].update(num_key_value_heads=4)
    write_preset(tmp_path, Preset(cfg, base.tokenizer, base.preprocessor, base.processor))
    engine_cfg = EngineConfig(device="cpu", dtype="float32", load_format="dummy", cache_max_entry_count=64)
    with pipeline(str(tmp_path), engine_cfg) as pipe:
        r = pipe(("What is it?", _image(336, 336)), GenerationConfig(max_new_tokens=4, ignore_eos=True))
        assert len(r.token_ids) == 4 and r.input_token_len > 576
        assert pipe.engine.num_free_blocks == pipe.engine.num_total_blocks
