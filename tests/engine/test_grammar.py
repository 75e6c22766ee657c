"""JSON mode's grammar state (``engine/grammar.py``) over the tiny trained tokenizer: the bitmask covers
the logits' (padded) width, stop ids only after a complete object, termination and rejection."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_archs import TINY_VOCAB

from hotloop.engine import grammar
from hotloop.engine.grammar import JsonGrammar, RequestGrammar, require_json_mode
from hotloop.messages import RequestError

PADDED = TINY_VOCAB + 40  # an LM head wider than the tokenizer (padding rows)


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))


@pytest.fixture(scope="module")
def json_grammar(tokenizer: Any) -> JsonGrammar:
    return JsonGrammar(tokenizer, PADDED)


def allowed(g: RequestGrammar) -> set[int]:
    words = g.next_token_bitmask()
    bits = (words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return set(bits.flatten().nonzero().flatten().tolist())


def feed(g: RequestGrammar, tokenizer: Any, text: str) -> list[bool]:
    return [g.advance(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def test_bitmask_covers_the_logits_width_and_never_allows_padding(json_grammar: JsonGrammar) -> None:
    g = json_grammar.matcher([2])
    words = g.next_token_bitmask()
    assert words.dtype == torch.int32 and words.shape == (-(-PADDED // 32),)
    first = allowed(g)
    assert first and max(first) < TINY_VOCAB
    assert 2 not in first  # nothing written yet: the output cannot end
    assert json_grammar.compiled() is json_grammar.compiled()  # compiled once


def test_a_closed_object_allows_only_the_stop_ids_and_terminates_on_one(
    json_grammar: JsonGrammar, tokenizer: Any
) -> None:
    g = json_grammar.matcher([2, 7])
    assert not any(feed(g, tokenizer, '{"a": [1, true], "b": {"c": null}}'))
    assert g.is_completed
    assert allowed(g) == {2, 7}
    assert g.advance(7) is True and not g.rejected


def test_an_open_object_masks_the_stop_ids(json_grammar: JsonGrammar, tokenizer: Any) -> None:
    g = json_grammar.matcher([2])
    assert not any(feed(g, tokenizer, '{"key": "val'))
    assert not g.is_completed
    assert 2 not in allowed(g)


def test_a_token_outside_the_grammar_ends_the_output(json_grammar: JsonGrammar, tokenizer: Any) -> None:
    g = json_grammar.matcher([2])
    (bad,) = tokenizer.encode("x", add_special_tokens=False)  # an object cannot start with x
    assert bad not in allowed(g)
    assert g.advance(bad) is True and g.rejected


@pytest.mark.parametrize("schema", [None, '{"type": "object"}'])
def test_whitespace_between_tokens_is_capped_but_pretty_printing_is_not(
    json_grammar: JsonGrammar, tokenizer: Any, schema: str | None
) -> None:
    (newline,) = tokenizer.encode("\n", add_special_tokens=False)
    g = json_grammar.matcher([2], schema)
    assert not any(feed(g, tokenizer, '{\n    "a": {\n        "b": "  x  "\n    }\n}'))
    assert g.is_completed
    g = json_grammar.matcher([2], schema)
    assert not any(feed(g, tokenizer, "{"))
    for _ in range(grammar.MAX_WHITESPACE):
        assert newline in allowed(g)
        assert g.advance(newline) is False
    assert newline not in allowed(g)  # a runaway run of whitespace ends here
    assert not any(feed(g, tokenizer, '"a": 1}')) and g.is_completed


SCHEMA = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'


def test_a_schema_allows_what_it_describes_and_nothing_else(
    json_grammar: JsonGrammar, tokenizer: Any
) -> None:
    g = json_grammar.matcher([2], SCHEMA)
    assert not any(feed(g, tokenizer, '{"n": 12}'))
    assert g.is_completed and allowed(g) == {2}
    g = json_grammar.matcher([2], SCHEMA)
    assert not any(feed(g, tokenizer, '{"n": '))
    (quote,) = tokenizer.encode('"', add_special_tokens=False)
    assert quote not in allowed(g)  # n is an integer: no string may start here
    assert json_grammar.compiled(SCHEMA) is json_grammar.compiled(SCHEMA)  # compiled once


def test_a_schema_that_does_not_compile_is_a_request_error(json_grammar: JsonGrammar) -> None:
    with pytest.raises(
        RequestError, match='json_schema could not be compiled.*Unsupported type "nonsense"'
    ) as e:
        json_grammar.compiled('{"type": "nonsense"}')
    assert e.value.param == "json_schema"


def test_without_xgrammar_json_mode_is_a_request_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        grammar.importlib.util, "find_spec", lambda name, *a: None if name == "xgrammar" else real(name, *a)
    )
    assert not grammar.json_mode_available()
    with pytest.raises(RequestError, match="xgrammar") as e:
        require_json_mode()
    assert e.value.param == "response_format"
