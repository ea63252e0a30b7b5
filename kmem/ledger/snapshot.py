"""Kafka producer-state snapshot files: read, write, and search them with a bounded number of descriptors.

Layout (big-endian): ``version i16 (= 1) | crc u32 | count i32`` then ``count`` entries of 46 bytes
``producerId i64 | epoch i16 | lastSequence i32 | lastOffset i64 | offsetDelta i32 | timestamp i64 |
coordinatorEpoch i32 | currentTxnFirstOffset i64``. The CRC-32C covers bytes [6, end of file). Files are
named by the offset they end at, zero-padded to 20 digits, plus ``.snapshot``.

Reading follows Kafka 3.9's ``ProducerStateManager.readSnapshot``: it parses the header and ``count``
entries from the start of the file and checks the CRC over everything after the CRC field, so bytes after
the entries are accepted when the CRC covers them. An entry with ``lastOffset < 0`` has no batch: Kafka
reads its sequence, offset and offset delta as -1, -1 and 0. A ``currentTxnFirstOffset`` below 0 is "no
open transaction" (-1). ``kafka_view`` applies those two rules; every reader here returns entries so.

Kafka writes entries in hash-map order; kmem writes them sorted by producer id, which is still a valid
Kafka snapshot and lets ``Snapshot.find`` binary-search it in the compiled core. For an
unsorted (Kafka-written) file kmem builds a sorted row order beside it (``<name>.order``: little-endian
u32 row numbers) rather than changing Kafka's file. ``merge_snapshot`` writes a snapshot from others and
newer entries, streamed in id order (the ledger's flush: each snapshot holds every producer).
"""
import mmap
import os
import re
import resource
import struct
from typing import NamedTuple

import numpy as np

from kmem import _core
from kmem.bloom import SIDECAR_SUFFIX, BloomFilter
from kmem.durable import replaced_atomically
from kmem.errors import CorruptSnapshotError, InvalidArgumentError

VERSION = 1
HEADER = struct.Struct(">hIi")          # version, crc, count
ENTRY = struct.Struct(">qhiqiqiq")
ENTRY_SIZE = ENTRY.size                 # 46
CRC_START = 6                           # the CRC covers everything after itself
SUFFIX = ".snapshot"
ORDER_SUFFIX = ".order"
NO_TXN = -1
MIN_TIMESTAMP = -(2**63)
_NAME = re.compile(r"^(\d{20})\.snapshot$")
_READ_CHUNK = ENTRY_SIZE * 100_000      # entries per read while verifying a file (4.6 MB)
# Every 128th id of a snapshot stays in the heap (1/16 byte per id): a search then touches one stride
# of the mapped file (5.9 KB) instead of a page per halving step.
FENCE_STRIDE = 128
MERGE_ROWS = 4096                       # entries per read of a sorted snapshot being merged (188 KB)

# The entry layout as a numpy record: arrays of entries are files' bytes and back without packing.
ENTRY_DTYPE = np.dtype([
    ("producer_id", ">i8"), ("epoch", ">i2"), ("last_sequence", ">i4"), ("last_offset", ">i8"),
    ("offset_delta", ">i4"), ("timestamp", ">i8"), ("coordinator_epoch", ">i4"),
    ("current_txn_first_offset", ">i8"),
])
assert ENTRY_DTYPE.itemsize == ENTRY_SIZE


class ProducerEntry(NamedTuple):
    """One producer's state, as a snapshot entry holds it."""

    producer_id: int
    epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int = NO_TXN

    def pack(self):
        try:
            return ENTRY.pack(*self)
        except struct.error as e:
            raise InvalidArgumentError(f"producer entry out of range ({e}): {self!r}") from None


class SnapshotStats(NamedTuple):
    """What one pass over a snapshot learns: enough for the read path and for retention."""

    count: int
    crc: int
    max_timestamp: int
    open_transactions: bool


def kafka_view(entry):
    """``entry`` as Kafka 3.9's ``readSnapshot`` hands it on (see the module docstring)."""
    if entry.last_offset >= 0 and entry.current_txn_first_offset >= NO_TXN:
        return entry
    if entry.last_offset < 0:
        entry = entry._replace(last_sequence=-1, last_offset=-1, offset_delta=0)
    if entry.current_txn_first_offset < NO_TXN:
        entry = entry._replace(current_txn_first_offset=NO_TXN)
    return entry


def kafka_view_array(array):
    """``kafka_view`` for an ENTRY_DTYPE array: the array itself when no entry changes, else a fixed copy."""
    no_batch = array["last_offset"] < 0
    no_txn = array["current_txn_first_offset"] < NO_TXN
    if not (no_batch.any() or no_txn.any()):
        return array
    array = array.copy()
    array["last_sequence"][no_batch] = -1
    array["last_offset"][no_batch] = -1
    array["offset_delta"][no_batch] = 0
    array["current_txn_first_offset"][no_txn] = NO_TXN
    return array


_ROW = np.dtype((np.void, ENTRY_SIZE))


def gather(array, rows):
    """``array[rows]`` for an ENTRY_DTYPE array, copied as whole 46-byte rows (numpy copies structured
    rows field by field, several times slower)."""
    return array.view(_ROW)[rows].view(ENTRY_DTYPE)


def scatter(array, where, rows):
    """``array[where] = rows`` for ENTRY_DTYPE arrays, as whole rows (see ``gather``)."""
    array.view(_ROW)[where] = rows.view(_ROW)


def snapshot_name(offset):
    """``00000000000000001234.snapshot`` for offset 1234."""
    if offset < 0 or offset >= 10**20:
        raise InvalidArgumentError(f"snapshot offset out of range: {offset}")
    return f"{offset:020d}{SUFFIX}"


def snapshot_offset(name):
    """The offset in a snapshot file name, or None if the name is not one."""
    match = _NAME.match(os.path.basename(name))
    return int(match.group(1)) if match else None


def entries_array(entries):
    """Entries as an ENTRY_DTYPE array: as given if already one, else converted (array or tuples)."""
    if isinstance(entries, np.ndarray) and entries.dtype == ENTRY_DTYPE:
        return entries
    if isinstance(entries, np.ndarray) and entries.dtype.names:
        missing = set(ENTRY_DTYPE.names) - set(entries.dtype.names)
        if missing:
            raise InvalidArgumentError(f"entry array lacks fields {sorted(missing)}")
        out = np.empty(len(entries), ENTRY_DTYPE)
        for name in ENTRY_DTYPE.names:
            # numpy's assignment would wrap or truncate; tuples out of range are refused, so are these.
            column, limits = entries[name], np.iinfo(ENTRY_DTYPE[name])
            if column.dtype.kind not in "iu":
                raise InvalidArgumentError(f"entry field {name} is {column.dtype}, not an integer")
            if len(column) and not limits.min <= int(column.min()) <= int(column.max()) <= limits.max:
                raise InvalidArgumentError(f"entry field {name} has values outside {ENTRY_DTYPE[name]}")
            out[name] = column
        return out
    try:
        rows = [tuple(e) for e in entries]
    except TypeError:
        raise InvalidArgumentError(
            f"entries must be ProducerEntry tuples or an array with ENTRY_DTYPE's fields, not {entries!r:.80}") from None
    try:
        return np.array(rows, ENTRY_DTYPE) if rows else np.empty(0, ENTRY_DTYPE)
    except (OverflowError, ValueError, TypeError) as e:
        raise InvalidArgumentError(f"bad producer entries: {e}") from None


def _raw(array):
    """The bytes of an ENTRY_DTYPE array, whole entries in a row (a copy only if it is strided)."""
    return np.ascontiguousarray(array).view(np.uint8)


def id_order(array):
    """Row numbers of an ENTRY_DTYPE array in producer-id order (uint32); an id present twice is rejected."""
    order, duplicate = _core.entries_id_order(_raw(array))
    if duplicate is not None:
        raise InvalidArgumentError(f"producer id {duplicate} appears twice in one snapshot")
    return order


def snapshot_stats(array, order=None):
    """The SnapshotStats of the file ``write_snapshot`` would write, without writing it."""
    return _stats(len(array), *_core.write_snapshot_body(-1, _raw(array), order))


def _stats(count, crc, max_timestamp, open_transactions):
    return SnapshotStats(count, crc, MIN_TIMESTAMP if max_timestamp is None else max_timestamp, open_transactions)


def write_snapshot(path, entries, *, sort=True, fsync=False):
    """Write a snapshot file atomically (temporary file, then rename), sorted by producer id by default.

    Returns its SnapshotStats.
    """
    array = entries_array(entries)
    return write_entries(path, array, id_order(array) if sort else None, fsync=fsync)


def write_entries(path, array, order, *, fsync=False):
    """``write_snapshot`` for an ENTRY_DTYPE array and its row order (None: as they are).

    The core gathers the rows in order, checksums and writes them a cache-sized piece at a time, so no
    second copy of a large array is made; the CRC goes into the header last.
    """
    with replaced_atomically(path, fsync) as f:
        f.write(struct.pack(">hI", VERSION, 0))        # the CRC is filled in once computed
        f.flush()
        stats = _stats(len(array), *_core.write_snapshot_body(f.fileno(), _raw(array), order))
        os.pwrite(f.fileno(), struct.pack(">I", stats.crc), 2)
    return stats


def merge_snapshot(path, sources, shape, *, expired_at=None, fsync=False):
    """Write the snapshot ``path`` and its Bloom sidecar (of ``shape``: room for every id) with each
    producer's newest entry among ``sources``, without the expired ones; returns its SnapshotStats and
    fences (every FENCE_STRIDE-th id, for ``Snapshot``).

    ``sources``: newest first, each an iterable of runs in increasing id order (``Snapshot.runs``,
    ``ActiveFile.runs``). The core merges them streaming (``SnapshotMerge``), dropping an entry without an
    open transaction whose timestamp is at or below ``expired_at`` (Kafka's ``isProducerExpired``); the
    filter is built in its file. So memory holds a run of each source and one piece of output, however
    many producers; the work is a pass over the sources. The sidecar is renamed into place first, so a
    snapshot never appears without it; a failure leaves neither file half-written."""
    with replaced_atomically(path, fsync) as out, replaced_atomically(path + SIDECAR_SUFFIX, fsync) as sidecar:
        bloom = BloomFilter.build_in(sidecar, shape)
        try:
            out.write(struct.pack(">hI", VERSION, 0))        # the CRC is filled in once computed
            out.flush()
            merge = _core.SnapshotMerge(out.fileno(), len(sources), bloom, expired_at, FENCE_STRIDE)
            runs = [iter(source) for source in sources]
            while (source := merge.run()) >= 0:
                merge.feed(source, *next(runs[source], (b"", None)))
            count, crc, max_timestamp, open_transactions, fences = merge.finish()
            os.pwrite(out.fileno(), struct.pack(">I", crc), 2)
        finally:
            bloom.close()
    return _stats(count, crc, max_timestamp, open_transactions), fences


def read_snapshot(path):
    """All entries of a snapshot file as ProducerEntry tuples (``kafka_view``), in file order.

    Verifies version, size and CRC as Kafka 3.9's ``readSnapshot`` does.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER.size)
        count = _check_header(head, size, path)
        data = head + f.read(size - HEADER.size)       # the size is checked first: no huge read of a bad count
    if len(data) != size:
        raise CorruptSnapshotError(f"{path}: snapshot changed size while being read")
    stored, computed = HEADER.unpack_from(data)[1], _core.crc32c(memoryview(data)[CRC_START:])
    if computed != stored:
        raise _crc_error(path, stored, computed)
    return [kafka_view(ProducerEntry(*ENTRY.unpack_from(data, HEADER.size + i * ENTRY_SIZE))) for i in range(count)]


def _check_header(head, size, path):
    """The entry count, once version and size allow it; bytes after the entries are allowed (as Kafka does)."""
    if size < HEADER.size:
        raise CorruptSnapshotError(f"{path}: Snapshot failed schema validation: snapshot truncated ({size} bytes, "
                                   f"the header needs {HEADER.size}, at byte 0)")
    version, _, count = HEADER.unpack_from(head)
    if version != VERSION:      # Kafka's CorruptSnapshotException messages, after the path
        raise CorruptSnapshotError(f"{path}: Snapshot failed schema validation: Snapshot contained an unknown "
                                   f"file version {version}")
    if count < 0:
        raise CorruptSnapshotError(f"{path}: Snapshot failed schema validation: snapshot entry count {count} is "
                                   "negative (at byte 6)")
    if size < HEADER.size + count * ENTRY_SIZE:
        raise CorruptSnapshotError(f"{path}: Snapshot failed schema validation: snapshot truncated: {size} bytes "
                                   f"cannot hold its {count} entries ({HEADER.size + count * ENTRY_SIZE} bytes)")
    return count


def _crc_error(path, stored, computed):
    return CorruptSnapshotError(f"{path}: Snapshot is corrupt (CRC is no longer valid). Stored crc: {stored}. "
                                f"Computed crc: {computed}")


def verify_snapshot(path):
    """Check version, size and CRC as ``read_snapshot`` does, reading the file in chunks (nothing stays
    mapped or in the heap). Returns its SnapshotStats (over the entries, not bytes after them)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER.size)
        count = _check_header(head, size, path)
        crc = _core.crc32c(head[CRC_START:])
        max_timestamp = MIN_TIMESTAMP
        open_txn = False
        entry_bytes, left = count * ENTRY_SIZE, size - HEADER.size
        while left:
            # Whole entries while there are entries, then what follows them (only the CRC covers it).
            chunk = f.read(min(entry_bytes or left, _READ_CHUNK))    # never more than the file holds
            if not chunk or (entry_bytes and len(chunk) % ENTRY_SIZE):
                raise CorruptSnapshotError(f"{path}: snapshot changed size while being read")
            left -= len(chunk)
            crc = _core.crc32c(chunk, crc)
            if entry_bytes:
                entry_bytes -= len(chunk)
                rows = np.frombuffer(chunk, ENTRY_DTYPE)
                max_timestamp = max(max_timestamp, int(rows["timestamp"].max()))
                open_txn = open_txn or bool((rows["current_txn_first_offset"] >= 0).any())
    expected = HEADER.unpack_from(head)[1]
    if crc != expected:
        raise _crc_error(path, expected, crc)
    return SnapshotStats(count, crc, max_timestamp, open_txn)


def _row_chunks(path, count):
    """The entries of the snapshot at ``path`` of ``count`` entries (``verify_snapshot`` checked it), as
    ENTRY_DTYPE arrays of ``MERGE_ROWS`` entries at most."""
    with open(path, "rb", buffering=0, opener=_open_without_atime) as f:
        for start in range(0, count, MERGE_ROWS):
            size = min(MERGE_ROWS, count - start) * ENTRY_SIZE
            data = os.pread(f.fileno(), size, HEADER.size + start * ENTRY_SIZE)
            if len(data) != size:
                raise CorruptSnapshotError(f"{path}: snapshot shrank while being read")
            yield np.frombuffer(data, ENTRY_DTYPE)


def open_transactions(path, count):
    """``{producer id: first offset of its open transaction}`` of the snapshot at ``path`` of ``count`` entries
    (``verify_snapshot`` checked it)."""
    found = {}
    for rows in _row_chunks(path, count):
        rows = rows[rows["current_txn_first_offset"] >= 0]
        found.update(zip(rows["producer_id"].tolist(), rows["current_txn_first_offset"].tolist()))
    return found


def entries_of(path, count, pids):
    """``{producer id: ProducerEntry}`` of the snapshot at ``path`` of ``count`` entries (``verify_snapshot``
    checked it) for those of ``pids`` it holds."""
    wanted = np.asarray(sorted(pids), np.int64)
    found = {}
    for rows in _row_chunks(path, count):
        for row in rows[np.isin(rows["producer_id"].astype(np.int64), wanted)].tolist():
            found[row[0]] = ProducerEntry(*row)
    return found


def set_open_snapshots_limit(limit):
    """Keep a descriptor open between searches for at most ``limit`` sorted snapshots in this process, the
    most recently searched (default 32, or an eighth of RLIMIT_NOFILE's soft limit at import when lower;
    0: every search opens and closes its file). Lowering it closes the least recently searched now. Each
    kept descriptor saves a search the ``open`` and ``close`` of its file (about 2 us, more than the
    search); the limit keeps a process's descriptors bounded however many ledgers (a broker's partitions)
    it has open."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 2**31:
        raise InvalidArgumentError(f"the limit of open snapshots must be an integer from 0 to 2**31 - 1: {limit!r}")
    _core.set_open_snapshots_limit(limit)


def open_snapshots():
    """``(open, limit)``: the sorted snapshots keeping a descriptor open now, and the most that may."""
    return _core.open_snapshots()


# A process allowed few descriptors keeps fewer for snapshots: they would be missed by its other files.
_allowed = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
if _allowed != resource.RLIM_INFINITY and _allowed // 8 < open_snapshots()[1]:
    set_open_snapshots_limit(_allowed // 8)

# A forked child gets copies of the kept descriptors and of the list's mutex, perhaps held by a thread of
# the parent that does not exist there.
os.register_at_fork(after_in_child=_core.forget_open_snapshots_in_child)


class Snapshot:
    """A verified snapshot file, searchable by producer id without loading it into the heap, holding a
    file descriptor only while it is among the process's most recently searched (``set_open_snapshots_limit``:
    a broker keeps the snapshots of every partition open).

    Every FENCE_STRIDE-th id stays in the heap ("fences"). A search picks the stride that may hold the
    id from the fences, reads with one ``pread`` the 16 rows (736 bytes) around the row interpolated
    between the two fences, or the stride's 5.9 KB when the id is not among them, and binary-searches the
    rows, all in one call to the core (``SnapshotIndex``), opening the file only when no descriptor of it
    is kept (the ledger drops it before it deletes or replaces the file). Reading rather than
    touching a mapping is deliberate: Linux maps a whole page-cache folio (up to 2 MB) on a fault, so
    mapped lookups either grow the resident set by about a megabyte per search or pay a fault and an
    unmap (~7 us) each time; the read costs ~1 us and leaves RSS flat.

    Unsorted (Kafka-written) files get a row order (``<name>.order``) built once (kept in the heap when
    opened ``read_only``); they are searched through read-only mappings of the file and the order
    (``FileMapping``s, which hold no descriptor), unmapping what the search touched afterwards.

    ``retire()`` before deleting the file: its descriptor is closed, and a search by a reader still holding
    the snapshot then finds nothing once the file is gone, instead of failing. ``close()`` closes it too.
    """

    def __init__(self, path, stats=None, *, read_only=False, fences=None):
        """``read_only``: an unsorted file's row order is kept in the heap instead of written beside it.
        ``stats`` and ``fences`` of a sorted file just written (``merge_snapshot``): the file is not read."""
        self.path = os.fspath(path)
        self.read_only = read_only
        self.offset = snapshot_offset(self.path)
        self.stats = stats or verify_snapshot(self.path)
        self.count = self.stats.count
        self._retired = False
        self._order_map = None
        self._order = None
        self._data = self._map = None
        if fences is not None:
            self._fences = fences
            self._index = _core.SnapshotIndex(self.path, self.count, fences, FENCE_STRIDE)
            return
        self._map = _map_file(self.path)
        _advise_random(self._map)
        self._data = memoryview(self._map)
        if not _core.snapshot_sorted(self._data, self.count):
            self._order = self._load_order()
        self._fences = _core.snapshot_fences(self._data, self.count, FENCE_STRIDE, self._order)
        self._index = None
        if self._order is None:     # searched with pread: no mapping kept
            self._data.release()
            self._map.close()
            self._data = self._map = None
            self._index = _core.SnapshotIndex(self.path, self.count, self._fences, FENCE_STRIDE)
        self.trim()         # the checks above read every page; none needs to stay mapped

    def _load_order(self):
        order_path = self.path + ORDER_SUFFIX
        try:
            self._order_map = _map_file(order_path)
            order = np.frombuffer(self._order_map, "<u4")
            if _core.snapshot_sorted(self._data, self.count, order):
                return order
        except (OSError, ValueError):
            pass
        self._order_map = None
        ids = np.frombuffer(self._data, ENTRY_DTYPE, count=self.count, offset=HEADER.size)["producer_id"]
        order = np.argsort(ids, kind="stable").astype("<u4")
        if not _core.snapshot_sorted(self._data, self.count, order):
            raise CorruptSnapshotError(f"{self.path}: a producer id appears twice in the snapshot")
        if not self.read_only:
            with replaced_atomically(order_path) as f:
                f.write(order.tobytes())
        return order

    @property
    def index(self):
        """What the ledger's compiled read path searches: the core's index of a sorted file, else this
        object (its ``find``)."""
        return self._index if self._index is not None else self

    @property
    def sorted(self):
        return self._order is None

    def find(self, pid):
        """The entry of producer ``pid``, or None."""
        if self._order is None:        # fences, open, a pread around the guessed row, its search: one call to the core
            entry = self._index.find(pid, ProducerEntry)
            if entry is False:
                raise CorruptSnapshotError(f"{self.path}: snapshot shrank while in use")
            return entry
        row = _core.snapshot_search(self._data, self.count, pid, self._order, self._fences, FENCE_STRIDE)
        entry = None if row < 0 else kafka_view(
            ProducerEntry(*ENTRY.unpack_from(self._data, HEADER.size + row * ENTRY_SIZE)))
        self.trim()
        return entry

    def find_many(self, pids):
        """(found per id, their entries, ``kafka_view``) for an int64 array of ids: one pass in the core.

        A sorted file is mapped for the call and unmapped after it (a batch amortises the mapping).
        """
        if self._data is not None:
            data = self._data
        else:
            try:
                data = _map_file(self.path)
            except FileNotFoundError:
                if not self._retired:
                    raise
                return np.zeros(len(pids), np.bool_), np.zeros(0, ENTRY_DTYPE)
        try:
            rows = np.full(len(pids), -1, np.int64)
            _core.snapshot_search_many(data, self.count, pids, rows, self._order, self._fences, FENCE_STRIDE)
            hits = rows >= 0
            found = gather(np.frombuffer(data, ENTRY_DTYPE, count=self.count, offset=HEADER.size), rows[hits])
        finally:
            if data is not self._data:
                data.close()
        self.trim()
        return hits, kafka_view_array(found)

    def entries(self):
        """All entries (``kafka_view``), as a read-only ENTRY_DTYPE array over a mapping (sorted files: in
        id order), or a copy in the heap if some entry reads differently in Kafka than as stored.

        Sorted files are mapped for the call; the mapping goes with the array.
        """
        data = self._data if self._data is not None else _map_file(self.path)
        return kafka_view_array(np.frombuffer(data, ENTRY_DTYPE, count=self.count, offset=HEADER.size))

    def runs(self):
        """The entries in increasing id order, as ``merge_snapshot`` takes them: ``(rows, order)`` runs.

        A sorted file is read ``MERGE_ROWS`` at a time, so none of it stays in memory; a Kafka-ordered
        file is one run through its mapping and row order (the pages read are dropped afterwards)."""
        if self._order is not None:
            yield np.frombuffer(self._data, np.uint8, count=self.count * ENTRY_SIZE, offset=HEADER.size), self._order
            self.trim()
            return
        with open(self.path, "rb", buffering=0, opener=_open_without_atime) as f:
            for start in range(0, self.count, MERGE_ROWS):
                size = min(MERGE_ROWS, self.count - start) * ENTRY_SIZE
                rows = os.pread(f.fileno(), size, HEADER.size + start * ENTRY_SIZE)
                if len(rows) != size:
                    raise CorruptSnapshotError(f"{self.path}: snapshot shrank while being merged")
                yield rows, None

    def trim(self):
        """Drop this process's mapping of pages already read (they remain in the page cache)."""
        for m in (self._map, self._order_map):
            if m is not None and hasattr(mmap, "MADV_DONTNEED"):
                m.madvise(mmap.MADV_DONTNEED)

    def retire(self):
        """The file is about to be deleted: its descriptor is closed, and searches that no longer find it find
        no entry."""
        self._retired = True
        if self._index is not None:
            self._index.retire()

    def close(self):
        """Unmap the file and the row order (see ``unmap``), close a kept descriptor; sorted files' searches
        raise from now on."""
        if self._index is not None:
            self._index.close()
        self._data = self._order = None
        for m in (self._map, self._order_map):
            if m is not None:
                unmap(m)

    def __repr__(self):
        return f"Snapshot({self.path!r}, {self.count} entries{'' if self.sorted else ', unsorted'})"


def _open_without_atime(path, flags):
    # Only the file's owner may ask for O_NOATIME (else EPERM): others open it plainly.
    try:
        return os.open(path, flags | getattr(os, "O_NOATIME", 0))
    except PermissionError:
        return os.open(path, flags)


def _map_file(path):
    """All of ``path`` mapped read-only (a ``FileMapping``: the file is closed on return)."""
    with open(path, "rb", buffering=0, opener=_open_without_atime) as f:
        return _core.FileMapping(f.fileno())


def unmap(mapping):
    """Close ``mapping`` now, or, while arrays over it are still alive (a reader's rows, a traceback's
    frame), leave it to go with the last of them."""
    try:
        mapping.close()
    except BufferError:
        pass


def _advise_random(mapping):
    # Lookups jump around the file: no read-ahead into pages they will not use.
    if hasattr(mmap, "MADV_RANDOM"):
        mapping.madvise(mmap.MADV_RANDOM)
