"""One launch that turns a decode step's inputs into the next step's, on the device: the multi-step
decode round's only work between two replays of the decode graph (``executor/gpu_runner.py``).

For each of the first ``b`` rows (the real rows; a graph's padding rows after them are untouched):
the token the step sampled becomes the next input and is recorded in ``history``. With ``p`` the row's
old ``seq_len`` (the next input's index in the sequence): while ``p <= limits[row]`` the position moves
one on, the KV slot is the next token's (``block_tables[row, p // bs] * bs + p % bs``) and the
sequence grows by one. Past its limit a row has reached its end (``max_new_tokens``) within the round:
its slot becomes -1 (nothing is written) and its position and length stay, so the rest of the round
computes a token that is dropped, over the row's cache as it is. The blocks up to each row's limit must
already be in the table (the engine allocates a round's blocks before it launches).
``reference.decode_advance`` is the same in torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels.checks import check, check_dtype
from hotloop.kernels.launch_math import cdiv

# rows per program, fixed: one compiled variant (per block size) serves every batch size, so no batch
# size met for the first time compiles a kernel mid-serving
BLOCK = 256


@triton.jit(do_not_specialize=["b", "stride_bt"])  # one variant for every batch and table width
def _decode_advance_kernel(
    sampled_ptr,
    ids_ptr,
    pos_ptr,
    slots_ptr,
    lens_ptr,
    bt_ptr,
    hist_ptr,
    lim_ptr,
    b,
    stride_bt,
    BS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < b
    tok = tl.load(sampled_ptr + rows, mask=mask, other=0)
    p = tl.load(lens_ptr + rows, mask=mask, other=0)
    live = p.to(tl.int64) <= tl.load(lim_ptr + rows, mask=mask, other=0)
    block = tl.load(bt_ptr + rows.to(tl.int64) * stride_bt + p // BS, mask=mask & live, other=0)
    tl.store(hist_ptr + rows, tok, mask=mask)
    tl.store(ids_ptr + rows, tok, mask=mask)
    pos = tl.load(pos_ptr + rows, mask=mask, other=0)
    tl.store(pos_ptr + rows, tl.where(live, pos + 1, pos), mask=mask)
    slot = tl.where(live, block.to(tl.int64) * BS + (p % BS).to(tl.int64), -1)
    tl.store(slots_ptr + rows, slot, mask=mask)
    tl.store(lens_ptr + rows, tl.where(live, p + 1, p), mask=mask)


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
    """In place, rows ``0 .. b-1`` with ``b = sampled.shape[0]``: ``input_ids`` / ``history`` take
    ``sampled`` (int64); a row whose next input index (its ``seq_len``) is at most ``limits[row]``:
    ``positions`` += 1, ``slots`` = the next token's KV slot, ``seq_lens`` += 1; other rows: slot -1.

    ``input_ids``, ``positions``, ``slots``: int64 ``[>= b]``; ``seq_lens``: int32 ``[>= b]``;
    ``block_tables``: int32 ``[>= b, W]`` (rows contiguous); ``history``: int64 ``[>= b]`` (one row of
    the round's token history); ``limits``: int64 ``[>= b]``, each row's last input index."""
    b = sampled.shape[0]
    check(sampled.dim() == 1, f"sampled must be [b], got {tuple(sampled.shape)}")
    vectors = (
        ("input_ids", input_ids),
        ("positions", positions),
        ("slots", slots),
        ("history", history),
        ("limits", limits),
    )
    for name, t in vectors:
        check_dtype(name, t, (torch.int64,))
        check(
            t.dim() == 1 and t.shape[0] >= b and t.stride(0) == 1, f"{name} must be a dense [>= {b}] vector"
        )
    check_dtype("sampled", sampled, (torch.int64,))
    check_dtype("seq_lens", seq_lens, (torch.int32,))
    check(
        seq_lens.dim() == 1 and seq_lens.shape[0] >= b and seq_lens.stride(0) == 1, "seq_lens must be [>= b]"
    )
    check_dtype("block_tables", block_tables, (torch.int32,))
    check(
        block_tables.dim() == 2 and block_tables.shape[0] >= b and block_tables.stride(1) == 1,
        f"block_tables must be [>= {b}, W] with contiguous rows, got {tuple(block_tables.shape)}",
    )
    check(block_size >= 1, f"block_size={block_size} must be >= 1")
    if b == 0:
        return
    _decode_advance_kernel[(cdiv(b, BLOCK),)](
        sampled.contiguous(),
        input_ids,
        positions,
        slots,
        seq_lens,
        block_tables,
        history,
        limits,
        b,
        block_tables.stride(0),
        BS=block_size,
        BLOCK=BLOCK,
        num_warps=4,
    )
