"""Prompt logprobs (``GenerationConfig.prompt_logprobs``) against transformers' own logits.

For every prompt token after the first, hotloop's log p(token | prefix) and its top-k must equal
the log-softmax of transformers' logits at the position before it (float32, tiny random models),
whether the prompt is prefilled whole or in chunks, beside other requests, with prefix caching on
(a request that asks for prompt logprobs takes no cached blocks) and after a preemption.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_engine_parity import make_prompts

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.messages import GenerationConfig, RequestError

TOP = 3


def hf_logprobs(path: Path, prompts: list[list[int]]) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32)
    with torch.no_grad():
        return [torch.log_softmax(model(torch.tensor([p])).logits[0].float(), -1) for p in prompts]


def run(path: Path, cfg: EngineConfig, prompts: list[list[int]], params: list[GenerationConfig]) -> dict:
    engine = build_engine(str(path), cfg).engine
    for i, (p, g) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), p, g)
    firsts: dict[str, list] = {}
    carried: dict[str, int] = {}
    done: set[str] = set()
    while len(done) < len(prompts):
        for o in engine.step():
            if o.prompt_logprobs is not None:
                carried[o.request_id] = carried.get(o.request_id, 0) + 1
                firsts[o.request_id] = o.prompt_logprobs
            if o.finished:
                done.add(o.request_id)
    assert engine.num_free_blocks == engine.num_total_blocks
    assert all(n == 1 for n in carried.values()), f"prompt logprobs must come once per request: {carried}"
    return firsts


def check(got: list, ref: torch.Tensor, prompt: list[int], k: int, tol: float = 1e-4) -> None:
    """``got`` against the float32 reference; ``tol`` > 1e-4 (bf16): the top-k values are compared
    as sorted lists, since bf16 may swap near-equal alternatives."""
    assert len(got) == len(prompt) and got[0] is None
    for p in range(1, len(prompt)):
        lp = got[p]
        assert lp.token_id == prompt[p]
        want = ref[p - 1, prompt[p]].item()
        assert lp.logprob == pytest.approx(want, abs=tol), f"position {p}"
        if k:
            values, ids = ref[p - 1].topk(k)
            if tol <= 1e-4:
                assert sorted(lp.top) == sorted(ids.tolist()), f"position {p}: top ids"
                for tid, v in zip(ids.tolist(), values.tolist(), strict=True):
                    assert lp.top[tid] == pytest.approx(v, abs=tol)
            else:
                assert sorted(lp.top.values(), reverse=True) == pytest.approx(values.tolist(), abs=tol)
        else:
            assert lp.top == {}


VARIANTS = {
    "whole": dict(cache_block_seq_len=4, cache_max_entry_count=512),
    "chunked": dict(cache_block_seq_len=4, cache_max_entry_count=512, max_prefill_token_num=7),
    "prefix_cache": dict(cache_block_seq_len=4, cache_max_entry_count=512, enable_prefix_caching=True),
    "preempt": dict(
        cache_block_seq_len=4,
        cache_max_entry_count=16,
        max_prefill_token_num=64,
        schedule_conservativeness=0.0,
    ),
}


def _case(variant: str, path: Path, cfg: EngineConfig, tol: float) -> None:
    prompts = make_prompts(seed=7, n=6)
    if variant == "prefix_cache":
        prompts[3] = prompts[1][:]  # the same prompt again: its blocks are cached by then
    ref = hf_logprobs(path, prompts)
    # every other request asks (top-3, then chosen only); the rest generate beside them
    params = [
        GenerationConfig(max_new_tokens=12, ignore_eos=True, prompt_logprobs=(TOP if i % 4 == 0 else 0))
        if i % 2 == 0 or (variant == "prefix_cache" and i == 3)
        else GenerationConfig(max_new_tokens=12, ignore_eos=True)
        for i in range(len(prompts))
    ]
    firsts = run(path, cfg, prompts, params)
    asked = {str(i) for i, g in enumerate(params) if g.prompt_logprobs is not None}
    assert set(firsts) == asked
    for rid in asked:
        i = int(rid)
        check(firsts[rid], ref[i], prompts[i], params[i].prompt_logprobs or 0, tol)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prompt_logprobs_match_transformers(variant: str, make_tiny_model: Callable[[str], Path]) -> None:
    cfg = EngineConfig(device="cpu", dtype="float32", max_batch_size=8, **VARIANTS[variant])
    _case(variant, make_tiny_model("llama_gqa_llama3rope"), cfg, 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prompt_logprobs_gpu_bf16(variant: str, eager: bool, make_tiny_model: Callable[[str], Path]) -> None:
    """The GPU runner (piecewise graphs, or eager) in bf16 against transformers in float32: within
    0.05 (bf16 logits of this tiny model are about 1; their rounding moves a log-softmax by ~0.01)."""
    cfg = EngineConfig(
        device="cuda", dtype="bfloat16", max_batch_size=8, eager_mode=eager, **VARIANTS[variant]
    )
    _case(variant, make_tiny_model("llama_gqa_llama3rope"), cfg, 0.05)


def test_prompt_logprobs_in_pipeline_and_validated(make_tiny_model: Callable[[str], Path]) -> None:
    from hotloop.api.pipeline import Pipeline

    path = make_tiny_model("llama_gqa_llama3rope")
    pipe = Pipeline(str(path), backend_config=EngineConfig(device="cpu", dtype="float32"))
    text = "the quick brown fox jumps over the lazy dog"
    prompt = list(pipe.tokenizer.encode(text))
    ref = hf_logprobs(path, [prompt])[0]
    cfg = GenerationConfig(max_new_tokens=2, prompt_logprobs=2)
    r = pipe([text], gen_config=cfg, do_preprocess=False)[0]
    assert r.prompt_logprobs is not None
    check(r.prompt_logprobs, ref, prompt, 2)
    streamed = [x.prompt_logprobs for x in pipe.stream_infer(text, gen_config=cfg, do_preprocess=False)]
    assert streamed[0] == r.prompt_logprobs and all(x is None for x in streamed[1:])
    plain = pipe([text], gen_config=GenerationConfig(max_new_tokens=2), do_preprocess=False)[0]
    assert plain.prompt_logprobs is None
    with pytest.raises(RequestError, match=r"prompts\[0\] is a list of int"):  # was: an AttributeError
        pipe([prompt], do_preprocess=False)
    for bad in (-1, 21, True, 1.5):
        with pytest.raises(RequestError) as e:
            GenerationConfig(prompt_logprobs=bad)  # type: ignore[arg-type]
        assert e.value.param == "prompt_logprobs"
