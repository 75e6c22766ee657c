"""A real ``Engine`` over a toy executor and a byte-level tokenizer, for fast in-process server tests.

The toy model is deterministic: the next token is a lowercase letter computed from the previous
token and the position; a seeded sampled request mixes in its seed. A prompt containing ``EOS``
makes the model emit the end-of-sequence token after three tokens; one containing ``SAY:`` makes it
say the rest of that line, byte by byte, then the end-of-sequence token. ``step_delay`` slows each step
so tests can catch requests mid-flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotloop.config import CacheConfig, ModelConfig, SchedulerConfig
from hotloop.engine.engine import Engine
from hotloop.engine.outputs import SampledToken
from hotloop.engine.scheduler import SchedulerOutput
from hotloop.messages import TokenLogprob

EOS = 256
BOS = 257
VOCAB = 260


class ByteTokenizer:
    """Token id = byte value; 256 is ``<eos>``, 257 ``<bos>``. Has a tiny chat template."""

    chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out = bytearray()
        for t in ids:
            if t < 256:
                out.append(t)
            elif not skip_special_tokens:
                out += {EOS: b"<eos>", BOS: b"<bos>"}.get(t, b"<unk>")
        return out.decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        chat_template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        import json

        text = f"<tools>{json.dumps(tools)}\n" if tools else ""
        for m in messages:
            calls = f"<calls>{json.dumps(m['tool_calls'])}" if m.get("tool_calls") else ""
            text += f"<{m['role']}>{m['content']}{calls}\n"
        return text + ("<assistant>" if add_generation_prompt else "")


def next_token(prev: int, pos: int, seed: int | None) -> int:
    mix = 0 if seed is None else (seed * 2654435761) % 9973
    return ord("a") + (prev * 7 + pos * 3 + mix) % 26


class ToyExecutor:
    def __init__(self, step_delay: float = 0.0) -> None:
        self.step_delay = step_delay
        self.fail_next = False

    def execute(self, out: SchedulerOutput) -> list[SampledToken]:
        if self.step_delay:
            time.sleep(self.step_delay)
        if self.fail_next:
            raise RuntimeError("injected executor failure")
        result = []
        for s in out.scheduled:
            if not s.samples:
                continue
            req = s.request
            ids = req.prompt_token_ids + req.output_token_ids
            pos = len(req.output_token_ids)
            params = req.params
            seed = params.random_seed if not params.greedy else None
            prompt = bytes(t for t in req.prompt_token_ids if t < 256)
            say = prompt.find(b"SAY:")
            if say >= 0:
                script = prompt[say + 4 :].split(b"\n", 1)[0]
                result.append(SampledToken(script[pos] if pos < len(script) else EOS))
                continue
            if (
                b"EOS" in bytes(t for t in req.prompt_token_ids if t < 256)
                and pos == 3
                and not params.ignore_eos
            ):
                tok = EOS
            else:
                tok = next_token(ids[-1], pos, seed)
            lp = None
            if params.logprobs is not None:
                alt = ord("a") + (tok - ord("a") + 1) % 26
                top = {tok: -0.25, alt: -1.5, EOS: -3.0} if params.logprobs else {}
                lp = TokenLogprob(tok, -0.25, dict(list(top.items())[: params.logprobs]))
            result.append(SampledToken(tok, lp))
        return result


@dataclass(frozen=True)
class FakeBuilt:
    engine: Engine
    model_path: Path
    model_config: ModelConfig
    backend: str
    device: str
    tokenizer: Any


def make_built(
    session_len: int = 256,
    num_blocks: int = 64,
    block_size: int = 16,
    max_batch_size: int = 32,
    step_delay: float = 0.0,
) -> FakeBuilt:
    mc = ModelConfig(
        path="/models/toy-model",
        architecture="ToyForCausalLM",
        hf_config=None,
        num_layers=1,
        num_kv_heads=1,
        head_dim=8,
        vocab_size=VOCAB,
        max_position_embeddings=session_len,
        dtype="float32",
        eos_token_ids=(EOS,),
    )
    tok = ByteTokenizer()
    engine = Engine(
        ToyExecutor(step_delay),
        tok,
        mc,
        CacheConfig(block_size=block_size, num_blocks=num_blocks),
        SchedulerConfig(max_batch_size=max_batch_size, max_prefill_token_num=4096, session_len=session_len),
    )
    return FakeBuilt(engine, Path("/models/toy-model"), mc, "toy", "cpu", tok)
