"""``GenerationConfig`` validation: a bad field raises ``RequestError`` naming it and the allowed values."""

from __future__ import annotations

import pytest

from hotloop.messages import GenerationConfig, RequestError


@pytest.mark.parametrize("fmt", [None, "text", "json_object", "json_schema"])
def test_response_format_accepts_the_known_formats(fmt: str | None) -> None:
    schema = '{"type": "object"}' if fmt == "json_schema" else None
    cfg = GenerationConfig(response_format=fmt, json_schema=schema)
    assert cfg.response_format == fmt
    assert cfg.json_mode is (fmt in ("json_object", "json_schema"))


@pytest.mark.parametrize("fmt", ["json", "", {"type": "json_object"}])
def test_response_format_rejects_anything_else(fmt: object) -> None:
    with pytest.raises(RequestError, match="response_format=.* must be None, 'text', 'json_object' or") as e:
        GenerationConfig(response_format=fmt)  # type: ignore[arg-type]
    assert e.value.param == "response_format"


@pytest.mark.parametrize("schema", [None, "", "[1]", "{not json", 7])
def test_json_schema_needs_a_schema_object(schema: object) -> None:
    with pytest.raises(RequestError, match="must be a JSON Schema object") as e:
        GenerationConfig(response_format="json_schema", json_schema=schema)  # type: ignore[arg-type]
    assert e.value.param == "json_schema"


def test_json_schema_only_with_its_format() -> None:
    with pytest.raises(RequestError, match="only used with response_format='json_schema'") as e:
        GenerationConfig(response_format="json_object", json_schema='{"type": "object"}')
    assert e.value.param == "json_schema"


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "1", True])
def test_logit_bias_values_are_numbers_below_inf(value: object) -> None:
    """A +inf bias makes the softmax NaN (a sampled request then drew token 0), so it is refused
    like NaN; finite biases of any size pass, and -inf bans a token (the engine's bad_words)."""
    with pytest.raises(RequestError, match="logit_bias.*below \\+inf") as e:
        GenerationConfig(logit_bias={42: value})  # type: ignore[dict-item]
    assert e.value.param == "logit_bias"
    ok = {42: 1e30, 7: -100, 8: float("-inf")}
    assert GenerationConfig(logit_bias=ok).logit_bias == ok
