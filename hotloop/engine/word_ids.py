"""Words to token ids for ``GenerationConfig``'s word lists: stop words that are special tokens, and
``bad_words``.

Stop words are matched in the output text (``detokenizer.py``), from which special tokens are
dropped by default; a stop word that is the text of a special token (``"<|im_end|>"``,
``"<|eot_id|>"``) therefore stops as that token's id instead, as LMDeploy turns such words into
stop ids. ``bad_words`` ban, as LMDeploy's do, every vocabulary token whose text contains the word;
a word split over several tokens is not caught.
"""

from __future__ import annotations

import threading
from typing import Any

from hotloop.engine.detokenizer import text_table

# A word inside more tokens than this (a single letter, a space) would ban a large part of the
# vocabulary: only the tokens that spell it alone are banned then.
MAX_BANNED_PER_WORD = 256


class WordIds:
    """One tokenizer's special tokens by text, and its vocabulary's texts (built on first use)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._special: dict[str, int] | None = None
        self._texts: list[str] | None = None
        self._lock = threading.Lock()

    @property
    def special(self) -> dict[str, int]:
        """Text -> id of every special (added) token."""
        if self._special is None:
            found: dict[str, int] = {}
            decoder = getattr(self._tokenizer, "added_tokens_decoder", None) or {}
            for i, tok in decoder.items():
                if getattr(tok, "special", False) and 0 <= i < self._vocab_size:
                    found[str(tok)] = i
            self._special = found
        return self._special

    def split_stop_words(self, words: tuple[str, ...]) -> tuple[tuple[str, ...], set[int]]:
        """``words`` -> (the words matched as text, the ids of those that are special tokens)."""
        special = self.special
        return tuple(w for w in words if w not in special), {special[w] for w in words if w in special}

    def _vocab_texts(self) -> list[str]:
        with self._lock:
            if self._texts is None:
                fast = text_table(self._tokenizer, False)
                if fast is not None:
                    texts = [t if t is not None else "" for t in fast[: self._vocab_size]]
                else:
                    n = min(self._vocab_size, len(self._tokenizer))
                    texts = self._tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False)
                self._texts = texts
            return self._texts

    def banned_ids(self, words: tuple[str, ...]) -> set[int]:
        """The ids of every token whose text contains one of ``words`` (a word in more than
        ``MAX_BANNED_PER_WORD`` tokens: the tokens whose text is the word, with or without a
        leading space)."""
        texts = self._vocab_texts()
        out: set[int] = set()
        for w in words:
            hits = [i for i, t in enumerate(texts) if w in t]
            if len(hits) > MAX_BANNED_PER_WORD:
                hits = [i for i, t in enumerate(texts) if t.strip() == w.strip()]
            out.update(hits)
        return out
