"""KV block accounting: which fixed-size blocks of the pool each request holds.

Pure bookkeeping over block ids ``0 .. num_blocks-1``; the executor owns the tensors. Blocks carry
reference counts so that a block can be shared (prefix caching); a block returns to the pool when
its count drops to zero. Uncached free blocks are handed out in queue order (lowest id first on a
fresh pool; freed blocks go to the back), which makes block ids exact and testable.

With prefix caching on, a free block that holds a registered full span stays in the
``PrefixCache`` as evictable: it still counts as free, is handed out only when no uncached block
is left (least recently freed first), and a later request with the same prefix takes it back.
"""

from __future__ import annotations

from collections import deque

from hotloop.engine.prefix_cache import PrefixCache, chain_hashes
from hotloop.engine.request import Request


class BlockManager:
    """Allocates and frees KV blocks for requests, with exact accounting."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must both be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks
        self.prefix_cache: PrefixCache | None = PrefixCache() if enable_prefix_caching else None
        # Counters in tokens, for /metrics: prompt tokens looked up at admission, and those found.
        self.prefix_queries = 0
        self.prefix_hits = 0

    @property
    def enable_prefix_caching(self) -> bool:
        return self.prefix_cache is not None

    @property
    def num_free_blocks(self) -> int:
        """Blocks a request can be given now: uncached free ones plus evictable cached ones."""
        evictable = self.prefix_cache.num_evictable if self.prefix_cache is not None else 0
        return len(self._free) + evictable

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Blocks ``request`` must gain to hold ``num_new_tokens`` more computed tokens."""
        total = request.num_computed_tokens + num_new_tokens
        return max(0, self.blocks_for(total) - len(request.block_ids))

    def can_allocate(self, request: Request, num_new_tokens: int, cached: list[int] | None = None) -> bool:
        """Whether ``allocate`` would succeed, after first taking the ``cached`` hit blocks."""
        if not cached:
            return self.num_new_blocks(request, num_new_tokens) <= self.num_free_blocks
        assert not request.block_ids
        reclaimed = self.num_reclaimed(cached)
        total = len(cached) * self.block_size + num_new_tokens
        need = max(0, self.blocks_for(total) - len(cached))
        return need + reclaimed <= self.num_free_blocks

    def num_reclaimed(self, cached: list[int]) -> int:
        """How many of the ``cached`` hit blocks are free now (evictable) and in use after the hit."""
        pc = self.prefix_cache
        if not cached:
            return 0
        assert pc is not None
        return sum(1 for b in cached if pc.is_evictable(b))

    def allocate(self, request: Request, num_new_tokens: int) -> list[int]:
        """Append enough blocks to ``request.block_ids``; returns the new ids. Raises if short."""
        need = self.num_new_blocks(request, num_new_tokens)
        if need > self.num_free_blocks:
            raise RuntimeError(f"allocate: need {need} blocks, {self.num_free_blocks} free")
        new = [self._take_free() for _ in range(need)]
        for b in new:
            self._ref_counts[b] = 1
        request.block_ids.extend(new)
        return new

    def _take_free(self) -> int:
        if self._free:
            return self._free.popleft()
        assert self.prefix_cache is not None
        return self.prefix_cache.evict()

    def free(self, request: Request) -> None:
        """Release every block of ``request`` (each drops one reference).

        Uncached blocks go to the back of the free queue in the request's order. Cached blocks
        become evictable tail first, so a chain loses its last blocks before its first ones.
        """
        pc = self.prefix_cache
        released: list[int] = []
        for b in request.block_ids:
            rc = self._ref_counts[b] - 1
            if rc < 0:
                raise RuntimeError(f"block {b} freed more often than allocated")
            self._ref_counts[b] = rc
            if rc == 0:
                if pc is not None and pc.is_cached(b):
                    released.append(b)
                else:
                    self._free.append(b)
        if pc is not None:
            for b in reversed(released):
                pc.release(b)
        request.block_ids.clear()
        request.block_epoch += 1
        request.num_registered_blocks = 0

    # -- prefix caching ------------------------------------------------------------------------
    def lookup_prefix(self, request: Request) -> list[int]:
        """Block ids of the longest cached prefix of ``request``'s known tokens (no side effects
        on the pool). At least the last token is left out, so the step that computes it yields
        logits, and a block the request would write into is never a shared one. A request that
        asks for prompt logprobs gets no hit: each of its prompt positions must be computed."""
        pc = self.prefix_cache
        if pc is None or request.block_ids or request.prompt_logprobs is not None:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._hashes(request, max_blocks)
        hits: list[int] = []
        for h in hashes[:max_blocks]:
            b = pc.lookup(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def take_cached(self, request: Request, cached: list[int]) -> int:
        """Give ``request`` (holding no blocks) the hit blocks ``cached``; returns the cached token
        count, which becomes its ``num_computed_tokens``. Updates the query and hit counters on a
        request's first admission only: a preempted request's re-admission recomputes its own
        output and hits its own freed blocks, which says nothing about the prompts' reuse."""
        pc = self.prefix_cache
        if pc is None:
            return 0
        assert not request.block_ids and request.num_computed_tokens == 0
        for b in cached:
            if self._ref_counts[b] == 0:
                pc.reclaim(b)
            self._ref_counts[b] += 1
        request.block_ids.extend(cached)
        request.num_registered_blocks = len(cached)
        num_cached = len(cached) * self.block_size
        if request.num_preemptions == 0:
            self.prefix_queries += request.num_tokens
            self.prefix_hits += num_cached
        return num_cached

    def cache_full_blocks(self, request: Request) -> None:
        """Register the full blocks whose K/V has been handed to the executor and whose token ids
        the host knows (a block ending in a still-pending sampled token waits for a later call).
        Readers of a registered block run in later steps, after the writes on the same stream."""
        pc = self.prefix_cache
        if pc is None:
            return
        first = request.num_registered_blocks
        end = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        if end <= first:
            return
        hashes = self._hashes(request, end)
        for i in range(first, end):
            # An equal block computed by another request in the same step stays private.
            pc.register(request.block_ids[i], hashes[i])
        request.num_registered_blocks = end

    def _hashes(self, request: Request, num_blocks: int) -> list[int]:
        """The chain hashes of the first ``num_blocks`` full blocks, computed once per request."""
        if len(request.block_hashes) < num_blocks:
            end = num_blocks * self.block_size
            chain_hashes(
                request.token_ids(0, end), self.block_size, request.block_hashes, request.cache_extra_keys
            )
        return request.block_hashes

    def check_consistency(self) -> None:
        """Assert the free queue, evictable set and reference counts agree (tests, debugging)."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is in the free queue twice"
        pc = self.prefix_cache
        for b, rc in enumerate(self._ref_counts):
            evictable = pc is not None and pc.is_evictable(b)
            assert not (b in free and evictable), f"block {b} is both free and evictable"
            if pc is not None and b in free:
                assert not pc.is_cached(b), f"free block {b} still has a hash"
            assert (rc == 0) == (b in free or evictable), (
                f"block {b}: ref_count {rc}, free: {b in free}, evictable: {evictable}"
            )
        if pc is not None:
            pc.check_consistency()
