"""Sampler semantics on constructed logits: exact masks, penalties against a plain loop, seeded draws."""

from __future__ import annotations

import math

import pytest
import torch

from hotloop.executor.sampler import (
    Sampler,
    SamplingMetadata,
    apply_logit_bias,
    apply_penalties,
    apply_suppression,
    apply_token_bitmask,
    apply_top_k_top_p_min_p,
    token_counts,
    top_k_top_p_min_p_mask,
)
from hotloop.messages import GenerationConfig

GREEDY = GenerationConfig()


def meta(
    params: list[GenerationConfig],
    *,
    prompt: list[list[int]] | None = None,
    output: list[list[int]] | None = None,
    generators: list[torch.Generator | None] | None = None,
    suppress: list[list[int]] | None = None,
    bitmasks: list[torch.Tensor | None] | None = None,
) -> SamplingMetadata:
    n = len(params)
    return SamplingMetadata(
        params=params,
        prompt_token_ids=prompt if prompt is not None else [[] for _ in range(n)],
        output_token_ids=output if output is not None else [[] for _ in range(n)],
        generators=generators if generators is not None else [None] * n,
        suppress_token_ids=suppress if suppress is not None else [[] for _ in range(n)],
        token_bitmasks=bitmasks,
    )


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def logits_for(probs: list[float]) -> torch.Tensor:
    """One row of logits whose softmax is ``probs`` (which sum to 1)."""
    return torch.tensor([[math.log(p) for p in probs]])


def kept(mask: torch.Tensor) -> set[int]:
    """The kept token ids of a single-row mask."""
    assert mask.dim() == 1 or mask.shape[0] == 1
    return set(mask.reshape(-1).nonzero().flatten().tolist())


def t(values: list[float] | list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


# --- greedy, bias, suppression -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_equals_argmax(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 50).to(dtype)
    params = [
        GREEDY,
        GenerationConfig(do_sample=True, temperature=0.0),
        GenerationConfig(do_sample=True, top_k=1),
    ] * 2
    out = Sampler()(logits, meta(params))
    assert out.token_ids.dtype == torch.int64 and out.token_ids.shape == (6,)
    assert torch.equal(out.token_ids, logits.float().argmax(dim=-1))
    assert out.logprobs is None and out.top_ids is None and out.top_logprobs is None


def test_greedy_input_not_modified() -> None:
    logits = torch.randn(2, 10)
    before = logits.clone()
    params = [GenerationConfig(logit_bias={1: 5.0}, repetition_penalty=1.5), GREEDY]
    Sampler()(logits, meta(params, output=[[1, 2], []], suppress=[[3], [4]]))
    assert torch.equal(logits, before)


def test_logit_bias_and_suppression() -> None:
    logits = torch.zeros(3, 8)
    logits[:, 0] = 1.0
    params = [
        GenerationConfig(logit_bias={5: 2.0}),  # bias lifts token 5 above token 0
        GenerationConfig(logit_bias={5: 0.5, 6: -100.0, 99: 7.0}),  # out-of-range id ignored
        GREEDY,
    ]
    out = Sampler()(logits, meta(params, suppress=[[], [], [0]]))
    assert out.token_ids.tolist() == [5, 0, 1]  # row 2: 0 suppressed, first of the ties wins

    biased = apply_logit_bias(logits, [{5: 2.0, 3: -1.0}, None, {}])
    expected = logits.clone()
    expected[0, 5] += 2.0
    expected[0, 3] -= 1.0
    assert torch.equal(biased, expected)

    suppressed = apply_suppression(logits, [[1, 2], [], [7, 100]])
    assert suppressed[0, 1] == -math.inf and suppressed[0, 2] == -math.inf and suppressed[2, 7] == -math.inf
    assert torch.isfinite(suppressed).sum() == 24 - 3


def test_suppression_never_sampled() -> None:
    logits = torch.tensor([[5.0, 0.0, 0.0, 0.0]]).repeat(200, 1)
    params = [GenerationConfig(do_sample=True, temperature=1.0)] * 200
    out = Sampler()(logits, meta(params, suppress=[[0]] * 200, generators=[seeded(i) for i in range(200)]))
    assert 0 not in out.token_ids.tolist()


# --- penalties ----------------------------------------------------------------------------------


def penalties_by_loop(
    logits: list[list[float]],
    prompt: list[list[int]],
    output: list[list[int]],
    rep: list[float],
    pres: list[float],
    freq: list[float],
) -> list[list[float]]:
    result = []
    for i, row in enumerate(logits):
        row = list(row)
        for tok in set(prompt[i]) | set(output[i]):
            row[tok] = row[tok] / rep[i] if row[tok] > 0 else row[tok] * rep[i]
        for tok in set(output[i]):
            count = output[i].count(tok)
            row[tok] -= freq[i] * count + pres[i]
        result.append(row)
    return result


def test_penalties_match_definition() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 12) * 3
    prompt = [[0, 1, 1, 2], [], [11, 3], [5]]
    output = [[2, 2, 2, 7], [4, 4, 9], [], [5, 5, 6]]
    rep, pres, freq = [1.3, 1.0, 2.0, 0.7], [0.5, -0.4, 1.0, 0.0], [0.25, 1.5, 0.0, -0.6]
    got = apply_penalties(logits, prompt, output, t(rep), t(pres), t(freq))
    want = torch.tensor(penalties_by_loop(logits.tolist(), prompt, output, rep, pres, freq))
    torch.testing.assert_close(got, want)


def test_penalties_off_is_identity_and_sampler_applies_them() -> None:
    logits = torch.tensor([[2.0, 1.9, -1.0, 0.5]])
    same = apply_penalties(logits, [[0, 1]], [[0, 0, 3]], t([1.0]), t([0.0]), t([0.0]))
    assert torch.equal(same, logits)
    # Greedy picks token 0 without penalties; a frequency penalty over two earlier 0s hands it to 1.
    params = [GREEDY, GenerationConfig(frequency_penalty=0.1), GenerationConfig(repetition_penalty=1.2)]
    out = Sampler()(logits.repeat(3, 1), meta(params, output=[[0, 0]] * 3, prompt=[[9]] * 3))
    assert out.token_ids.tolist() == [0, 1, 1]


def test_repetition_penalty_counts_prompt_tokens() -> None:
    logits = torch.tensor([[2.0, 1.9]])
    out = Sampler()(logits, meta([GenerationConfig(repetition_penalty=1.1)], prompt=[[0]]))
    assert out.token_ids.tolist() == [1]
    out = Sampler()(logits, meta([GenerationConfig(presence_penalty=1.0)], prompt=[[0]]))
    assert out.token_ids.tolist() == [0]  # presence counts output tokens only


def test_token_counts_ignores_out_of_range() -> None:
    counts = token_counts([[0, 0, 3, -1, 5], []], 4, torch.device("cpu"))
    assert counts.tolist() == [[2, 0, 0, 1], [0, 0, 0, 0]]


# --- top-k / top-p / min-p masks ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (1, {0}),
        (2, {0, 2, 3}),
        (3, {0, 2, 3}),
        (4, {0, 1, 2, 3}),
        (0, {0, 1, 2, 3, 4}),
        (99, {0, 1, 2, 3, 4}),
    ],
)
def test_top_k_mask_keeps_ties(k: int, expected: set[int]) -> None:
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    assert kept(top_k_top_p_min_p_mask(logits, top_k=t([k], torch.int64))) == expected


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (1e-6, {0}),
        (0.3, {0}),
        (0.5, {0}),  # exactly the top token's mass: it alone suffices
        (0.5001, {0, 1}),
        (0.75, {0, 1}),  # exact edge: 0.5 + 0.25
        (0.7501, {0, 1, 2}),
        (0.875, {0, 1, 2}),  # exact edge again
        (0.8751, {0, 1, 2, 3, 4}),  # the nucleus needs one 0.0625 token; its tie comes too
        (0.99, {0, 1, 2, 3, 4}),
        (1.0, {0, 1, 2, 3, 4}),
    ],
)
def test_top_p_mask_edges(top_p: float, expected: set[int]) -> None:
    logits = logits_for([0.5, 0.25, 0.125, 0.0625, 0.0625])
    assert kept(top_k_top_p_min_p_mask(logits, top_p=t([top_p]))) == expected


@pytest.mark.parametrize(
    ("probs", "top_p", "expected"),
    [
        ([0.7, 0.2, 0.1], 0.9, {0, 1}),
        ([0.6, 0.3, 0.1], 0.9, {0, 1}),
        ([0.1, 0.2, 0.3, 0.4], 0.7, {2, 3}),
        ([0.05, 0.15, 0.3, 0.5], 0.95, {1, 2, 3}),
        ([0.1, 0.1, 0.8], 0.9, {0, 1, 2}),
        # float32 softmax + cumsum land just below the edge here (0.79999995, 0.84999996):
        ([0.45, 0.35, 0.2], 0.8, {0, 1}),
        ([0.6, 0.25, 0.15], 0.85, {0, 1}),
        ([0.65, 0.2, 0.15], 0.85, {0, 1}),
    ],
)
def test_top_p_mask_decimal_edges(probs: list[float], top_p: float, expected: set[int]) -> None:
    # Masses that are not exact in binary must still hit the edge: no extra token from rounding.
    assert kept(top_k_top_p_min_p_mask(logits_for(probs), top_p=t([top_p]))) == expected


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [(0.1, {0, 1}), (0.4, {0, 1}), (0.8, {0, 1}), (0.8001, {0, 1, 2, 3}), (0.9, {0, 1, 2, 3})],
)
def test_top_p_mask_ties(top_p: float, expected: set[int]) -> None:
    # Two tokens tie for the top and two tie for the bottom: a tie is kept or dropped as a whole.
    logits = logits_for([0.4, 0.4, 0.1, 0.1])
    assert kept(top_k_top_p_min_p_mask(logits, top_p=t([top_p]))) == expected


def test_top_p_applies_after_top_k() -> None:
    logits = logits_for([0.4, 0.3, 0.2, 0.1])
    # Alone, top_p=0.55 needs 0.4 + 0.3. After top_k=2 the survivors renormalise to 4/7, 3/7: 4/7 >= 0.55.
    assert kept(top_k_top_p_min_p_mask(logits, top_p=t([0.55]))) == {0, 1}
    assert kept(top_k_top_p_min_p_mask(logits, top_k=t([2], torch.int64), top_p=t([0.55]))) == {0}
    assert kept(top_k_top_p_min_p_mask(logits, top_k=t([2], torch.int64), top_p=t([0.6]))) == {0, 1}


@pytest.mark.parametrize(
    ("min_p", "expected"),
    [(0.0, {0, 1, 2, 3}), (0.05, {0, 1, 2, 3}), (0.2, {0, 1, 2}), (0.5, {0, 1}), (0.7, {0}), (1.0, {0})],
)
def test_min_p_mask(min_p: float, expected: set[int]) -> None:
    # probs relative to the max: 1, 0.6, 0.3, 0.1
    logits = logits_for([0.5, 0.3, 0.15, 0.05])
    assert kept(top_k_top_p_min_p_mask(logits, min_p=t([min_p]))) == expected


def test_min_p_one_keeps_all_ties() -> None:
    logits = torch.tensor([[1.0, 1.0, 0.0]])
    assert kept(top_k_top_p_min_p_mask(logits, min_p=t([1.0]))) == {0, 1}


def test_masks_are_per_row_and_combined() -> None:
    logits = torch.cat([logits_for([0.4, 0.3, 0.2, 0.1])] * 4)
    mask = top_k_top_p_min_p_mask(
        logits,
        top_k=t([0, 3, 0, 2], torch.int64),
        top_p=t([1.0, 1.0, 0.6, 1.0]),
        min_p=t([0.0, 0.0, 0.0, 0.8]),
    )
    assert [kept(row) for row in mask] == [{0, 1, 2, 3}, {0, 1, 2}, {0, 1}, {0}]
    filtered = apply_top_k_top_p_min_p(logits, top_k=t([0, 3, 0, 2], torch.int64))
    assert filtered[1, 3] == -math.inf and torch.equal(filtered[0], logits[0])


def test_sampled_tokens_stay_in_filtered_set() -> None:
    torch.manual_seed(2)
    logits = torch.randn(1, 30)
    params = GenerationConfig(do_sample=True, temperature=0.7, top_k=10, top_p=0.8, min_p=0.1)
    # Filters act on the temperature-scaled logits.
    allowed = kept(top_k_top_p_min_p_mask(logits / 0.7, t([10], torch.int64), t([0.8]), t([0.1]))[0])
    out = Sampler()(logits.repeat(2000, 1), meta([params] * 2000))
    drawn = set(out.token_ids.tolist())
    assert drawn <= allowed and len(drawn) == len(allowed)


# --- seeded reproduction and the distribution ---------------------------------------------------


def run_steps(rows: list[tuple[GenerationConfig, int | None, torch.Tensor]], steps: int) -> list[list[int]]:
    """Sample ``steps`` times from fixed per-row logits; one generator per seeded row kept across steps."""
    gens = [seeded(seed) if seed is not None else None for _, seed, _ in rows]
    logits = torch.stack([row_logits for _, _, row_logits in rows])
    params = [p for p, _, _ in rows]
    sampler = Sampler()
    tokens: list[list[int]] = [[] for _ in rows]
    for _ in range(steps):
        out = sampler(logits, meta(params, generators=gens)).token_ids.tolist()
        for i, tok in enumerate(out):
            tokens[i].append(tok)
    return tokens


def test_seeded_rows_reproduce_across_batches_and_order() -> None:
    torch.manual_seed(3)
    vocab = 64
    a = (GenerationConfig(do_sample=True, temperature=1.2, top_p=0.95, top_k=40), 1234, torch.randn(vocab))
    b = (GenerationConfig(do_sample=True, temperature=1.0), None, torch.randn(vocab))
    c = (GenerationConfig(do_sample=True, temperature=0.5, min_p=0.05), 99, torch.randn(vocab))
    d = (GREEDY, 7, torch.randn(vocab))

    alone = run_steps([a], 25)[0]
    batched = run_steps([b, c, a, d], 25)[2]
    reordered = run_steps([d, a, b], 25)[1]
    assert alone == batched == reordered
    assert len(set(alone)) > 3  # it really sampled
    # The same seed in two rows of one batch: each row owns its generator, so both reproduce.
    twins = run_steps([a, b, a], 25)
    assert twins[0] == twins[2] == alone
    other_seed = run_steps([(a[0], 4321, a[2])], 25)[0]
    assert other_seed != alone


def test_sample_distribution_matches_probs() -> None:
    probs = [0.5, 0.25, 0.15, 0.1]
    draws = 40_000
    logits = logits_for(probs).repeat(draws, 1)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        out = Sampler()(logits, meta([GenerationConfig(do_sample=True, temperature=1.0)] * draws))
    freq = torch.bincount(out.token_ids, minlength=4).float() / draws
    assert torch.allclose(freq, torch.tensor(probs), atol=0.015), freq

    # Temperature 0.5 squares and renormalises; top_k=3 then drops the last token.
    sq = torch.tensor(probs[:3]) ** 2
    want = torch.cat([sq / sq.sum(), torch.zeros(1)])
    gens = [seeded(i) for i in range(draws // 4)]
    out = Sampler()(
        logits[: draws // 4],
        meta([GenerationConfig(do_sample=True, temperature=0.5, top_k=3)] * (draws // 4), generators=gens),
    )
    freq = torch.bincount(out.token_ids, minlength=4).float() / (draws // 4)
    assert torch.allclose(freq, want, atol=0.025), freq


# --- logprobs -----------------------------------------------------------------------------------


def test_logprobs_are_log_softmax_before_temperature() -> None:
    torch.manual_seed(4)
    logits = torch.randn(4, 20)
    params = [
        GenerationConfig(do_sample=True, temperature=0.3, top_k=5, logprobs=3, logit_bias={2: 1.5}),
        GenerationConfig(logprobs=0),
        GREEDY,  # no logprobs asked: filled anyway, the caller ignores the row
        GenerationConfig(do_sample=True, logprobs=5, frequency_penalty=0.5),
    ]
    out = Sampler()(logits, meta(params, output=[[], [], [], [1, 1, 3]], suppress=[[0], [], [], []]))
    assert out.logprobs is not None and out.top_ids is not None and out.top_logprobs is not None

    ref = logits.clone()
    ref[0, 2] += 1.5
    ref[0, 0] = -math.inf
    ref[3, 1] -= 1.0
    ref[3, 3] -= 0.5
    want = torch.log_softmax(ref, dim=-1)
    torch.testing.assert_close(out.logprobs, want.gather(1, out.token_ids.unsqueeze(1)).squeeze(1))
    assert out.top_ids.shape == (4, 5) and out.top_logprobs.dtype == torch.float32
    want_top, want_ids = want.topk(5, dim=-1)
    assert torch.equal(out.top_ids, want_ids)
    torch.testing.assert_close(out.top_logprobs, want_top)
    assert out.token_ids[1] == want[1].argmax()


# --- grammar bitmask (JSON mode) ----------------------------------------------------------------


def bitmask(allowed: set[int], vocab: int) -> torch.Tensor:
    """The int32 bitmask of ``allowed`` (bit ``t % 32`` of word ``t // 32``), built by hand."""
    words = [0] * (-(-vocab // 32))
    for tok in allowed:
        words[tok // 32] |= 1 << (tok % 32)
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


def test_bitmask_masks_exactly_the_disallowed_ids_of_its_rows() -> None:
    torch.manual_seed(5)
    vocab = 70  # three words, the last one partial; ids 31 and 63 use the sign bit
    logits = torch.randn(3, vocab)
    allowed = {0, 5, 31, 32, 63, 69}
    out = apply_token_bitmask(logits, [bitmask(allowed, vocab), None, bitmask({7}, vocab)])
    assert set(out[0].isfinite().nonzero().flatten().tolist()) == allowed
    assert torch.equal(out[0, sorted(allowed)], logits[0, sorted(allowed)])
    assert torch.equal(out[1], logits[1])  # an unconstrained row is untouched
    assert out[2].isfinite().nonzero().flatten().tolist() == [7]
    assert apply_token_bitmask(logits, [None, None, None]) is logits
    with pytest.raises(ValueError, match="cannot cover"):
        apply_token_bitmask(logits, [bitmask({1}, 32), None, None])


def test_masked_ids_get_probability_zero_and_logprobs_renormalise() -> None:
    torch.manual_seed(6)
    vocab = 40
    logits = torch.randn(3, vocab)
    allowed = {3, 17, 33, 39}
    masks = [bitmask(allowed, vocab), None, bitmask(allowed, vocab)]
    params = [
        GenerationConfig(logprobs=5),  # greedy: the best allowed id
        GenerationConfig(logprobs=1),  # unconstrained
        GenerationConfig(do_sample=True, temperature=1.5, logprobs=2),
    ]
    gens: list[torch.Generator | None] = [None, None, seeded(1)]
    sampler = Sampler()
    for _ in range(50):
        out = sampler(logits, meta(params, generators=gens, bitmasks=masks))
        assert out.token_ids[2].item() in allowed
    assert out.token_ids[0].item() == max(allowed, key=lambda t: logits[0, t].item())
    assert out.token_ids[1].item() == logits[1].argmax().item()
    assert out.logprobs is not None and out.top_ids is not None and out.top_logprobs is not None
    ref = torch.full_like(logits[0], -math.inf)
    ref[sorted(allowed)] = logits[0, sorted(allowed)]
    want = torch.log_softmax(ref, dim=-1)  # renormalised over the allowed ids
    assert math.isclose(want.exp().sum().item(), 1.0, rel_tol=1e-5)
    torch.testing.assert_close(out.logprobs[0], want[out.token_ids[0]])
    assert set(out.top_ids[0, :4].tolist()) == allowed
    assert out.top_logprobs[0, 4].item() == -math.inf  # a fifth alternative is a masked id
    torch.testing.assert_close(out.top_logprobs[1, 0], torch.log_softmax(logits[1], dim=-1).max())


def test_bitmask_rows_must_match_the_params() -> None:
    with pytest.raises(ValueError, match="token_bitmasks has 1 rows, params has 2"):
        meta([GREEDY, GREEDY], bitmasks=[None])


def test_top_k_past_the_vocabulary_is_off() -> None:
    """A top_k at or past the vocabulary keeps every token, even one past int64 (a request's
    unbounded integer once made the tensor conversion raise inside the engine loop); a top_k
    below it still filters in the same batch."""
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]])).repeat(3, 1)
    params = [
        GenerationConfig(do_sample=True, temperature=1.0, top_k=10**20),
        GenerationConfig(do_sample=True, temperature=1.0, top_k=4),
        GenerationConfig(do_sample=True, temperature=1.0, top_k=1),
    ]
    gens: list[torch.Generator | None] = [seeded(s) for s in (1, 2, 3)]
    drawn: list[set[int]] = [set(), set(), set()]
    for _ in range(200):
        out = Sampler()(logits, meta(params, generators=gens))
        for i, t in enumerate(out.token_ids.tolist()):
            drawn[i].add(t)
    assert drawn[0] == {0, 1, 2, 3} and drawn[1] == {0, 1, 2, 3}
    assert drawn[2] == {0}
