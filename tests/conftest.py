"""Shared fixtures: GPU skipping, a tiny trained tokenizer, tiny random HF checkpoints."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_archs import TINY_ARCHS, TINY_VOCAB

__all__ = ["TINY_ARCHS", "TINY_VOCAB"]

# Without a GPU, Triton kernels run through Triton's interpreter (tests/kernels). ``triton.jit``
# reads this when it decorates, so it is set before any test imports a kernel module.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Converted models go to a per-session cache unless HOTLOOP_CACHE is already set."""
    if "HOTLOOP_CACHE" not in os.environ:
        os.environ["HOTLOOP_CACHE"] = str(tmp_path_factory.mktemp("hotloop-cache"))


def _train_tokenizer(out: Path) -> None:
    """A byte-level BPE with TINY_VOCAB ids, trained on Python's own docs (no download)."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(topics.values())[:200], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>", unk_token="<|endoftext|>"
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast.save_pretrained(str(out))


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-tokenizer")
    _train_tokenizer(out)
    return out


def _hf_config(arch: str, overrides: dict[str, Any]) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    base: dict[str, Any] = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    base.update(overrides)
    return cls(**base)


@pytest.fixture(scope="session")
def make_tiny_model(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path
) -> Callable[[str], Path]:
    """``make_tiny_model(name)`` -> a saved HF folder (random weights, seeded) for ``TINY_ARCHS[name]``."""
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name in made:
            return made[name]
        from transformers import AutoModelForCausalLM

        spec = dict(TINY_ARCHS[name])
        arch = spec.pop("arch")
        cfg = _hf_config(arch, spec)
        torch.manual_seed(1234)
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
        with torch.no_grad():  # larger weights than the init so greedy paths are decisive
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0, 0.08)
        out = tmp_path_factory.mktemp(name)
        model.save_pretrained(str(out))
        for f in tiny_tokenizer_dir.iterdir():
            (out / f.name).write_bytes(f.read_bytes())
        made[name] = out
        return out

    return make


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
