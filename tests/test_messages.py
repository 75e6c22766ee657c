"""``GenerationConfig`` validation: a bad field raises ``RequestError`` naming it and the allowed values."""

from __future__ import annotations

import pytest

from hotloop.messages import GenerationConfig, RequestError


@pytest.mark.parametrize("fmt", [None, "text", "json_object"])
def test_response_format_accepts_the_known_formats(fmt: str | None) -> None:
    cfg = GenerationConfig(response_format=fmt)
    assert cfg.response_format == fmt
    assert cfg.json_mode is (fmt == "json_object")


@pytest.mark.parametrize("fmt", ["json", "json_schema", "", {"type": "json_object"}])
def test_response_format_rejects_anything_else(fmt: object) -> None:
    with pytest.raises(RequestError, match="response_format=.* must be None, 'text' or 'json_object'") as e:
        GenerationConfig(response_format=fmt)  # type: ignore[arg-type]
    assert e.value.param == "response_format"
