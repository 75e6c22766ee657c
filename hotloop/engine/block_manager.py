"""KV block accounting: which fixed-size blocks of the pool each request holds.

Pure bookkeeping over block ids ``0 .. num_blocks-1``; the executor owns the tensors. Blocks carry
reference counts so that later a block can be shared (prefix caching); a block returns to the free
queue when its count drops to zero. Free blocks are handed out in queue order (lowest id first on
a fresh pool; freed blocks go to the back), which makes block ids exact and testable.
"""

from __future__ import annotations

from collections import deque

from hotloop.engine.request import Request


class BlockManager:
    """Allocates and frees KV blocks for requests, with exact accounting."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must both be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return 1.0 - len(self._free) / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Blocks ``request`` must gain to hold ``num_new_tokens`` more computed tokens."""
        total = request.num_computed_tokens + num_new_tokens
        return max(0, self.blocks_for(total) - len(request.block_ids))

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self.num_new_blocks(request, num_new_tokens) <= len(self._free)

    def allocate(self, request: Request, num_new_tokens: int) -> list[int]:
        """Append enough blocks to ``request.block_ids``; returns the new ids. Raises if short."""
        need = self.num_new_blocks(request, num_new_tokens)
        if need > len(self._free):
            raise RuntimeError(f"allocate: need {need} blocks, {len(self._free)} free")
        new = [self._free.popleft() for _ in range(need)]
        for b in new:
            self._ref_counts[b] = 1
        request.block_ids.extend(new)
        return new

    def free(self, request: Request) -> None:
        """Release every block of ``request`` (each drops one reference)."""
        for b in request.block_ids:
            rc = self._ref_counts[b] - 1
            if rc < 0:
                raise RuntimeError(f"block {b} freed more often than allocated")
            self._ref_counts[b] = rc
            if rc == 0:
                self._free.append(b)
        request.block_ids.clear()

    def check_consistency(self) -> None:
        """Assert the free queue and reference counts agree (for tests and debugging)."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is in the free queue twice"
        for b, rc in enumerate(self._ref_counts):
            assert (rc == 0) == (b in free), f"block {b}: ref_count {rc}, in free queue: {b in free}"
