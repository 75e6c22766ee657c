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
