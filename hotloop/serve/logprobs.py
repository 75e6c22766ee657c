"""Engine ``TokenLogprob``s -> OpenAI's chat and completions logprob shapes.

A token is shown as its own decoded text, and its ``bytes`` are its raw bytes (a token that is part
of a UTF-8 character shows U+FFFD as text, but the bytes join up into the character). ``-inf`` (a token masked by a filter or a bias) is
reported as -9999.0, as OpenAI does, because JSON has no infinity.
"""

from __future__ import annotations

import codecs
import math
from typing import Any

from hotloop.messages import TokenLogprob
from hotloop.serve.state import ServerState

_FLOOR = -9999.0


def _finite(x: float) -> float:
    return _FLOOR if math.isnan(x) or x < _FLOOR else float(x)


def _top(lp: TokenLogprob, k: int) -> list[tuple[int, float]]:
    return sorted(lp.top.items(), key=lambda kv: -kv[1])[:k]


def chat_logprobs(state: ServerState, lps: list[TokenLogprob], top_k: int) -> list[dict[str, Any]]:
    """``choices[i].logprobs.content`` entries."""
    out = []
    for lp in lps:
        text = state.token_text(lp.token_id)
        out.append(
            {
                "token": text,
                "logprob": _finite(lp.logprob),
                "bytes": list(state.token_bytes(lp.token_id)),
                "top_logprobs": [
                    {
                        "token": state.token_text(tid),
                        "logprob": _finite(v),
                        "bytes": list(state.token_bytes(tid)),
                    }
                    for tid, v in _top(lp, top_k)
                ],
            }
        )
    return out


class CompletionLogprobAccumulator:
    """Builds ``choices[i].logprobs`` for /v1/completions (tokens, token_logprobs, top_logprobs,
    text_offset), with offsets continuing from ``offset``. A token's offset is where its text starts
    in the output: the characters its bytes and the earlier tokens' complete (the tokens of one
    emoji share an offset, and the next token starts one character later)."""

    def __init__(self, state: ServerState, top_k: int, offset: int = 0) -> None:
        self.state = state
        self.top_k = top_k
        self.offset = offset
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, lps: list[TokenLogprob]) -> dict[str, Any]:
        """The logprobs of these tokens, as one increment."""
        inc: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for lp in lps:
            text = self.state.token_text(lp.token_id)
            inc["tokens"].append(text)
            inc["token_logprobs"].append(_finite(lp.logprob))
            inc["top_logprobs"].append(
                {self.state.token_text(tid): _finite(v) for tid, v in _top(lp, self.top_k)}
                if self.top_k
                else None
            )
            inc["text_offset"].append(self.offset)
            self.offset += len(self._utf8.decode(self.state.token_bytes(lp.token_id)))
        return inc


def prompt_completion_logprobs(
    state: ServerState,
    prompt_ids: list[int],
    lps: list[TokenLogprob | None],
    top_k: int,
    echoed: str,
    specials_shown: bool,
) -> dict[str, Any]:
    """``choices[i].logprobs`` of an echoed prompt (``echo`` with ``logprobs``): every prompt token,
    its log p(token | the tokens before) (None for the first, which has no prefix) and its top
    alternatives, with offsets into ``echoed``, the echoed text. A special token (a BOS the
    tokenizer added) takes no characters unless ``specials_shown`` (token-id prompts are echoed
    decoded with them); offsets never pass the echoed text's end, where the output's begin."""
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    special = set(getattr(state.tokenizer, "all_special_ids", None) or ())
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for tid, lp in zip(prompt_ids, lps, strict=True):
        out["tokens"].append(state.token_text(tid))
        out["token_logprobs"].append(None if lp is None else _finite(lp.logprob))
        out["top_logprobs"].append(
            None if lp is None or not top_k else {state.token_text(t): _finite(v) for t, v in _top(lp, top_k)}
        )
        out["text_offset"].append(min(offset, len(echoed)))
        if specials_shown or tid not in special:
            offset += len(utf8.decode(state.token_bytes(tid)))
    return out


def merge_completion_logprobs(total: dict[str, Any] | None, inc: dict[str, Any]) -> dict[str, Any]:
    if total is None:
        return {k: list(v) for k, v in inc.items()}
    for k, v in inc.items():
        total[k].extend(v)
    return total


def vllm_prompt_logprobs(
    state: ServerState, prompt_ids: list[int], lps: list[TokenLogprob | None], top_k: int
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token (None for the first), a map from token id (as a
    JSON key) to ``{logprob, rank, decoded_token}``: the prompt's own token first, then the
    ``top_k`` most likely (rank 1, 2, ...; the prompt's token keeps its own entry where it is one
    of them)."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for tid, lp in zip(prompt_ids, lps, strict=True):
        if lp is None:
            out.append(None)
            continue
        entry = {
            str(tid): {
                "logprob": _finite(lp.logprob),
                "rank": lp.rank,
                "decoded_token": state.token_text(tid),
            }
        }
        for r, (t, v) in enumerate(_top(lp, top_k), start=1):
            entry.setdefault(str(t), {"logprob": _finite(v), "rank": r, "decoded_token": state.token_text(t)})
        out.append(entry)
    return out
