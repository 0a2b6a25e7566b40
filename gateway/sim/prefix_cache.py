"""vLLM's automatic prefix caching, as block bookkeeping: which full prompt blocks are cached, and which
of them nobody uses any more (and so may be evicted).

vLLM names a full KV block by a hash chained over the block hashes before it, so one hash stands for the
whole prefix up to the end of its block; a new request reuses the longest run of leading blocks whose hashes
are cached and prefills only the rest. A block stays cached after its last user finishes: it sits in the
free list, still counted as free space, until an allocation needs it and evicts the least recently freed
one. That is why a cache hit costs no memory while the cache is cold and is the first thing lost under KV
pressure. This module holds the two tables; the engine (:mod:`gateway.sim.engine`) owns the block counts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """Cached block hashes: ``in use`` ones with a reference count, ``free`` ones in eviction order.

    Every cached block is one physical block. An in-use block is counted in the engine's ``used_blocks``;
    a free one is not (it is reclaimable space), and :meth:`evict` drops free ones, oldest first, when
    the engine needs their room.
    """

    __slots__ = ("_free", "_refs", "evictions")

    def __init__(self) -> None:
        self._refs: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._refs) + len(self._free)

    @property
    def free_blocks(self) -> int:
        """Cached blocks nobody uses: free space that still holds a prefix."""
        return len(self._free)

    def match(self, hashes: Sequence[int], max_blocks: int) -> tuple[int, int]:
        """(leading blocks of ``hashes`` that are cached, how many of those sit in the free list)."""
        refs, free = self._refs, self._free
        hit = revived = 0
        for h in hashes[:max_blocks]:
            if h in refs:
                hit += 1
            elif h in free:
                hit += 1
                revived += 1
            else:
                break
        return hit, revived

    def acquire(self, h: int) -> int:
        """Take a reference on a cached block; returns the physical blocks it newly takes (1 if it was free)."""
        if h in self._refs:
            self._refs[h] += 1
            return 0
        del self._free[h]
        self._refs[h] = 1
        return 1

    def register(self, h: int) -> int:
        """A sequence filled a block whose hash is ``h`` and now holds it through the cache.

        Returns the change in physical blocks in use *beyond* the sequence's own block: 0 when ``h`` is new
        (the sequence's block becomes the cached one), -1 when another sequence already holds ``h`` (the
        sequence's copy is dropped), and 0 when ``h`` was free (it is revived and the copy dropped)."""
        refs = self._refs
        if h in refs:
            refs[h] += 1
            return -1
        if h in self._free:
            del self._free[h]
        refs[h] = 1
        return 0

    def release(self, hashes: Sequence[int]) -> int:
        """Drop one reference on each of ``hashes``; returns how many blocks became free (still cached).

        The tail of a prefix is freed first, so it is evicted before the blocks that lead to it, as vLLM
        frees a request's blocks in reverse order."""
        refs, free = self._refs, self._free
        freed = 0
        for h in reversed(hashes):
            n = refs[h] - 1
            if n:
                refs[h] = n
            else:
                del refs[h]
                free[h] = None
                freed += 1
        return freed

    def evict(self, room: int) -> None:
        """Evict free blocks, least recently freed first, until at most ``room`` of them remain."""
        free = self._free
        while len(free) > max(room, 0):
            free.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        self._free.clear()
