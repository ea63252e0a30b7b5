"""Bloom filter index loops from mmh3 and the published algorithms alone (no kmem code involved).

``commons_indices``: commons-collections 4.5.0's EnhancedDoubleHasher. ``m1_indices``: the 4.5.0-M1 loop
(before COLLECTIONS-855) that kmem 0.1 ran, to build the sidecars such a version left behind.
"""
import struct

import mmh3
import numpy as np

MASK64 = (1 << 64) - 1


def pid_hash(pid):
    """MurmurHash3_x64_128 of the id's 8 big-endian bytes, seed 0, as two unsigned halves."""
    return tuple(v & MASK64 for v in mmh3.hash64(struct.pack(">q", pid), seed=0, x64arch=True))


def commons_indices(m, k, pid):
    h1, h2 = pid_hash(pid)
    index, inc = h1 % m, h2 % m
    out = [index]
    i = 1
    for _ in range(1, k):
        index = (index - inc) % m
        out.append(index)
        inc = (inc - i) % m
        i += 1
        if k >= m and i == m:      # commons restarts the counter only when k >= m
            i = 0
    return out


def m1_indices(m, k, pid):
    h1, h2 = pid_hash(pid)
    index, inc = h1 % m, h2 % m
    out = []
    i = 0
    for _ in range(k):
        out.append(index)
        index = (index - inc) % m
        inc = (inc - i) % m
        i = (i + 1) % m
    return out


def sidecar_bytes(m, k, pids, indices=commons_indices):
    """A `.bloom` sidecar (m i32, k i32, ceil(m/64) longs, big-endian) holding ``pids``."""
    words = np.zeros((m + 63) // 64, np.uint64)
    for pid in pids:
        for i in indices(m, k, int(pid)):
            words[i >> 6] |= np.uint64(1) << np.uint64(i & 63)
    return struct.pack(">ii", m, k) + words.astype(">u8").tobytes()
