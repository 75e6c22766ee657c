"""Persistent device input buffers for the GPU runner, filled each step through pinned host mirrors.

Every step's flat inputs (token ids, positions, KV slots, block tables, sequence and query lengths)
live at fixed device addresses, which is what a captured CUDA graph replays against. The host side
writes numpy views of pinned buffers and issues one asynchronous copy per tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hotloop.engine.scheduler import SchedulerOutput
from hotloop.layers.attention import AttentionMetadata


@dataclass
class StepInputs:
    """One step's device inputs (views of the persistent buffers) and what the host needs after it."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    logits_rows: list[int]  # row of the flat batch whose logits are sampled, per sampling request
    num_seqs: int  # real sequences (the graph may run a padded batch)


class InputBuffers:
    """Device tensors sized for the largest step, plus their pinned host mirrors."""

    def __init__(
        self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, block_size: int, device: torch.device
    ) -> None:
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.width = max_blocks_per_seq
        self.block_size = block_size
        self.device = device

        def pair(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
            dev = torch.zeros(shape, dtype=dtype, device=device)
            host = torch.zeros(shape, dtype=dtype, pin_memory=device.type == "cuda")
            return dev, host, host.numpy()

        self.input_ids, self._ids_h, self.ids_np = pair((max_tokens,), torch.int64)
        self.positions, self._pos_h, self.pos_np = pair((max_tokens,), torch.int64)
        self.slots, self._slots_h, self.slots_np = pair((max_tokens,), torch.int64)
        self.seq_lens, self._lens_h, self.lens_np = pair((max_seqs,), torch.int32)
        self.query_start, self._qs_h, self.qs_np = pair((max_seqs + 1,), torch.int32)
        self.block_tables, self._bt_h, self.bt_np = pair((max_seqs, max_blocks_per_seq), torch.int32)
        self._rows: list[tuple[int, int]] = []  # per row: (id of the request last written there, blocks)

    def fits(self, out: SchedulerOutput) -> bool:
        return (
            len(out.scheduled) <= self.max_seqs
            and out.num_tokens <= self.max_tokens
            and all(len(s.request.block_ids) <= self.width for s in out.scheduled)
        )

    def prepare(self, out: SchedulerOutput, padded_seqs: int | None = None) -> StepInputs:
        """Fill the buffers for ``out``; with ``padded_seqs`` (decode only) pad the batch to that size
        with rows that read nothing (seq_len 0) and write nothing (slot -1)."""
        bs = self.block_size
        ids, pos, slots, lens, qs, bt = (
            self.ids_np,
            self.pos_np,
            self.slots_np,
            self.lens_np,
            self.qs_np,
            self.bt_np,
        )
        query_lens: list[int] = []
        seq_lens: list[int] = []
        rows: list[int] = []
        t = 0
        decode_only = True
        for i, s in enumerate(out.scheduled):
            req = s.request
            n = s.num_tokens
            start = s.start
            end = start + n
            blocks = req.block_ids
            nb = len(blocks)
            # Block-table rows persist across steps: write only what changed since this row's last step.
            rid = id(req)
            if i < len(self._rows) and self._rows[i][0] == rid and self._rows[i][1] <= nb:
                done = self._rows[i][1]
                if done < nb:
                    bt[i, done:nb] = blocks[done:]
                self._rows[i] = (rid, nb)
            else:
                bt[i, :nb] = blocks
                if i < len(self._rows):
                    self._rows[i] = (rid, nb)
                else:
                    self._rows.append((rid, nb))
            if n == 1:
                p0 = req.num_prompt_tokens
                ids[t] = req.output_token_ids[start - p0] if start >= p0 else req.prompt_token_ids[start]
                pos[t] = start
                slots[t] = blocks[start // bs] * bs + start % bs
            else:
                decode_only = False
                ids[t : t + n] = req.token_ids(start, end)
                p = np.arange(start, end, dtype=np.int64)
                pos[t : t + n] = p
                slots[t : t + n] = np.asarray(blocks, dtype=np.int64)[p // bs] * bs + p % bs
            qs[i] = t
            lens[i] = end
            t += n
            query_lens.append(n)
            seq_lens.append(end)
            if s.samples:
                rows.append(t - 1)
        b = len(out.scheduled)
        qs[b] = t
        nseq = b
        ntok = t
        if padded_seqs is not None and padded_seqs > b:
            pad = padded_seqs - b
            ids[t : t + pad] = 0
            pos[t : t + pad] = 0
            slots[t : t + pad] = -1
            lens[b:padded_seqs] = 0
            nseq = ntok = padded_seqs
        self.input_ids[:ntok].copy_(self._ids_h[:ntok], non_blocking=True)
        self.positions[:ntok].copy_(self._pos_h[:ntok], non_blocking=True)
        self.slots[:ntok].copy_(self._slots_h[:ntok], non_blocking=True)
        self.seq_lens[:nseq].copy_(self._lens_h[:nseq], non_blocking=True)
        self.query_start[: b + 1].copy_(self._qs_h[: b + 1], non_blocking=True)
        width = max(len(s.request.block_ids) for s in out.scheduled) if b else 1
        if padded_seqs is not None:
            width = self.width  # a graph was captured over the full table
        self.block_tables[:b, :width].copy_(self._bt_h[:b, :width], non_blocking=True)
        meta = AttentionMetadata(
            slot_mapping=self.slots[:ntok],
            block_tables=self.block_tables[:nseq, :width],
            query_lens=query_lens,
            seq_lens=seq_lens,
            seq_lens_t=self.seq_lens[:nseq],
            query_start_t=self.query_start[: b + 1],
            max_query_len=max(query_lens, default=0),
            decode_only=decode_only,
        )
        return StepInputs(self.input_ids[:ntok], self.positions[:ntok], meta, rows, b)

    def graph_meta(self, batch: int) -> AttentionMetadata:
        """The metadata a decode graph of ``batch`` rows is captured with (views of the buffers)."""
        return AttentionMetadata(
            slot_mapping=self.slots[:batch],
            block_tables=self.block_tables[:batch],
            query_lens=[1] * batch,
            seq_lens=[1] * batch,
            seq_lens_t=self.seq_lens[:batch],
            query_start_t=self.query_start[: batch + 1],
            max_query_len=1,
            decode_only=True,
        )

    def reset_for_capture(self, batch: int) -> None:
        """Rows that touch nothing, so capturing a graph leaves the KV cache as it was."""
        self.slots[:batch].fill_(-1)
        self.seq_lens[:batch].zero_()
        self.input_ids[:batch].zero_()
        self.positions[:batch].zero_()
