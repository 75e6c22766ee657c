"""The GPU runner's input preparation and the Triton model path, end to end on the CPU.

``GpuModelRunner`` (persistent buffers, device metadata) runs a tiny model with every op forced
onto the Triton kernels through the interpreter; its greedy tokens must equal the plain CPU
runner's (torch reference ops) over prefill, chunked prefill and decode steps.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from kernel_checks import interpret

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.executor.gpu_runner import GpuModelRunner
from hotloop.messages import GenerationConfig


def _generate(engine: object, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    params = GenerationConfig(max_new_tokens=max_new, ignore_eos=True)
    out: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, p in enumerate(prompts[:2]):
        engine.add_request(str(i), p, params)  # type: ignore[attr-defined]
    step = 0
    while engine.has_unfinished() or step < 2:  # type: ignore[attr-defined]
        if step == 2:
            for i, p in enumerate(prompts[2:], start=2):
                engine.add_request(str(i), p, params)  # type: ignore[attr-defined]
        for o in engine.step():  # type: ignore[attr-defined]
            out[o.request_id] += o.new_token_ids
        step += 1
    return [out[str(i)] for i in range(len(prompts))]


@interpret
@pytest.mark.parametrize("arch", ["mistral_window"])
def test_triton_path_matches_reference(
    arch: str, make_tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_tiny_model(arch)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(2, 20))] for _ in range(4)]
    cfg = EngineConfig(
        device="cpu",
        dtype="float32",
        max_batch_size=4,
        cache_block_seq_len=4,
        cache_max_entry_count=128,
        max_prefill_token_num=16,
    )
    expected = _generate(build_engine(str(path), cfg).engine, prompts, 4)

    built = build_engine(str(path), cfg)
    ex = built.engine.executor
    ex.runner = GpuModelRunner(  # type: ignore[attr-defined]
        ex.model,
        ex.kv_caches,
        4,
        ex.device,
        4,
        20,
        128,
        use_cuda_graph=False,  # type: ignore[attr-defined]
    )
    from hotloop.kernels import ops

    monkeypatch.setattr(ops, "use_triton", lambda x: True)
    got = _generate(built.engine, prompts, 4)
    assert got == expected
