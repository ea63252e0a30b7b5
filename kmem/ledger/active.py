"""The ledger's active file: a memory-mapped file in the snapshot layout, updated in place, that grows.

``ledger-<sequence>.active`` holds the snapshot header (CRC left 0 while active) and room for some rows;
``count`` in the header says how many rows are in use. Rows are appended in arrival order and updated in
place; a ``RowTable`` (4 bytes a slot, in the heap) finds a producer's row. The rows are the producers
written since the ledger's newest snapshot, which holds every producer; a flush merges the two into the
next snapshot (``runs`` gives the rows in id order). The header's version says so: 2. Version 1 is kmem
0.1's file, whose snapshots each held only the producers written since the previous one (``legacy``);
the ledger merges them all once. The file's Bloom filter (KIP-1044) is kept as rows are added and decides
when the file is full (flushed); lookups go to the row table directly, which is exact and cheaper than the
filter's k bit reads.

The file starts with room for ``INITIAL_ROWS`` and doubles when the rows run out, up to ``capacity``.
Each growth reserves the new blocks (``posix_fallocate``) before the mapping covers them, so a full disk
is an ``OSError`` from ``put``, never SIGBUS at a store into the mapping; a growth that fails leaves the
file at its size. ``reserve(n)`` makes room ahead, so that ``n`` new ids are then stored without I/O.
The mapping (``_core.FileMapping``) holds no file descriptor.

An entry is written before the count that makes it visible, so a process killed at any instant leaves
every row whose ``put`` returned readable when the file is reopened (the page cache holds the mapping's
writes). Power loss is another matter: only ``sync()`` (msync) makes the rows durable.
"""
import os
import re
import numpy as np

from kmem import _core
from kmem.bloom import BloomFilter
from kmem.durable import replaced_atomically
from kmem.errors import CorruptSnapshotError, IllegalStateError
from kmem.ledger.snapshot import ENTRY_DTYPE, ENTRY_SIZE, HEADER, VERSION, ProducerEntry, gather, id_order, unmap

PREFIX = "ledger-"
SUFFIX = ".active"
INITIAL_ROWS = 1024                 # 46 KB: a small ledger stays small
ACTIVE_VERSION = 2                  # rows since a snapshot holding every producer (1: kmem 0.1's, see above)
_NAME = re.compile(r"^ledger-(\d{20})\.active$")


def active_name(sequence):
    return f"{PREFIX}{sequence:020d}{SUFFIX}"


def active_sequence(name):
    """The sequence number in an active file's name, or None."""
    match = _NAME.match(os.path.basename(name))
    return int(match.group(1)) if match else None


def _reserve(file, size):
    """Give ``file`` ``size`` bytes with their blocks allocated (where the platform can). On failure (a
    full disk) the file keeps its size: a file system may have extended it before running out, and
    rows mapped over blocks that are not there would be SIGBUS at the first store."""
    if not hasattr(os, "posix_fallocate"):
        file.truncate(size)
        return
    before = os.fstat(file.fileno()).st_size
    try:
        os.posix_fallocate(file.fileno(), 0, size)
    except OSError:
        os.ftruncate(file.fileno(), before)
        raise


def room_for(shape, cardinality):
    """New ids that cannot bring a filter of ``shape`` with ``cardinality`` bits set to saturation (half
    its bits set): each sets at most k bits."""
    return (shape.number_of_bits // 2 - cardinality) // shape.number_of_hash_functions


class ActiveFile:
    """One active ledger file. Not thread-safe: the ledger serialises ``put`` against ``find``."""

    def __init__(self, path, shape, capacity=None, fsync=False, *, read_only=False, rows=INITIAL_ROWS):
        """Open ``path``, creating it (room for ``min(rows, capacity)`` rows) if it does not exist.

        ``capacity``: the most rows the file may grow to (at least what it holds). The blocks are reserved
        on creation; ``fsync`` makes the new file and its name durable. ``read_only`` maps it read-only
        and never writes (no creation, no growth).
        """
        self.path = os.fspath(path)
        self.sequence = active_sequence(self.path)
        self.read_only = read_only
        if capacity is not None and not read_only and not os.path.exists(self.path):
            with replaced_atomically(self.path, fsync) as f:
                f.write(HEADER.pack(ACTIVE_VERSION, 0, 0))
                f.flush()
                # Reserve the blocks now: a full disk is an OSError here, not SIGBUS at a later store.
                _reserve(f, HEADER.size + min(rows, capacity) * ENTRY_SIZE)
        with open(self.path, "rb" if read_only else "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            # No room for a row would leave update() flushing an empty file forever. Bytes past the last
            # whole row (a growth cut short) are not used.
            if size < HEADER.size + ENTRY_SIZE:
                raise CorruptSnapshotError(f"{self.path}: active ledger file of {size} bytes is truncated or foreign")
            self.rows = (size - HEADER.size) // ENTRY_SIZE
            self._map = _core.FileMapping(f.fileno(), HEADER.size + self.rows * ENTRY_SIZE, writable=not read_only)
        version, _, count = HEADER.unpack_from(self._map)
        if version not in (VERSION, ACTIVE_VERSION) or not 0 <= count <= self.rows:
            self._map.close()
            raise CorruptSnapshotError(
                f"{self.path}: active ledger file has version {version} and {count} entries for "
                f"{self.rows} rows (torn or foreign)")
        self.legacy = version == VERSION
        self.capacity = self.rows if read_only else max(capacity or 0, self.rows)
        self._table = _core.RowTable(self.rows)
        duplicate = self._table.insert_rows(self._map, count)
        if duplicate is not None:
            self._map.close()
            raise CorruptSnapshotError(f"{self.path}: producer id {duplicate} appears twice")
        self._table.bind(self._map, not read_only)
        self._filter = BloomFilter(shape)
        self._filtered = 0                  # rows 0 .. _filtered - 1 are in the filter
        self.cardinality = 0
        self._catch_up()

    def _catch_up(self):
        """Add the rows not yet in the filter, then recount its set bits.

        New ids go into the filter in batches rather than one call per ``put``: ``room`` says how many
        may wait, the most that cannot saturate it (each sets at most k bits), so ``full`` still turns
        true exactly when the filter reaches half its bits set.
        """
        start, self._filtered = self._filtered, self.count
        ids = self.entries()["producer_id"][start:]
        if len(ids) <= 16:              # near saturation, one at a time: no recount of every bit
            cardinality = self.cardinality + sum(self._filter.add(pid) for pid in ids.tolist())
        else:
            self._filter.add_many(ids)
            cardinality = self._filter.cardinality()
        self.cardinality = cardinality
        self.room = room_for(self._filter.shape, cardinality)
        self._saturated = cardinality >= self._filter.shape.number_of_bits // 2
        self._set_limit()

    def _set_limit(self):
        # New rows the core may add before put() must come back here: filter, capacity, growth. Near
        # saturation one at a time, each checked before the next.
        # While no row waits for the filter, ``reserve`` may answer from the limit in the core (has_room).
        self._table.set_limit(min(self.capacity, self._filtered + max(1, self.room)),
                              -1 if self._saturated else self._filtered)

    @property
    def table(self):
        """The core's row table over the file (the same object for the file's life: growth rebinds it)."""
        return self._table

    @property
    def count(self):
        """Rows in use (the row table indexes exactly those)."""
        return self._table.size

    def find(self, pid):
        """The entry of ``pid`` (``kafka_view``), or None. The row table answers exactly, in one probe of
        its slots; asking the filter first would cost k scattered bit reads more."""
        return self._table.get(pid, ProducerEntry)

    def put(self, entry):
        """Insert or update ``entry`` in place, as Kafka reads it back (``kafka_view``).

        True once written; None if the file is ``full`` (nothing written: flush first); False if the
        core refused it (not eight ints in their fields' ranges, or an offset below -1): the caller
        says why. ``table.put`` is the core's part alone (-1: a new row needs this method)."""
        row = self._table.put(entry)                       # the header's count is written after the row
        if row == -1:                                   # a new row at the limit
            self._catch_up()
            if self.full:
                return None
            if self.count == self.rows:
                self._grow()
            row = self._table.put(entry)
        return row != -2

    def put_many(self, raw):
        """``put`` for each entry of ``raw`` (checked entries in the file layout, as bytes), in order,
        until the file is ``full``. Returns how many entries were written."""
        done, total = 0, len(raw) // ENTRY_SIZE
        while done < total and not self.full:
            if self.count == self.rows:
                self._grow(self.count + total - done)   # room for the rest at once: one rehash, not one per doubling
            # At most ``room`` new rows, so the filter cannot saturate unnoticed.
            done += self._table.put_many(raw[done * ENTRY_SIZE:], min(self.capacity, self._filtered + max(1, self.room)))
        return done

    def reserve(self, count):
        """Make room for ``count`` new rows that ``put`` then adds in the core, with no I/O and no check of
        the filter: True; False if the file cannot take them (the filter could saturate, or past
        ``capacity``): flush it. Grows the file if its rows are short (OSError: nothing changed)."""
        used = self._table.size         # ``count``, read once: every append reserves
        if self._filtered < used:
            self._catch_up()
        room = 0 if self._saturated else max(1, self.room)     # one row past the room: see _set_limit
        if count > room or used + count > self.capacity:
            return False
        if used + count > self.rows:
            self._grow(used + count)
        return True

    def runs(self):
        """The rows in id order, as ``merge_snapshot`` takes them: one run over the mapping (the order in
        the heap, 4 bytes a row)."""
        entries = self.entries()
        yield entries.view(np.uint8), id_order(entries)

    def find_many(self, pids):
        """(row found per id, their entries as stored) for an int64 array of ids."""
        rows = np.empty(len(pids), np.int64)
        self._table.find_many(pids, rows)
        hits = rows >= 0
        return hits, gather(self.entries(), rows[hits])

    def _grow(self, wanted=0):
        """Double the rows, or to ``wanted`` if more (up to ``capacity``): reserve the blocks, then map them.
        On failure nothing changed."""
        if self.rows >= self.capacity:
            raise IllegalStateError(f"{self.path} has no room left (the caller checks ``full``)")
        rows = min(self.capacity, max(2 * self.rows, wanted))
        with open(self.path, "r+b") as f:
            _reserve(f, HEADER.size + rows * ENTRY_SIZE)
            mapping = _core.FileMapping(f.fileno(), HEADER.size + rows * ENTRY_SIZE, writable=True)
        self._table.bind(mapping, True)                 # new slots for the new rows
        self._map, self.rows, previous = mapping, rows, self._map
        self._set_limit()
        unmap(previous)

    @property
    def full(self):
        """No room left, or the filter reached the shape's false-positive rate (half its bits set)."""
        if self.count - self._filtered >= self.room:
            self._catch_up()
        return self.count >= self.capacity or self._saturated

    def entries(self):
        """The rows in use, as an ENTRY_DTYPE array over the mapping."""
        return np.frombuffer(self._map, ENTRY_DTYPE, count=self.count, offset=HEADER.size)

    def sync(self):
        """msync: make the rows durable against power loss."""
        self._map.flush()

    def close(self):
        self._table.unbind()
        unmap(self._map)

    def __repr__(self):
        return f"ActiveFile({self.path!r}, {self.count}/{self.rows} rows, up to {self.capacity})"
