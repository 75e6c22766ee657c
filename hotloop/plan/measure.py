"""``hotloop plan --measure``: start the engine with dummy weights on the GPU and set the planner's
predicted block count beside the one the engine really allocates.

The prediction uses the engine's own sizing rule (``--cache-max-entry-count`` of the memory free
after the weights) with the GPU's total memory as read from the device and the weight bytes from
the architecture; the engine's figure comes from ``build_engine``. CUDA graphs are not captured
(they are allocated after the KV pool and do not change it).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from typing import Any

from hotloop.plan.capacity import GIB, Plan, PlanInput, plan
from hotloop.plan.presets import ModelShape


@dataclass(frozen=True)
class Measurement:
    """One engine start: what the planner said, what the engine allocated."""

    predicted: Plan
    allocated_blocks: int
    weight_bytes_on_gpu: int

    @property
    def error(self) -> float:
        """(predicted - allocated) / allocated."""
        return (self.predicted.num_blocks - self.allocated_blocks) / max(1, self.allocated_blocks)

    def as_dict(self) -> dict[str, Any]:
        i = self.predicted.inputs
        return {
            "weight_format": i.weight_format,
            "kv_bits": i.kv_bits,
            "predicted_blocks": self.predicted.num_blocks,
            "allocated_blocks": self.allocated_blocks,
            "error": round(self.error, 5),
            "predicted_weight_gib": round(self.predicted.weight_bytes / GIB, 3),
            "weight_gib_on_gpu": round(self.weight_bytes_on_gpu / GIB, 3),
            "max_sequences_allocated": self.allocated_blocks // max(1, self.predicted.blocks_per_sequence),
            "max_sequences_predicted": self.predicted.max_sequences,
        }


def measure(model: str, shape: ModelShape, inputs: PlanInput, cache_max_entry_count: float) -> Measurement:
    """Build the engine for ``model`` (an engine preset or a folder) as ``inputs`` describe, on CUDA."""
    import torch

    from hotloop.api.build import build_engine
    from hotloop.config import EngineConfig

    if not torch.cuda.is_available():
        raise RuntimeError("--measure starts the engine on a GPU, and torch sees none")
    total = torch.cuda.mem_get_info()[1]
    predicted = plan(
        shape, replace(inputs, gpu_mem_gib=total / GIB, cache_max_entry_count=cache_max_entry_count)
    )
    before = torch.cuda.memory_allocated()
    cfg = EngineConfig(
        device="cuda",
        dtype="bfloat16",
        load_format="dummy",
        model_format="awq" if inputs.weight_format == "awq" else None,
        quant_policy=inputs.quant_policy,
        cache_max_entry_count=cache_max_entry_count,
        cache_block_seq_len=inputs.block_size,
        session_len=inputs.session_len,
        eager_mode=True,
        embeddings_on_host=inputs.embeddings_on_host,
    )
    built = build_engine(model, cfg)
    executor: Any = built.engine.executor
    kv = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in executor.kv_caches)
    weights = torch.cuda.memory_allocated() - before - kv
    result = Measurement(predicted, built.engine.num_total_blocks, weights)
    del built, executor
    gc.collect()
    torch.cuda.empty_cache()
    return result
