"""Continuous batching: which requests run this step, and how many tokens each.

Prefill, chunked prefill and decode are one mechanism: each scheduled request advances its
``num_computed_tokens`` by ``num_tokens``; a request samples a token when the step reaches the end
of its known tokens. Running requests go first (oldest first); when one of them cannot get a
block, the newest running request is preempted (blocks freed, recomputed later). Waiting requests
join in FIFO order while slots (``max_batch_size``), blocks and the step's prefill token budget
(``max_prefill_token_num``) allow; a prompt longer than the budget is prefilled over several steps,
alongside the running decodes. With prefix caching, an admitted request first takes the cached
blocks of its longest cached prefix and only the rest is prefilled (and counts against the
budget); blocks that became full in a step are registered in ``advance``, after they were computed.

Admission also keeps room for the growth of the running requests and of the new one, since a
preemption recomputes a whole prompt. Each is reserved ``reserve_sure`` x the KV slots it will surely
still fill (the rest of its prompt; its output up to ``max_new_tokens`` with ``ignore_eos`` and no stop
words or ids, else up to ``min_new_tokens``) and ``reserve`` x the rest up to ``max_new_tokens``,
rounded up to blocks. The reserve starts at ``reserve_min`` (0 by default: what may stop at EOS
is not reserved), is ``reserve_max`` after a step that had to preempt and falls back over
``reserve_decay_steps`` steps.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from hotloop.config import SchedulerConfig
from hotloop.engine.block_manager import BlockManager
from hotloop.engine.request import Request, RequestStatus


@dataclass(slots=True)
class ScheduledRequest:
    """``num_tokens`` new tokens of ``request`` run this step, starting at position ``start``."""

    request: Request
    num_tokens: int
    start: int
    samples: bool = False  # this step reaches the last known token, so a new token is sampled

    @classmethod
    def of(cls, request: Request, num_tokens: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        return cls(request, num_tokens, start, start + num_tokens == request.num_scheduled_tokens)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


def multi_step_ok(out: SchedulerOutput) -> bool:
    """Whether ``out`` can run as a multi-step decode launch: every row one token that samples past
    its prompt (so a request's images, all in its prompt, are behind it), no 3-D positions (M-RoPE),
    and nothing a later step would need from the host (logprobs, penalties over the output history,
    JSON mode's grammar mask, a ``min_new_tokens`` mask that changes with the step). The engine
    checks this before it allocates a round's blocks; the runner checks again."""
    for s in out.scheduled:
        req = s.request
        p = req.params
        if (
            s.num_tokens != 1
            or not s.samples
            or s.start < len(req.prompt_token_ids)
            or p.logprobs is not None
            or req.needs_output_history
            or req.mrope_positions is not None
            or len(req.output_token_ids) + req.num_pending_tokens < (p.min_new_tokens or 0)
        ):
            return False
    return bool(out.scheduled)


class Scheduler:
    """Owns the waiting queue and the running batch; allocates blocks through the BlockManager."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        # the admission reserve (SchedulerConfig): full after a step that preempted, then falling each
        # step to its minimum; it starts at the minimum (no preemption seen yet)
        self.reserve = config.reserve_min
        self._reserve_step = (config.reserve_max - config.reserve_min) / config.reserve_decay_steps
        # finishes and preemptions so far, and (request serial, that count, reserve) of the last
        # admission the reserve refused: the same refusal is not worked out again every step
        self._events = 0
        self._refused: tuple[int, int, float] | None = None

    # -- queue management -------------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self._ends(request)
        self.waiting.append(request)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Take ``request`` out of the queues and free its blocks."""
        assert status.finished
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.block_manager.cache_full_blocks(request)  # e.g. a finished turn, for the next one
        self.block_manager.free(request)
        self._events += 1
        request.status = status
        request.num_pending_tokens = 0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        bm = self.block_manager
        budget = self.config.max_prefill_token_num
        bs = bm.block_size
        now = time.monotonic()

        session_len = self.config.session_len
        scheduled = out.scheduled
        idx = 0
        while idx < len(self.running):
            req = self.running[idx]
            # The known tokens (``num_scheduled_tokens``) and ``generation_done``, inlined: this loop
            # runs for every running request every step.
            num_out = len(req.output_token_ids)
            pending = req.num_pending_tokens
            known = len(req.prompt_token_ids) + num_out + pending
            start = req.num_computed_tokens
            remaining = known - start
            n = remaining if remaining == 1 else min(remaining, budget)
            if (
                n == 0
                or (pending > 0 and num_out + pending >= req.params.max_new_tokens)
                or known >= session_len
            ):
                idx += 1
                continue
            if n == 1 and start < len(req.block_ids) * bs:  # a decode with room in its last block
                scheduled.append(ScheduledRequest(req, 1, start, start + 1 == known))
                idx += 1
                continue
            while not bm.can_allocate(req, n):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                bm.allocate(req, n)
                out.scheduled.append(ScheduledRequest.of(req, n))
                if remaining > 1:
                    budget -= n
                idx += 1

        # No admissions in a step that had to preempt: the pool is under pressure.
        growth = -1  # blocks reserved for the running requests' growth (computed when first needed)
        while (
            self.waiting
            and not out.preempted
            and budget > 0
            and len(self.running) < self.config.max_batch_size
        ):
            req = self.waiting[0]
            cached = bm.lookup_prefix(req)
            n = min(req.num_tokens - len(cached) * bm.block_size - req.num_computed_tokens, budget)
            if not bm.can_allocate(req, n, cached):
                break
            if self.running:
                # keep back blocks for the growth of the running requests and of this one, each
                # rounded up to whole blocks (a request's growth starts at a block boundary)
                key = (req.serial, self._events, self.reserve)
                if key == self._refused:
                    # refused before and nothing has freed room since: running requests grow into
                    # their reserve, so the blocks left over it cannot have grown
                    break
                if growth < 0:
                    growth = self._reserved_blocks()
                held = -(-(req.num_computed_tokens + len(cached) * bs + n) // bs)
                mine = self._blocks_reserved(req, held)
                need = bm.num_new_blocks(req, n) + bm.num_reclaimed(cached)
                if bm.num_free_blocks - need < growth + mine:
                    self._refused = key
                    break
                growth += mine
            self.waiting.popleft()
            if bm.enable_prefix_caching:
                num_cached = bm.take_cached(req, cached)
                req.num_computed_tokens = num_cached
                if req.num_preemptions == 0:  # usage reports prompt tokens served from the cache
                    req.num_cached_tokens = num_cached
            bm.allocate(req, n)
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            self.running.append(req)
            out.scheduled.append(ScheduledRequest.of(req, n))
            budget -= n
        # Single-token rows first (stable): a mixed step's decodes then form one leading run that
        # the GPU serves with the decode kernel, the rest with the prefill kernel.
        if any(s.num_tokens != 1 for s in out.scheduled):
            out.scheduled.sort(key=lambda s: s.num_tokens != 1)
        if out.preempted:
            self.reserve = self.config.reserve_max
        elif self.reserve > self.config.reserve_min:
            self.reserve = max(self.config.reserve_min, self.reserve - self._reserve_step)
        return out

    def _ends(self, request: Request) -> tuple[int, int]:
        """(sure, final): the KV slots ``request`` will surely fill (its prompt, then all of
        ``max_new_tokens`` with ``ignore_eos`` and no stop words or ids, else ``min_new_tokens``) and
        the most it may fill (prompt plus ``max_new_tokens``, less the last sampled token, which is
        never written), within the session. Worked out once, at ``add``."""
        if request.reserve_ends is None:
            p = request.params
            prompt = len(request.prompt_token_ids)
            final = min(prompt + p.max_new_tokens - 1, self.config.session_len)
            surely = (
                p.max_new_tokens
                if p.ignore_eos and not p.stop_words and not p.stop_token_ids
                else p.min_new_tokens
            )
            request.reserve_ends = (min(prompt + max((surely or 0) - 1, 0), final), final)
        return request.reserve_ends

    def _blocks_reserved(self, request: Request, held: int) -> int:
        """Blocks kept back for ``request``, which holds ``held`` blocks: ``reserve_sure`` x its sure
        growth and ``reserve`` x the rest, rounded up."""
        bs = self.block_manager.block_size
        sure, final = request.reserve_ends or self._ends(request)
        have = held * bs
        tokens = self.config.reserve_sure * max(0, sure - have) + self.reserve * max(
            0, final - max(sure, have)
        )
        return -(-math.ceil(tokens) // bs)

    def _reserved_blocks(self) -> int:
        """``_blocks_reserved`` summed over the running requests (inlined: it runs every step while
        requests wait, over up to ``max_batch_size`` requests)."""
        bs = self.block_manager.block_size
        w_sure, w_rest = self.config.reserve_sure, self.reserve
        total = 0
        for r in self.running:
            sure, final = r.reserve_ends or self._ends(r)
            have = len(r.block_ids) * bs
            if have >= final:
                continue
            tokens = w_sure * (sure - have if sure > have else 0) + w_rest * (
                final - (sure if sure > have else have)
            )
            if tokens > 0:
                total += -(-math.ceil(tokens) // bs)
        return total

    def _preempt(self, request: Request) -> None:
        """Free ``request``'s blocks; it goes to the front of the queue to be recomputed."""
        self.block_manager.free(request)
        self._events += 1
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def advance(self, out: SchedulerOutput, steps: int = 1) -> None:
        """Record that the executor computed (or, overlapped, was handed) this step's tokens; a
        request that samples now has a pending token until the engine collects it. ``steps`` > 1:
        a multi-step decode launch (every row one token per step) ran that many steps."""
        bm = self.block_manager
        caching = bm.prefix_cache is not None
        for s in out.scheduled:
            req = s.request
            req.num_computed_tokens += s.num_tokens * steps
            if s.samples:
                req.num_pending_tokens += steps
            if caching:
                bm.cache_full_blocks(req)
