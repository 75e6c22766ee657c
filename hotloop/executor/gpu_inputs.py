"""Persistent device input buffers for the GPU runner, filled each step through pinned host mirrors.

Every step's flat inputs (token ids, positions, KV slots, block tables, sequence and query lengths)
live at fixed device addresses, which is what a captured CUDA graph replays against. The host side
writes numpy views of pinned buffers and issues one asynchronous copy per tensor. There are two sets
of pinned buffers, used in turn: with overlapped scheduling the host fills step N+1's while step N's
copies may still be queued behind the GPU, and by step N+2 the engine has waited for step N.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hotloop.engine.request import Request
from hotloop.engine.scheduler import SchedulerOutput
from hotloop.executor.model_runner import known_token_ids, pending_index
from hotloop.layers.attention import AttentionMetadata

# ``InputBuffers.prepare``'s steady-decode path (tests turn it off to compare with the general loop)
STEADY_DECODE = True


@dataclass
class StepInputs:
    """One step's device inputs (views of the persistent buffers) and what the host needs after it."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    logits_rows: list[int]  # row of the flat batch whose logits are sampled, per sampling request
    num_seqs: int  # real sequences (the graph may run a padded batch)
    pending_dst: torch.Tensor | None = None  # [P] rows of input_ids that take a pending token
    pending_reqs: list[Request] | None = None  # whose pending token, per row of pending_dst
    # pending_dst is rows 0 .. P-1 (every row of a decode step): the copy can skip the index, and
    # pending_dst's device copy is then not made
    pending_dense: bool = False


class _HostSet:
    """One set of pinned host mirrors (and their numpy views) of the device inputs."""

    def __init__(self, max_tokens: int, max_seqs: int, width: int, pin: bool) -> None:
        def host(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray]:
            t = torch.zeros(shape, dtype=dtype, pin_memory=pin)
            return t, t.numpy()

        self.ids_h, self.ids = host((max_tokens,), torch.int64)
        self.pos_h, self.pos = host((max_tokens,), torch.int64)
        self.slots_h, self.slots = host((max_tokens,), torch.int64)
        self.lens_h, self.lens = host((max_seqs,), torch.int32)
        self.qs_h, self.qs = host((max_seqs + 1,), torch.int32)
        self.qsp_h, self.qsp = host((max_seqs + 1,), torch.int32)
        self.bt_h, self.bt = host((max_seqs, width), torch.int32)
        self.fix_h, self.fix = host((max_seqs,), torch.int64)
        self.idx_h, self.idx = host((2, max_seqs), torch.int64)  # small index lists (see stage_indices)
        self.lim_h, self.lim = host((max_seqs,), torch.int64)  # multi-step rows' last inputs (stage_limits)
        self.rows: list[tuple[tuple[int, int], int]] = []  # per table row: ((serial, block epoch), blocks)
        # the last batch prepared in this set, for the steady-decode path: its requests, their block
        # epochs and the blocks of each that the table rows hold
        self.steady_reqs: list[Request] = []
        self.steady_epochs: list[int] = []
        self.steady_nb: np.ndarray = np.zeros(0, dtype=np.int64)


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

        def dev(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = dev((max_tokens,), torch.int64)
        self.positions = dev((max_tokens,), torch.int64)
        self.slots = dev((max_tokens,), torch.int64)
        self.seq_lens = dev((max_seqs,), torch.int32)
        self.query_start = dev((max_seqs + 1,), torch.int32)
        self.prefill_query_start = dev((max_seqs + 1,), torch.int32)
        self.block_tables = dev((max_seqs, max_blocks_per_seq), torch.int32)
        self.pending_dst = dev((max_seqs,), torch.int64)
        self.indices = dev((2, max_seqs), torch.int64)
        self.limits = dev((max_seqs,), torch.int64)
        pin = device.type == "cuda"
        self._sets = [_HostSet(max_tokens, max_seqs, max_blocks_per_seq, pin) for _ in range(2)]
        self._turn = 0
        self._current = self._sets[0]

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
        h = self._sets[self._turn]
        self._current = h
        self._turn ^= 1
        if STEADY_DECODE:
            steady = self._steady_decode(out, h, padded_seqs)
            if steady is not None:
                return steady
        ids, pos, slots, lens, qs, bt = h.ids, h.pos, h.slots, h.lens, h.qs, h.bt
        fix: list[int] = []
        fix_reqs: list[Request] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        rows: list[int] = []
        t = 0
        decode_only = True
        # Single-token rows (every row of a decode step) are gathered in lists and written with one
        # numpy assignment each after the loop: element-wise numpy writes cost ~0.1 us apiece.
        one_t: list[int] = []
        one_ids: list[int] = []
        one_pos: list[int] = []
        one_slots: list[int] = []
        starts: list[int] = []
        row_nb: list[int] = []
        for i, s in enumerate(out.scheduled):
            req = s.request
            n = s.num_tokens
            start = s.start
            end = start + n
            blocks = req.block_ids
            nb = len(blocks)
            row_nb.append(nb)
            # Block-table rows persist across steps: write only what changed since this row's last step.
            rid = (req.serial, req.block_epoch)
            rows_seen = h.rows
            if i < len(rows_seen) and rows_seen[i][0] == rid and rows_seen[i][1] <= nb:
                done = rows_seen[i][1]
                if done < nb:
                    bt[i, done:nb] = blocks[done:]
                rows_seen[i] = (rid, nb)
            else:
                bt[i, :nb] = blocks
                if i < len(rows_seen):
                    rows_seen[i] = (rid, nb)
                else:
                    rows_seen.append((rid, nb))
            delta = req.position_delta
            if n == 1:
                p0 = len(req.prompt_token_ids)
                one_t.append(t)
                # ``pending_index`` inlined for one token: the last pending token sits at
                # num_tokens + num_pending_tokens - 1
                pending = req.num_pending_tokens
                if pending and p0 + len(req.output_token_ids) + pending - 1 == start:
                    fix.append(t)
                    fix_reqs.append(req)
                    one_ids.append(0)
                else:
                    one_ids.append(
                        req.output_token_ids[start - p0] if start >= p0 else req.prompt_token_ids[start]
                    )
                one_pos.append(start + delta)
                one_slots.append(blocks[start // bs] * bs + start % bs)
            else:
                pi = pending_index(req, start, n)
                if pi is not None:
                    fix.append(t + pi)
                    fix_reqs.append(req)
                decode_only = False
                ids[t : t + n] = known_token_ids(req, start, end)
                p = np.arange(start, end, dtype=np.int64)
                pos[t : t + n] = p + delta
                slots[t : t + n] = np.asarray(blocks, dtype=np.int64)[p // bs] * bs + p % bs
            starts.append(t)
            t += n
            query_lens.append(n)
            seq_lens.append(end)
            if s.samples:
                rows.append(t - 1)
        b = len(out.scheduled)
        h.steady_reqs = [s.request for s in out.scheduled]
        h.steady_epochs = [r.block_epoch for r in h.steady_reqs]
        h.steady_nb = np.asarray(row_nb, dtype=np.int64)
        if one_t:
            if len(one_t) == t:  # all rows are single tokens: they are rows 0..t-1 in order
                ids[:t] = one_ids
                pos[:t] = one_pos
                slots[:t] = one_slots
            else:
                where = np.asarray(one_t, dtype=np.int64)
                ids[where] = one_ids
                pos[where] = one_pos
                slots[where] = one_slots
        qs[:b] = starts
        lens[:b] = seq_lens
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
        self._copy_common(h, b, ntok, nseq)
        width = max(row_nb) if b else 1
        if padded_seqs is not None:
            width = self.width  # a graph was captured over the full table
        self.block_tables[:b, :width].copy_(h.bt_h[:b, :width], non_blocking=True)
        # Leading single-token rows go to the decode kernel in a mixed step (see AttentionMetadata).
        nd = 0
        while nd < b and query_lens[nd] == 1:
            nd += 1
        prefill_qs = None
        if not decode_only and nd:
            h.qsp[: b - nd + 1] = qs[nd : b + 1] - nd
            prefill_qs = self.prefill_query_start[: b - nd + 1]
            prefill_qs.copy_(h.qsp_h[: b - nd + 1], non_blocking=True)
        pending_dst = None
        dense = False
        if fix:
            pending_dst = self.pending_dst[: len(fix)]
            dense = fix[0] == 0 and fix[-1] == len(fix) - 1  # increasing, so rows 0 .. P-1
            if not dense:
                h.fix[: len(fix)] = fix
                pending_dst.copy_(h.fix_h[: len(fix)], non_blocking=True)
        meta = AttentionMetadata(
            slot_mapping=self.slots[:ntok],
            block_tables=self.block_tables[:nseq, :width],
            query_lens=query_lens,
            seq_lens=seq_lens,
            seq_lens_t=self.seq_lens[:nseq],
            query_start_t=self.query_start[: b + 1],
            max_query_len=max(query_lens, default=0),
            decode_only=decode_only,
            num_decodes=nd if prefill_qs is not None else 0,
            prefill_query_start_t=prefill_qs,
        )
        return StepInputs(
            self.input_ids[:ntok], self.positions[:ntok], meta, rows, b, pending_dst, fix_reqs or None, dense
        )

    def _copy_common(self, h: _HostSet, b: int, ntok: int, nseq: int) -> None:
        """The step's flat inputs from host set ``h`` to the device (asynchronous)."""
        self.input_ids[:ntok].copy_(h.ids_h[:ntok], non_blocking=True)
        self.positions[:ntok].copy_(h.pos_h[:ntok], non_blocking=True)
        self.slots[:ntok].copy_(h.slots_h[:ntok], non_blocking=True)
        self.seq_lens[:nseq].copy_(h.lens_h[:nseq], non_blocking=True)
        self.query_start[: b + 1].copy_(h.qs_h[: b + 1], non_blocking=True)

    def _steady_decode(self, out: SchedulerOutput, h: _HostSet, padded_seqs: int | None) -> StepInputs | None:
        """``prepare`` for the steady state of overlapped decoding: the batch this host set last
        held (same requests, same order, same block lists but for blocks appended since), each row
        one token that is still pending on the device. The rows are then written by a few list
        comprehensions and numpy operations instead of the general per-row loop; the buffers and the
        returned inputs are the loop's (``tests/executor/test_gpu_inputs.py`` compares them). Returns
        ``None`` where the step is anything else."""
        sched = out.scheduled
        b = len(sched)
        reqs = [s.request for s in sched]
        if not b or reqs != h.steady_reqs:
            return None
        starts = [s.start for s in sched]
        # one token per row, sampled, and it is the request's last pending token (after the
        # host-known tokens): its id is patched on the device, so nothing of it is written here
        if (
            not all(s.num_tokens == 1 and s.samples for s in sched)
            or not all(r.num_pending_tokens for r in reqs)
            or [len(r.prompt_token_ids) + len(r.output_token_ids) + r.num_pending_tokens - 1 for r in reqs]
            != starts
            or [r.block_epoch for r in reqs] != h.steady_epochs
        ):
            return None
        nb = np.asarray([len(r.block_ids) for r in reqs], dtype=np.int64)
        grew = np.nonzero(nb != h.steady_nb)[0]
        if grew.size and bool((nb[grew] < h.steady_nb[grew]).any()):
            return None  # a block list shrank without a new epoch: leave it to the general loop
        bs = self.block_size
        bt = h.bt
        rows_seen = h.rows
        for i in grew.tolist():  # rows that crossed into a new block since this set's last step
            req = reqs[i]
            done, now = int(h.steady_nb[i]), int(nb[i])
            bt[i, done:now] = req.block_ids[done:now]
            rows_seen[i] = ((req.serial, req.block_epoch), now)
        h.steady_nb = nb
        st = np.asarray(starts, dtype=np.int64)
        h.ids[:b] = 0
        h.pos[:b] = st + np.asarray([r.position_delta for r in reqs], dtype=np.int64)
        h.slots[:b] = bt[np.arange(b), st // bs].astype(np.int64) * bs + st % bs
        h.lens[:b] = st + 1
        h.qs[: b + 1] = np.arange(b + 1, dtype=np.int32)
        nseq = ntok = b
        if padded_seqs is not None and padded_seqs > b:
            h.ids[b:padded_seqs] = 0
            h.pos[b:padded_seqs] = 0
            h.slots[b:padded_seqs] = -1
            h.lens[b:padded_seqs] = 0
            nseq = ntok = padded_seqs
        self._copy_common(h, b, ntok, nseq)
        width = self.width if padded_seqs is not None else int(nb.max())
        self.block_tables[:b, :width].copy_(h.bt_h[:b, :width], non_blocking=True)
        seq_lens = (st + 1).tolist()
        meta = AttentionMetadata(
            slot_mapping=self.slots[:ntok],
            block_tables=self.block_tables[:nseq, :width],
            query_lens=[1] * b,
            seq_lens=seq_lens,
            seq_lens_t=self.seq_lens[:nseq],
            query_start_t=self.query_start[: b + 1],
            max_query_len=1,
            decode_only=True,
            num_decodes=0,
            prefill_query_start_t=None,
        )
        rows = list(range(b))
        return StepInputs(
            self.input_ids[:ntok], self.positions[:ntok], meta, rows, b, self.pending_dst[:b], reqs, True
        )

    def stage_indices(self, values: list[int], slot: int) -> torch.Tensor:
        """``values`` (at most ``max_seqs``) as a device int64 tensor, copied asynchronously from the
        pinned set of the last ``prepare`` (``torch.tensor(values, device=...)`` would copy from
        pageable memory, which waits for the GPU and defeats overlapped scheduling). ``slot`` 0 or 1:
        two lists per step."""
        h = self._current
        n = len(values)
        h.idx[slot, :n] = values
        dev = self.indices[slot, :n]
        dev.copy_(h.idx_h[slot, :n], non_blocking=True)
        return dev

    def stage_limits(self, values: list[int]) -> torch.Tensor:
        """A multi-step launch's per-row last input index on the device (``kernels/decode_advance.py``),
        copied asynchronously from the pinned set of the last ``prepare``."""
        h = self._current
        n = len(values)
        h.lim[:n] = values
        dev = self.limits[:n]
        dev.copy_(h.lim_h[:n], non_blocking=True)
        return dev

    def graph_meta(self, batch: int, max_splits: int | None = None) -> AttentionMetadata:
        """The metadata a decode graph of ``batch`` rows is captured with (views of the buffers);
        ``max_splits`` caps its decode attention's splits (a short-context graph)."""
        return AttentionMetadata(
            slot_mapping=self.slots[:batch],
            block_tables=self.block_tables[:batch],
            query_lens=[1] * batch,
            seq_lens=[1] * batch,
            seq_lens_t=self.seq_lens[:batch],
            query_start_t=self.query_start[: batch + 1],
            max_query_len=1,
            decode_only=True,
            graph=True,
            graph_max_splits=max_splits,
        )

    def reset_for_capture(self, batch: int) -> None:
        """Rows that touch nothing, so capturing a graph leaves the KV cache as it was."""
        self.slots[:batch].fill_(-1)
        self.seq_lens[:batch].zero_()
        self.input_ids[:batch].zero_()
        self.positions[:batch].zero_()
