"""Incremental detokenization of one request's output, with stop strings.

Owns turning a stream of output token ids into a stream of text that is safe to show: never a
broken UTF-8 character, never a piece of a stop string that is later taken back, and, once the
request finishes, exactly ``tokenizer.decode(output_ids)`` (cut at the stop string, if one matched).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# What a decoder returns for bytes that are not (yet) a whole UTF-8 character.
_REPLACEMENT = "\ufffd"
_TABLE_ATTR = "_hotloop_byte_tables"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (the ByteLevel format)."""
    bs = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    )
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def byte_table(tokenizer: Any, skip_special_tokens: bool) -> list[bytes] | None:
    """Each token id's bytes, for a byte-level BPE tokenizer whose decode is exactly "concatenate
    the tokens' bytes and decode them as UTF-8, invalid bytes as U+FFFD" (a fast tokenizer with the
    ``ByteLevel`` decoder and no space clean-up); ``None`` for any other tokenizer.

    Special added tokens are empty with ``skip_special_tokens``; ids unknown to the vocabulary are
    empty (the backend skips them). Built once per tokenizer and flag, and checked against the
    backend's own decode on a sample of tokens before it is used."""
    cache = getattr(tokenizer, _TABLE_ATTR, None)
    if cache is not None and skip_special_tokens in cache:
        return cache[skip_special_tokens]  # type: ignore[no-any-return]
    table = _build_byte_table(tokenizer, skip_special_tokens)
    try:
        if cache is None:
            cache = {}
            setattr(tokenizer, _TABLE_ATTR, cache)
        cache[skip_special_tokens] = table
    except (AttributeError, TypeError):  # an object that takes no attributes: rebuild next time
        pass
    return table


def text_table(tokenizer: Any, skip_special_tokens: bool) -> list[str | None] | None:
    """``byte_table``'s entries as text where a token's bytes are whole UTF-8 characters on their
    own (``None`` where they are not): such a token, arriving when no character is in progress,
    needs no decoding at all."""
    table = byte_table(tokenizer, skip_special_tokens)
    if table is None:
        return None
    cache = getattr(tokenizer, _TABLE_ATTR, None)
    key = ("text", skip_special_tokens)
    if cache is not None and key in cache:
        return cache[key]  # type: ignore[no-any-return]
    texts: list[str | None] = []
    for b in table:
        try:
            texts.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(None)
    if cache is not None:
        cache[key] = texts
    return texts


def _build_byte_table(tokenizer: Any, skip_special_tokens: bool) -> list[bytes] | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True) is not False:
        return None
    try:
        decoder = json.loads(backend.to_str()).get("decoder") or {}
        vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
    except Exception:  # noqa: BLE001 - an unusual backend: use the general path
        return None
    if decoder.get("type") != "ByteLevel" or not vocab:
        return None
    byte_of = {c: bytes([b]) for b, c in _bytes_to_unicode().items()}
    table = [b""] * (max(vocab.values()) + 1)
    for piece, i in vocab.items():
        table[i] = b"".join(byte_of.get(c) or c.encode("utf-8") for c in piece)
    if skip_special_tokens:
        for i, tok in added.items():
            if getattr(tok, "special", False) and i < len(table):
                table[i] = b""
    # The backend is the reference: every id whose bytes are a whole text must decode to it.
    step = max(1, len(table) // 4000)
    for i in list(range(0, len(table), step)) + list(added):
        try:
            text = table[i].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if backend.decode([i], skip_special_tokens=skip_special_tokens) != text:
            return None
    return table


class IncrementalDetokenizer:
    """Decodes one request's output ids a few tokens at a time and applies its stop strings.

    Decoding uses two offsets into the output ids, ``prefix`` <= ``read``: the text of
    ``ids[prefix:read]`` is already known, so the text of new tokens is
    ``decode(ids[prefix:]) - decode(ids[prefix:read])``. Decoding with a few tokens of left context
    keeps what a lone token would decode differently (a SentencePiece word-start space, bytes of a
    character split across tokens) the same as in a full decode, while each step costs O(1) and
    not O(length). When the decoded window ends in U+FFFD the last character is incomplete: nothing
    is emitted and the window grows until the character completes. The offsets then move forward.

    The window starts at the first output token, so the finished text equals
    ``tokenizer.decode(output_ids, skip_special_tokens=...)``. ``prompt_token_ids`` is accepted for
    the vLLM-shaped signature but deliberately not used as left context: with a SentencePiece
    tokenizer that context would add a leading space to the first output token that a decode of
    the output ids alone does not have.

    Stop strings are searched in the decoded text across token boundaries. When several could
    match, the one that completes first as the text streams wins (for stop strings that do not
    overlap, simply the earliest in the text; at the same end, the longer one); this makes the
    result independent of how the text is split into tokens or ``add_tokens`` calls. Text after
    the stop string is dropped, and so is the stop string itself unless
    ``include_stop_str_in_output``. In that (default) case, a tail of the text that could be the
    start of a stop string is held back until it either completes the stop string or stops being
    a possible prefix.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        stop_words: tuple[str, ...] = (),
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self._tokenizer = tokenizer
        self.num_prompt_tokens = len(prompt_token_ids)
        self._skip_special_tokens = skip_special_tokens
        self._stop_words = tuple(s for s in stop_words if s)
        self._include_stop = include_stop_str_in_output
        # (min_new_tokens) stop strings that complete before this many tokens do not stop, as in vLLM;
        # the engine feeds such a request one token per step (no multi-step rounds until then)
        self._min_tokens = min_tokens
        self._ids: list[int] = []
        # A fast tokenizer without space clean-up decodes exactly as its Rust backend does; calling
        # the backend directly skips transformers' per-call argument conversion (most of the host
        # time of a large decode batch).
        backend = getattr(tokenizer, "backend_tokenizer", None)
        cleanup = getattr(tokenizer, "clean_up_tokenization_spaces", True)
        self._backend_decode = backend.decode if backend is not None and cleanup is False else None
        # A byte-level BPE tokenizer decodes token by token through a table and an incremental UTF-8
        # decoder: the same text, without a tokenizer call per token.
        self._table = byte_table(tokenizer, skip_special_tokens)
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        # Without stop strings nothing is ever held back or taken back: the table path then keeps
        # the emitted pieces in a list (no copy of the whole text per token).
        self._fast = self._table is not None and not self._stop_words
        self._texts = text_table(tokenizer, skip_special_tokens) if self._fast else None
        self._pieces: list[str] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_text = ""  # decode(ids[prefix_offset:read_offset])
        self._decoded = ""  # text of ids[:read_offset]; cut at the stop string once one matched
        self._emitted = 0  # length of the prefix of _decoded handed out so far
        self._stopped = False
        self._flushed = False

    @property
    def stopped(self) -> bool:
        """A stop string has matched; the request should finish with reason ``stop``."""
        return self._stopped

    @property
    def text(self) -> str:
        """All text emitted so far (by ``add_tokens`` and ``flush``)."""
        if self._fast:
            return "".join(self._pieces)
        return self._decoded[: self._emitted]

    @property
    def output_token_ids(self) -> list[int]:
        """Every output id given to ``add_tokens``, including any after a stop string."""
        return list(self._ids)

    def add_token(self, token_id: int) -> str:
        """``add_tokens([token_id])``, with a short path for the common case (a byte-level
        tokenizer, no stop strings): one table lookup and one incremental UTF-8 decode."""
        if not self._fast:
            return self.add_tokens((token_id,))
        if self._flushed:
            return ""
        self._ids.append(token_id)
        table = self._table
        texts = self._texts
        assert table is not None and texts is not None
        if not 0 <= token_id < len(table):
            return ""
        piece = texts[token_id]
        # No character in progress (the decoder holds no bytes) and the token is whole characters.
        if piece is None or self._utf8.getstate()[0]:
            piece = self._utf8.decode(table[token_id])
        if piece:
            self._pieces.append(piece)
        return piece

    @property
    def plain(self) -> bool:
        """The short path applies: a byte-level tokenizer's table and no stop strings (so nothing
        is ever held back or taken back and ``stopped`` stays False)."""
        return self._fast

    def add_plain_tokens(self, token_ids: list[int]) -> str:
        """``add_tokens`` on the ``plain`` path, for several ids at once (a multi-step decode round):
        when no character is in progress and every id is whole characters, one lookup per id and
        one join; otherwise one incremental decode of all their bytes."""
        if not self._fast:
            return self.add_tokens(token_ids)
        if self._flushed:
            return ""
        texts, table = self._texts, self._table
        assert texts is not None and table is not None
        n = len(texts)
        utf8 = self._utf8
        # no character in progress (the decoder holds no bytes) and every id is whole characters
        if token_ids and not utf8.getstate()[0] and min(token_ids) >= 0 and max(token_ids) < n:
            pieces = [texts[t] for t in token_ids]
            if None not in pieces:
                self._ids.extend(token_ids)
                text = "".join(pieces)  # type: ignore[arg-type]
                if text:
                    self._pieces.append(text)
                return text
        # Otherwise the ids' bytes in one incremental decode: the same text as decoding them one by
        # one (the decoder keeps an unfinished character's bytes for the next call either way)
        self._ids.extend(token_ids)
        text = utf8.decode(b"".join([table[t] for t in token_ids if 0 <= t < n]))
        if text:
            self._pieces.append(text)
        return text

    def add_tokens(self, new_token_ids: Sequence[int]) -> str:
        """Decode the new tokens and return the text that is now safe to emit (may be '').

        After a stop string matched (or after ``flush``) further tokens are ignored and '' is returned.
        """
        if self._fast:
            return "".join([self.add_token(int(t)) for t in new_token_ids])
        if self._stopped or self._flushed:
            return ""
        checked = len(self._decoded)
        table = self._table
        if table is not None:
            n = len(table)
            for token_id in new_token_ids:
                t = int(token_id)
                self._ids.append(t)
                if 0 <= t < n:
                    self._decoded += self._utf8.decode(table[t])
            return self._check_and_emit(checked, final=False)
        for token_id in new_token_ids:
            self._ids.append(int(token_id))
            self._advance(final=False)
        return self._check_and_emit(checked, final=False)

    def flush(self) -> str:
        """At finish: the text held back so far, i.e. a possible stop-string prefix that never
        completed and the bytes of an unfinished character (as U+FFFD, as a full decode gives them).
        Never the matched stop string unless ``include_stop_str_in_output``. Idempotent."""
        if self._flushed:
            return ""
        self._flushed = True
        if self._fast:
            piece = self._utf8.decode(b"", final=True)
            if piece:
                self._pieces.append(piece)
            return piece
        if self._stopped:
            return ""  # everything up to the stop string went out with the token that matched it
        checked = len(self._decoded)
        if self._table is not None:
            self._decoded += self._utf8.decode(b"", final=True)
        elif self._read_offset < len(self._ids):
            self._advance(final=True)
        return self._check_and_emit(checked, final=True)

    def _decode(self, ids: list[int]) -> str:
        if self._backend_decode is not None:
            return self._backend_decode(ids, skip_special_tokens=self._skip_special_tokens)
        text = self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)
        assert isinstance(text, str)
        return text

    def _advance(self, final: bool) -> None:
        """Move decoded text of ``ids[read_offset:]`` into ``_decoded`` if it ends on a whole character."""
        window = self._decode(self._ids[self._prefix_offset :])
        # A character is at most 4 bytes, so a window still ending in U+FFFD 4 tokens on holds invalid
        # bytes (random ids do this), not a character in progress: emit it rather than let it grow.
        incomplete = window.endswith(_REPLACEMENT) and len(self._ids) - self._read_offset < 4
        if not final and (len(window) <= len(self._prefix_text) or incomplete):
            return  # nothing visible yet, or an incomplete character: wait for more tokens
        self._decoded += window[len(self._prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])

    def _check_and_emit(self, checked: int, final: bool) -> str:
        """Look for a stop string in text added after ``checked`` and return what may now go out."""
        end = len(self._decoded)
        match = self._find_stop(checked) if len(self._ids) >= self._min_tokens else None
        if match is not None:
            start, stop_end = match
            end = stop_end if self._include_stop else start
            self._decoded = self._decoded[:end]
            self._stopped = True
        elif not final and not self._include_stop:
            # With the stop string included, a prefix of it is never taken back, so nothing is held.
            end -= self._partial_stop_len()
        end = max(end, self._emitted)
        piece = self._decoded[self._emitted : end]
        self._emitted = end
        return piece

    def _find_stop(self, checked: int) -> tuple[int, int] | None:
        """(start, end) of the stop string that completes first in the text, or None.

        Only matches ending after ``checked`` are new: earlier text was searched already.
        """
        best: tuple[int, int] | None = None
        for word in self._stop_words:
            start = self._decoded.find(word, max(0, checked - len(word) + 1))
            if start >= 0:
                # Earliest end first; at the same end the earlier start (the longer word) wins.
                key = (start + len(word), start)
                if best is None or key < best:
                    best = key
        return None if best is None else (best[1], best[0])

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of the decoded text that is a proper prefix of a stop string."""
        longest = 0
        for word in self._stop_words:
            for k in range(min(len(word) - 1, len(self._decoded)), longest, -1):
                if self._decoded.endswith(word[:k]):
                    longest = k
                    break
        return longest
