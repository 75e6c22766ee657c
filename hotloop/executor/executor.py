"""The in-process executor: loads the model, sizes and allocates the KV pool, runs steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch

from hotloop.config import EngineConfig, ModelConfig
from hotloop.engine.outputs import SampledToken
from hotloop.engine.request import Request
from hotloop.engine.scheduler import SchedulerOutput
from hotloop.executor.kv_cache import allocate_kv_cache, block_bytes, num_kv_blocks
from hotloop.executor.model_runner import CausalLM, ModelRunner, StepHandle
from hotloop.models.loader import load_model
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when present, else the CPU; asking for CUDA without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was requested but torch sees no CUDA device; use --device cpu")
    return torch.device(name)


def resolve_dtype(requested: str, model_dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: float32 on the CPU (exact and fast there); on the GPU the model's own 16-bit dtype."""
    if requested != "auto":
        return _DTYPES[requested]
    if device.type == "cpu":
        return torch.float32
    return torch.float16 if model_dtype == "float16" else torch.bfloat16


class LocalExecutor:
    """One model on one device (tp=1)."""

    def __init__(
        self,
        model_path: str | Path,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
        session_len: int,
    ) -> None:
        if engine_config.tp != 1:
            raise ValueError(f"tp={engine_config.tp}: tensor parallelism is not available yet; use tp=1")
        self.device = device
        self.dtype = dtype
        self._compile_watch: Any = None  # kernels.compile_watch on a GPU: Triton compiles, counted
        if device.type == "cuda":
            from hotloop.kernels import compile_watch

            compile_watch.install()  # reports compiles after ``warmed_up``
            compile_watch.disarm()  # this engine's start-up compiles are expected
            self._compile_watch = compile_watch
        logger.info("loading %s (%s) on %s as %s", model_path, model_config.architecture, device, dtype)
        self.model = load_model(
            model_path,
            dtype,
            device,
            load_format=engine_config.load_format,
            model_format=engine_config.model_format,
            embeddings_on_host=engine_config.embeddings_on_host,
        )
        bs = engine_config.cache_block_seq_len
        self.num_blocks = num_kv_blocks(
            model_config,
            engine_config.cache_max_entry_count,
            bs,
            dtype,
            device,
            max_useful_tokens=engine_config.max_batch_size * session_len,
            quant_policy=engine_config.quant_policy,
        )
        per_block = block_bytes(model_config, bs, dtype, engine_config.quant_policy)
        logger.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB, %d tokens, quant_policy=%d)",
            self.num_blocks,
            bs,
            self.num_blocks * per_block / 2**20,
            self.num_blocks * bs,
            engine_config.quant_policy,
        )
        self.kv_caches = allocate_kv_cache(
            model_config, self.num_blocks, bs, dtype, device, engine_config.quant_policy
        )
        self.runner: ModelRunner
        if device.type == "cuda":
            from hotloop.executor.gpu_runner import GpuModelRunner

            self.runner = GpuModelRunner(
                cast(CausalLM, self.model),
                self.kv_caches,
                bs,
                device,
                max_batch_size=engine_config.max_batch_size,
                max_num_tokens=engine_config.max_prefill_token_num + engine_config.max_batch_size,
                session_len=session_len,
                use_cuda_graph=not engine_config.eager_mode,
                measure_step_time=engine_config.jit_schedule,
                vision_max_batch_size=engine_config.vision_max_batch_size,
            )
        else:
            self.runner = ModelRunner(
                cast(CausalLM, self.model), self.kv_caches, bs, device, engine_config.vision_max_batch_size
            )

    def execute(self, out: SchedulerOutput) -> list[SampledToken]:
        return self.runner.execute(out)

    @property
    def warm_up_prompt_lens(self) -> tuple[int, ...]:
        """Prompt lengths whose steps compile every kernel variant serving can need: on a GPU one
        per prefill launch configuration (``paged_prefill_attention.CONFIG_LENGTHS``)."""
        if self.device.type != "cuda":
            return (64,)
        from hotloop.kernels.paged_prefill_attention import CONFIG_LENGTHS

        return CONFIG_LENGTHS

    def warmed_up(self) -> None:
        """The warm-up is over: from now on a Triton compile is logged as a warning."""
        if self._compile_watch is not None:
            self._compile_watch.arm()

    def compile_stats(self) -> tuple[int, float, int, float]:
        """Triton compiles ``(before the warm-up ended, their seconds, after it, their seconds)``;
        zeros off the GPU."""
        if self._compile_watch is None:
            return (0, 0.0, 0, 0.0)
        s = self._compile_watch.stats()
        return (s.startup, s.startup_s, s.serving, s.serving_s)

    def launch(self, out: SchedulerOutput, steps: int = 1) -> StepHandle:
        """Start a step without waiting for it (see ``Engine`` for overlapped scheduling); ``steps``
        > 1 asks for a multi-step decode launch (``handle.steps`` says how many ran)."""
        return self.runner.launch(out, steps)

    def collect(self, handle: StepHandle) -> list[SampledToken]:
        return self.runner.collect(handle)

    @property
    def supports_multi_step(self) -> bool:
        """Whether ``launch(out, steps > 1)`` can run several decode steps (not in eager mode on CUDA)."""
        return bool(getattr(self.runner, "supports_multi_step", False))

    def collect_steps(self, handle: StepHandle) -> list[list[int]]:
        """A multi-step launch's ids: per sampling request, one per step."""
        return self.runner.collect_steps(handle)

    def estimate_s(self, out: SchedulerOutput) -> float | None:
        """Expected device time of step ``out`` (None where the runner does not measure steps)."""
        estimate = getattr(self.runner, "estimate_s", None)
        return estimate(out) if estimate is not None else None

    def score(self, request: Request, start: int, num_tokens: int) -> list[float]:
        return self.runner.score(request, start, num_tokens)
