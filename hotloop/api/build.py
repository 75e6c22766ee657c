"""Assemble an ``Engine`` from a model argument and an ``EngineConfig``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from hotloop.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from hotloop.engine.engine import Engine
from hotloop.executor.executor import LocalExecutor, resolve_device, resolve_dtype
from hotloop.messages import GenerationConfig
from hotloop.models.loader import model_config_from_path
from hotloop.models.registry import resolve_architecture
from hotloop.models.resolve import resolve_model_path
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)


@dataclass(frozen=True)
class BuiltEngine:
    engine: Engine
    model_path: Path
    model_config: ModelConfig
    backend: str
    device: str
    tokenizer: Any


def choose_backend(requested: str, architecture: str) -> str:
    """``auto`` and ``turbo`` run our own model implementations; ``pytorch`` is not built yet."""
    resolve_architecture(architecture)  # raises UnsupportedModelError listing what is supported
    if requested == "pytorch":
        raise ValueError(
            "backend='pytorch' (transformers modeling code over the paged cache) is not available in this "
            f"version; use backend='turbo' (or 'auto'), which supports {architecture}"
        )
    if requested == "auto":
        logger.info("backend auto -> turbo (%s is in the turbo model zoo)", architecture)
    return "turbo"


def build_engine(model: str | None, config: EngineConfig | None = None) -> BuiltEngine:
    if config is None:
        config = EngineConfig()
    elif not isinstance(config, EngineConfig):  # (a dict or a GenerationConfig failed on a missing attribute)
        raise TypeError(
            "backend_config must be an EngineConfig (or TurbomindEngineConfig / PytorchEngineConfig), "
            f"got {type(config).__name__}"
        )
    # EngineConfig.seed: torch's global RNG (CPU and every GPU), which unseeded sampled requests and
    # dummy weights draw from, starts from it, as vLLM's seed does
    torch.manual_seed(config.seed)
    gguf_file = model is not None and str(model).lower().endswith(".gguf")
    if config.model_format == "gguf" and model is not None and not gguf_file:
        raise ValueError(
            f"model_format='gguf', but {model} is not a .gguf file; leave --model-format out to detect it"
        )
    if config.model_format in ("hf", "awq") and gguf_file:
        raise ValueError(
            f"model_format={config.model_format!r}, but {model} is a .gguf file; use model_format='gguf' or "
            "leave it out"
        )
    path = resolve_model_path(model)
    device = resolve_device(config.device)
    probe = model_config_from_path(path, "auto")
    dtype = resolve_dtype(config.dtype, probe.dtype, device)
    dtype_name = str(dtype).removeprefix("torch.")
    model_config = model_config_from_path(path, dtype_name)
    backend = choose_backend(config.backend, model_config.architecture)
    session_len = config.session_len or model_config.max_position_embeddings
    if session_len > model_config.max_position_embeddings:
        # allowed, as in LMDeploy (a model with rope scaling may hold more), but said: vLLM refuses it
        logger.warning(
            "session_len=%d exceeds the model's max_position_embeddings=%d: positions past %d are beyond "
            "what the model was trained on, and its outputs there may degrade",
            session_len,
            model_config.max_position_embeddings,
            model_config.max_position_embeddings,
        )
    try:  # (before the weights load and the KV pool is allocated: a folder without it fails fast)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path}: its tokenizer cannot be loaded ({str(e).strip().splitlines()[0][:300]}); the folder needs "
            "the model's tokenizer files (tokenizer.json, or tokenizer_config.json with its vocabulary)"
        ) from None
    executor = LocalExecutor(path, model_config, config, device, dtype, session_len)
    pool_tokens = executor.num_blocks * config.cache_block_seq_len
    if pool_tokens < session_len:
        logger.warning(
            "the KV pool holds %d tokens (%d blocks of %d), fewer than one session of %d: requests are "
            "limited to %d tokens; raise --cache-max-entry-count (a fraction of free memory, or a block "
            "count when > 1) or lower --session-len",
            pool_tokens, executor.num_blocks, config.cache_block_seq_len, session_len, pool_tokens,
        )  # fmt: skip
    engine = Engine(
        executor,
        tokenizer,
        model_config,
        CacheConfig(
            block_size=config.cache_block_seq_len,
            num_blocks=executor.num_blocks,
            enable_prefix_caching=config.enable_prefix_caching,
            quant_policy=config.quant_policy,
        ),
        SchedulerConfig(
            max_batch_size=config.max_batch_size,
            max_prefill_token_num=config.max_prefill_token_num,
            session_len=session_len,
            reserve_sure=float(config.schedule_conservativeness),
            reserve_max=float(config.schedule_conservativeness),
        ),
        overlap=not config.disable_overlap_schedule,
        jit_schedule=config.jit_schedule,
        num_scheduler_steps=config.num_scheduler_steps,
        full_batch_steps=config.full_batch_steps,
    )
    if config.num_scheduler_steps > 1:
        if engine.num_scheduler_steps > 1:
            logger.info("multi-step decode: up to %d decode steps per launch", engine.num_scheduler_steps)
        else:
            logger.warning(
                "--num-scheduler-steps %d ignored: multi-step decode needs overlapped scheduling and, on a "
                "GPU, CUDA graphs (drop --disable-overlap-schedule / --eager-mode)",
                config.num_scheduler_steps,
            )
    if engine.full_batch_steps > 1:
        logger.info(
            "a full batch with nothing waiting runs up to %d decode steps per launch (--full-batch-steps)",
            engine.full_batch_steps,
        )
    elif config.full_batch_steps > 1:
        logger.info(
            "--full-batch-steps %d not in effect: multi-step decode needs overlapped scheduling and, on a GPU, "
            "CUDA graphs",
            config.full_batch_steps,
        )
    if device.type == "cuda":
        warm_up(engine)
    return BuiltEngine(engine, path, model_config, backend, device.type, tokenizer)


def warm_up(engine: Engine, prompt_lens: tuple[int, ...] | None = None) -> None:
    """Run short requests to the end before serving, so that the first real requests do not pay for
    compiling the prefill and mixed-step kernels (Triton compiles on first use: a second or more per
    variant on the GPU). One prompt per length the executor names (``warm_up_prompt_lens``: on a
    GPU one per prefill launch configuration), capped at what one request may hold, one after the
    other; then the executor is told (``warmed_up``: later compiles are logged as warnings). Leaves
    the pool as it found it; with prefix caching its blocks may stay cached."""
    executor: Any = engine.executor
    if prompt_lens is None:
        prompt_lens = getattr(executor, "warm_up_prompt_lens", (64,))
    limit = engine.max_tokens_per_request - 2
    lengths = sorted({max(1, min(n, limit)) for n in prompt_lens})
    for i, n in enumerate(lengths):
        # a first token of its own per prompt: with prefix caching, a prompt sharing the previous
        # one's blocks would skip them, and its step would not reach the longer configuration
        prompt = [i + 1] + [0] * (n - 1)
        engine.add_request(f"hotloop-warmup-{n}", prompt, GenerationConfig(max_new_tokens=2, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    logger.info("warm-up requests done (%s prompt tokens)", ", ".join(map(str, lengths)))
    done = getattr(executor, "warmed_up", None)
    if done is not None:
        done()
