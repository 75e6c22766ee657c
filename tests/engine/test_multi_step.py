"""Multi-step decode (``num_scheduler_steps``) gives the same tokens, text and finish reasons as one
step per launch, really runs several steps per launch, and leaks no blocks: with stop ids and stop
strings that end a request mid-round, ``max_new_tokens`` and ``session_len`` limits, aborts,
preemption and prefix caching. On the CPU the runner's eager path runs the rounds (the GPU runner
replays its decode graph instead; ``tests/executor`` and the GPU tests cover that path)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiny_archs import TINY_VOCAB

from hotloop.api.build import build_engine
from hotloop.config import ConfigError, EngineConfig
from hotloop.engine.engine import Engine
from hotloop.messages import GenerationConfig

ARCH = "llama_gqa_llama3rope"


def _params(i: int) -> GenerationConfig:
    kinds: list[dict[str, Any]] = [
        dict(max_new_tokens=23, ignore_eos=True),
        dict(
            max_new_tokens=19, do_sample=True, temperature=0.9, top_k=20, random_seed=7 + i, ignore_eos=True
        ),
        dict(max_new_tokens=26, stop_token_ids=[5, 9, 11, 13]),
        dict(max_new_tokens=24, min_new_tokens=6, stop_token_ids=[5, 9, 11, 13]),
        dict(max_new_tokens=17, stop_words=["e", "a"], ignore_eos=True),
        dict(max_new_tokens=21, do_sample=True, top_p=0.8, min_p=0.05, random_seed=3 + i, ignore_eos=True),
    ]
    return GenerationConfig(**kinds[i % len(kinds)])


def _prompts(n: int, seed: int = 11) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randrange(3, 30))] for _ in range(n)]


def _run(
    engine: Engine,
    prompts: list[list[int]],
    params: Callable[[int], GenerationConfig] = _params,
    abort: dict[int, int] | None = None,
    join_every: int = 2,
) -> dict[str, tuple[list[int], str, str | None, int]]:
    """Drive the engine (request i joins at step i // join_every); per request: all its tokens, all
    its text, its finish reason and its final token count."""
    abort = abort or {}
    toks: dict[str, list[int]] = {}
    text: dict[str, str] = {}
    last: dict[str, tuple[str | None, int]] = {}
    step = 0
    while len(last) < len(prompts) or engine.has_unfinished():
        for i, p in enumerate(prompts):
            if i // join_every == step:
                engine.add_request(str(i), p, params(i))
            if abort.get(i) == step:
                engine.abort_request(str(i))
        for o in engine.step():
            toks.setdefault(o.request_id, []).extend(o.new_token_ids)
            text[o.request_id] = text.get(o.request_id, "") + o.new_text
            if o.finished:
                last[o.request_id] = (o.finish_reason, o.num_generated_tokens)
        step += 1
        assert step < 1000
    assert engine.num_free_blocks == engine.num_total_blocks
    engine.block_manager.check_consistency()
    return {rid: (toks.get(rid, []), text.get(rid, ""), *last[rid]) for rid in last}


def _record_round_ends(engine: Engine) -> list[tuple[str | None, int, int]]:
    """Wrap the engine's multi-step update: per request that finished in a round, its finish reason,
    the ids it kept and the ids the round computed for it."""
    ends: list[tuple[str | None, int, int]] = []
    update = engine._update_steps

    def wrapped(out: Any, sampled: list[list[int]]) -> Any:
        outs = update(out, sampled)
        live = [
            ids
            for s, ids in zip([s for s in out.scheduled if s.samples], sampled, strict=True)
            if s.request.request_id in {o.request_id for o in outs}
        ]
        for o, ids in zip(outs, live, strict=True):
            if o.finished:
                ends.append((o.finish_reason, len(o.new_token_ids), len(ids)))
        return outs

    engine._update_steps = wrapped  # type: ignore[method-assign]
    return ends


def _default_engine(path: Path, **kw: Any) -> Engine:
    """A CPU engine of 8 slots with ``EngineConfig``'s defaults for the launch (``num_scheduler_steps``
    1, ``full_batch_steps`` 8) unless ``kw`` sets them."""
    cfg: dict[str, Any] = dict(
        device="cpu", dtype="float32", max_batch_size=8, cache_block_seq_len=4, cache_max_entry_count=512
    )
    cfg.update(kw)
    return build_engine(str(path), EngineConfig(**cfg)).engine


def _engine(path: Path, steps: int, **kw: Any) -> Engine:
    """``steps`` decode steps per launch at most, and no more while the batch is full (unless ``kw``
    sets ``full_batch_steps``): the one-step baseline runs one step a launch throughout."""
    return _default_engine(path, **{"num_scheduler_steps": steps, "full_batch_steps": 1, **kw})


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"max_prefill_token_num": 7},  # chunked prefill between the rounds
        # preemption (without the admission reserve, which would avoid it)
        {"cache_max_entry_count": 30, "max_prefill_token_num": 64, "schedule_conservativeness": 0.0},
        {"enable_prefix_caching": True},
        {"session_len": 40},  # a short session (requests end within a few tokens of it)
    ],
    ids=["plain", "chunked", "preempt", "prefix", "session"],
)
def test_multi_step_equals_one_step(variant: dict[str, Any], make_tiny_model: Callable[[str], Path]) -> None:
    path = make_tiny_model(ARCH)
    prompts = _prompts(12)
    if "session_len" in variant:
        prompts = [p[:12] for p in prompts]
    one = _engine(path, 1, **variant)
    # a burst: 12 requests for 8 slots, so the rest wait for a full batch to free one
    expected = _run(one, prompts, join_every=100)
    assert one.num_multi_step_launches == 0
    multi = _engine(path, 4, **variant)
    ends = _record_round_ends(multi)
    got = _run(multi, prompts, join_every=100)
    assert got == expected
    assert any(kept == ran for _, kept, ran in ends), ends  # requests also end inside rounds
    if "cache_max_entry_count" in variant:  # the pool is short: fewer rounds fit
        assert multi.scheduler.num_preemptions > 0
        assert multi.num_multi_step_launches > 0
    else:
        assert multi.num_multi_step_launches > 5, multi.num_multi_step_launches
    finish = {v[2] for v in got.values()}
    assert {"stop", "length"} <= finish, "the mix should end some requests on a stop and some on length"


def test_rounds_are_long_and_end_exactly_at_max_new_tokens(make_tiny_model: Callable[[str], Path]) -> None:
    """All requests at once, no stops: after the prefill every launch is a full round but the last,
    which is cut to what the requests have left (no token is computed past max_new_tokens)."""
    path = make_tiny_model(ARCH)
    prompts = _prompts(6, seed=3)
    multi = _engine(path, 8)
    got = _run(multi, prompts, lambda i: GenerationConfig(max_new_tokens=30, ignore_eos=True), join_every=100)
    assert all(len(v[0]) == 30 and v[2] == "length" for v in got.values())
    # 1 prefill step (its token) + 29 decode steps in rounds of 8, 8, 8, 5: 5 launches in all
    assert multi.num_multi_step_launches == 4
    assert multi.num_steps == 30
    expected = _run(
        _engine(path, 1),
        prompts,
        lambda i: GenerationConfig(max_new_tokens=30, ignore_eos=True),
        join_every=100,
    )
    assert got == expected


def test_stop_token_and_stop_string_mid_round(make_tiny_model: Callable[[str], Path]) -> None:
    """Stops chosen from a plain greedy run so that they fall inside rounds: the stop id (or the stop
    string's token) is the 11th (or 8th) token of the request's own greedy output."""
    path = make_tiny_model(ARCH)
    prompts = _prompts(6, seed=21)
    plain = _run(
        _engine(path, 1),
        prompts,
        lambda i: GenerationConfig(max_new_tokens=40, ignore_eos=True),
        join_every=100,
    )
    tok = _engine(path, 1).tokenizer

    def params(i: int) -> GenerationConfig:
        ids = plain[str(i)][0]
        if i % 2:
            return GenerationConfig(max_new_tokens=40, stop_token_ids=[ids[10]])
        word = tok.decode([ids[7]]).strip()
        return GenerationConfig(max_new_tokens=40, stop_words=[word] if word else None, ignore_eos=True)

    expected = _run(_engine(path, 1), prompts, params, join_every=100)
    multi = _engine(path, 4)
    ends = _record_round_ends(multi)
    got = _run(multi, prompts, params, join_every=100)
    assert got == expected
    assert sum(v[2] == "stop" for v in got.values()) >= 4
    # requests stopped before their round's last step: their later ids were computed and dropped
    assert sum(reason == "stop" and kept < ran for reason, kept, ran in ends) >= 2, ends


def _record_rounds(engine: Engine) -> list[tuple[int, bool, bool, int]]:
    """Wrap ``_round_steps``: per launch decided, (steps, batch full, requests waiting, the fewest
    tokens any row had left before it)."""
    rounds: list[tuple[int, bool, bool, int]] = []
    decide = engine._round_steps

    def wrapped(out: Any) -> int:
        sched = engine.scheduler
        full = sched.num_running >= engine.scheduler_config.max_batch_size
        waiting = bool(sched.waiting)
        left = min(
            s.request.params.max_new_tokens - len(s.request.output_token_ids) - s.request.num_pending_tokens
            for s in out.scheduled
        )
        k = decide(out)
        rounds.append((k, full, waiting, left))
        return k

    engine._round_steps = wrapped  # type: ignore[method-assign]
    return rounds


def test_full_batch_runs_rounds_by_default(make_tiny_model: Callable[[str], Path]) -> None:
    """``full_batch_steps`` (default 8) with ``num_scheduler_steps`` 1: rounds run only while
    ``max_batch_size`` requests are running and none waits (a round then delays nobody); outputs
    equal one step per launch throughout, also with one slot (every lone request is a full batch)."""
    path = make_tiny_model(ARCH)
    assert EngineConfig().full_batch_steps == 8 and EngineConfig().num_scheduler_steps == 1

    def params(i: int) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=12 + 3 * i, ignore_eos=True)

    # 8 requests for 8 slots: full from the start, nothing waits; then no longer full as they finish
    prompts = _prompts(8, seed=4)
    full = _default_engine(path)
    assert full.full_batch_steps == 8 and full.num_scheduler_steps == 1
    rounds = _record_rounds(full)
    assert _run(full, prompts, params, join_every=100) == _run(
        _engine(path, 1), prompts, params, join_every=100
    )
    assert any(k == 8 for k, _, _, _ in rounds), rounds
    assert all(f and not w for k, f, w, _ in rounds if k > 1), rounds
    assert any(not f for k, f, _, _ in rounds), "the tail of the run (a batch that is not full) was not seen"
    # 12 requests for 8 slots: no round while requests wait
    prompts = _prompts(12, seed=4)
    queued = _default_engine(path)
    rounds = _record_rounds(queued)
    assert _run(queued, prompts, params, join_every=100) == _run(
        _engine(path, 1), prompts, params, join_every=100
    )
    assert all(k == 1 for k, _, w, _ in rounds if w), rounds
    assert any(w for _, _, w, _ in rounds)
    # the same requests in a batch that never fills: one step per launch
    roomy = _default_engine(path, max_batch_size=16)
    assert _run(roomy, prompts, params, join_every=100) == _run(
        _engine(path, 1), prompts, params, join_every=100
    )
    assert roomy.num_multi_step_launches == 0


@pytest.mark.parametrize("slots", [1, 3])
def test_full_batch_rounds_keep_outputs_with_few_slots(
    slots: int, make_tiny_model: Callable[[str], Path]
) -> None:
    """The test mix (stop ids and strings, sampling, min_tokens) through 1 or 3 slots with
    ``full_batch_steps`` 4: the same outputs as one step a launch, no leaked block (``_run``)."""
    path = make_tiny_model(ARCH)
    prompts = _prompts(7, seed=8)
    expected = _run(_engine(path, 1, max_batch_size=slots), prompts)
    multi = _engine(path, 1, max_batch_size=slots, full_batch_steps=4)
    assert _run(multi, prompts) == expected
    assert multi.num_multi_step_launches > 0


def test_rounds_while_requests_wait_admit_them_on_time(make_tiny_model: Callable[[str], Path]) -> None:
    """``num_scheduler_steps`` 4 with a queue (``ignore_eos``, mixed lengths): no round outlasts the
    running request with the fewest tokens left, none runs while a request's last token is in flight,
    and a round is collected before the next step is scheduled, so every queued request is admitted no
    later than with one step a launch (one step earlier where the overlapped single steps would
    schedule once more before collecting the finished request)."""
    path = make_tiny_model(ARCH)
    prompts = _prompts(14, seed=6)

    def params(i: int) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=(5, 17, 9, 23, 12, 30, 7)[i % 7], ignore_eos=True)

    def admitted(engine: Engine) -> dict[str, int]:
        """request id -> engine.num_steps when its prefill was scheduled."""
        at: dict[str, int] = {}
        schedule = engine.scheduler.schedule

        def wrapped() -> Any:
            out = schedule()
            for s in out.scheduled:
                at.setdefault(s.request.request_id, engine.num_steps)
            return out

        engine.scheduler.schedule = wrapped  # type: ignore[method-assign]
        return at

    one = _engine(path, 1)
    at_one = admitted(one)
    expected = _run(one, prompts, params, join_every=100)
    multi = _engine(path, 4)
    at_multi = admitted(multi)
    rounds = _record_rounds(multi)
    assert _run(multi, prompts, params, join_every=100) == expected
    assert any(k > 1 and w for k, _, w, _ in rounds), "no round ran while requests waited"
    assert all(k <= left for k, _, w, left in rounds if w), rounds
    assert at_multi.keys() == at_one.keys()
    assert all(at_multi[r] <= at_one[r] for r in at_one), (at_multi, at_one)


def test_a_round_is_collected_before_scheduling_while_requests_wait(
    make_tiny_model: Callable[[str], Path],
) -> None:
    """While requests wait, a round in flight is collected before the next step is scheduled (a
    request that stopped in it hands its slot over at once); with nobody waiting the next step is
    scheduled over it (overlap)."""
    path = make_tiny_model(ARCH)
    engine = _engine(path, 4, max_batch_size=2)
    for i, p in enumerate(_prompts(3, seed=2)):
        engine.add_request(str(i), p, GenerationConfig(max_new_tokens=40, ignore_eos=True))
    seen = []
    for _ in range(30):
        engine.step()
        flight = engine._inflight
        if flight is not None and flight[2] > 1:
            seen.append((bool(engine.scheduler.waiting), engine._may_overlap()))
    assert (True, False) in seen, seen
    assert all(not overlap for waiting, overlap in seen if waiting), seen
    while engine.has_unfinished():
        engine.step()
    solo = _engine(path, 4, max_batch_size=2)
    solo.add_request("0", _prompts(1, seed=2)[0], GenerationConfig(max_new_tokens=40, ignore_eos=True))
    seen = []
    while solo.has_unfinished():
        solo.step()
        flight = solo._inflight
        if flight is not None and flight[2] > 1:
            seen.append(solo._may_overlap())
    assert seen and all(seen), seen


def test_full_batch_steps_is_validated() -> None:
    for bad in (0, 65, 2.5):
        with pytest.raises(ConfigError, match="full_batch_steps"):
            EngineConfig(full_batch_steps=bad)  # type: ignore[arg-type]


def test_rows_that_need_the_host_fall_back_to_one_step(make_tiny_model: Callable[[str], Path]) -> None:
    """A batch with a logprobs or penalty row runs one step per launch (and gives the same output)."""
    path = make_tiny_model(ARCH)
    prompts = _prompts(4, seed=9)

    def params(i: int) -> GenerationConfig:
        if i == 0:
            return GenerationConfig(max_new_tokens=20, logprobs=2, ignore_eos=True)
        if i == 1:
            return GenerationConfig(max_new_tokens=20, repetition_penalty=1.2, ignore_eos=True)
        return GenerationConfig(max_new_tokens=20, ignore_eos=True)

    multi = _engine(path, 4)
    got = _run(multi, prompts, params, join_every=100)
    assert multi.num_multi_step_launches == 0
    assert got == _run(_engine(path, 1), prompts, params, join_every=100)


def test_abort_mid_round_frees_blocks_and_keeps_other_outputs(make_tiny_model: Callable[[str], Path]) -> None:
    path = make_tiny_model(ARCH)
    prompts = _prompts(8, seed=5)
    baseline = _run(_engine(path, 4), prompts)
    got = _run(_engine(path, 4), prompts, abort={0: 6, 3: 7, 6: 9})
    for rid in ("0", "3", "6"):
        assert got[rid][2] == "abort"
        assert got[rid][0] == baseline[rid][0][: len(got[rid][0])]
    for rid in set(baseline) - {"0", "3", "6"}:
        assert got[rid] == baseline[rid]


def test_num_scheduler_steps_is_validated() -> None:
    with pytest.raises(ConfigError, match="num_scheduler_steps"):
        EngineConfig(num_scheduler_steps=0)
    with pytest.raises(ConfigError, match="num_scheduler_steps"):
        EngineConfig(num_scheduler_steps=65)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "variant", [{}, {"enable_prefix_caching": True}, {"quant_policy": 8}], ids=["plain", "prefix", "int8"]
)
def test_multi_step_graph_rounds_equal_one_step_gpu(
    variant: dict[str, Any], make_tiny_model: Callable[[str], Path]
) -> None:
    """On the GPU a round replays the decode graph with ``kernels/decode_advance.py`` between the
    replays (greedy rows take the graph's argmax, sampled rows the sampler): the same outputs as one
    step per launch, and the rounds really ran from the graphs."""
    path = make_tiny_model(ARCH)
    prompts = _prompts(12)
    kw = dict(device="cuda", dtype="bfloat16", cache_max_entry_count=0.05, **variant)
    expected = _run(_engine(path, 1, **kw), prompts, join_every=100)
    multi = _engine(path, 4, **kw)
    runner = multi.executor.runner  # type: ignore[attr-defined]
    got = _run(multi, prompts, join_every=100)
    assert got == expected
    assert multi.num_multi_step_launches > 5 and runner.num_graph_steps > 3 * multi.num_multi_step_launches
    assert runner._history is not None


GraphKey = tuple[int, "int | None"]


def _short_then_full(g: Any, run: Callable[[], Any]) -> tuple[Any, list[GraphKey], Any, list[GraphKey]]:
    """``run()`` with the decode graphs' short-context graphs, then with each bucket's graph for any
    context alone -> ``(short output, its replayed graph keys, full output, its keys)``; the graphs'
    ``key_for`` and limits are restored."""
    keys: list[GraphKey] = []
    key_for, limits = g.key_for, g.short_limits

    def record(bucket: int, context: int | None = None) -> GraphKey:
        keys.append(key_for(bucket, context))
        return keys[-1]

    g.key_for = record
    try:
        short = run()
        short_keys = list(keys)
        keys.clear()
        g.short_limits = {}
        full = run()
    finally:
        del g.key_for
        g.short_limits = limits
    return short, short_keys, full, list(keys)


@pytest.mark.gpu
def test_short_context_graphs_gpu(make_tiny_model: Callable[[str], Path]) -> None:
    """Batch 1 replays the short-context decode graph of the fewest splits whose limit the context
    fits (1 split up to 64 tokens, 2 up to 128, 4 up to 256 at this head dim), switching inside
    multi-step rounds; greedy tokens are those of the same engine replaying only its graph for any
    context."""
    path = make_tiny_model(ARCH)
    prompt = [3 + (7 * i) % (TINY_VOCAB - 3) for i in range(10)]
    engine = _engine(path, 4, device="cuda", dtype="bfloat16", cache_max_entry_count=0.05, max_batch_size=4)
    g = engine.executor.runner.graphs  # type: ignore[attr-defined]
    assert g.short_limits[1] == {1: 64, 2: 128, 4: 256, 8: 512}
    one = GenerationConfig(max_new_tokens=150, ignore_eos=True)
    short, short_keys, full, full_keys = _short_then_full(
        g, lambda: _run(engine, [prompt], params=lambda i: one)["0"][0]
    )
    # batch 4 (rows of 9 and 10 tokens): bucket 4's short graphs against its full one
    rows = [prompt, prompt[::-1], prompt[1:], prompt[2:] + prompt[:1]]
    four_cfg = GenerationConfig(max_new_tokens=90, ignore_eos=True)
    four, four_keys, four_full, _ = _short_then_full(
        g, lambda: _run(engine, rows, params=lambda i: four_cfg, join_every=100)
    )
    assert len(short) == 150 and short == full
    assert set(full_keys) == {(1, None)}
    # decode contexts 11 .. 159 (the first token comes from the prefill)
    assert short_keys.count((1, 1)) == 64 - 10 and short_keys.count((1, 2)) == 64, short_keys
    assert set(short_keys) == {(1, 1), (1, 2), (1, 4)}, short_keys
    assert short_keys == sorted(short_keys, key=lambda k: k[1] or 0), short_keys
    assert four == four_full and all(len(v[0]) == 90 for v in four.values())
    caps4 = g.short_limits.get(4, {})
    assert caps4 and {k for k in four_keys if k[0] == 4} == {(4, c) for c in caps4 if c <= 2}, four_keys


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("arch", "limits", "replays"),
    [
        # the Triton int8 kernel: 32-key tiles with splits; contexts 11-128 take cap 4, 129-209 cap 8
        ("llama_gqa_llama3rope", {4: 128, 8: 256}, {4: 118, 8: 81}),
        # the CUDA int8 kernel (head dim 128): 64-key tiles; every context up to 209 fits cap 4
        ("llama_hd128", {4: 256, 8: 512}, {4: 199}),
    ],
)
def test_short_context_graphs_int8_gpu(
    make_tiny_model: Callable[[str], Path], arch: str, limits: dict[int, int], replays: dict[int, int]
) -> None:
    """Over an int8 KV cache batch 1 replays its short-context graphs (caps 8 and 4, their limits in
    the tiles of the kernel that runs) by context, switching inside multi-step rounds; greedy tokens
    are those of the same engine replaying only its graph for any context."""
    if arch == "llama_hd128":
        import torch

        from hotloop.kernels import cuda_jit, kv_int8_decode_cuda

        names = kv_int8_decode_cuda.kernel_names()
        if cuda_jit.load(kv_int8_decode_cuda.SOURCE, torch.device("cuda"), names) is None:
            pytest.skip(
                "the CUDA int8 decode kernel does not build here (no nvcc, or a GPU older than Hopper)"
            )
    path = make_tiny_model(arch)
    prompt = [3 + (5 * i) % (TINY_VOCAB - 3) for i in range(10)]
    engine = _engine(
        path, 4, device="cuda", dtype="bfloat16", cache_max_entry_count=0.05, max_batch_size=4, quant_policy=8
    )
    g = engine.executor.runner.graphs  # type: ignore[attr-defined]
    assert g.short_limits[1] == limits
    cfg = GenerationConfig(max_new_tokens=200, ignore_eos=True)
    short, short_keys, full, full_keys = _short_then_full(
        g, lambda: _run(engine, [prompt], params=lambda i: cfg)["0"][0]
    )
    assert len(short) == 200 and short == full
    assert set(full_keys) == {(1, None)}
    # decode contexts 11 .. 209, one replay each (a last round may run past 209: at least that many
    # of the last cap's), the caps in order and no other graph
    counts = {c: short_keys.count((1, c)) for c in limits if (1, c) in short_keys}
    *inner, last = sorted(replays)
    assert set(counts) == set(replays), short_keys
    assert all(counts[c] == replays[c] for c in inner) and counts[last] >= replays[last], counts
    assert len(short_keys) == len(full_keys) == sum(counts.values())
    assert short_keys == sorted(short_keys, key=lambda k: k[1] or 0), short_keys


def test_prefix_cache_after_a_row_ends_mid_round(make_tiny_model: Callable[[str], Path]) -> None:
    """A request that reaches max_new_tokens inside a longer round (another row keeps it going) never
    writes its last token's K/V; its blocks must be cached only up to what was written. A follow-up
    request whose prompt is the first one's whole text (a multi-turn chat) then gives the same tokens
    as with one step per launch."""
    path = make_tiny_model(ARCH)
    rng = random.Random(4)
    first = [rng.randrange(3, TINY_VOCAB) for _ in range(6)]  # 6 + 10 tokens: four full blocks of 4
    other = [rng.randrange(3, TINY_VOCAB) for _ in range(9)]
    extra = [rng.randrange(3, TINY_VOCAB) for _ in range(5)]
    runs = []
    for steps in (1, 8):
        eng = _engine(path, steps, enable_prefix_caching=True)
        a = _run(
            eng,
            [first, other],
            lambda i: GenerationConfig(max_new_tokens=10 if i == 0 else 40, ignore_eos=True),
            join_every=100,
        )
        follow = first + a["0"][0] + extra
        b = _run(
            eng, [follow], lambda i: GenerationConfig(max_new_tokens=12, ignore_eos=True), join_every=100
        )
        assert eng.block_manager.prefix_hits > 0
        runs.append((a, b, eng.block_manager.prefix_hits, eng.num_multi_step_launches))
    assert runs[1][3] > 0
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]
    # the follow-up hits three blocks (12 tokens) both ways: the fourth block's last token (the first
    # request's last output) has no K/V, so that block was never registered
    assert runs[0][2] == runs[1][2] == 12


def test_off_where_the_executor_cannot_run_rounds() -> None:
    """An executor whose runner cannot run several steps per launch (the GPU runner in eager mode)
    gets single steps, so no round's blocks are allocated ahead for nothing; overlap off as well."""
    from types import SimpleNamespace

    from hotloop.config import CacheConfig, ModelConfig, SchedulerConfig

    mc = ModelConfig(
        path="x", architecture="LlamaForCausalLM", hf_config=None, num_layers=1, num_kv_heads=1, head_dim=8,
        vocab_size=10, max_position_embeddings=64, dtype="float32", eos_token_ids=(2,),
    )  # fmt: skip

    def engine(supports: bool, overlap: bool = True) -> Engine:
        ex = SimpleNamespace(
            launch=None, collect=None, collect_steps=None, execute=None, supports_multi_step=supports
        )
        cache = CacheConfig(block_size=4, num_blocks=8)
        return Engine(ex, None, mc, cache, SchedulerConfig(4, 64, 64), overlap=overlap, num_scheduler_steps=8)

    assert engine(True).num_scheduler_steps == 8
    assert engine(False).num_scheduler_steps == 1
    assert engine(True, overlap=False).num_scheduler_steps == 1


def test_build_says_when_the_flag_is_ignored(
    make_tiny_model: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    path = make_tiny_model(ARCH)
    root = logging.getLogger("hotloop")  # (it does not propagate to the root logger caplog watches)
    root.addHandler(caplog.handler)
    try:
        assert _engine(path, 4).num_scheduler_steps == 4
        assert _engine(path, 4, disable_overlap_schedule=True).num_scheduler_steps == 1
    finally:
        root.removeHandler(caplog.handler)
    text = caplog.text
    assert "up to 4 decode steps per launch" in text
    assert "--num-scheduler-steps 4 ignored" in text and "--disable-overlap-schedule" in text


def test_json_mode_rows_run_one_step_at_a_time_with_their_mask(
    make_tiny_model: Callable[[str], Path],
) -> None:
    """A JSON-mode row keeps its batch out of multi-step rounds and out of overlap (its grammar needs each
    token on the host before the next mask): the same outputs as one step, collected every step, and the
    JSON rows' tokens are a prefix the grammar accepts, or a whole object."""
    import json

    path = make_tiny_model(ARCH)
    prompts = _prompts(4, seed=5)

    def params(i: int) -> GenerationConfig:
        if i % 2 == 0:
            return GenerationConfig(max_new_tokens=24, response_format="json_object", ignore_eos=i == 2)
        return GenerationConfig(max_new_tokens=24, ignore_eos=True)

    multi = _engine(path, 4)
    got = _run(multi, prompts, params, join_every=100)
    assert multi.num_multi_step_launches == 0 and multi.num_overlapped_steps == 0
    assert got == _run(_engine(path, 1, disable_overlap_schedule=True), prompts, params, join_every=100)
    for i in (0, 2):
        ids, text, reason, _n = got[str(i)]
        g = multi.json_grammar.matcher([2])
        assert not any(g.advance(t) for t in ids[:-1]), text
        if reason == "stop":
            assert ids[-1] == 2 and isinstance(json.loads(text), dict)
        else:
            assert reason == "length" and not g.advance(ids[-1])
