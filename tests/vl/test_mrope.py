"""M-RoPE: prompt positions and deltas equal transformers' ``get_rope_index`` (Qwen2-VL and
Qwen2.5-VL), a step's positions slice them per chunk, and ``MRotaryEmbedding`` equals transformers'
rotary for ``[3, T]`` positions and plain rotary for ``[T]``."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hotloop.layers.rotary import MRotaryEmbedding, RopeConfig, RotaryEmbedding
from hotloop.vl.inputs import ImageInput
from hotloop.vl.mrope import GRID_KEY, prompt_positions, step_positions

MERGE = 2
IMAGE_ID = 60
Segment = tuple[str, Any]  # ("text", n) or ("image", (h', w'))


def _tiny_hf_model(variant: str) -> Any:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel, Qwen2VLConfig, Qwen2VLModel

    text = dict(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    if variant == "qwen2_vl":
        vision = dict(depth=1, embed_dim=8, hidden_size=16, num_heads=2, spatial_merge_size=MERGE)
        return Qwen2VLModel(Qwen2VLConfig(vision_config=vision, text_config=text, image_token_id=IMAGE_ID))
    vision = dict(depth=1, hidden_size=8, out_hidden_size=16, num_heads=2, spatial_merge_size=MERGE)
    return Qwen2_5_VLModel(Qwen2_5_VLConfig(vision_config=vision, text_config=text, image_token_id=IMAGE_ID))


def _layout(segments: list[Segment]) -> tuple[list[int], list[ImageInput], list[list[int]]]:
    """Token ids, our ImageInputs and transformers' image_grid_thw rows for a prompt layout."""
    ids: list[int] = []
    mm: list[ImageInput] = []
    grids: list[list[int]] = []
    for kind, what in segments:
        if kind == "text":
            ids += [5] * what
            continue
        h, w = what
        mm.append(ImageInput(torch.empty(0), len(ids), h * w, "", {GRID_KEY: (1, h, w)}))
        grids.append([1, h * MERGE, w * MERGE])
        ids += [IMAGE_ID] * (h * w)
    return ids, mm, grids


def _random_layouts(n: int) -> list[list[Segment]]:
    rng = random.Random(11)
    out = []
    for _ in range(n):
        segments: list[Segment] = []
        for i in range(rng.randint(1, 4)):
            if i or rng.random() < 0.5:  # images never touch: text (vision start/end) lies between
                segments.append(("text", rng.randint(1, 6)))
            segments.append(("image", (rng.randint(1, 6), rng.randint(1, 6))))
        if rng.random() < 0.5:
            segments.append(("text", rng.randint(1, 6)))
        out.append(segments)
    return out


FIXED_LAYOUTS: list[list[Segment]] = [
    [("text", 3), ("image", (2, 3)), ("text", 4)],
    [("image", (1, 1)), ("text", 2), ("image", (4, 2)), ("text", 1), ("image", (3, 5))],
    [("text", 2), ("image", (6, 1)), ("text", 1), ("image", (1, 6))],
]


@pytest.mark.parametrize("variant", ["qwen2_vl", "qwen2_5_vl"])
def test_prompt_positions_equal_get_rope_index(variant: str) -> None:
    model = _tiny_hf_model(variant)
    for segments in FIXED_LAYOUTS + _random_layouts(30):
        ids, mm, grids = _layout(segments)
        input_ids = torch.tensor([ids])
        expected, delta = model.get_rope_index(
            input_ids, mm_token_type_ids=(input_ids == IMAGE_ID).int(), image_grid_thw=torch.tensor(grids)
        )
        got = prompt_positions(len(ids), mm)
        assert got is not None
        assert torch.equal(got[0], expected[:, 0]), segments
        assert got[1] == int(delta), segments


def test_text_only_prompts_keep_plain_positions() -> None:
    assert prompt_positions(5, []) is None
    plain = ImageInput(torch.empty(0), 1, 2, "")  # an image without an M-RoPE grid (e.g. LLaVA)
    assert prompt_positions(5, [plain]) is None


def test_step_positions_slice_prompt_chunks() -> None:
    """A chunk of an M-RoPE prompt takes its columns; a decode row repeats ``index + delta``."""
    ids, mm, _ = _layout([("text", 2), ("image", (2, 3)), ("text", 3)])
    pos, delta = prompt_positions(len(ids), mm) or (torch.empty(0), 0)
    assert delta == 8 - 11  # text 0-1, image rows 2-4, text 5-7: the 11th token sits at 7
    prompt = SimpleNamespace(mrope_positions=pos, num_prompt_tokens=len(ids))
    decode = SimpleNamespace(mrope_positions=None, num_prompt_tokens=4)
    scheduled = [
        SimpleNamespace(request=prompt, start=3, num_tokens=5),
        SimpleNamespace(request=decode, start=6, num_tokens=1),
    ]
    flat = torch.tensor([3, 4, 5, 6, 7, 6])  # what the runner gives: index + delta per token
    rows = step_positions(scheduled, flat)
    assert rows.shape == (3, 6)
    assert torch.equal(rows[:, :5], pos[:, 3:8])
    assert rows[:, 5].tolist() == [6, 6, 6]
    assert step_positions(scheduled[1:], flat[5:]).dim() == 1  # no prompt token: plain positions


def test_mrotary_equals_transformers() -> None:
    from transformers import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    section = [2, 3, 3]
    cfg = Qwen2VLTextConfig(
        hidden_size=64,
        num_attention_heads=4,
        rope_parameters={"rope_type": "default", "rope_theta": 50.0, "mrope_section": section},
    )
    hf = Qwen2VLRotaryEmbedding(cfg)
    ours = MRotaryEmbedding(16, RopeConfig.from_hf(cfg), section)
    positions = torch.randint(0, 300, (3, 40))
    cos, sin = hf(torch.zeros(1, dtype=torch.float32), positions[:, None, :])  # [3, 1, T] -> [1, T, 16]
    got_cos, got_sin = ours.cos_sin(positions)
    assert got_cos.is_contiguous() and got_sin.is_contiguous()  # the fused rotary kernel's layout
    torch.testing.assert_close(torch.cat([got_cos, got_cos], -1), cos[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.cat([got_sin, got_sin], -1), sin[0], atol=1e-6, rtol=0)
    flat = positions[0]
    plain = RotaryEmbedding(16, RopeConfig.from_hf(cfg)).cos_sin(flat)
    for a, b, c in zip(ours.cos_sin(flat), ours.cos_sin(flat.expand(3, -1)), plain, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    with pytest.raises(ValueError, match="add up to rotary_dim / 2"):
        MRotaryEmbedding(16, RopeConfig.from_hf(cfg), [2, 2, 2])
