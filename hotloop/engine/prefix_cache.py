"""Prefix cache bookkeeping: which full KV blocks hold which token spans, and which may be evicted.

A full block is named by a hash chain: ``hash(parent block's hash, the block's token ids, extra
keys)``, so equal hashes mean equal whole prefixes. Only full blocks whose K/V has been computed
are registered. A registered block whose reference count drops to zero stays cached but becomes
evictable; evictable blocks are reclaimed least-recently-freed first. Pure Python, no torch.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence

# The hash of "no parent": the root of every chain.
ROOT_HASH = 0


def hash_block(parent: int, token_ids: Sequence[int], extra_keys: Sequence[str] = ()) -> int:
    """A 128-bit chain hash of one full block (deterministic across processes, unlike ``hash``).

    ``extra_keys`` (adapter name, image hashes, a cache salt) separate otherwise equal token spans.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(parent.to_bytes(16, "little"))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    for key in extra_keys:
        h.update(b"\x00" + key.encode())
    return int.from_bytes(h.digest(), "little")


def chain_hashes(
    token_ids: Sequence[int],
    block_size: int,
    known: list[int],
    extra_keys: Sequence[str] = (),
) -> list[int]:
    """Extend ``known`` (hashes of the first full blocks) to every full block of ``token_ids``.

    ``known`` is extended in place and returned; the extra keys mix into the first block only,
    which is enough since every later hash depends on it.
    """
    num_full = len(token_ids) // block_size
    for i in range(len(known), num_full):
        parent = known[i - 1] if i else ROOT_HASH
        span = token_ids[i * block_size : (i + 1) * block_size]
        known.append(hash_block(parent, span, extra_keys if i == 0 else ()))
    return known


class PrefixCache:
    """Maps chain hashes to block ids and keeps the LRU order of evictable cached blocks."""

    def __init__(self) -> None:
        self._block_of: dict[int, int] = {}  # hash -> block id
        self._hash_of: dict[int, int] = {}  # block id -> hash
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref-0 cached blocks, oldest first

    def __len__(self) -> int:
        return len(self._block_of)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def lookup(self, block_hash: int) -> int | None:
        return self._block_of.get(block_hash)

    def hash_of(self, block_id: int) -> int | None:
        return self._hash_of.get(block_id)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._hash_of

    def is_evictable(self, block_id: int) -> bool:
        return block_id in self._evictable

    def register(self, block_id: int, block_hash: int) -> bool:
        """Name ``block_id`` by ``block_hash``; False if another block already holds that hash."""
        if block_hash in self._block_of or block_id in self._hash_of:
            return False
        self._block_of[block_hash] = block_id
        self._hash_of[block_id] = block_hash
        return True

    def release(self, block_id: int) -> None:
        """A cached block's reference count reached zero: it becomes the most recent evictable."""
        self._evictable[block_id] = None

    def reclaim(self, block_id: int) -> None:
        """A request takes an evictable cached block again (a cache hit on a free block)."""
        del self._evictable[block_id]

    def evict(self) -> int:
        """Forget the least recently released cached block and return its id for reuse."""
        block_id, _ = self._evictable.popitem(last=False)
        del self._block_of[self._hash_of.pop(block_id)]
        return block_id

    def evictable_order(self) -> list[int]:
        """Evictable block ids, next to be evicted first (for tests)."""
        return list(self._evictable)

    def check_consistency(self) -> None:
        assert len(self._block_of) == len(self._hash_of), "hash maps disagree in size"
        for h, b in self._block_of.items():
            assert self._hash_of.get(b) == h, f"block {b}: hash maps disagree"
        for b in self._evictable:
            assert b in self._hash_of, f"evictable block {b} has no hash"
