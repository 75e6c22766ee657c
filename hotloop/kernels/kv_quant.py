"""KV cache quantization (``--quant-policy 8|4``): the storage format and its torch reference.

Each token's K (and V) row of one head, ``head_dim`` values, is stored as unsigned integers with
an asymmetric per-token, per-head scale and zero point: ``x ~= q * scale + zero`` with
``q in [0, 255]`` (int8) or ``[0, 15]`` (int4, two per byte: even index in the low nibble).
The scale and zero are kept in the model's dtype (the unquantized cache dtype). A quantized cache is
one ``uint8`` tensor per K and V, ``[num_blocks, block_size, num_kv_heads, row_bytes]``, with the
same paging as the float cache and ``row_bytes`` per token and head:

    row_bytes = packed values (head_dim for int8, head_dim / 2 for int4) + scale + zero

Inside a block the bytes are not laid out row by row: all the block's packed values come first,
then all its scales and zeros,

    block = [ codes [block_size, num_kv_heads, packed] | (scale, zero) [block_size, num_kv_heads] ]

so that every row of codes starts on a multiple of 16 bytes when the packed width is a multiple of
16 (head_dim 128 is; 24 or 40 are read with narrower loads), and the attention kernels read it with
16-byte loads: with the pair right after each row's codes (132-byte rows for int8 at head_dim 128)
they could only use 4-byte loads. ``block_views`` gives the two
regions as tensors; ``to_rows`` / ``from_rows`` convert whole blocks to and from the logical
``[codes | scale | zero]`` rows that ``quantize`` makes and ``dequantize`` reads.

The format is read off the tensor: a ``uint8`` cache is quantized, and its row width says which
policy (``head_dim + 2 * itemsize`` for int8, ``head_dim / 2 + 2 * itemsize`` for int4).
Values are quantized as they are written and dequantized only where attention reads a sequence's
context, never in a pass over the whole cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

KV_POLICIES = (0, 4, 8)
_QMAX = {8: 255, 4: 15}


def packed_bytes(head_dim: int, policy: int) -> int:
    """Bytes of one head's packed values."""
    if policy == 8:
        return head_dim
    if policy == 4:
        return head_dim // 2
    raise ValueError(f"quant_policy={policy!r} is not 4 or 8")


def row_bytes(head_dim: int, policy: int, itemsize: int) -> int:
    """Bytes one token takes per head in K (or V): the values, or packed values plus scale and zero
    (each ``itemsize`` bytes, the model dtype's). Policy 0 is the unquantized ``head_dim * itemsize``."""
    if policy == 0:
        return head_dim * itemsize
    return packed_bytes(head_dim, policy) + 2 * itemsize


def check_head_dim(head_dim: int, policy: int) -> None:
    """The packed row must keep the scale aligned for every dtype: head_dim a multiple of 8."""
    if policy and head_dim % 8:
        raise ValueError(f"quant_policy={policy} needs head_dim to be a multiple of 8, got {head_dim}")


def is_quantized(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.uint8


def cache_policy(cache: torch.Tensor, head_dim: int, dtype: torch.dtype) -> int:
    """0, 8 or 4: the format of ``cache`` for a model of ``head_dim`` and dtype ``dtype``."""
    if not is_quantized(cache):
        return 0
    itemsize = torch.empty((), dtype=dtype).element_size()
    row = cache.shape[-1]
    for policy in (8, 4):
        if row == row_bytes(head_dim, policy, itemsize):
            return policy
    raise ValueError(
        f"a uint8 KV cache row of {row} bytes fits neither int8 nor int4 for head_dim={head_dim}"
    )


def _round_toward(x: torch.Tensor, target: torch.Tensor, direction: float) -> torch.Tensor:
    """``target`` (float32) in ``x``'s dtype, rounded down (direction -inf) or up (+inf)."""
    r = target.to(x.dtype)
    bad = r.float() > target if direction < 0 else r.float() < target
    return torch.where(bad, torch.nextafter(r, torch.full_like(r, direction)), r)


def quantize(x: torch.Tensor, policy: int, dtype: torch.dtype) -> torch.Tensor:
    """``x`` ``[..., head_dim]`` -> ``uint8`` rows ``[..., row_bytes]``; scale and zero in ``dtype``.

    The stored zero is rounded down to at most the row minimum and the stored scale up, so every
    value lands in range and the round-trip error is at most half a (stored) step.
    """
    qmax = _QMAX[policy]
    xf = x.float()
    lo = xf.amin(-1, keepdim=True)
    hi = xf.amax(-1, keepdim=True)
    proto = torch.empty((), dtype=dtype, device=x.device)
    zero = _round_toward(proto.expand_as(lo), lo, float("-inf"))
    scale = _round_toward(proto.expand_as(lo), (hi - zero.float()) / qmax, float("inf"))
    sf = scale.float()
    inv = torch.where(sf > 0, 1.0 / sf.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(sf))
    q = ((xf - zero.float()) * inv).round_().clamp_(0, qmax).to(torch.uint8)
    if policy == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)
    params = torch.cat([scale, zero], dim=-1).contiguous().view(torch.uint8)
    return torch.cat([q, params], dim=-1)


def dequantize(rows: torch.Tensor, policy: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``uint8`` rows ``[..., row_bytes]`` -> float32 ``[..., head_dim]``."""
    n = packed_bytes(head_dim, policy)
    q = rows[..., :n]
    params = rows[..., n:].contiguous().view(dtype).float()  # [..., 2]: scale, zero
    if policy == 4:
        q = torch.stack([q & 0xF, q >> 4], dim=-1).flatten(-2)
    return q.float() * params[..., :1] + params[..., 1:]


def block_views(cache: torch.Tensor, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The two regions of a quantized cache's blocks: codes ``uint8 [NB, BS, KV, packed]`` and
    ``(scale, zero)`` ``[NB, BS, KV, 2]`` in ``dtype``, as views (writes go to the cache). Each block
    must be dense (its ``block_size * num_kv_heads * row_bytes`` bytes contiguous)."""
    policy = cache_policy(cache, head_dim, dtype)
    nb, bs, h, row = cache.shape
    if cache.stride()[1:] != (h * row, row, 1):
        raise ValueError(f"a quantized cache's blocks must be dense, got strides {cache.stride()}")
    n = packed_bytes(head_dim, policy)
    flat = cache.as_strided((nb, bs * h * row), (cache.stride(0), 1))
    codes = flat[:, : bs * h * n].view(nb, bs, h, n)
    params = flat[:, bs * h * n :].view(dtype).view(nb, bs, h, 2)
    return codes, params


def to_rows(blocks: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Quantized cache blocks -> the same bytes as logical rows ``[codes | scale | zero]`` (a new
    ``[n, BS, KV, row_bytes]`` tensor, what ``dequantize`` reads)."""
    codes, params = block_views(blocks, head_dim, dtype)
    return torch.cat([codes, params.contiguous().view(torch.uint8)], dim=-1)


def from_rows(rows: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Logical rows ``[n, BS, KV, row_bytes]`` (``quantize``'s output) -> cache blocks (a new tensor)."""
    out = torch.empty_like(rows)
    codes, params = block_views(out, head_dim, dtype)
    n = codes.shape[-1]
    codes.copy_(rows[..., :n])
    params.copy_(rows[..., n:].contiguous().view(dtype))
    return out


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Quantize ``k``, ``v`` ``[T, num_kv_heads, head_dim]`` (scale dtype: theirs) into the uint8
    caches at flat slots ``slot_mapping`` ``[T]`` (``block * block_size + offset``)."""
    head_dim = k.shape[-1]
    policy = cache_policy(k_cache, head_dim, k.dtype)
    n = packed_bytes(head_dim, policy)
    bs = k_cache.shape[1]
    blk, off = slot_mapping // bs, slot_mapping % bs
    for x, cache in ((k, k_cache), (v, v_cache)):
        rows = quantize(x, policy, x.dtype)
        codes, params = block_views(cache, head_dim, x.dtype)
        codes[blk, off] = rows[..., :n]
        params[blk, off] = rows[..., n:].contiguous().view(x.dtype)


def dequantize_cache(cache: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """A whole cache back to float32 ``[NB, BS, KV, head_dim]`` (tests only: attention never does
    this)."""
    return dequantize(to_rows(cache, head_dim, dtype), cache_policy(cache, head_dim, dtype), head_dim, dtype)


def block_rows(blocks: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Gathered cache blocks ``[n, BS, KV, row]`` as per-token rows: themselves for a float cache,
    ``to_rows`` for a quantized one (token rows are only contiguous after it)."""
    return to_rows(blocks, head_dim, dtype) if is_quantized(blocks) else blocks


def kv_loader(
    cache: torch.Tensor, head_dim: int, dtype: torch.dtype
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function attention applies to gathered context rows to get float32 K or V."""
    policy = cache_policy(cache, head_dim, dtype)
    if policy == 0:
        return lambda x: x.float()
    return lambda x: dequantize(x, policy, head_dim, dtype)
