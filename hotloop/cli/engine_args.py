"""Engine flags, generated from ``EngineConfig``'s fields with LMDeploy's names."""

from __future__ import annotations

import argparse
import dataclasses

from hotloop.config import BACKENDS, DEVICES, DTYPES, LOAD_FORMATS, EngineConfig

_HELP = {
    "backend": f"inference engine: {', '.join(BACKENDS)} ('turbomind' is an alias of 'turbo')",
    "device": f"device: {', '.join(DEVICES)}",
    "dtype": f"weight and activation dtype: {', '.join(DTYPES)} (auto: float32 on CPU, the model's 16-bit dtype on GPU)",
    "tp": "tensor parallel degree",
    "session_len": "most tokens a sequence may hold, prompt plus output (default: the model's context length)",
    "max_batch_size": "most sequences running at once",
    "cache_max_entry_count": "KV pool: a float in (0, 1] is the fraction of free memory (1: all of it, as in LMDeploy); an int >= 2 a block count",
    "cache_block_seq_len": "tokens per KV block",
    "max_prefill_token_num": "most prompt tokens prefilled in one step; longer prompts are chunked",
    "enable_prefix_caching": "reuse KV blocks of shared prompt prefixes",
    "quant_policy": "KV cache quantization: 0 (none), 8 (int8), 4 (int4)",
    "model_format": "weight format: hf, gguf, awq (default: detected)",
    "eager_mode": "disable CUDA graphs",
    "embeddings_on_host": "keep the token-embedding table in pinned host memory (the GPU reads the looked-up rows "
    "over PCIe; frees vocab x hidden x 2 bytes of GPU memory for KV; turbo backend, untied embeddings)",
    "disable_overlap_schedule": "collect each step before scheduling the next (by default the host prepares step N+1 while the GPU runs step N)",
    "jit_schedule": "(experimental) with overlap, schedule the next step just before the GPU is expected to finish "
    "the current one, so that requests arriving meanwhile join it (lower TTFT; timing only, outputs unchanged)",
    "num_scheduler_steps": "multi-step decode: with overlap, run up to this many decode steps per host round trip "
    "when every running request is decoding (less host time per token; streamed tokens then arrive in bursts "
    "of this many)",
    "full_batch_steps": "multi-step decode while the batch is full (--max-batch-size requests running) and no "
    "request waits, so a round delays nobody: run up to this many decode steps per host round trip then, "
    "whatever --num-scheduler-steps says (the host's work per step falls several times; the streamed tokens "
    "of such a batch arrive in bursts of up to this many; with --max-batch-size 1 that is every lone request). "
    "Needs overlapped scheduling and, on a GPU, CUDA graphs. 1 turns it off",
    "schedule_conservativeness": "KV room admission keeps back for running requests' growth, in [0, 1] (SGLang's "
    "name): this weight x what a request will surely still fill (the rest of its prompt; its output with "
    "ignore_eos, else up to min_tokens), and after a step that had to preempt a request (its prompt is then "
    "computed again) up to this fraction of the rest of max_new_tokens, falling to 0 over 1,000 scheduler steps. "
    "0: admit whatever fits now (vLLM's behaviour)",
    "load_format": f"weights: {', '.join(LOAD_FORMATS)} (dummy: random weights from the config)",
    "seed": "engine-wide random seed",
    "vision_max_batch_size": "most images the vision encoder runs at once, counting each tile of a tiled model "
    "(LLaVA-NeXT, InternVL) as one image (vision-language models)",
}


# vLLM's names for the flags whose meaning is the same, accepted beside LMDeploy's (so that a vLLM
# command line needs fewer edits). Not aliased because the meaning differs: --gpu-memory-utilization
# (vLLM: the whole engine's share of total memory; --cache-max-entry-count: the KV cache's share of what
# is free after the weights), --max-num-batched-tokens (vLLM: every token of a step; hotloop's
# --max-prefill-token-num: prompt tokens), --kv-cache-dtype (fp8 there; --quant-policy is int8 / int4).
VLLM_ALIASES = {
    "tp": ("--tensor-parallel-size",),
    "session_len": ("--max-model-len",),
    "max_batch_size": ("--max-num-seqs",),
    "cache_block_seq_len": ("--block-size",),
    "eager_mode": ("--enforce-eager",),
}


def _cache_count(text: str) -> float | int:
    """A fraction of the free GPU memory in (0, 1] (LMDeploy's meaning, so ``1`` is all of it), or an
    integer block count from 2 up."""
    try:
        value = int(text)
        return 1.0 if value == 1 else value
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--cache-max-entry-count {text!r}: expected a float in (0, 1] (1: all free memory) or an int >= 2 (blocks)"
        ) from None


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    for f in dataclasses.fields(EngineConfig):
        flags = ("--" + f.name.replace("_", "-"), *VLLM_ALIASES.get(f.name, ()))
        default = f.default
        help_text = _HELP.get(f.name, f.name)
        if "(default:" not in help_text:
            help_text += f" (default: {default})"
        if f.name == "cache_max_entry_count":
            group.add_argument(*flags, type=_cache_count, default=default, help=help_text)
        elif isinstance(default, bool):
            group.add_argument(*flags, action="store_true", default=default, help=help_text)
        elif f.name == "quant_policy":
            group.add_argument(*flags, type=int, choices=(0, 4, 8), default=default, help=help_text)
        elif f.name in ("backend",):
            group.add_argument(*flags, choices=(*BACKENDS, "turbomind"), default=default, help=help_text)
        elif f.name in ("device",):
            group.add_argument(*flags, choices=DEVICES, default=default, help=help_text)
        elif f.name == "model_format":
            group.add_argument(*flags, choices=("hf", "gguf", "awq"), default=None, help=help_text)
        elif f.name == "load_format":
            group.add_argument(*flags, choices=LOAD_FORMATS, default=default, help=help_text)
        elif isinstance(default, float):
            group.add_argument(*flags, type=float, default=default, help=help_text)
        elif isinstance(default, int) or f.name == "session_len":
            group.add_argument(*flags, type=int, default=default, help=help_text)
        else:
            group.add_argument(*flags, type=str, default=default, help=help_text)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)})
