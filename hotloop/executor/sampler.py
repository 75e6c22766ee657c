"""The sampler: one batch of logits plus per-row ``GenerationConfig`` in, next token ids (and logprobs) out.

Owns the sampling semantics shared by both backends: logit bias, suppressed ids, grammar masks
(JSON mode), repetition / presence / frequency penalties, greedy, temperature, top-k / top-p / min-p, seeded draws and
logprobs. Everything runs on the logits' device with batched tensor ops; the only Python loops are
over rows or over sparse per-row entries (bias dicts, seeded generators), never over the vocabulary,
and no step reads a device value back to the host.

Order of operations for one row (the same order the helpers below are composed in ``Sampler``):

1. ``logits += logit_bias``; suppressed ids -> ``-inf``; ids outside the row's grammar bitmask
   (JSON mode) -> ``-inf``.
2. repetition penalty, then frequency and presence penalties (a ``-inf`` stays ``-inf``).
3. logprobs (if asked) are the log-softmax of the logits *at this point*: after bias, suppression,
   the grammar mask and penalties, before temperature and the top-k / top-p / min-p filters, so they
   describe the model's (penalised) distribution constrained to what the grammar allows
   (renormalised over the allowed ids; a disallowed id has logprob ``-inf``) rather than the
   truncated one that was sampled from.
4. greedy rows: argmax.
5. sampled rows: ``/ temperature``, then top-k, top-p, min-p masks, then one draw.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hotloop.messages import GenerationConfig

# A cumulative mass within this of top_p counts as reaching it, so float32 rounding of softmax and
# cumsum (probs 0.45, 0.35 summing to 0.79999995) never pulls one extra token into the nucleus at an
# exact edge such as top_p=0.8.
_TOP_P_EPS = 1e-6


@dataclass
class SamplingMetadata:
    """Per-row inputs of one sampling step; every list has one entry per row of the logits.

    ``generators`` must live on the logits' device; each seeded request keeps its own generator
    across steps (seeded once from ``GenerationConfig.random_seed``). ``suppress_token_ids`` are
    the ids forbidden this step, e.g. EOS and stop ids while ``min_new_tokens`` is not reached.
    ``token_bitmasks`` (JSON mode): per row, the allowed ids as a host int32 bitmask of
    ``ceil(V / 32)`` words (bit ``t % 32`` of word ``t // 32``; ``hotloop.engine.grammar``), or
    ``None`` for an unconstrained row; ``None`` for the whole list when no row is constrained.
    """

    params: list[GenerationConfig]
    prompt_token_ids: list[list[int]]
    output_token_ids: list[list[int]]
    generators: list[torch.Generator | None]
    suppress_token_ids: list[list[int]]
    token_bitmasks: list[torch.Tensor | None] | None = None

    def __post_init__(self) -> None:
        n = len(self.params)
        for name in ("prompt_token_ids", "output_token_ids", "generators", "suppress_token_ids"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"SamplingMetadata.{name} has {len(getattr(self, name))} rows, params has {n}"
                )
        if self.token_bitmasks is not None and len(self.token_bitmasks) != n:
            raise ValueError(
                f"SamplingMetadata.token_bitmasks has {len(self.token_bitmasks)} rows, params has {n}"
            )


@dataclass
class SamplerOutput:
    """What one sampling step produced, still on the device.

    ``logprobs`` / ``top_ids`` / ``top_logprobs`` are ``None`` when no row asked for logprobs;
    otherwise they are filled for every row (rows that did not ask are simply ignored by the
    caller) and ``K`` is the largest ``logprobs`` requested in the batch, so a row that asked for
    fewer alternatives takes the first ``params.logprobs`` columns (sorted by logprob, descending).
    """

    token_ids: torch.Tensor  # [N] int64
    logprobs: torch.Tensor | None  # [N] float32, logprob of the chosen token
    top_ids: torch.Tensor | None  # [N, K] int64
    top_logprobs: torch.Tensor | None  # [N, K] float32


def _to_device(data: Sequence[Any] | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list or array as a device tensor, without stalling the host on the device queue."""
    t = torch.from_numpy(data).to(dtype) if isinstance(data, np.ndarray) else torch.tensor(data, dtype=dtype)
    if device.type == "cuda":
        # A pageable host->device copy synchronizes; a pinned one can be queued behind the model.
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def token_counts(token_ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """How often each id occurs in each row: ``[N, vocab_size]`` int32. Ids outside [0, V) are ignored."""
    n = len(token_ids)
    lens = [len(row) for row in token_ids]
    total = sum(lens)
    # Column vocab_size is a bin for out-of-range ids; it is dropped before returning.
    counts = torch.zeros(n, vocab_size + 1, dtype=torch.int32, device=device)
    if total == 0:
        return counts[:, :vocab_size]
    # Prompts are long: flatten on the host with numpy (a torch.tensor of nested lists costs ~100 ns
    # an id) into one index into the flattened [N, V + 1] counts.
    ids = np.fromiter(itertools.chain.from_iterable(token_ids), dtype=np.int64, count=total)
    ids = np.where((ids >= 0) & (ids < vocab_size), ids, vocab_size)
    flat = np.repeat(np.arange(n, dtype=np.int64) * (vocab_size + 1), lens) + ids
    index = _to_device(flat, torch.int64, device)
    counts.view(-1).scatter_add_(0, index, torch.ones_like(index, dtype=torch.int32))
    return counts[:, :vocab_size]


def apply_logit_bias(logits: torch.Tensor, logit_bias: Sequence[Mapping[int, float] | None]) -> torch.Tensor:
    """``logits[i, t] + logit_bias[i][t]`` (OpenAI ``logit_bias``); ids outside the vocabulary are ignored."""
    vocab = logits.shape[-1]
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for i, bias in enumerate(logit_bias):
        for tok, b in (bias or {}).items():
            if 0 <= tok < vocab:
                rows.append(i)
                cols.append(tok)
                vals.append(float(b))
    if not rows:
        return logits
    index = (_to_device(rows, torch.int64, logits.device), _to_device(cols, torch.int64, logits.device))
    return logits.index_put(index, _to_device(vals, logits.dtype, logits.device), accumulate=True)


def apply_suppression(logits: torch.Tensor, suppress_token_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Set ``logits[i, t] = -inf`` for every ``t`` in ``suppress_token_ids[i]`` (out-of-range ids ignored)."""
    vocab = logits.shape[-1]
    rows = [i for i, ids in enumerate(suppress_token_ids) for t in ids if 0 <= t < vocab]
    cols = [t for ids in suppress_token_ids for t in ids if 0 <= t < vocab]
    if not rows:
        return logits
    index = (_to_device(rows, torch.int64, logits.device), _to_device(cols, torch.int64, logits.device))
    # torch.full, not torch.tensor(-inf, device=...): the latter is a synchronizing host->device copy.
    return logits.index_put(
        index, torch.full((len(rows),), float("-inf"), dtype=logits.dtype, device=logits.device)
    )


def apply_token_bitmask(logits: torch.Tensor, bitmasks: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """Set ``logits[i, t] = -inf`` for every ``t`` not allowed by ``bitmasks[i]`` (an int32 bitmask of
    ``ceil(V / 32)`` words, bit ``t % 32`` of word ``t // 32`` set = allowed); ``None`` rows stay."""
    rows = [i for i, m in enumerate(bitmasks) if m is not None]
    if not rows:
        return logits
    vocab = logits.shape[-1]
    words = torch.stack([m for m in bitmasks if m is not None])  # [R, W] int32, host
    if words.shape[-1] * 32 < vocab:
        raise ValueError(f"token bitmask of {words.shape[-1]} words cannot cover a vocabulary of {vocab}")
    words = _to_device(words.numpy(), torch.int32, logits.device)
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab]  # [R, V]
    if len(rows) == logits.shape[0]:
        return logits.masked_fill(~allowed, float("-inf"))
    index = _to_device(rows, torch.int64, logits.device)
    masked = logits.index_select(0, index).masked_fill(~allowed, float("-inf"))
    return logits.index_copy(0, index, masked)


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    repetition_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
) -> torch.Tensor:
    """Repetition, then frequency and presence penalties; the penalties are ``[N]`` tensors.

    Repetition (CTRL paper / Hugging Face ``RepetitionPenaltyLogitsProcessor``): for every token
    seen in the prompt *or* the output, ``logit / p`` if ``logit > 0`` else ``logit * p``; 1.0 is off.
    Frequency and presence (OpenAI): over output tokens only, with ``c`` the token's count so far,
    ``logit - frequency * c - presence * (c > 0)``; 0.0 is off.
    """
    vocab = logits.shape[-1]
    out_counts = token_counts(output_token_ids, vocab, logits.device)
    seen_in_output = out_counts > 0
    seen = seen_in_output | (token_counts(prompt_token_ids, vocab, logits.device) > 0)
    rep = repetition_penalty.to(logits.dtype).unsqueeze(1)
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    freq = frequency_penalty.to(logits.dtype).unsqueeze(1)
    pres = presence_penalty.to(logits.dtype).unsqueeze(1)
    return logits - freq * out_counts.to(logits.dtype) - pres * seen_in_output.to(logits.dtype)


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``logits / temperature`` per row (``temperature`` is ``[N]``, > 0)."""
    return logits / temperature.to(logits.dtype).unsqueeze(1)


def top_k_top_p_min_p_mask(
    logits: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Which tokens survive the filters, applied in the order top-k, top-p, min-p: ``[N, V]`` bool, True = keep.

    Each argument is an ``[N]`` tensor or ``None`` (off for every row); per row, ``top_k == 0``,
    ``top_p >= 1`` and ``min_p == 0`` are off. Ties never make the result depend on sort order:

    - top-k keeps every token whose logit is >= the k-th largest logit (so ties at the k-th
      place are all kept and more than k tokens may survive).
    - top-p (nucleus) works on the probabilities renormalised over the top-k survivors. With them
      sorted descending it keeps the smallest prefix whose mass is >= top_p (always at least one
      token), plus every token tied with the last token of that prefix. Equivalently: a token is
      kept iff the mass of the tokens strictly more probable than it is < top_p.
    - min-p drops tokens whose probability is < ``min_p * max probability``; that ratio is
      ``exp(logit - max logit)`` whatever the normalisation, so it does not depend on the order.

    Tokens whose logit is already ``-inf`` may come back True; they have zero probability anyway.
    """
    n, vocab = logits.shape
    keep = torch.ones_like(logits, dtype=torch.bool)
    neg_inf = float("-inf")
    if top_k is not None or top_p is not None:
        sorted_logits = logits.sort(dim=-1, descending=True).values
        if top_k is not None:
            k = torch.where(top_k > 0, top_k, vocab).clamp(1, vocab).to(torch.int64)
            kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))  # [N, 1]
            keep &= logits >= kth
            # The top-k survivors are a prefix of the sorted row (ties included): mask the rest so
            # top-p sees the renormalised distribution.
            sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, neg_inf)
        if top_p is not None:
            p = top_p.to(logits.dtype).unsqueeze(1)
            cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            # Index of the first sorted position whose cumulative mass reaches top_p.
            last = (cum < p - _TOP_P_EPS).sum(dim=-1, keepdim=True).clamp(max=vocab - 1)
            cutoff = sorted_logits.gather(1, last)
            cutoff = torch.where(p >= 1.0, neg_inf, cutoff)
            keep &= logits >= cutoff
    if min_p is not None:
        ratio = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
        keep &= ratio >= min_p.to(logits.dtype).unsqueeze(1)
    return keep


def apply_top_k_top_p_min_p(
    logits: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logits`` with the tokens dropped by :func:`top_k_top_p_min_p_mask` set to ``-inf``."""
    if top_k is None and top_p is None and min_p is None:
        return logits
    return logits.masked_fill(~top_k_top_p_min_p_mask(logits, top_k, top_p, min_p), float("-inf"))


def random_sample(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """Draw one token per row from ``probs`` ``[N, V]``: ``argmax(probs / q)`` with ``q ~ Exp(1)`` i.i.d.

    This picks token ``t`` with probability ``probs[t]`` (the exponential-race form of the Gumbel-max
    trick) and, unlike ``torch.multinomial``, needs no host sync. A row with a generator draws its
    ``V`` exponentials from that generator alone, so a seeded request gets the same tokens whatever
    else is in the batch and in which order; other rows share one draw from the default RNG.
    """
    q = torch.empty_like(probs)
    if any(g is None for g in generators):
        q.exponential_()
    for i, g in enumerate(generators):
        if g is not None:
            q[i].exponential_(generator=g)
    # Exp(1) can return exactly 0; 0/0 would be NaN, which argmax would pick.
    q.clamp_min_(torch.finfo(q.dtype).tiny)
    return (probs / q).argmax(dim=-1)


def _penalties_active(p: GenerationConfig) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


class Sampler:
    """Samples the next token of every row; see the module docstring for the order of operations.

    Greedy rows (``GenerationConfig.greedy``) take the argmax after bias, masks and penalties, ignoring
    temperature and the filters. Sampled rows divide by temperature, apply top-k / top-p / min-p
    (:func:`top_k_top_p_min_p_mask`) and draw with :func:`random_sample`.
    """

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        n, vocab = logits.shape
        if len(meta.params) != n:
            raise ValueError(f"logits have {n} rows but SamplingMetadata has {len(meta.params)}")
        device = logits.device
        params = meta.params
        x = logits.float()  # no copy for float32 input; every helper is out of place

        x = apply_logit_bias(x, [p.logit_bias for p in params])
        x = apply_suppression(x, meta.suppress_token_ids)
        if meta.token_bitmasks is not None:
            x = apply_token_bitmask(x, meta.token_bitmasks)
        if any(_penalties_active(p) for p in params):
            # Counting the prompt is only needed for the repetition penalty, and prompts are long.
            any_rep = any(p.repetition_penalty != 1.0 for p in params)
            x = apply_penalties(
                x,
                meta.prompt_token_ids if any_rep else [[] for _ in params],
                meta.output_token_ids,
                _to_device([p.repetition_penalty for p in params], torch.float32, device),
                _to_device([p.presence_penalty for p in params], torch.float32, device),
                _to_device([p.frequency_penalty for p in params], torch.float32, device),
            )

        token_ids = x.argmax(dim=-1)
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if sampled:
            sampled_ids = self._sample_rows(x, sampled, params, meta.generators)
            if len(sampled) == n:
                token_ids = sampled_ids
            else:
                token_ids[_to_device(sampled, torch.int64, device)] = sampled_ids

        asked = [p.logprobs for p in params if p.logprobs is not None]
        if not asked:
            return SamplerOutput(token_ids=token_ids, logprobs=None, top_ids=None, top_logprobs=None)
        logprobs = torch.log_softmax(x, dim=-1)
        chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
        top_logprobs, top_ids = logprobs.topk(min(max(asked), vocab), dim=-1)
        return SamplerOutput(token_ids=token_ids, logprobs=chosen, top_ids=top_ids, top_logprobs=top_logprobs)

    @staticmethod
    def _sample_rows(
        x: torch.Tensor,
        rows: list[int],
        params: Sequence[GenerationConfig],
        generators: Sequence[torch.Generator | None],
    ) -> torch.Tensor:
        """Temperature, filters and one draw for the given (non-greedy) rows of ``x``; ``[len(rows)]`` int64."""
        device = x.device
        if len(rows) != x.shape[0]:
            x = x.index_select(0, _to_device(rows, torch.int64, device))
        sub = [params[i] for i in rows]
        x = apply_temperature(x, _to_device([p.temperature for p in sub], torch.float32, device))
        top_k = top_p = min_p = None
        vocab = x.shape[-1]
        if any(0 < p.top_k < vocab for p in sub):
            # a top_k at or past the vocabulary keeps every token: off (0), which also keeps an
            # arbitrarily large Python int out of the int64 tensor
            top_k = _to_device([p.top_k if p.top_k < vocab else 0 for p in sub], torch.int64, device)
        if any(p.top_p < 1.0 for p in sub):
            top_p = _to_device([p.top_p for p in sub], torch.float32, device)
        if any(p.min_p > 0.0 for p in sub):
            min_p = _to_device([p.min_p for p in sub], torch.float32, device)
        x = apply_top_k_top_p_min_p(x, top_k, top_p, min_p)
        return random_sample(x.softmax(dim=-1), [generators[i] for i in rows])
