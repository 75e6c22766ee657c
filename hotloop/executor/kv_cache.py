"""KV cache sizing and allocation: how many blocks fit, and the per-layer tensors."""

from __future__ import annotations

import os

import torch

from hotloop.config import ModelConfig
from hotloop.kernels import kv_quant
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)


def available_memory(device: torch.device) -> int:
    """Free bytes on ``device``: free GPU memory, or available RAM on the CPU."""
    if device.type == "cuda":
        torch.cuda.empty_cache()  # blocks cached by the allocator (e.g. load-time temporaries) count as free
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def block_bytes(model_config: ModelConfig, block_size: int, dtype: torch.dtype, quant_policy: int = 0) -> int:
    """Bytes of one block: K and V of ``block_size`` tokens in every layer (with KV quantization:
    the packed values plus each token's and head's scale and zero, see ``kernels/kv_quant.py``)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    row = kv_quant.row_bytes(model_config.head_dim, quant_policy, itemsize)
    return 2 * model_config.num_layers * block_size * model_config.num_kv_heads * row


CPU_KV_CAP_BYTES = 2 * 2**30


def num_kv_blocks(
    model_config: ModelConfig,
    cache_max_entry_count: float | int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    max_useful_tokens: int | None = None,
    quant_policy: int = 0,
) -> int:
    """Resolve ``cache_max_entry_count`` into a block count.

    A float in (0, 1] takes that fraction of the memory free now (after the weights are loaded);
    an int is an exact block count. On the CPU, which has no dedicated pool to fill, a fractional
    count is also capped at ``max_useful_tokens`` (every sequence of a full batch at session
    length) and at ``CPU_KV_CAP_BYTES``, so a laptop keeps its RAM; pass an int for a bigger pool.
    """
    if isinstance(cache_max_entry_count, int):
        return cache_max_entry_count
    per_block = block_bytes(model_config, block_size, dtype, quant_policy)
    free = available_memory(device)
    n = int(free * cache_max_entry_count) // per_block
    if device.type == "cpu":
        n = min(n, CPU_KV_CAP_BYTES // per_block)
        if max_useful_tokens is not None:
            n = min(n, -(-max_useful_tokens // block_size))
    if n < 1:
        raise RuntimeError(
            f"no room for KV blocks: {free / 2**30:.2f} GiB free x cache_max_entry_count="
            f"{cache_max_entry_count} < one block of {per_block} bytes; raise cache_max_entry_count, "
            "lower session_len or use a smaller model"
        )
    return n


def allocate_kv_cache(
    model_config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    quant_policy: int = 0,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer ``(k_cache, v_cache)``, each ``[num_blocks, block_size, num_kv_heads, head_dim]``;
    quantized, ``uint8`` ``[..., num_kv_heads, row_bytes]`` (the layout is in ``kernels/kv_quant.py``)."""
    shape = (num_blocks, block_size, model_config.num_kv_heads, model_config.head_dim)
    if quant_policy:
        kv_quant.check_head_dim(model_config.head_dim, quant_policy)
        itemsize = torch.empty((), dtype=dtype).element_size()
        shape = (*shape[:3], kv_quant.row_bytes(model_config.head_dim, quant_policy, itemsize))
        dtype = torch.uint8
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(model_config.num_layers)
    ]
