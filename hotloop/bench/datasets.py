"""Prompt sets for ``hotloop bench serve``: ``random`` and ``synthetic-chat``.

Both are generated from ``--seed``. With a tokenizer, a prompt of N tokens is N random token ids
decoded to text (re-encoding may differ by a token or two). Without one, a prompt of N tokens is N
common English words, each about one token in the usual BPE vocabularies; the report counts
prompt tokens from the server's ``usage`` either way.

``synthetic-chat`` stands in for ShareGPT, which is not available offline: input and output
lengths are independent log-normals, by default input median 180 tokens (sigma 1.0, clipped to
[4, 2048]) and output median 160 tokens (sigma 0.8, clipped to [4, 1024]), roughly the shape of
ShareGPT's conversation turns (long-tailed, most prompts short, a few very long).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

_WORDS = (
    "the of and to in is was for on as with by at from that this which are be or an it his her their has "
    "had have not but were all one two new first after also more time year years city people world state "
    "school music war film book game team water house light river house market paper story system power "
    "family country history language science number group place point work life name part day night road"
).split()


@dataclass(frozen=True)
class BenchRequest:
    """One request: its prompt (text, or token ids for /v1/completions), the planned prompt length
    in tokens, and max_tokens."""

    prompt: str | list[int]
    prompt_len: int
    output_len: int


def make_text(num_tokens: int, rng: random.Random, tokenizer: Any | None = None) -> str:
    """About ``num_tokens`` tokens of text."""
    if tokenizer is not None:
        vocab = int(getattr(tokenizer, "vocab_size", 32000))
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        ids: list[int] = []
        while len(ids) < num_tokens:
            t = rng.randrange(vocab)
            if t not in special:
                ids.append(t)
        return str(tokenizer.decode(ids, skip_special_tokens=True))
    return " ".join(rng.choice(_WORDS) for _ in range(num_tokens))


def _span(length: int, ratio: float) -> tuple[int, int]:
    lo = max(1, int(round(length * (1.0 - ratio))))
    hi = max(lo, int(round(length * (1.0 + ratio))))
    return lo, hi


def random_dataset(
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    seed: int = 0,
    tokenizer: Any | None = None,
    token_id_vocab: int | None = None,
) -> list[BenchRequest]:
    """Lengths uniform in ``[L * (1 - ratio), L * (1 + ratio)]``; an optional shared prefix.

    With ``token_id_vocab``, prompts are lists of random token ids in ``[0, token_id_vocab)``: exact
    lengths whatever the tokenizer (for ``/v1/completions``, which accepts token ids)."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio={range_ratio} must lie in [0, 1)")
    if input_len < 1 or output_len < 1 or num_prompts < 1:
        raise ValueError("--random-input-len, --random-output-len and --num-prompts must be >= 1")
    rng = random.Random(seed)
    in_lo, in_hi = _span(input_len, range_ratio)
    out_lo, out_hi = _span(output_len, range_ratio)
    out = []
    if token_id_vocab is not None:
        if token_id_vocab < 1:
            raise ValueError(f"--random-token-ids={token_id_vocab} must be a vocabulary size >= 1")
        prefix_ids = [rng.randrange(token_id_vocab) for _ in range(prefix_len)]
        for _ in range(num_prompts):
            n_in = rng.randint(in_lo, in_hi)
            ids = prefix_ids + [rng.randrange(token_id_vocab) for _ in range(n_in)]
            out.append(BenchRequest(ids, len(ids), rng.randint(out_lo, out_hi)))
        return out
    prefix = make_text(prefix_len, rng, tokenizer) + " " if prefix_len > 0 else ""
    for _ in range(num_prompts):
        n_in = rng.randint(in_lo, in_hi)
        n_out = rng.randint(out_lo, out_hi)
        out.append(BenchRequest(prefix + make_text(n_in, rng, tokenizer), prefix_len + n_in, n_out))
    return out


def _lognormal_len(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma)))))


def synthetic_chat_dataset(
    num_prompts: int,
    seed: int = 0,
    input_median: float = 180.0,
    input_sigma: float = 1.0,
    output_median: float = 160.0,
    output_sigma: float = 0.8,
    max_input: int = 2048,
    max_output: int = 1024,
    tokenizer: Any | None = None,
) -> list[BenchRequest]:
    """Log-normal input and output lengths (see the module docstring for the defaults)."""
    if num_prompts < 1 or input_median < 1 or output_median < 1:
        raise ValueError("--num-prompts and the synthetic-chat medians must be >= 1")
    rng = random.Random(seed)
    out = []
    for _ in range(num_prompts):
        n_in = _lognormal_len(rng, input_median, input_sigma, min(4, max_input), max_input)
        n_out = _lognormal_len(rng, output_median, output_sigma, min(4, max_output), max_output)
        out.append(BenchRequest(make_text(n_in, rng, tokenizer), n_in, n_out))
    return out


def arrival_gaps(num: int, request_rate: float, seed: int = 0) -> list[float]:
    """Seconds to wait before each request: a Poisson process of ``request_rate`` per second
    (exponential gaps); all zeros for an infinite rate."""
    if request_rate <= 0:
        raise ValueError(f"--request-rate={request_rate} must be > 0 (or inf)")
    if math.isinf(request_rate):
        return [0.0] * num
    rng = random.Random(seed + 1)
    return [rng.expovariate(request_rate) for _ in range(num)]
