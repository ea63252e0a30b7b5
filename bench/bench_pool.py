"""Allocate+release pairs: kmem's pool vs a hand-written lock-and-counter pool vs plain bytearray.

Fixed sizes reuse a cached block every time; "mixed sizes" (1 B to 64 KiB, drawn once) shows the case
where a cached block rarely has the exact size asked for (blocks are never rounded up, so that the pool's
memory stays within its bound) and most allocations go to malloc.
"""
import random
import threading

import pytest

from kmem.pool import SimpleMemoryPool

PAIRS = 1000
SIZES = {"64B": 64, "16KiB": 16 << 10, "1MiB": 1 << 20, "mixed sizes": "mixed"}


class LockAndCounterPool:
    """What a Python user writes without kmem: a lock, a counter, a fresh bytearray per request."""

    def __init__(self, size_bytes):
        self._lock = threading.Lock()
        self.available = size_bytes

    def try_allocate(self, size_bytes):
        with self._lock:
            if self.available < 1:
                return None
            self.available -= size_bytes
        return bytearray(size_bytes)

    def release(self, buf):
        with self._lock:
            self.available += len(buf)


MIXED = [random.Random(1).randint(1, 64 << 10) for _ in range(PAIRS)]


def pairs(pool, size_bytes):
    allocate, release = pool.try_allocate, pool.release
    sizes = MIXED if size_bytes == "mixed" else [size_bytes] * PAIRS

    def run():
        for size in sizes:
            release(allocate(size))
    return run


def plain_bytearrays(size_bytes):
    sizes = MIXED if size_bytes == "mixed" else [size_bytes] * PAIRS

    def run():
        for size in sizes:
            bytearray(size)
    return run


@pytest.mark.parametrize("size_name", SIZES)
def test_kmem_pool(compare, size_name):
    size = SIZES[size_name]
    compare(f"pool allocate+release {size_name}", "kmem", pairs(SimpleMemoryPool(64 << 20, 1 << 20), size), PAIRS)


@pytest.mark.parametrize("size_name", SIZES)
def test_lock_and_counter_pool(compare, size_name):
    size = SIZES[size_name]
    compare(f"pool allocate+release {size_name}", "lock-and-counter pool", pairs(LockAndCounterPool(64 << 20), size),
            PAIRS)


@pytest.mark.parametrize("size_name", SIZES)
def test_plain_bytearray(compare, size_name):
    compare(f"pool allocate+release {size_name}", "bytearray(n)", plain_bytearrays(SIZES[size_name]), PAIRS)
