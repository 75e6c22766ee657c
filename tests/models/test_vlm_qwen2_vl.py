"""Qwen2-VL and Qwen2.5-VL greedy parity with transformers through the engine, on real images.

Tiny random checkpoints (native-resolution ViT with 2D rotary, window attention for Qwen2.5-VL, patch
merger, Qwen2 decoder with M-RoPE) saved by transformers. Images of several sizes and aspect ratios
give 4 to 30 tokens each. Prompts mix one and two images with a text-only request in one continuous
batch, and a small prefill budget splits the images' tokens (and their M-RoPE positions) over steps.
"""

# ruff: noqa: F811  (fixtures imported from tests/vl/vlm_fixtures.py are test parameters)
from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from vl.vlm_fixtures import (  # noqa: F401
    QWEN2_VL_IMAGE,
    hf_qwen2_vl_greedy,
    images,
    make_tiny_qwen2_vl,
    pasta_image,
    run_vl_engine,
)

from hotloop.config import EngineConfig

MAX_NEW = 8
PROMPTS = [
    (f"{QWEN2_VL_IMAGE}\nWhat is shown here?", [0]),
    (f"Compare {QWEN2_VL_IMAGE} with {QWEN2_VL_IMAGE} please", [1, 2]),
    ("A plain text request without images", []),
    (f"{QWEN2_VL_IMAGE} and {QWEN2_VL_IMAGE} two more", [3, 4]),
]


@pytest.mark.parametrize("variant,chunks", [("qwen2_vl", [8192, 7]), ("qwen2_5_vl", [8192, 5])])
def test_qwen2_vl_greedy_parity(
    variant: str, chunks: list[int], make_tiny_qwen2_vl: Callable[[str], Path], images: list[Any]
) -> None:
    path = make_tiny_qwen2_vl(variant)
    prompts = [(text, [images[j] for j in idx]) for text, idx in PROMPTS]
    expected = hf_qwen2_vl_greedy(path, prompts, MAX_NEW)
    for chunk in chunks:
        cfg = EngineConfig(
            device="cpu",
            dtype="float32",
            cache_block_seq_len=4,
            cache_max_entry_count=256,
            max_prefill_token_num=chunk,
        )
        got = run_vl_engine(path, cfg, prompts, MAX_NEW)
        for i, ((g_ids, g_out), (e_ids, e_out)) in enumerate(zip(got, expected, strict=True)):
            assert g_ids == e_ids, f"prompt {i}: expanded prompt ids differ from Qwen2VLProcessor's"
            assert g_out == e_out, f"chunk {chunk}, prompt {i}: hotloop {g_out} != transformers {e_out}"


@pytest.mark.parametrize("variant", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen2_vl_image_embeddings_equal_transformers(
    variant: str, make_tiny_qwen2_vl: Callable[[str], Path], images: list[Any]
) -> None:
    """The vision tower (several images in one pass) against transformers' ``get_image_features``."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from hotloop.models.loader import load_hf_config, load_model
    from hotloop.vl import build_vl_processor

    path = make_tiny_qwen2_vl(variant)
    hf = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32).eval()
    ours = load_model(path, torch.float32, "cpu")
    vl = build_vl_processor(path, load_hf_config(path), AutoTokenizer.from_pretrained(str(path)))
    assert vl is not None
    pixels = [vl.preprocess(img)[0] for img in images]
    grid = torch.tensor([[p.shape[0], p.shape[1] * 2, p.shape[2] * 2] for p in pixels])
    with torch.no_grad():
        expected = hf.model.get_image_features(
            torch.cat([p.reshape(-1, p.shape[-1]) for p in pixels]), grid
        ).pooler_output
        got = ours.encode_images(pixels)
    assert [g.shape[0] for g in got] == [e.shape[0] for e in expected]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_qwen2_vl_loads_the_older_checkpoint_layout(
    make_tiny_qwen2_vl: Callable[[str], Path], tmp_path: Path
) -> None:
    """The Hub's Qwen releases name tensors ``visual.*`` / ``model.*`` / ``lm_head.*``."""
    from safetensors.torch import load_file, save_file

    from hotloop.models.loader import load_model

    path = make_tiny_qwen2_vl("qwen2_vl")
    renamed = {}
    for f in path.iterdir():
        if f.suffix == ".safetensors":
            for name, t in load_file(str(f)).items():
                name = name.replace("model.visual.", "visual.").replace("model.language_model.", "model.")
                renamed[name] = t
        elif f.is_file():
            (tmp_path / f.name).write_bytes(f.read_bytes())
    assert any(n.startswith("visual.") for n in renamed) and "model.embed_tokens.weight" in renamed
    save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    old = dict(load_model(tmp_path, torch.float32, "cpu").state_dict())
    new = dict(load_model(path, torch.float32, "cpu").state_dict())
    assert old.keys() == new.keys()
    assert all(torch.equal(old[k], new[k]) for k in new)


def _data_url(img: Any) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_qwen2_vl_pipeline(make_tiny_qwen2_vl: Callable[[str], Path], images: list[Any]) -> None:
    """The Python API places images where Qwen2-VL's chat template puts them."""
    from transformers import AutoTokenizer

    from hotloop import pipeline
    from hotloop.messages import GenerationConfig

    path = make_tiny_qwen2_vl("qwen2_5_vl")
    tok = AutoTokenizer.from_pretrained(str(path))
    chat = tok.apply_chat_template(
        [{"role": "user", "content": f"{QWEN2_VL_IMAGE}\nWhat is this?\n{QWEN2_VL_IMAGE}\nand this"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    bare = "Look: <|image_pad|> what is it?"  # the image token without vision_start / vision_end
    refs = [(PROMPTS[0][0], [images[0]]), (chat, [images[1], images[3]]), (bare, [images[2]])]
    expected = [out for _ids, out in hf_qwen2_vl_greedy(path, refs, MAX_NEW)]
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": _data_url(images[1])}},
                {"type": "text", "text": "What is this?"},
                {"type": "image", "image": images[3]},
                {"type": "text", "text": "and this"},
            ],
        }
    ]
    gen = GenerationConfig(max_new_tokens=MAX_NEW, ignore_eos=True)
    cfg = EngineConfig(device="cpu", dtype="float32", cache_max_entry_count=64, max_prefill_token_num=16)
    with pipeline(str(path), cfg) as pipe:
        assert pipe(("What is shown here?", images[0]), gen, do_preprocess=False).token_ids == expected[0]
        assert pipe(messages, gen).token_ids == expected[1]
        # A bare <|image_pad|> places the image where it is, as transformers' processor does.
        assert pipe((bare, images[2]), gen, do_preprocess=False).token_ids == expected[2]
