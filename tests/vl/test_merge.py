"""``vl/merge.py``: encoder batches count tiles, embeddings land at their tokens, chunked steps."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hotloop.vl.inputs import ImageInput
from hotloop.vl.merge import encode_missing, encoder_units, merged_embeddings


class ToyVLM:
    """Embeds token ids as ``[id, 0]``; an image's embeddings are ``[k, image tag]`` per token."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([input_ids.float(), torch.zeros(len(input_ids))], dim=1)

    def encode_images(self, pixel_values: list[torch.Tensor]) -> list[torch.Tensor]:
        self.batches.append(sum(p.shape[0] if p.dim() == 4 else 1 for p in pixel_values))
        out = []
        for p in pixel_values:
            n = int(p.reshape(-1)[1].item())  # the test stores the token count in the pixels
            tag = float(p.reshape(-1)[0].item())
            out.append(torch.stack([torch.arange(n).float(), torch.full((n,), tag)], dim=1))
        return out


def image(tag: int, offset: int, length: int, tiles: int | None) -> ImageInput:
    shape = (tiles, 3, 2, 2) if tiles else (3, 2, 2)
    pv = torch.zeros(shape)
    pv.view(-1)[0] = tag
    pv.view(-1)[1] = length
    return ImageInput(pv, offset, length, f"h{tag}")


def step(req: Any, start: int, n: int) -> Any:
    return SimpleNamespace(request=req, start=start, num_tokens=n)


def request(rid: str, *imgs: ImageInput) -> Any:
    return SimpleNamespace(request_id=rid, mm_inputs=tuple(imgs), mm_embeds={})


def test_encoder_units_count_tiles() -> None:
    assert encoder_units(image(1, 0, 4, None)) == 1
    assert encoder_units(image(1, 0, 4, 5)) == 5
    qwen_patches = ImageInput(torch.zeros(64, 1176), 0, 16, "q")  # Qwen2-VL: a patch sequence
    assert encoder_units(qwen_patches) == 1


@pytest.mark.parametrize(
    ("tiles", "cap", "expected"),
    [
        ([None, None, None], 2, [2, 1]),
        ([5, 5, 1], 8, [5, 6]),  # 5 + 5 > 8: the second tiled image starts a new batch
        ([5, 5, 1], 16, [11]),
        ([9, 1], 4, [9, 1]),  # an image over the cap goes alone
    ],
)
def test_encoder_batches_respect_the_cap_in_tiles(
    tiles: list[int | None], cap: int, expected: list[int]
) -> None:
    model = ToyVLM()
    reqs = [request(str(i), image(i + 1, 2, 3, t)) for i, t in enumerate(tiles)]
    encode_missing(model, [step(r, 0, 8) for r in reqs], cap)  # type: ignore[arg-type]
    assert model.batches == expected
    assert all(0 in r.mm_embeds for r in reqs)


def test_embeddings_land_at_image_tokens_across_chunks() -> None:
    model = ToyVLM()
    req = request("r", image(7, 2, 3, 2))  # tokens 2, 3, 4 are the image's
    ids = torch.tensor([10, 11, 0, 0, 0, 12])
    first = merged_embeddings(model, [step(req, 0, 4)], ids[:4], max_batch=16)  # type: ignore[arg-type]
    assert first.tolist() == [[10, 0], [11, 0], [0, 7], [1, 7]]
    second = merged_embeddings(model, [step(req, 4, 2)], ids[4:], max_batch=16)  # type: ignore[arg-type]
    assert second.tolist() == [[2, 7], [12, 0]]
    assert model.batches == [2]  # encoded once, for the step that first touched it
