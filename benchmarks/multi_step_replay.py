"""How many decode steps multi-step rounds cost when requests stop on a stop id while others queue
(CPU, a tiny random Llama: the engine's scheduling, not a model's speed).

    python benchmarks/multi_step_replay.py [--requests 48] [--slots 8] [--out replay.json]

48 requests (sampled, seeded) through 8 slots, each up to 200 tokens, with stop ids a random 0.5%,
1% and 3% of the vocabulary (the random model samples nearly uniformly, so about that share of its
tokens is a stop). Per stop rate,
the decode steps the engine launched (``Engine.num_steps``; a stop mid-round leaves the rest of its
round computed and dropped) under:

- ``one_step``: ``--full-batch-steps 1`` (one step a launch throughout), the baseline;
- ``default``: ``--full-batch-steps 8`` (rounds only while the batch is full and nothing waits);
- ``ms8``: ``--num-scheduler-steps 8``, which also runs rounds while requests wait;
- ``ms8_overlapped``: the same with the engine's collect-first rule removed (``_may_overlap`` as
  before it: the next round is scheduled before a round in flight is collected, so a request that
  stopped in it holds its slot through the next round too).

Every variant's tokens must equal the baseline's (checked). The model is random (64 wide, 2 layers)
with the embedded default model's tokenizer (SmolLM2's vocabulary).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.messages import GenerationConfig
from hotloop.models.resolve import resolve_model_path

MAX_NEW = 200


def tiny_model(folder: Path) -> Path:
    """A random 2-layer Llama over the default model's tokenizer, saved as an HF folder."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(resolve_model_path(None)))
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def run(path: Path, params: Callable[[int], GenerationConfig], n: int, slots: int, overlapped: bool = False,
        **cfg: Any) -> tuple[dict[str, list[int]], int]:  # fmt: skip
    """Every request at once; returns (tokens per request, decode steps launched)."""
    engine = build_engine(
        str(path),
        EngineConfig(
            device="cpu",
            dtype="float32",
            max_batch_size=slots,
            cache_block_seq_len=4,
            cache_max_entry_count=4096,
            **cfg,
        ),  # fmt: skip
    ).engine
    if overlapped:  # the collect-first rule removed: a round in flight counts as a single step there
        may_overlap = engine._may_overlap

        def without_rule() -> bool:
            flight = engine._inflight
            if flight is None or flight[2] == 1:
                return may_overlap()
            engine._inflight = (flight[0], flight[1], 1)
            try:
                return may_overlap()
            finally:
                engine._inflight = flight

        engine._may_overlap = without_rule  # type: ignore[method-assign]
    rng = random.Random(5)
    vocab = engine.model_config.vocab_size
    for i in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 30))]
        engine.add_request(str(i), prompt, params(i))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert engine.num_free_blocks == engine.num_total_blocks, "leaked KV blocks"
    return tokens, engine.num_steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    args = ap.parse_args()
    n, slots = args.requests, args.slots
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model(Path(tmp))

        def sampled(i: int, stops: tuple[int, ...] = ()) -> GenerationConfig:
            return GenerationConfig(
                max_new_tokens=MAX_NEW, stop_token_ids=list(stops) or None, ignore_eos=not stops,
                do_sample=True, temperature=1.0, random_seed=i,
            )  # fmt: skip

        vocab = int(json.loads((path / "config.json").read_text())["vocab_size"])
        pick = random.Random(11)
        for target in (0.005, 0.01, 0.03):
            # the random model samples its vocabulary nearly uniformly: stop ids that are this share of
            # it end about this share of the sampled tokens
            stops = pick.sample(range(3, vocab), round(target * vocab))

            def params(i: int, s: tuple[int, ...] = tuple(stops)) -> GenerationConfig:
                return sampled(i, s)

            base, base_steps = run(path, params, n, slots, full_batch_steps=1)
            row: dict[str, Any] = {
                "stop_ids_share_of_vocab": target,
                "tokens": sum(len(v) for v in base.values()),
                "stopped": sum(len(v) < MAX_NEW for v in base.values()),
                "one_step": base_steps,
            }
            variants = {
                "default": dict(full_batch_steps=8),
                "ms8": dict(num_scheduler_steps=8, full_batch_steps=1),
                "ms8_overlapped": dict(num_scheduler_steps=8, full_batch_steps=1, overlapped=True),
            }
            for name, kw in variants.items():
                got, steps = run(path, params, n, slots, **kw)
                assert got == base, f"{name}: tokens differ from one step a launch"
                row[name] = steps
                row[name + "_vs_one_step"] = round(steps / base_steps - 1, 4)
            rows.append(row)
            print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
