"""A model of PyTorch's CUDA caching allocator: which blocks it hands out and how much it reserves.

The simulated device uses it to report `reserved` next to `allocated` and to decide when an
allocation would not fit a virtual card. The constants and rules follow
c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x):

* every request is rounded up to a multiple of 512 bytes (kMinBlockSize);
* requests up to 1 MiB (kSmallSize) come from a "small" pool of 2 MiB segments (kSmallBuffer);
  larger ones from a "large" pool: 20 MiB segments (kLargeBuffer) for requests under 10 MiB
  (kMinLargeAlloc), otherwise a segment of exactly the request rounded up to 2 MiB (kRoundLarge);
* a request takes the smallest cached free block that fits (best fit), and the block is split
  when the remainder is worth keeping: >= 512 B in the small pool, > 1 MiB in the large pool.
  An unsplit remainder stays inside the block, so `allocated` counts it too;
* freed blocks stay cached (reserved) and merge with free neighbours of the same segment;
  `empty_cache()` returns wholly free segments to the driver;
* when a new segment would not fit the card, the allocator first frees all cached segments
  and retries; only then is it out of memory.

Not modelled: streams and events, expandable segments, max_split_size_mb, garbage collection
thresholds. They change *reserved*, never the bytes live tensors hold.
"""
from __future__ import annotations

import bisect
import itertools

from ..units import MiB, round_block

SMALL_SIZE = 1 * MiB
SMALL_BUFFER = 2 * MiB
LARGE_BUFFER = 20 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB


class Block:
    __slots__ = ("addr", "size", "free", "prev", "next", "segment", "small")

    def __init__(self, addr, size, segment, small):
        self.addr, self.size, self.segment, self.small = addr, size, segment, small
        self.free, self.prev, self.next = True, None, None

    def key(self):
        return (self.size, self.addr)


class SegmentOverflow(Exception):
    """Raised by `malloc` when a new segment would exceed the capacity (after freeing the cache)."""

    def __init__(self, request, segment_size):
        self.request, self.segment_size = request, segment_size


class CachingAllocatorModel:
    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self._addr = itertools.count(1 << 20, 1 << 40)      # segments never overlap
        self._free = {True: [], False: []}                  # small? -> sorted [(size, addr, block)]
        self.segments: dict[int, int] = {}                  # segment addr -> size
        self.allocated = 0
        self.reserved = 0
        self.num_alloc_retries = 0

    # -- helpers -------------------------------------------------------------------------------
    def _insert_free(self, b: Block):
        bisect.insort(self._free[b.small], (b.size, b.addr, b))

    def _remove_free(self, b: Block):
        lst = self._free[b.small]
        i = bisect.bisect_left(lst, (b.size, b.addr))
        assert lst[i][2] is b
        del lst[i]

    @staticmethod
    def segment_size(size: int) -> int:
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    # -- API -----------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block:
        """Allocate; returns the block (its `size` is what `allocated` counts)."""
        size = round_block(nbytes)
        small = size <= SMALL_SIZE
        lst = self._free[small]
        i = bisect.bisect_left(lst, (size, -1))
        if i < len(lst):
            block = lst[i][2]
            del lst[i]
        else:
            seg = self.segment_size(size)
            if self.capacity is not None and self.reserved + seg > self.capacity:
                self.num_alloc_retries += 1
                self.empty_cache()
                if self.reserved + seg > self.capacity:
                    raise SegmentOverflow(size, seg)
            addr = next(self._addr)
            block = Block(addr, seg, addr, small)
            self.segments[addr] = seg
            self.reserved += seg
        remaining = block.size - size
        if (small and remaining >= 512) or (not small and remaining > SMALL_SIZE):
            rest = Block(block.addr + size, remaining, block.segment, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert_free(rest)
        block.free = False
        self.allocated += block.size
        return block

    def free(self, block: Block):
        assert not block.free
        self.allocated -= block.size
        block.free = True
        for nb in (block.prev, block.next):       # merge with free neighbours in the segment
            if nb is not None and nb.free:
                self._remove_free(nb)
                if nb is block.prev:
                    nb.size += block.size
                    nb.next = block.next
                    if block.next is not None:
                        block.next.prev = nb
                    block = nb
                else:
                    block.size += nb.size
                    block.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = block
        self._insert_free(block)

    def empty_cache(self) -> int:
        """Release wholly free segments; returns the bytes given back."""
        released = 0
        for small in (True, False):
            keep = []
            for size, addr, b in self._free[small]:
                if b.prev is None and b.next is None and self.segments.get(b.segment) == b.size:
                    released += b.size
                    del self.segments[b.segment]
                else:
                    keep.append((size, addr, b))
            self._free[small] = keep
        self.reserved -= released
        return released

    def inactive_split_bytes(self) -> int:
        """Free bytes inside segments that also hold live blocks: the fragmentation PyTorch reports
        as `inactive_split_bytes` in torch.cuda.memory_stats()."""
        total = 0
        for small in (True, False):
            for size, _, b in self._free[small]:
                if b.prev is not None or b.next is not None:
                    total += size
        return total
