"""Torch reference ops: the CPU path, and what every GPU kernel is tested against.

Paged KV cache layout, per layer: ``k_cache`` and ``v_cache`` of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``. Token ``i`` of a sequence lives in block
``block_table[i // block_size]`` at offset ``i % block_size``; its flat slot is
``block * block_size + offset``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hotloop.kernels import kv_quant


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store ``k``, ``v`` ``[T, num_kv_heads, head_dim]`` at flat slots ``slot_mapping`` ``[T]``.

    A quantized (uint8) cache is written through ``kv_quant``, quantizing on the way in. A slot of -1
    writes nothing (as in the kernels: padding rows, a multi-step row past its end).
    """
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    if kv_quant.is_quantized(k_cache):
        kv_quant.write_kv_cache(k, v, k_cache, v_cache, slot_mapping)
        return
    nb, bs, h, d = k_cache.shape
    k_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def decode_advance(
    sampled: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    history: torch.Tensor,
    limits: torch.Tensor,
) -> None:
    """A decode step's inputs -> the next step's, rows ``0 .. b-1`` (``kernels/decode_advance.py``):
    the sampled ids become the inputs (and ``history``); a row whose next input index ``p`` (its old
    length) is at most ``limits[row]`` moves one position on, grows by one and writes its next token
    at ``block_tables[row, p // bs] * bs + p % bs``; a row past its limit writes nothing (slot -1)."""
    b = sampled.shape[0]
    if b == 0:
        return
    p = seq_lens[:b].long()
    live = p <= limits[:b]
    rows = torch.arange(b, device=p.device)
    blocks = block_tables[rows, torch.where(live, p // block_size, 0)].long()
    history[:b] = sampled
    input_ids[:b] = sampled
    positions[:b] += live.long()
    slots[:b] = torch.where(live, blocks * block_size + p % block_size, -1)
    seq_lens[:b] += live.int()


def gather_ids(values: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[:n] = values[index]`` for 1-D int64 tensors (``kernels/gather_ids.py``); returns ``out[:n]``."""
    n = index.numel()
    torch.index_select(values, 0, index, out=out[:n])
    return out[:n]


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``table[ids]``: ``[T]`` ids -> ``[T, hidden]`` rows (``kernels/embedding_gather.py``)."""
    return F.embedding(ids.to(table.device), table).to(ids.device)


def gather_rows(
    cache: torch.Tensor, block_table: torch.Tensor, length: int, head_dim: int, dtype: torch.dtype
) -> torch.Tensor:
    """The first ``length`` tokens of one sequence, ``[length, num_kv_heads, row]``: a quantized
    cache's blocks go to per-token rows (``kv_quant.to_rows``) before the tokens are cut."""
    bs = cache.shape[1]
    nblk = (length + bs - 1) // bs
    blocks = kv_quant.block_rows(cache[block_table[:nblk].long()], head_dim, dtype)
    return blocks.flatten(0, 1)[:length]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_lens: list[int],
    seq_lens: list[int],
    scale: float,
    sliding_window: int | None = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of new queries over each sequence's paged context.

    q: ``[T, num_heads, head_dim]``, the queries of all sequences back to back (``query_lens``).
    Sequence ``b`` has ``seq_lens[b]`` tokens in the cache (its new tokens already written), and
    its queries are the last ``query_lens[b]`` of those. GQA: ``num_heads`` is a multiple of the
    cache's ``num_kv_heads``. Returns ``[T, num_heads, head_dim]`` in q's dtype. A quantized
    cache (see ``kv_quant``) is dequantized as each sequence's context is gathered.

    ``k_new`` / ``v_new`` ``[T, num_kv_heads, head_dim]``: this step's keys and values, which a
    sequence of more than one new token attends to in place of the cache's copy of them (its
    cached prefix still comes from the cache); single-token rows read the cache only.
    """
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new are given together")
    num_heads, head_dim = q.shape[1], q.shape[2]
    load = kv_quant.kv_loader(k_cache, head_dim, q.dtype)
    num_kv = k_cache.shape[2]
    group = num_heads // num_kv
    out = torch.empty_like(q)
    bs = k_cache.shape[1]
    decode_rows = [b for b, ql in enumerate(query_lens) if ql == 1]
    starts = [0]
    for ql in query_lens:
        starts.append(starts[-1] + ql)

    # Decodes of the batch together: pad contexts to the longest, mask the tail.
    if len(decode_rows) > 1:
        idx = torch.tensor(decode_rows, dtype=torch.long, device=q.device)
        lens = torch.tensor([seq_lens[b] for b in decode_rows], device=q.device)
        max_len = int(lens.max())
        nblk = (max_len + bs - 1) // bs
        tables = block_tables[idx, :nblk].long()
        flat = tables.flatten()
        k = kv_quant.block_rows(k_cache.index_select(0, flat), head_dim, q.dtype)
        v = kv_quant.block_rows(v_cache.index_select(0, flat), head_dim, q.dtype)
        k = k.view(len(decode_rows), nblk * bs, *k_cache.shape[2:])[:, :max_len]
        v = v.view(len(decode_rows), nblk * bs, *v_cache.shape[2:])[:, :max_len]
        pos = torch.arange(max_len, device=q.device)
        valid = pos[None, :] < lens[:, None]
        if sliding_window is not None:
            valid &= pos[None, :] >= (lens[:, None] - sliding_window)
        qi = torch.tensor([starts[b] for b in decode_rows], dtype=torch.long, device=q.device)
        qd = q[qi].view(len(decode_rows), num_kv, group, head_dim).float()  # [D, kv, g, d]
        # The g query heads of a KV group act as g queries over that group's keys: no repeat of K/V.
        o = F.scaled_dot_product_attention(
            qd,
            load(k).float().transpose(1, 2),  # [D, kv, L, d]
            load(v).float().transpose(1, 2),
            attn_mask=valid[:, None, None, :],
            scale=scale,
        )  # [D, kv, g, d]
        out[qi] = o.reshape(len(decode_rows), num_heads, head_dim).to(q.dtype)
        done = set(decode_rows)
    else:
        done = set()

    for b, ql in enumerate(query_lens):
        if b in done or ql == 0:
            continue
        L = seq_lens[b]
        k = load(gather_rows(k_cache, block_tables[b], L, head_dim, q.dtype))  # [L, kv, d]
        v = load(gather_rows(v_cache, block_tables[b], L, head_dim, q.dtype))
        if k_new is not None and v_new is not None and ql > 1:
            k = torch.cat([k[: L - ql], k_new[starts[b] : starts[b] + ql].to(k.dtype)])
            v = torch.cat([v[: L - ql], v_new[starts[b] : starts[b] + ql].to(v.dtype)])
        qb = q[starts[b] : starts[b] + ql].float()  # [ql, h, d]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        qpos = torch.arange(L - ql, L, device=q.device)
        kpos = torch.arange(L, device=q.device)
        mask = kpos[None, :] <= qpos[:, None]
        if sliding_window is not None:
            mask &= kpos[None, :] > qpos[:, None] - sliding_window
        o = F.scaled_dot_product_attention(
            qb.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
        )
        out[starts[b] : starts[b] + ql] = o.transpose(0, 1).to(q.dtype)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, returned in x's dtype (as transformers' LlamaRMSNorm)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``x = cat([gate, up], -1)``."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def fused_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    silu: bool = False,
) -> torch.Tensor:
    """``epilogue(linear(prologue(x)))`` as the unfused decoder computes it (``kernels/dense_gemv.py``):
    an optional RMSNorm before, then SiLU-and-mul over ``[gate | up]`` or the residual add after."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps)
    y = F.linear(x, weight, bias)
    if silu:
        y = silu_and_mul(y)
    if residual is not None:
        y = y + residual
    return y


def merge_decode_partials(part: torch.Tensor, lse: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Split decode attention's partials ``part [B, H, S, D]`` and log-sum-exps ``lse [B, H, S]``
    (float32, log2 units) -> the attention ``[B, H * D]`` in ``dtype``: each split weighted by
    ``exp2(lse - max lse)`` over the weights' sum (all-empty rows: zeros)."""
    m = lse.amax(dim=-1, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    w = torch.exp2(lse - m)
    denom = w.sum(-1, keepdim=True)
    o = (part * w.unsqueeze(-1)).sum(2) / torch.where(denom > 0, denom, torch.ones_like(denom))
    return o.to(dtype).flatten(1)


def fused_qkv_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    norm_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """The q/k/v projection (input norm in front), then ``rotary_kv_write``: k and v stored at
    ``slot_mapping``; returns the rotated q ``[T, H * D]`` (``kernels/dense_gemv.py``)."""
    qkv = fused_linear(x, weight, bias, norm_weight=norm_weight, eps=eps)
    T = qkv.shape[0]
    D = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    q, k, v = qkv.split([num_heads * D, num_kv_heads * D, num_kv_heads * D], dim=-1)
    q = q.reshape(T, num_heads, D).clone()
    rotary_kv_write(
        q,
        k.reshape(T, num_kv_heads, D),
        v.reshape(T, num_kv_heads, D),
        cos,
        sin,
        k_cache,
        v_cache,
        slot_mapping,
    )
    return q.reshape(T, num_heads * D)


def fused_qkv_rope_staged(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    norm_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The q/k/v projection (input norm in front) with q and k rotated as ``rotary_kv_write``
    rotates them, nothing written: ``(q [T, H * D], kv [T, 2 KV, D])``, kv's rows k (rotated) then v
    (``kernels/dense_gemv.py``'s ``dense_gemv_qkv_rope_staged``)."""
    qkv = fused_linear(x, weight, bias, norm_weight=norm_weight, eps=eps)
    T = qkv.shape[0]
    H, KV = num_heads, num_kv_heads
    D = qkv.shape[1] // (H + 2 * KV)
    half = cos.shape[-1]
    heads = qkv.reshape(T, H + 2 * KV, D).float()
    x1, x2 = heads[..., :half], heads[..., half : 2 * half]
    c, s = cos[:, None, :], sin[:, None, :]
    rotated = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, heads[..., 2 * half :]], dim=-1)
    out = torch.cat([rotated[:, : H + KV], heads[:, H + KV :]], dim=1).to(x.dtype)
    return out[:, :H].reshape(T, H * D).contiguous(), out[:, H:].contiguous()


def rotary_kv_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Rotate q ``[T, H, D]`` in place (rotate-half on the first ``2 * cos.shape[-1]`` dims, in
    float32); rotate k ``[T, KV, D]`` and store it and v at ``slot_mapping`` (negative: skipped)."""
    half = cos.shape[-1]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        x1, x2 = xf[..., :half], xf[..., half : 2 * half]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, xf[..., 2 * half :]], dim=-1).to(x.dtype)

    q.copy_(rotate(q))
    keep = slot_mapping >= 0
    write_kv_cache(rotate(k)[keep], v[keep], k_cache, v_cache, slot_mapping[keep])


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``: the pre-norm decoder's add-then-norm."""
    x = x + residual
    return rms_norm(x, weight, eps), x


def w4a16_dequantize(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """AutoAWQ GEMM tensors (see ``kernels/w4a16_layout.py``) -> ``W`` ``[in, out]`` in scales' dtype."""
    from hotloop.kernels.w4a16_layout import check_awq_shapes, unpack_int4

    check_awq_shapes(qweight, qzeros, scales, group_size)
    q = unpack_int4(qweight).to(scales.dtype)  # [in, out]
    z = unpack_int4(qzeros).to(scales.dtype).repeat_interleave(group_size, dim=0)
    s = scales.repeat_interleave(group_size, dim=0)
    return (q - z) * s


def w4a16_matmul(
    x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``x [M, in] @ dequantize(W) [in, out]`` computed in float32, returned in x's dtype."""
    w = w4a16_dequantize(qweight, qzeros, scales.float(), group_size)
    return (x.float() @ w).to(x.dtype)
