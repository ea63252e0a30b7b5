"""The ledger's active file: a memory-mapped, preallocated file in the snapshot layout, updated in place.

``ledger-<sequence>.active`` holds the snapshot header (CRC left 0 while active) and room for
``capacity`` entries; ``count`` in the header says how many rows are in use. Rows are appended in
arrival order and updated in place; a ``RowTable`` (4 bytes a slot, in the heap) finds a producer's row
and a Bloom filter answers "certainly not here" first, as KIP-1044 describes.

An entry is written before the count that makes it visible, so a process killed at any instant leaves
every row whose ``put`` returned readable when the file is reopened (the page cache holds the mapping's
writes). Power loss is another matter: only ``sync()`` (msync) makes the rows durable.
"""
import mmap
import os
import re
import struct

import numpy as np

from kmem import _core
from kmem.bloom import BloomFilter
from kmem.durable import replaced_atomically
from kmem.errors import CorruptSnapshotError
from kmem.ledger.snapshot import ENTRY, ENTRY_DTYPE, ENTRY_SIZE, HEADER, VERSION, ProducerEntry, kafka_view, unmap

PREFIX = "ledger-"
SUFFIX = ".active"
_NAME = re.compile(r"^ledger-(\d{20})\.active$")
_COUNT = struct.Struct(">i")
_COUNT_AT = 6


def active_name(sequence):
    return f"{PREFIX}{sequence:020d}{SUFFIX}"


def active_sequence(name):
    """The sequence number in an active file's name, or None."""
    match = _NAME.match(os.path.basename(name))
    return int(match.group(1)) if match else None


class ActiveFile:
    """One active ledger file. Not thread-safe: the ledger serialises ``put`` against ``find``."""

    def __init__(self, path, shape, capacity=None, fsync=False):
        """Open ``path``, creating it with room for ``capacity`` entries if it does not exist.

        The blocks are reserved on creation; ``fsync`` makes the new file and its name durable.
        """
        self.path = os.fspath(path)
        self.sequence = active_sequence(self.path)
        if capacity is not None and not os.path.exists(self.path):
            with replaced_atomically(self.path, fsync) as f:
                f.write(HEADER.pack(VERSION, 0, 0))
                f.flush()
                size = HEADER.size + capacity * ENTRY_SIZE
                if hasattr(os, "posix_fallocate"):
                    # Reserve the blocks now: a full disk is an OSError here, not SIGBUS at a later store.
                    os.posix_fallocate(f.fileno(), 0, size)
                else:
                    f.truncate(size)
        with open(self.path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            # No room for a row would leave update() flushing an empty file forever.
            if size < HEADER.size + ENTRY_SIZE or (size - HEADER.size) % ENTRY_SIZE:
                raise CorruptSnapshotError(f"{self.path}: active ledger file of {size} bytes is truncated or foreign")
            self._map = mmap.mmap(f.fileno(), 0)
        version, _, count = HEADER.unpack_from(self._map)
        self.capacity = (size - HEADER.size) // ENTRY_SIZE
        if version != VERSION or not 0 <= count <= self.capacity:
            self._map.close()
            raise CorruptSnapshotError(
                f"{self.path}: active ledger file has version {version} and {count} entries for "
                f"{self.capacity} rows (torn or foreign)")
        self.count = count
        self._table = _core.RowTable(self.capacity)
        self.bloom = BloomFilter(shape)
        duplicate = self._table.insert_rows(self._map, count)
        if duplicate is not None:
            self._map.close()
            raise CorruptSnapshotError(f"{self.path}: producer id {duplicate} appears twice")
        self.bloom.add_many(self.entries()["producer_id"])
        self.cardinality = self.bloom.cardinality()

    def find(self, pid):
        if pid not in self.bloom:
            return None
        row = self._table.find(self._map, pid)
        if row < 0:
            return None
        return kafka_view(ProducerEntry(*ENTRY.unpack_from(self._map, HEADER.size + row * ENTRY_SIZE)))

    def put(self, entry):
        """Insert or update ``entry`` in place. The caller checks ``full`` first."""
        packed = entry.pack()
        pid = entry.producer_id
        row = self._table.find(self._map, pid) if pid in self.bloom else -1
        if row >= 0:
            self._map[HEADER.size + row * ENTRY_SIZE:HEADER.size + (row + 1) * ENTRY_SIZE] = packed
            return
        row = self.count
        self._map[HEADER.size + row * ENTRY_SIZE:HEADER.size + (row + 1) * ENTRY_SIZE] = packed
        self._table.insert(pid, row)
        self.cardinality += self.bloom.add(pid)
        self.count = row + 1
        _COUNT.pack_into(self._map, _COUNT_AT, self.count)      # the row becomes visible only now

    @property
    def full(self):
        """No room left, or the filter reached the shape's false-positive rate (half its bits set)."""
        return self.count >= self.capacity or 2 * self.cardinality >= self.bloom.shape.number_of_bits

    def entries(self):
        """The rows in use, as an ENTRY_DTYPE array over the mapping."""
        return np.frombuffer(self._map, ENTRY_DTYPE, count=self.count, offset=HEADER.size)

    def sync(self):
        """msync: make the rows durable against power loss."""
        self._map.flush()

    def close(self):
        unmap(self._map)

    def __repr__(self):
        return f"ActiveFile({self.path!r}, {self.count}/{self.capacity} entries)"
