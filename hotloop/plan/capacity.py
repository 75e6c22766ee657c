"""The capacity arithmetic: weight bytes, KV bytes per token, blocks, and concurrent sequences.

All sizes are bytes; the GPU's memory is given in GiB (2**30 bytes). The KV row sizes are the ones
the engine allocates (``kernels/kv_quant.row_bytes``), so the predicted block count follows the
same formula as ``executor/kv_cache.block_bytes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hotloop.kernels.kv_quant import check_head_dim, row_bytes
from hotloop.plan.presets import ModelShape

GIB = 2**30
WEIGHT_FORMATS = ("bf16", "awq")
KV_POLICIES = (16, 8, 4)  # bits of a KV value; 16 is the unquantized cache (quant_policy 0)
AWQ_GROUP = 128


@dataclass(frozen=True, slots=True)
class PlanInput:
    """One question: this model, on this GPU, with these levers."""

    gpu_mem_gib: float = 80.0
    weight_format: str = "bf16"
    kv_bits: int = 16
    session_len: int = 32768
    prefix_hit_rate: float = 0.0
    mem_util: float = 0.9  # share of GPU memory the engine may use (weights + KV + overhead)
    overhead_gib: float = 0.0  # activations, CUDA graphs, allocator slack
    # The engine's own rule instead of mem_util: KV gets this fraction of what is free after the
    # weights (``--cache-max-entry-count``), i.e. (GPU memory - weights - overhead) x fraction.
    cache_max_entry_count: float | None = None
    block_size: int = 64
    tp: int = 1
    gpus_per_node: int = 8
    # ``--embeddings-on-host``: an untied embedding table lives in pinned host memory, not on the GPU
    embeddings_on_host: bool = False

    def __post_init__(self) -> None:
        if self.weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"weight_format={self.weight_format!r} is not one of {WEIGHT_FORMATS}")
        if self.kv_bits not in KV_POLICIES:
            raise ValueError(f"kv_bits={self.kv_bits!r} is not one of {KV_POLICIES}")
        if not 0.0 <= self.prefix_hit_rate < 1.0:
            raise ValueError(
                f"prefix_hit_rate={self.prefix_hit_rate!r} (--prefix-hit-rate) must lie in [0, 1)"
            )
        if not 0.0 < self.mem_util <= 1.0:
            raise ValueError(f"mem_util={self.mem_util!r} (--mem-util) must lie in (0, 1]")
        if self.cache_max_entry_count is not None and not 0.0 < self.cache_max_entry_count <= 1.0:
            raise ValueError(f"cache_max_entry_count={self.cache_max_entry_count!r} must lie in (0, 1]")
        for name, value in (
            ("session_len", self.session_len),
            ("block_size", self.block_size),
            ("tp", self.tp),
            ("gpus_per_node", self.gpus_per_node),
        ):
            if value < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{name}={value!r} ({flag}) must be >= 1")
        if not self.gpu_mem_gib > 0:
            raise ValueError(f"gpu_mem_gib={self.gpu_mem_gib!r} (--gpu-mem) must be > 0")
        if not self.overhead_gib >= 0:
            raise ValueError(f"overhead_gib={self.overhead_gib!r} (--overhead) must be >= 0")
        if self.tp > self.gpus_per_node:
            raise ValueError(
                f"tp={self.tp} (--tp) exceeds gpus_per_node={self.gpus_per_node}: a replica spans one node"
            )

    @property
    def quant_policy(self) -> int:
        """The engine's ``--quant-policy`` for these KV bits."""
        return 0 if self.kv_bits == 16 else self.kv_bits


@dataclass(frozen=True, slots=True)
class Plan:
    """The answer, per GPU unless named otherwise."""

    model: str
    inputs: PlanInput
    num_params: int
    weight_bytes: int  # on one GPU (a 1/tp share)
    kv_bytes_per_token: int  # on one GPU, all layers, K and V, scales included
    kv_budget_bytes: int
    num_blocks: int
    blocks_per_sequence: int  # unshared blocks one full-length sequence needs
    shared_blocks: int  # the cached shared prefix, stored once
    max_sequences: int  # per model replica (tp GPUs)

    @property
    def kv_bytes_per_sequence(self) -> int:
        return self.kv_bytes_per_token * self.inputs.session_len * self.inputs.tp

    @property
    def effective_bytes_per_sequence(self) -> float:
        """KV one sequence costs once its shared prefix is deduplicated, all tp GPUs together."""
        return self.kv_bytes_per_sequence * (1.0 - self.inputs.prefix_hit_rate)

    @property
    def replicas_per_node(self) -> int:
        return self.inputs.gpus_per_node // self.inputs.tp

    @property
    def max_sequences_per_node(self) -> int:
        return self.max_sequences * self.replicas_per_node

    def as_dict(self) -> dict[str, float | int | str]:
        i = self.inputs
        return {
            "model": self.model,
            "weight_format": i.weight_format,
            "kv_bits": i.kv_bits,
            "quant_policy": i.quant_policy,
            "session_len": i.session_len,
            "prefix_hit_rate": i.prefix_hit_rate,
            "tp": i.tp,
            "num_params": self.num_params,
            "weight_gib": round(self.weight_bytes / GIB, 2),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_budget_gib": round(self.kv_budget_bytes / GIB, 2),
            "num_blocks": self.num_blocks,
            "kv_gib_per_sequence": round(self.kv_bytes_per_sequence / GIB, 3),
            "effective_gib_per_sequence": round(self.effective_bytes_per_sequence / GIB, 3),
            "max_sequences": self.max_sequences,
            "max_sequences_per_node": self.max_sequences_per_node,
        }


def weight_bytes(shape: ModelShape, weight_format: str, embeddings_on_host: bool = False) -> int:
    """Bytes of the model's weights on the GPU(s). AWQ (W4A16, group 128): every projection stores
    4-bit values plus a 16-bit scale and a 4-bit zero per group of 128 inputs; embeddings, LM head
    and norms stay 16-bit. ``embeddings_on_host``: an untied input embedding is not counted."""
    linear = shape.num_layers * shape.linear_params_per_layer
    embedding = shape.embedding_params
    if embeddings_on_host and not shape.tie_word_embeddings:
        embedding -= shape.vocab_size * shape.hidden_size
    other = embedding + shape.num_layers * shape.other_params_per_layer + shape.hidden_size
    if weight_format == "bf16":
        return 2 * (linear + other)
    per_param = 0.5 + (2 + 0.5) / AWQ_GROUP
    return math.ceil(linear * per_param) + 2 * other


def kv_bytes_per_token(shape: ModelShape, kv_bits: int, tp: int = 1, itemsize: int = 2) -> int:
    """K and V of one token in every layer on one GPU: layers x KV heads x 2 x row bytes, where a
    quantized row holds the packed values plus its scale and zero (``itemsize`` bytes each).

    The KV heads split evenly over the ``tp`` ranks, or, with more ranks than heads, each rank
    keeps a copy of one head: any other ``tp`` raises ``ValueError``, as does a head_dim the
    quantized cache cannot hold (``kv_quant.check_head_dim``, the engine's rule)."""
    kv = shape.num_kv_heads
    if (tp <= kv and kv % tp) or (tp > kv and tp % kv):
        raise ValueError(
            f"tp={tp} (--tp) must divide the model's {kv} KV heads or be a multiple of them "
            "(each rank holds whole heads)"
        )
    heads = max(1, kv // tp)  # fewer KV heads than ranks: each rank keeps a copy
    policy = 0 if kv_bits == 16 else kv_bits
    try:
        check_head_dim(shape.head_dim, policy)
    except ValueError as e:
        raise ValueError(f"--kv-bits {kv_bits}: {e}") from None
    return 2 * shape.num_layers * heads * row_bytes(shape.head_dim, policy, itemsize)


def plan(shape: ModelShape, inputs: PlanInput) -> Plan:
    """How many blocks the pool gets and how many full-length sequences it holds at once."""
    w = weight_bytes(shape, inputs.weight_format, inputs.embeddings_on_host) // inputs.tp
    per_token = kv_bytes_per_token(shape, inputs.kv_bits, inputs.tp)
    if inputs.cache_max_entry_count is not None:
        free = inputs.gpu_mem_gib * GIB - w - inputs.overhead_gib * GIB
        budget = max(0, int(free * inputs.cache_max_entry_count))
    else:
        usable = inputs.gpu_mem_gib * GIB * inputs.mem_util
        budget = max(0, int(usable - w - inputs.overhead_gib * GIB))
    bs = inputs.block_size
    blocks = budget // (per_token * bs)
    seq_blocks = math.ceil(inputs.session_len / bs)
    shared = min(seq_blocks, int(inputs.prefix_hit_rate * inputs.session_len) // bs)
    private = seq_blocks - shared
    if blocks < seq_blocks:
        max_seqs = 0
    else:
        max_seqs = (blocks - shared) // private if private else blocks
    return Plan(
        model=shape.name,
        inputs=inputs,
        num_params=shape.num_params,
        weight_bytes=w,
        kv_bytes_per_token=per_token,
        kv_budget_bytes=budget,
        num_blocks=blocks,
        blocks_per_sequence=private,
        shared_blocks=shared,
        max_sequences=max_seqs,
    )


def sweep(shape: ModelShape, base: PlanInput) -> list[Plan]:
    """Every weight format x KV policy for one question (the worked-example table)."""
    from dataclasses import replace

    return [
        plan(shape, replace(base, weight_format=wf, kv_bits=kv))
        for wf in WEIGHT_FORMATS
        for kv in KV_POLICIES
    ]
