"""Configuration: the user-facing ``EngineConfig`` and the resolved, frozen configs the engine runs on.

``EngineConfig`` carries LMDeploy's field names so its users can switch by changing an import.
It is validated on construction; ``resolve`` turns it plus a model folder into ``ModelConfig``,
``CacheConfig`` and ``SchedulerConfig``, which nothing mutates afterwards.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("auto", "turbo", "pytorch")
BACKEND_ALIASES = {"turbomind": "turbo"}
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
DTYPE_ALIASES = {
    "fp32": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "float": "float32",
}
MODEL_FORMATS = (None, "hf", "gguf", "awq")
QUANT_POLICIES = (0, 4, 8)
LOAD_FORMATS = ("auto", "dummy")


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the field and the limit."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True)
class EngineConfig:
    """Everything about how the engine runs a model (LMDeploy-compatible names).

    cache_max_entry_count: a float in (0, 1] is the fraction of free device memory (on the CPU:
    of available RAM) given to KV blocks (``1``, int or float, is all of it, as on the command line
    and in LMDeploy); an int >= 2 is an exact number of blocks.
    session_len: the most tokens one sequence may hold (prompt plus output); None takes the model's
    ``max_position_embeddings``.
    schedule_conservativeness: how much KV room admission keeps back for the running requests'
    growth (SGLang's name), in [0, 1]: the weight of what a request will surely still fill (the rest of
    its prompt; its output with ``ignore_eos``, else up to ``min_new_tokens``) and the reserve for the
    rest after a step that had to preempt (``SchedulerConfig``); 0 admits whatever fits now and serves
    growth by preempting (vLLM's way).
    """

    backend: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    tp: int = 1
    session_len: int | None = None
    max_batch_size: int = 128
    cache_max_entry_count: float | int = 0.8
    cache_block_seq_len: int = 64
    max_prefill_token_num: int = 8192
    enable_prefix_caching: bool = False
    quant_policy: int = 0
    model_format: str | None = None
    eager_mode: bool = False
    embeddings_on_host: bool = False
    disable_overlap_schedule: bool = False
    jit_schedule: bool = False
    num_scheduler_steps: int = 1
    full_batch_steps: int = 8
    schedule_conservativeness: float = 1.0
    load_format: str = "auto"
    seed: int = 0
    vision_max_batch_size: int = 16

    def __post_init__(self) -> None:
        backend = BACKEND_ALIASES.get(self.backend, self.backend)
        object.__setattr__(self, "backend", backend)
        _check(backend in BACKENDS, f"backend={self.backend!r} is not one of {BACKENDS} (or 'turbomind')")
        _check(self.device in DEVICES, f"device={self.device!r} is not one of {DEVICES}")
        dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        object.__setattr__(self, "dtype", dtype)
        _check(dtype in DTYPES, f"dtype={self.dtype!r} is not one of {DTYPES}")
        _check(isinstance(self.tp, int) and self.tp >= 1, f"tp={self.tp!r} must be an integer >= 1")
        _check(
            self.session_len is None or (isinstance(self.session_len, int) and self.session_len >= 2),
            f"session_len={self.session_len!r} must be an integer >= 2",
        )
        _check(
            isinstance(self.max_batch_size, int) and self.max_batch_size >= 1,
            f"max_batch_size={self.max_batch_size!r} must be an integer >= 1",
        )
        c = self.cache_max_entry_count
        if isinstance(c, bool) or not isinstance(c, (int, float)):
            raise ConfigError(f"cache_max_entry_count={c!r} must be a float in (0, 1] or an int >= 1")
        if isinstance(c, float):
            _check(0.0 < c <= 1.0, f"cache_max_entry_count={c!r}: a float must lie in (0, 1]")
        else:
            _check(
                c >= 1,
                f"cache_max_entry_count={c!r}: an int must be >= 2 (a number of blocks) or 1 (all memory)",
            )
            if c == 1:  # all of the free memory, as the CLI reads "1" (cli/engine_args._cache_count)
                object.__setattr__(self, "cache_max_entry_count", 1.0)
        b = self.cache_block_seq_len
        _check(
            isinstance(b, int) and 1 <= b <= 1024,
            f"cache_block_seq_len={b!r} must be an integer in [1, 1024]",
        )
        _check(
            isinstance(self.max_prefill_token_num, int) and self.max_prefill_token_num >= 1,
            f"max_prefill_token_num={self.max_prefill_token_num!r} must be an integer >= 1",
        )
        _check(
            self.quant_policy in QUANT_POLICIES, f"quant_policy={self.quant_policy!r} must be one of 0, 4, 8"
        )
        _check(
            self.model_format in MODEL_FORMATS,
            f"model_format={self.model_format!r} must be one of {MODEL_FORMATS}",
        )
        _check(
            self.load_format in LOAD_FORMATS,
            f"load_format={self.load_format!r} must be one of {LOAD_FORMATS}",
        )
        for name in ("num_scheduler_steps", "full_batch_steps"):  # decode steps per launch
            v = getattr(self, name)
            _check(
                isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 64,
                f"{name}={v!r} must be an integer in [1, 64]",
            )
        r = self.schedule_conservativeness
        _check(
            isinstance(r, (int, float)) and not isinstance(r, bool) and 0.0 <= r <= 1.0,
            f"schedule_conservativeness={r!r} must be a number in [0, 1]",
        )
        _check(
            isinstance(self.vision_max_batch_size, int) and self.vision_max_batch_size >= 1,
            f"vision_max_batch_size={self.vision_max_batch_size!r} must be an integer >= 1",
        )

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class TurbomindEngineConfig(EngineConfig):
    """``EngineConfig`` with ``backend='turbo'`` preset (LMDeploy name)."""

    backend: str = "turbo"


@dataclass(frozen=True)
class PytorchEngineConfig(EngineConfig):
    """``EngineConfig`` with ``backend='pytorch'`` preset (LMDeploy name)."""

    backend: str = "pytorch"


@dataclass(frozen=True)
class ModelConfig:
    """What the engine needs to know about a model, read once from its Hugging Face config."""

    path: str
    architecture: str
    hf_config: Any = field(repr=False, compare=False)
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str
    eos_token_ids: tuple[int, ...] = ()

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer, at the model's dtype (no KV quantization)."""
        itemsize = 4 if self.dtype == "float32" else 2
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The resolved KV pool: block size and an exact block count."""

    block_size: int
    num_blocks: int
    enable_prefix_caching: bool = False
    quant_policy: int = 0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Admission limits of the scheduler.

    Admission keeps back KV blocks for the running requests' growth (``engine/scheduler.py``):
    ``reserve_sure`` x the KV slots each will surely still fill (the rest of its prompt; its output
    with ``ignore_eos``, else up to ``min_new_tokens``) and the reserve x the rest up to
    ``max_new_tokens``. The reserve starts at ``reserve_min``, is
    ``reserve_max`` after a step that had to preempt and falls linearly back over
    ``reserve_decay_steps`` steps. All three at 0: admission takes whatever fits now, and growth is
    served by preempting."""

    max_batch_size: int
    max_prefill_token_num: int
    session_len: int
    reserve_sure: float = 1.0
    reserve_max: float = 1.0
    reserve_min: float = 0.0
    reserve_decay_steps: int = 1000

    def __post_init__(self) -> None:
        if not 0.0 <= self.reserve_sure <= 1.0:
            raise ValueError(f"reserve_sure={self.reserve_sure} must lie in [0, 1]")
        if not 0.0 <= self.reserve_min <= self.reserve_max <= 1.0:
            raise ValueError(
                f"reserve_min={self.reserve_min} and reserve_max={self.reserve_max} must satisfy "
                "0 <= reserve_min <= reserve_max <= 1"
            )
        if self.reserve_decay_steps < 1:
            raise ValueError(f"reserve_decay_steps={self.reserve_decay_steps} must be >= 1")
