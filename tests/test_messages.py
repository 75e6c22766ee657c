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


@pytest.mark.parametrize(
    "field", ["n", "max_new_tokens", "top_k", "min_new_tokens", "logprobs", "random_seed"]
)
def test_integer_fields_refuse_bools(field: str) -> None:
    """``True`` is an ``int`` to Python: ``n=True`` ran as one choice, ``top_k=False`` as no top-k."""
    with pytest.raises(RequestError, match=f"{field}=True must be an integer") as e:
        GenerationConfig(**{field: True})  # type: ignore[arg-type]
    assert e.value.param == field
    assert getattr(GenerationConfig(**{field: 1}), field) == 1  # the integer itself passes


def test_repetition_penalty_has_a_floor_that_keeps_logits_finite() -> None:
    """A penalty of 1e-308 is 0 in float32: the penalised logits divided into inf and the row went NaN."""
    import torch

    from hotloop.messages import MIN_REPETITION_PENALTY

    for bad in (0.0, 1e-308, MIN_REPETITION_PENALTY / 2):
        with pytest.raises(RequestError, match="repetition_penalty=.* must be >= 1e-06") as e:
            GenerationConfig(repetition_penalty=bad)
        assert e.value.param == "repetition_penalty"
    assert torch.tensor(1e-308, dtype=torch.float32) == 0  # why: the value the sampler would divide by
    logits = torch.tensor([40.0, -40.0]) / torch.tensor(MIN_REPETITION_PENALTY, dtype=torch.float32)
    assert torch.isfinite(torch.softmax(logits, 0)).all()
    assert (
        GenerationConfig(repetition_penalty=MIN_REPETITION_PENALTY).repetition_penalty
        == MIN_REPETITION_PENALTY
    )
