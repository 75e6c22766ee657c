"""Grammar-constrained output (JSON mode and JSON Schemas): the compiled JSON grammars of a
tokenizer, and one xgrammar matcher per request that says which tokens may come next and when the
output is over.

xgrammar is imported on the first JSON-mode request (``JsonGrammar``), never at start-up.

A request's allowed next tokens are an int32 bitmask of ``ceil(vocab_size / 32)`` words: bit
``t % 32`` of word ``t // 32`` is set when token ``t`` is allowed (xgrammar's layout, which the
sampler unpacks). ``vocab_size`` is the width of the model's logits, which may exceed the
tokenizer's vocabulary (padding rows of the LM head): those ids are never allowed.
"""

from __future__ import annotations

import importlib.util
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import torch

from hotloop.messages import RequestError

# OpenAI's JSON mode asks for an object; xgrammar's built-in JSON grammar also accepts a top-level
# array, so the grammar is the schema of "any object" instead (strict_mode=False: any properties).
_JSON_OBJECT_SCHEMA = '{"type": "object"}'

# Whitespace between JSON tokens is capped at this many characters in a row (llama.cpp's JSON
# grammar allows 20 too). xgrammar's default is unlimited, and a model that has lost its way can then
# emit newlines or tabs until max_tokens (vLLM issue 21026); pretty-printing (a newline and the
# indentation of a few levels) stays legal. Whitespace inside strings is not affected.
MAX_WHITESPACE = 20


def json_mode_available() -> bool:
    """Whether JSON mode can be served here (xgrammar is installed); it is not imported."""
    return importlib.util.find_spec("xgrammar") is not None


def require_json_mode() -> None:
    """Raise ``RequestError`` (param ``response_format``) when JSON mode cannot be served."""
    if not json_mode_available():
        raise RequestError(
            "response_format 'json_object' / 'json_schema' needs the xgrammar package, which is not installed "
            "(pip install 'xgrammar>=0.2')",
            param="response_format",
        )


class RequestGrammar:
    """One sequence's position in the grammar.

    Contract: the engine calls ``advance`` with every token the request outputs, in order, before
    the runner asks for the next ``next_token_bitmask`` (a JSON-mode request is never overlapped or
    run in a multi-step round, see ``Request.needs_output_history``).
    """

    def __init__(self, matcher: Any, bitmask_words: int) -> None:
        self._matcher = matcher
        self._words = bitmask_words
        self.rejected = False  # a token outside the grammar was output (all its tokens were masked)

    def next_token_bitmask(self) -> torch.Tensor:
        """The tokens allowed next: ``[ceil(vocab_size / 32)]`` int32 on the host. Stop ids are
        allowed exactly when the object is complete."""
        mask = torch.empty(1, self._words, dtype=torch.int32)
        self._matcher.fill_next_token_bitmask(mask, 0)
        return mask[0]

    @property
    def is_completed(self) -> bool:
        """The object is closed: only a stop id may follow."""
        return bool(self._matcher.is_completed())

    def advance(self, token_id: int) -> bool:
        """Accept the request's next output token; True when the output is over: the matcher took a
        stop id after a complete object, or the token broke the grammar (which the mask prevents,
        unless every token was masked)."""
        if not self._matcher.accept_token(token_id):
            self.rejected = True
            return True
        return bool(self._matcher.is_terminated())


class JsonGrammar:
    """The JSON grammars compiled for one tokenizer and logits width, and their matchers: the
    "any object" grammar (JSON mode) and one per JSON Schema (the most recent ``MAX_SCHEMAS``).

    Compiles on first use (thread-safe: ``Engine.add_request`` may run on any thread; the server
    compiles off its event loop first). A compiled grammar is shared by every request that uses it.
    """

    MAX_SCHEMAS = 64

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._compiler: Any = None
        self._compiled: OrderedDict[str | None, Any] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def bitmask_words(self) -> int:
        return -(-self.vocab_size // 32)

    def compiled(self, schema: str | None = None) -> Any:
        """The xgrammar ``CompiledGrammar`` of ``schema`` (a JSON Schema as JSON text; None: any
        object), compiled once. A schema xgrammar cannot compile raises ``RequestError`` naming
        ``json_schema``."""
        with self._lock:
            hit = self._compiled.get(schema)
            if hit is not None:
                self._compiled.move_to_end(schema)
                return hit
            require_json_mode()
            import xgrammar as xgr

            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            if schema is None:
                grammar = self._compiler.compile_json_schema(
                    _JSON_OBJECT_SCHEMA, strict_mode=False, max_whitespace_cnt=MAX_WHITESPACE
                )
            else:
                try:
                    grammar = self._compiler.compile_json_schema(
                        schema, strict_mode=True, max_whitespace_cnt=MAX_WHITESPACE
                    )
                except Exception as e:  # xgrammar raises RuntimeError / ValueError on bad schemas
                    # (its messages start with "[time] /source/file.cc:line: ")
                    why = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip())
                    raise RequestError(
                        f"json_schema could not be compiled into a grammar: {why}", param="json_schema"
                    ) from e
            self._compiled[schema] = grammar
            if len(self._compiled) > self.MAX_SCHEMAS + 1:  # (+1: the any-object grammar)
                oldest = next(k for k in self._compiled if k is not None)
                del self._compiled[oldest]
            return grammar

    def matcher(self, stop_token_ids: Iterable[int], schema: str | None = None) -> RequestGrammar:
        """A fresh matcher for one sequence, over ``schema`` (None: any object).
        ``stop_token_ids``: the ids that end it (EOS and the request's stop ids); empty means the
        tokenizer's EOS."""
        import xgrammar as xgr

        compiled = self.compiled(schema)
        stops = sorted(t for t in set(stop_token_ids) if 0 <= t < self.vocab_size)
        matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stops or None)
        return RequestGrammar(matcher, self.bitmask_words)
