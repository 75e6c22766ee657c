"""Greedy parity of LLaVA, LLaVA-NeXT, InternVL, Qwen2-VL and Qwen2.5-VL with transformers on the GPU
in bf16 (skipped without CUDA).

The tiny random checkpoints of ``vlm_fixtures.py`` and real images (``pasta.jpeg`` from llama-models,
and PIL-drawn images of several sizes and modes). hotloop serves all prompts of a model in one
continuous batch on cuda in bfloat16 (one and two images per prompt, a text-only request among the
image requests, requests arriving one step apart so prefills and decodes mix), with and without a
prefill budget small enough to split an image's tokens across steps, with and without decode CUDA
graphs. transformers runs ``generate`` on each prompt alone, on cuda in bfloat16, with the same
images through its own processor (the PIL backend, as on the CPU tests; for Qwen2-VL the image
processor and Qwen2VLProcessor's token expansion, as ``vlm_fixtures.qwen2_vl_expand``).

Tolerance rule (the one of tests/api/test_gpu_parity.py): hotloop's greedy tokens must equal
transformers' token by token. At the first step where they differ, the difference is accepted only
if transformers' own top-2 logits at that step are within bf16 noise, ``top1 - top2 <
max(NOISE * |top1|, FLOOR)``; after such a near-tie either continuation is correct, so the rest of
that sequence is not compared. A difference at any other step fails. Enough tokens must be compared
(at least half of all) for the test to mean something.

The check functions take ``device`` and ``dtype`` (both sides): ``check_model(..., device="cpu",
dtype="float32")`` runs the same code on the CPU (the CPU parity tests in tests/models check that
case exactly, so it is not a test here).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from vlm_fixtures import QWEN2_VL_IMAGE, hf_qwen2_vl_model, qwen2_vl_inputs, run_vl_engine

from hotloop.config import EngineConfig

NOISE = 2**-7  # bf16 has 8 significant bits
FLOOR = 1e-2  # absolute floor of the near-tie gap (logits near zero)
MAX_NEW = 10
DEVICE = "cuda"

LLAVA_PROMPTS = [
    ("<image>\nWhat is shown here?", [0]),  # the photo
    ("Compare <image> with <image> please", [1, 2]),  # two images
    ("A plain text request without images", []),
    ("Describe the colours of <image>", [3]),  # RGBA
    ("<image><image> and a grey one first", [4, 0]),  # L mode, then the photo
]
INTERNVL_PROMPTS = [
    ("<IMG_CONTEXT>\nWhat is shown here?", [0]),
    ("Compare <IMG_CONTEXT> with <IMG_CONTEXT> please", [1, 2]),
    ("A plain text request without images", []),
    ("<IMG_CONTEXT><IMG_CONTEXT> two more", [3, 4]),
]
QWEN2_VL_PROMPTS = [
    (f"{QWEN2_VL_IMAGE}\nWhat is shown here?", [0]),
    (f"Compare {QWEN2_VL_IMAGE} with {QWEN2_VL_IMAGE} please", [1, 2]),
    ("A plain text request without images", []),
    (f"Describe the colours of {QWEN2_VL_IMAGE}", [3]),  # RGBA
    (f"{QWEN2_VL_IMAGE}{QWEN2_VL_IMAGE} and a grey one first", [4, 0]),  # L mode, then the photo
]
# Prefill budgets: everything in one step, or a budget that splits every image's tokens (a LLaVA
# image is 25 tokens; a LLaVA-NeXT image 33 to 150 (tiles and newlines); an InternVL image is 4
# tokens per tile, 1 to 7 tiles, between <img> and </img>; a Qwen2(.5)-VL image 6 to 30, between
# <|vision_start|> and <|vision_end|>, so a split also splits its M-RoPE positions).
CHUNKS = {"llava": 7, "llava_next": 13, "internvl": 5, "qwen2_vl": 5, "qwen2_5_vl": 5}
# kind -> (fixture that makes the checkpoint, its variant, prompts)
MODELS: dict[str, tuple[str, str, list[tuple[str, list[int]]]]] = {
    "llava": ("make_tiny_llava", "default", LLAVA_PROMPTS),
    "llava_next": ("make_tiny_llava_next", "default", LLAVA_PROMPTS),
    "internvl": ("make_tiny_internvl", "layernorm", INTERNVL_PROMPTS),
    "qwen2_vl": ("make_tiny_qwen2_vl", "qwen2_vl", QWEN2_VL_PROMPTS),
    "qwen2_5_vl": ("make_tiny_qwen2_vl", "qwen2_5_vl", QWEN2_VL_PROMPTS),
}


def near_tie(logits: torch.Tensor) -> bool:
    """Whether the top-2 of one step's logits are within bf16 noise of each other."""
    top2 = logits.float().topk(2).values
    return bool((top2[0] - top2[1]).item() < max(NOISE * top2[0].abs().item(), FLOOR))


def hf_generate_with_ties(
    model: Any, inputs: dict[str, torch.Tensor], max_new: int
) -> tuple[list[int], list[int], list[bool]]:
    """(prompt ids, greedy tokens, near-tie flag of each step) of one prompt from ``generate``."""
    with torch.no_grad():
        g = model.generate(
            **inputs,
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    prompt = inputs["input_ids"][0].tolist()
    return prompt, g.sequences[0, len(prompt) :].tolist(), [near_tie(s[0]) for s in g.logits]


def compare(got: Sequence[int], expected: Sequence[int], ties: Sequence[bool], what: str) -> int:
    """Apply the tolerance rule to one sequence; -> how many tokens were compared equal."""
    assert len(got) == len(expected) == len(ties), f"{what}: lengths {len(got)}, {len(expected)}, {len(ties)}"
    for step, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g != e:
            assert ties[step], (
                f"{what}: hotloop {list(got)} != transformers {list(expected)} at step {step}, "
                "where transformers' top-2 logits are not a bf16 near-tie"
            )
            return step
    return len(expected)


def _pil_image_processor(name: str, path: Path) -> Any:
    """transformers' PIL-backend image processor ``name + 'Pil'`` where it exists (transformers 5
    otherwise picks the torchvision one when torchvision is installed), else ``name``."""
    import transformers

    cls = getattr(transformers, name + "Pil", None) or getattr(transformers, name)
    return cls.from_pretrained(str(path))


Reference = list[tuple[list[int], list[int], list[bool]]]


def _on(inputs: Mapping[str, torch.Tensor], device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Model inputs on ``device``, the floating-point ones (pixel values) in ``dtype``."""
    return {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}


def _hf_model(cls_name: str, path: Path, device: str, dtype: torch.dtype) -> Any:
    import transformers

    model = getattr(transformers, cls_name).from_pretrained(str(path), dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None
    return model


def hf_llava_family(
    model_cls: str,
    image_processor: str,
    path: Path,
    prompts: list[tuple[str, list[Any]]],
    max_new: int,
    device: str,
    dtype: torch.dtype,
) -> Reference:
    """LLaVA or LLaVA-NeXT: the folder's processor (``AutoProcessor``) with the PIL image processor."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(path))
    processor.image_processor = _pil_image_processor(image_processor, path)
    model = _hf_model(model_cls, path, device, dtype)
    outs = []
    for text, imgs in prompts:
        inputs = processor(text=text, images=imgs or None, return_tensors="pt")
        outs.append(hf_generate_with_ties(model, _on(inputs, device, dtype), max_new))
    return outs


def hf_internvl(
    path: Path, prompts: list[tuple[str, list[Any]]], max_new: int, device: str, dtype: torch.dtype
) -> Reference:
    """As ``vlm_fixtures.hf_internvl_greedy`` (``<IMG_CONTEXT>`` expanded as InternVLProcessor does),
    in ``dtype`` on ``device``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    image_processor = _pil_image_processor("GotOcr2ImageProcessor", path)
    model = _hf_model("InternVLForConditionalGeneration", path, device, dtype)
    per_tile = model.config.image_seq_length
    outs = []
    for text, imgs in prompts:
        inputs: dict[str, torch.Tensor] = {}
        if imgs:
            feats = image_processor(images=imgs, crop_to_patches=True, return_tensors="pt")
            inputs["pixel_values"] = feats["pixel_values"]
            parts = text.split("<IMG_CONTEXT>")
            assert len(parts) == len(imgs) + 1
            text = parts[0]
            for n, part in zip(feats["num_patches"], parts[1:], strict=True):
                text += "<img>" + "<IMG_CONTEXT>" * (per_tile * int(n)) + "</img>" + part
        ids = torch.tensor([tok.encode(text)])
        inputs.update(input_ids=ids, attention_mask=torch.ones_like(ids))
        outs.append(hf_generate_with_ties(model, _on(inputs, device, dtype), max_new))
    return outs


def hf_qwen2_vl(
    path: Path, prompts: list[tuple[str, list[Any]]], max_new: int, device: str, dtype: torch.dtype
) -> Reference:
    """Qwen2-VL or Qwen2.5-VL (``AutoModelForImageTextToText`` picks the class from the config): the
    inputs of ``vlm_fixtures.hf_qwen2_vl_greedy`` (PIL image processor, Qwen2VLProcessor's expansion,
    ``mm_token_type_ids`` for M-RoPE), in ``dtype`` on ``device``."""
    model = hf_qwen2_vl_model(str(path), device, dtype)
    outs = []
    for text, imgs in prompts:
        inputs = qwen2_vl_inputs(path, text, imgs, model.config.image_token_id)
        outs.append(hf_generate_with_ties(model, _on(inputs, device, dtype), max_new))
    return outs


HF_REFERENCE: dict[str, Callable[..., Reference]] = {
    "llava": functools.partial(hf_llava_family, "LlavaForConditionalGeneration", "CLIPImageProcessor"),
    "llava_next": functools.partial(
        hf_llava_family, "LlavaNextForConditionalGeneration", "LlavaNextImageProcessor"
    ),
    "internvl": hf_internvl,
    "qwen2_vl": hf_qwen2_vl,
    "qwen2_5_vl": hf_qwen2_vl,
}


_EXPECTED: dict[str, Reference] = {}


def alpha_on_white(img: Any) -> Any:
    """An image with transparency composited onto white, as transformers >= 5.2x's ``convert_to_rgb``
    does and hotloop does. transformers 5.17 (on the GPU machine) instead drops the alpha channel,
    so transformers is handed the composited RGB image: the GPU test then checks the model's numerics
    whichever transformers is installed (the CPU tests check the preprocessing against the current
    transformers, RGBA included)."""
    from PIL import Image

    if "A" not in img.getbands() and img.info.get("transparency") is None:
        return img
    rgba = img.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")


def check_model(
    kind: str,
    path: Path,
    prompts: list[tuple[str, list[Any]]],
    chunk: int,
    eager: bool,
    device: str = DEVICE,
    dtype: str = "bfloat16",
) -> None:
    """hotloop serves ``prompts`` in one continuous batch on ``device`` in ``dtype``; each request's
    tokens against transformers' ``generate`` on that prompt alone, same device and dtype."""
    key = f"{kind}:{path}:{device}:{dtype}"
    if key not in _EXPECTED:  # transformers' side does not depend on the engine's settings
        hf_prompts = [(text, [alpha_on_white(im) for im in imgs]) for text, imgs in prompts]
        _EXPECTED[key] = HF_REFERENCE[kind](path, hf_prompts, MAX_NEW, device, getattr(torch, dtype))
    expected = _EXPECTED[key]
    cfg = EngineConfig(
        device=device,
        dtype=dtype,
        max_batch_size=8,
        cache_block_seq_len=4,
        cache_max_entry_count=512,
        max_prefill_token_num=chunk,
        eager_mode=eager,
    )
    got = run_vl_engine(path, cfg, prompts, MAX_NEW)
    compared = 0
    for i, ((g_ids, g_out), (e_ids, e_out, ties)) in enumerate(zip(got, expected, strict=True)):
        assert g_ids == e_ids, f"{kind} prompt {i}: expanded prompt ids differ from transformers'"
        compared += compare(g_out, e_out, ties, f"{kind} chunk {chunk} eager {eager} prompt {i}")
    assert compared >= len(prompts) * MAX_NEW // 2, "too many near-ties: the test would check little"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("split", [False, True], ids=["one-step-prefill", "split-images"])
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_vl_greedy_parity_bf16_gpu(
    kind: str, split: bool, eager: bool, request: pytest.FixtureRequest, images: list[Any]
) -> None:
    fixture, variant, table = MODELS[kind]
    path = request.getfixturevalue(fixture)(variant)
    prompts = [(text, [images[j] for j in idx]) for text, idx in table]
    check_model(kind, path, prompts, CHUNKS[kind] if split else 8192, eager)


def test_tolerance_rule() -> None:
    """The rule itself (runs everywhere): equal tokens pass, a difference passes only at a near-tie
    step and ends the comparison there."""
    assert near_tie(torch.tensor([5.0, 5.0 - 0.01, 1.0]))  # gap 0.01 < 5 * 2**-7
    assert not near_tie(torch.tensor([5.0, 4.9, 1.0]))
    assert near_tie(torch.tensor([0.001, 0.0]))  # the absolute floor
    assert compare([1, 2, 3], [1, 2, 3], [False] * 3, "x") == 3
    assert compare([1, 9, 7], [1, 2, 3], [False, True, False], "x") == 1
    with pytest.raises(AssertionError, match="not a bf16 near-tie"):
        compare([1, 9, 3], [1, 2, 3], [True, False, True], "x")
