"""``api/build.py``: what building an engine says about its configuration."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig


def test_session_len_past_the_models_positions_is_said(
    make_tiny_model: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Allowed, as in LMDeploy, but logged as a warning (a review found it passed silently)."""
    path = make_tiny_model("llama_gqa_llama3rope")
    positions = json.loads((path / "config.json").read_text())["max_position_embeddings"]
    root = logging.getLogger("hotloop")  # (it does not propagate to the root logger caplog watches)
    root.addHandler(caplog.handler)
    try:
        for session_len in (positions, 2 * positions):
            cfg = EngineConfig(
                device="cpu", dtype="float32", session_len=session_len, cache_max_entry_count=64
            )
            build_engine(str(path), cfg)
    finally:
        root.removeHandler(caplog.handler)
    warned = [
        r.getMessage()
        for r in caplog.records
        if "exceeds the model's max_position_embeddings" in r.getMessage()
    ]
    assert warned == [
        f"session_len={2 * positions} exceeds the model's max_position_embeddings={positions}: positions past "
        f"{positions} are beyond what the model was trained on, and its outputs there may degrade"
    ]


def _warnings(caplog: pytest.LogCaptureFixture, build: Callable[[], object]) -> list[str]:
    root = logging.getLogger("hotloop")
    root.addHandler(caplog.handler)
    try:
        build()
    finally:
        root.removeHandler(caplog.handler)
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_pool_smaller_than_one_session_is_said(
    make_tiny_model: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    """``--cache-max-entry-count 80`` (percent in mind) gave 80 blocks, fewer tokens than one session,
    silently: requests were then limited to the pool."""
    path = make_tiny_model("llama_gqa_llama3rope")
    cfg = EngineConfig(
        device="cpu", dtype="float32", session_len=256, cache_max_entry_count=2, cache_block_seq_len=64
    )
    warned = _warnings(caplog, lambda: build_engine(str(path), cfg))
    assert any(
        "the KV pool holds 128 tokens (2 blocks of 64), fewer than one session of 256" in w for w in warned
    ), warned
    caplog.clear()
    cfg = EngineConfig(
        device="cpu", dtype="float32", session_len=128, cache_max_entry_count=2, cache_block_seq_len=64
    )
    assert not any("KV pool" in w for w in _warnings(caplog, lambda: build_engine(str(path), cfg)))


def test_broken_model_files_are_named_before_the_weights_load(
    make_tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    import shutil

    src = make_tiny_model("llama_gqa_llama3rope")
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    (bad / "config.json").write_text("{bad")
    with pytest.raises(
        ValueError, match=r"config.json is not valid JSON \(Expecting property name.*line 1 column 2\)"
    ):
        build_engine(str(bad), EngineConfig(device="cpu", cache_max_entry_count=4))
    notok = tmp_path / "notok"
    notok.mkdir()
    for f in src.iterdir():
        if f.suffix in (".json", ".safetensors") and not f.name.startswith(
            ("tokenizer", "special_tokens", "vocab")
        ):
            shutil.copy(f, notok / f.name)
    with pytest.raises(ValueError, match="its tokenizer cannot be loaded"):
        build_engine(str(notok), EngineConfig(device="cpu", cache_max_entry_count=4))


@pytest.mark.parametrize("config", [{"device": "cpu"}, {}, "cpu"])
def test_a_backend_config_that_is_not_an_engine_config_is_named(config: object) -> None:
    """``pipeline(backend_config=...)`` with a dict (or another config) failed with "'dict' object has
    no attribute 'seed'", and an empty dict silently meant the defaults; it is refused by name before
    anything loads."""
    with pytest.raises(TypeError, match="backend_config must be an EngineConfig.*got (dict|str)"):
        build_engine(None, config)  # type: ignore[arg-type]
