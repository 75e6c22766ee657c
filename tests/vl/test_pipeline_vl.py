"""The Python API with images: ``pipe((text, image))``, batches of ``(text, [images])``, OpenAI message
lists with ``image_url`` parts, and ``stream_infer``; greedy tokens equal transformers' on the same
inputs (LLaVA tiny checkpoint)."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from vlm_fixtures import hf_llava_greedy

from hotloop import pipeline
from hotloop.config import EngineConfig
from hotloop.messages import GenerationConfig, RequestError

MAX_NEW = 6
GEN = GenerationConfig(max_new_tokens=MAX_NEW, ignore_eos=True)
CFG = EngineConfig(
    device="cpu", dtype="float32", cache_block_seq_len=4, cache_max_entry_count=192, max_prefill_token_num=16
)


def _data_url(img: Any) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_pipeline_with_images(
    make_tiny_llava: Callable[[str], Path], images: list[Any], tmp_path: Path
) -> None:
    path = make_tiny_llava("default")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    chat = tok.apply_chat_template(
        [
            {"role": "user", "content": "<image>\nWhat is this?\n<image>\nand this"}
        ],  # parts joined by newlines
        add_generation_prompt=True,
        tokenize=False,
    )
    refs = [
        ("Describe <image> now", [images[0]]),
        ("Compare <image> and <image>", [images[1], images[2]]),
        ("plain text", []),
        ("<image>\n<image>\nno placeholders given", [images[3], images[4]]),
        (chat, [images[1], images[2]]),
    ]
    expected = [out for _ids, out in hf_llava_greedy(path, refs, MAX_NEW)]
    png = tmp_path / "img2.png"
    images[2].save(png)

    with pipeline(str(path), CFG) as pipe:
        assert pipe(("Describe <image> now", images[0]), GEN, do_preprocess=False).token_ids == expected[0]
        batch = pipe(
            [
                ("Compare <image> and <image>", [images[1], str(png)]),
                "plain text",
                ("no placeholders given", [images[3], images[4]]),
            ],
            GEN,
            do_preprocess=False,
        )
        assert [r.token_ids for r in batch] == [expected[1], expected[2], expected[3]]

        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": _data_url(images[1]), "detail": "high"}},
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": png.as_uri()}},
                    {"type": "text", "text": "and this"},
                ],
            }
        ]
        assert pipe(messages, GEN).token_ids == expected[4]

        streamed: dict[int, list[int]] = {}
        for r in pipe.stream_infer(
            [("Describe <image> now", [images[0]]), ("Compare <image> and <image>", [images[1], images[2]])],
            GEN,
            do_preprocess=False,
        ):
            streamed.setdefault(r.index, []).extend(r.token_ids)
        assert streamed == {0: expected[0], 1: expected[1]}

        # LMDeploy's VL chat form: the turn is a user message with the image in front of the text
        turn = [{"role": "user", "content": [{"type": "image_url", "image_url": images[0]},
                                             {"type": "text", "text": "Describe it"}]}]  # fmt: skip
        sess = pipe.chat(("Describe it", images[0]), gen_config=GEN)
        assert sess.response is not None and sess.response.token_ids == pipe(turn, GEN).token_ids
        for bad in (["hello"], 42):
            with pytest.raises(RequestError, match="chat\\(\\) takes a string"):
                pipe.chat(bad)  # type: ignore[arg-type]

        with pytest.raises(RequestError, match="2 image placeholder.*1 image"):
            pipe(("<image> <image>", images[0]), GEN, do_preprocess=False)
        assert pipe.engine.num_free_blocks == pipe.engine.num_total_blocks


def test_text_model_refuses_images(make_tiny_model: Callable[[str], Path], images: list[Any]) -> None:
    with pipeline(str(make_tiny_model("llama_mha_odd")), CFG) as pipe:
        with pytest.raises(RequestError, match="does not take images"):
            pipe(("hello", images[1]), GEN)
        # two strings in a tuple stay two text prompts for a text model
        assert len(pipe(("hello", "world"), GEN)) == 2


def test_too_many_images_are_refused_before_the_rest_load(
    make_tiny_llava: Callable[[str], Path], images: list[Any]
) -> None:
    """Once the expanded images fill the context the request is refused, naming how far it got,
    before the later images are fetched: the undecodable last one is never read. A bad image is
    named by its index."""
    path = make_tiny_llava("default")
    garbage = "data:image/png;base64," + base64.b64encode(b"not an image").decode()
    cfg = EngineConfig(device="cpu", dtype="float32", cache_block_seq_len=4, session_len=256)
    with pipeline(str(path), cfg) as pipe:
        many = [images[0]] * 300 + [garbage]
        with pytest.raises(RequestError, match=r"with the first \d+ of its 301 image\(s\).*within 256") as e:
            pipe(("look", many), GEN, do_preprocess=False)
        assert e.value.param == "messages"
        with pytest.raises(RequestError, match="image 1 of 2: cannot decode"):
            pipe(("look", [images[0], garbage]), GEN, do_preprocess=False)
        assert pipe.engine.num_free_blocks == pipe.engine.num_total_blocks
