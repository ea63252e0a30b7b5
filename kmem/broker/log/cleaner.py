"""Log compaction: Kafka 3.9's ``LogCleaner`` for the partitions whose ``cleanup.policy`` holds ``compact``.

A pass over one partition (``Cleaner.clean``), as Kafka's ``Cleaner.doClean``:

1. The dirty section runs from the partition's first dirty offset (``cleaner-offset-checkpoint``, or the
   log start) to the first uncleanable offset: the active segment's base, the last stable offset (an open
   transaction's records, such as a TxnOffsetCommit's pending offsets, are never cleaned or mapped), or the
   first segment holding a record younger than ``min.compaction.lag.ms``.
2. The key map (``kmem._core.OffsetMap``, a fixed buffer of ``log.cleaner.dedupe.buffer.size`` bytes:
   a 16-byte key hash and an offset per slot, as Kafka's ``SkimpyOffsetMap``) is filled with the latest
   offset of each key of the dirty section, batch by batch, until it is ``log.cleaner.io.buffer.load.factor``
   full: a section with more keys than that is cleaned in several passes, the map never grows.
3. Every segment before the end of what the map covers (not the active one) is rewritten, in groups of
   consecutive segments, into ``<base>.log.cleaned`` with rebuilt ``.index.cleaned`` and
   ``.timeindex.cleaned`` (and ``.txnindex.cleaned``). A group takes in the next segment when what that
   segment keeps fits: at most ``segment.bytes`` in all, room in the indexes (``segment.index.bytes``),
   offsets within 32 bits of the group's base. The segment is tried when it would fit keeping as much of its
   size as the previous one kept of its own; if what it keeps does not fit after all, the cleaned files are
   cut back to where it started and it begins the next group. (Kafka's ``groupSegmentsBySize`` adds up the
   segments' sizes before cleaning, so a group of segments that each keep a quarter of their records holds
   one: here cleaned segments are full, and a pass pays its fsyncs, renames and lock once per segment it
   writes rather than per segment it read.) A record is kept when it is the latest of its key (offsets are never
   rewritten: consumers see gaps); keyless records go (Kafka refuses them on a compacted topic). A batch
   whose records all stay is copied byte for byte, else it is rebuilt with the same base and last offset,
   producer id, epoch, base sequence and codec. A batch left without records is dropped, unless it is the
   last batch of its producer (Kafka's ``RETAIN_EMPTY``): kept as an empty batch so that the producer's
   sequence survives and its retries are still recognised. Transactions (Kafka's
   ``CleanedTransactionMetadata``): nothing at or past the last stable offset is cleaned (the segment
   holding it and later ones stay dirty); the records of aborted transactions never enter the key map, so
   they cannot supersede a committed record, and are dropped (an empty batch stays when it is its
   producer's last). Which transactions aborted comes from the ``.txnindex`` files, read a few entries at a
   time as the pass moves through the log (``CleanedTransactions``): a pass holds one entry per producer
   with a transaction open at its position, whatever the number of aborted transactions in the log. A
   transaction marker stays while a batch of its transaction is before it; the first pass that finds it
   alone gives it a delete horizon (as a tombstone's, below) and a pass after the horizon removes it,
   leaving an empty batch when it is its producer's last batch (Kafka keeps it: it holds the producer's
   epoch). The cleaned segment's ``.txnindex`` holds the aborted transactions whose ABORT marker stays
   because part of the transaction is still before it (Kafka rewrites it the same way): the entry of an
   aborted transaction whose records are all gone is dropped, its marker follows after the horizon.
4. Tombstones (null values) and lone transaction markers, KIP-534: the first pass that keeps a batch
   holding a tombstone, or a marker whose transaction is gone, gives it a delete horizon
   (``now + delete.retention.ms``, in the base timestamp with attribute bit 0x40, as Kafka); a later pass
   drops the tombstones of a batch, or the marker, whose horizon is past.
5. The cleaned files are fsynced and swapped in under the partition's lock (``PartitionLog.replace_segments``)
   as Kafka's ``replaceSegments``: renamed ``.swap``, the old segments renamed ``.deleted``, the ``.swap``
   files renamed to their live names; the ``.deleted`` files are removed once the lock is released (appends
   do not wait for large files to be freed). A crash at any point is completed or undone when the
   partition loads (``complete_interrupted_swaps``, Kafka's ``LogLoader``): ``.cleaned`` and ``.deleted``
   files are removed, a ``.log.swap`` file replaces the live segments its offsets cover and its indexes are
   rebuilt. If the old segments changed meanwhile (retention deleted one), the pass is dropped.

Reads and writes go through ``log.cleaner.io.buffer.size`` windows and are throttled to
``log.cleaner.io.max.bytes.per.second``. Memory of a pass: the map, the I/O buffers, one batch
decompressed (at most ``MAX_DECOMPRESSED_BYTES``) with its filtered copy, two chunks of ``.txnindex``
entries, and per producer with a transaction open at the pass's position its entry (``CleanedTransactions``).
"""
import bisect
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass, field

from kmem import _core
from kmem.broker.log import checkpoints
from kmem.broker.log.index import OffsetIndex, TimeIndex
from kmem.broker.log.segment import INDEX_SUFFIX, TIME_INDEX_SUFFIX, delete_segment_files
from kmem.broker.log.txn_index import ENTRY_SIZE, READ_ENTRIES, TXN_INDEX_SUFFIX, TransactionIndex
from kmem.durable import fsync_directory
from kmem.errors import IllegalStateError, KmemError
from kmem.records import FileRecords, MemoryRecords, codecs, segment_file_name
from kmem.records.batches import INT32_MAX, V2_HEADER
from kmem.records.files import read_entries

log = logging.getLogger(__name__)

CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX = ".cleaned", ".swap", ".deleted"
DELETE_HORIZON_FLAG = 0x40          # Kafka's DefaultRecordBatch.DELETE_HORIZON_FLAG_MASK
SEGMENT_SUFFIXES = (".log", INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
_HEADER_AFTER_CRC = struct.Struct(">hiqqqhii")      # attributes .. record count: what the CRC covers first


class LogCleaningError(KmemError):
    """A partition cannot be cleaned (Kafka marks it uncleanable until the broker restarts)."""


@dataclass
class CleanerStats:
    """One pass (Kafka's ``CleanerStats``): ``map_bytes_read`` filling the key map, ``bytes_read`` and
    ``bytes_written`` rewriting segments, ``map_utilization`` the share of the map's slots filled."""
    map_bytes_read: int = 0
    map_utilization: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    map_records: int = 0
    records_read: int = 0
    records_kept: int = 0
    started: float = field(default_factory=time.monotonic)
    elapsed_secs: float = 0.0


class Throttler:
    """At most ``bytes_per_second`` through ``done(n)`` (Kafka's ``Throttler``); unlimited when infinite."""

    def __init__(self, bytes_per_second):
        self.rate = bytes_per_second
        self._start = time.monotonic()
        self._bytes = 0

    def done(self, n):
        if self.rate == float("inf"):
            return
        self._bytes += n
        ahead = self._bytes / self.rate - (time.monotonic() - self._start)
        if ahead > 0:
            time.sleep(ahead)


def _stem(directory, base_offset):
    return os.path.join(directory, segment_file_name(base_offset))[:-len(".log")]


class _CleanedSegment:
    """``<base>.log.cleaned`` and its indexes, written batch by batch (as ``LogSegment.append``)."""

    def __init__(self, directory, base_offset, config, io_buffer_size, throttler):
        stem = _stem(directory, base_offset)
        self.base_offset = base_offset
        self.log_path = stem + ".log" + CLEANED_SUFFIX
        self.config = config
        self._io_buffer_size = io_buffer_size
        self._throttler = throttler
        self._pending, self._pending_bytes = [], 0
        for suffix in SEGMENT_SUFFIXES:         # leftovers of an interrupted pass
            _unlink(stem + suffix + CLEANED_SUFFIX)
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.offset_index = OffsetIndex(stem + INDEX_SUFFIX + CLEANED_SUFFIX, base_offset, config.segment_index_bytes,
                                        writable=True)
        self.time_index = TimeIndex(stem + TIME_INDEX_SUFFIX + CLEANED_SUFFIX, base_offset,
                                    config.segment_index_bytes, writable=True)
        self.txn_index = TransactionIndex(stem + TXN_INDEX_SUFFIX + CLEANED_SUFFIX, base_offset)
        self._aborted, self._aborted_written = [], 0     # AbortedTxn entries to write to txn_index, written
        self.size = 0
        self._since_index_entry = 0
        self.max_timestamp, self.offset_of_max_timestamp = -1, -1

    def append(self, data, last_offset, max_timestamp, offset_of_max_timestamp, max_size=None):
        """Append a batch; False, nothing written, when ``max_size`` is given and the batch would take the
        segment past it or need an index entry its full indexes have no room for."""
        index_entry = self._since_index_entry > self.config.index_interval_bytes
        if max_size is not None and (self.size + len(data) > max_size or index_entry and (
                self.offset_index.is_full or self.time_index.is_full)):
            return False
        if max_timestamp > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = max_timestamp, offset_of_max_timestamp
        if index_entry:
            self.offset_index.append(last_offset, self.size)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._since_index_entry = 0
        self._pending.append(data)
        self._pending_bytes += len(data)
        self.size += len(data)
        self._since_index_entry += len(data)
        if self._pending_bytes >= self._io_buffer_size:
            self._write_pending()
        return True

    def mark(self):
        """What has been written so far, to ``rewind`` to."""
        return (self.size, self._since_index_entry, self.max_timestamp, self.offset_of_max_timestamp,
                self.offset_index.mark(), self.time_index.mark(), self._aborted_written + len(self._aborted))

    def rewind(self, mark):
        """Forget what was appended since ``mark``: the file is cut back to it."""
        self._write_pending()
        (self.size, self._since_index_entry, self.max_timestamp, self.offset_of_max_timestamp, offset_index,
         time_index, aborted) = mark
        os.ftruncate(self._fd, self.size)
        self.offset_index.rewind(offset_index)
        self.time_index.rewind(time_index)
        if aborted < self._aborted_written:
            self.txn_index.rewind(aborted * ENTRY_SIZE if aborted else None)
            self._aborted, self._aborted_written = [], aborted
        else:
            del self._aborted[aborted - self._aborted_written:]

    def add_aborted(self, txn):
        """Index ``txn`` (an ``AbortedTxn`` whose ABORT marker this segment keeps), in marker order."""
        self._aborted.append(txn)
        if len(self._aborted) == READ_ENTRIES:
            self._write_aborted()

    def _write_aborted(self):
        self.txn_index.extend(self._aborted)
        self._aborted_written += len(self._aborted)
        self._aborted = []

    def _write_pending(self):
        written = _core.append_segment(self._fd, self._pending, self.size - self._pending_bytes)
        self._throttler.done(written)
        self._pending, self._pending_bytes = [], 0

    def finish(self):
        """Write what is buffered, the last time index entry, trim the indexes and fsync everything."""
        self._write_pending()
        self._write_aborted()
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        for index in (self.offset_index, self.time_index):
            index.trim_to_valid_size()
            index.flush()
        self.txn_index.flush()
        os.fsync(self._fd)
        self.close()

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def discard(self):
        self.close()
        for suffix in SEGMENT_SUFFIXES:
            _unlink(_stem(os.path.dirname(self.log_path), self.base_offset) + suffix + CLEANED_SUFFIX)


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def swap_in_cleaned_files(directory, new_base, old_bases):
    """The file renames of Kafka's ``replaceSegments``: the cleaned files become ``.swap`` (the log last),
    the old segments' files ``.deleted`` (``remove_deleted_files`` removes them), the ``.swap`` files their
    live names (the log first). Every step is durable before the next, so a crash leaves a state
    ``complete_interrupted_swaps`` completes or undoes."""
    stem = _stem(directory, new_base)
    if os.path.exists(stem + TXN_INDEX_SUFFIX + CLEANED_SUFFIX):        # made only for an aborted transaction kept
        os.rename(stem + TXN_INDEX_SUFFIX + CLEANED_SUFFIX, stem + TXN_INDEX_SUFFIX + SWAP_SUFFIX)
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, ".log"):
        os.rename(stem + suffix + CLEANED_SUFFIX, stem + suffix + SWAP_SUFFIX)
    fsync_directory(directory)
    for base in old_bases:
        old = _stem(directory, base)
        for suffix in SEGMENT_SUFFIXES:
            if os.path.exists(old + suffix):
                os.rename(old + suffix, old + suffix + DELETED_SUFFIX)
    fsync_directory(directory)
    for suffix in (".log", INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
        if suffix != TXN_INDEX_SUFFIX or os.path.exists(stem + suffix + SWAP_SUFFIX):
            os.rename(stem + suffix + SWAP_SUFFIX, stem + suffix)
    fsync_directory(directory)


def remove_deleted_files(directory, old_bases):
    """The ``.deleted`` files a swap left (a crash before leaves them to ``complete_interrupted_swaps``)."""
    for base in old_bases:
        for suffix in SEGMENT_SUFFIXES:
            _unlink(_stem(directory, base) + suffix + DELETED_SUFFIX)


def complete_interrupted_swaps(directory):
    """Before a partition loads (Kafka's ``LogLoader.removeTempFilesAndCollectSwapFiles`` and
    ``completeSwapOperations``): ``.cleaned`` and ``.deleted`` files are removed, so are ``.swap`` files
    from the first cleaned one on (their pass did not finish writing); each remaining ``<base>.log.swap``
    replaces the live segments whose base offsets lie in ``[base, its next offset)`` and becomes live,
    without its offset and time indexes (the loader rebuilds them) but with its ``.txnindex.swap``, if any,
    as its ``.txnindex`` (the log's replay adds what it lacks). Returns the bases of the segments swapped in."""
    names = os.listdir(directory)
    cleaned = [_base_of(n) for n in names if n.endswith(CLEANED_SUFFIX)]
    min_cleaned = min((b for b in cleaned if b is not None), default=None)
    swapped_logs, swapped_txn_indexes = [], []
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith((CLEANED_SUFFIX, DELETED_SUFFIX)):
            log.warning("%s: removed, left by an interrupted clean", path)
            _unlink(path)
        elif name.endswith(SWAP_SUFFIX):
            base = _base_of(name)
            if base is None:
                continue
            finished = min_cleaned is None or base < min_cleaned
            if name.endswith(".log" + SWAP_SUFFIX) and finished:
                swapped_logs.append(base)
            elif name.endswith(TXN_INDEX_SUFFIX + SWAP_SUFFIX) and finished:
                swapped_txn_indexes.append(base)
            else:
                _unlink(path)           # a swap index is rebuilt; a swap log of an unfinished pass goes
    live = sorted(b for b in (_base_of(n) for n in names if n.endswith(".log")) if b is not None)
    for base in sorted(swapped_logs):
        stem = _stem(directory, base)
        next_offset = _next_offset(stem + ".log" + SWAP_SUFFIX, base)
        for old in live:
            if base <= old < max(next_offset, base + 1):
                log.warning("%s: replaced by the cleaned segment an interrupted clean left", _stem(directory, old))
                delete_segment_files(directory, old)
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            _unlink(stem + suffix)
        os.rename(stem + ".log" + SWAP_SUFFIX, stem + ".log")
        log.warning("%s.log: swapped in after an interrupted clean", stem)
    for base in swapped_txn_indexes:        # its log is live (swapped just now, or before the crash)
        stem = _stem(directory, base)
        os.replace(stem + TXN_INDEX_SUFFIX + SWAP_SUFFIX, stem + TXN_INDEX_SUFFIX)
    if swapped_logs or swapped_txn_indexes or cleaned:
        fsync_directory(directory)
    return sorted(swapped_logs)


def _base_of(name):
    digits = name.split(".", 1)[0]
    return int(digits) if len(digits) == 20 and digits.isdigit() else None


def _next_offset(path, base):
    next_offset = base
    with FileRecords(path) as records:
        try:
            for batch in records.batches():
                next_offset = batch.next_offset
        except KmemError:
            pass
    return next_offset


class _IndexedAbortedTxns:
    """The ``AbortedTxn`` entries of consecutive segments' ``.txnindex`` files as one sequence, numbered from
    0 in marker order, as many as the files held when it was made; read ``READ_ENTRIES`` at a time, the
    last ``CACHED_CHUNKS`` chunks read kept."""
    CACHED_CHUNKS = 2

    def __init__(self, txn_indexes):
        self._indexes = txn_indexes
        self._firsts = []               # the number of each file's first entry
        self.count = 0
        for index in txn_indexes:
            self._firsts.append(self.count)
            self.count += index.entry_count()
        self._chunks = {}               # (file, chunk number) -> [AbortedTxn], oldest read first

    def get(self, number):
        """Entry ``number``, or None past the last."""
        if number >= self.count:
            return None
        file = bisect.bisect_right(self._firsts, number) - 1
        chunk, at = divmod(number - self._firsts[file], READ_ENTRIES)
        entries = self._chunks.get((file, chunk))
        if entries is None:
            entries = self._indexes[file].read(chunk * READ_ENTRIES, READ_ENTRIES)
            if len(self._chunks) == self.CACHED_CHUNKS:
                del self._chunks[next(iter(self._chunks))]
            self._chunks[file, chunk] = entries
        return entries[at] if at < len(entries) else None       # None: the file shrank (retention deleted it)


class CleanedTransactions:
    """Kafka's ``CleanedTransactionMetadata``: which batches of a pass belong to aborted transactions and which
    transaction markers may go, the batches given in offset order. The aborted transactions come from the
    ``.txnindex`` files (``txn_indexes``, those of every segment from the pass's first offset to the log
    end, taken once the last stable offset is known) a few entries at a time: what is held is one entry per
    producer with a transaction read and its marker not yet, and where each producer's next search starts,
    not every aborted transaction of the log.

    A transaction's fate is looked up when its first batch is read: the producer's first entry whose marker
    is not behind the batch, searched from the entries whose markers are not behind the batches read, up to
    the first entry whose last stable offset is past the batch (every transaction open at the batch had
    ended when it was written, so a later entry cannot be this one's). Each producer's search resumes where
    its last one stopped: the entries before hold no transaction of it.
    ``cleaned`` is the ``_CleanedSegment`` written: an ABORT marker kept because its transaction's batches
    were read adds its ``AbortedTxn`` there."""
    FORGET_RESUMES = 4096               # resume points the pass went by are dropped past this many

    def __init__(self, txn_indexes, start_offset):
        first = max(bisect.bisect_right([index.base_offset for index in txn_indexes], start_offset) - 1, 0)
        self._entries = _IndexedAbortedTxns(txn_indexes[first:])
        self._passed = 0                # the entries before have their markers behind the batch read
        self._ongoing = {}              # producer id -> its AbortedTxn, or None (committed): marker not read yet
        self._resume = {}               # producer id -> the entry its next search starts from
        self._forget_at = self.FORGET_RESUMES
        self.cleaned = None

    def _pass(self, offset):
        while (txn := self._entries.get(self._passed)) is not None and txn.last_offset < offset:
            self._passed += 1

    def on_batch_read(self, batch):
        """Whether ``batch`` (a data batch) belongs to an aborted transaction (Kafka's ``onBatchRead``)."""
        if not batch.is_transactional:
            return False
        pid = batch.producer_id
        if pid not in self._ongoing:
            self._pass(batch.base_offset)
            self._ongoing[pid] = self._find_aborted(pid, batch.base_offset)
        return self._ongoing[pid] is not None

    def _find_aborted(self, pid, offset):
        number = max(self._passed, self._resume.get(pid, 0))
        while (txn := self._entries.get(number)) is not None:
            if txn.producer_id == pid:
                if txn.first_offset <= offset:
                    self._resume[pid] = number + 1
                    return txn
                break
            if txn.last_stable_offset > offset:
                break
            number += 1
        self._resume[pid] = number
        if len(self._resume) > self._forget_at:
            self._resume = {p: n for p, n in self._resume.items() if n > self._passed}
            self._forget_at = max(self.FORGET_RESUMES, 2 * len(self._resume))
        return None

    def mark(self):
        """Where the pass is, to ``rewind`` to: a segment tried in a group and taken back is read again."""
        return self._passed, dict(self._ongoing), dict(self._resume), self._forget_at

    def rewind(self, mark):
        self._passed, self._ongoing, self._resume, self._forget_at = mark

    def on_marker_read(self, marker):
        """Whether the transaction marker ``marker`` may go (Kafka's ``onControlBatchRead``): no batch of its
        transaction was read before it in this pass. An ABORT kept indexes its transaction in ``cleaned``."""
        self._pass(marker.base_offset)
        pid = marker.producer_id
        if pid not in self._ongoing:
            return True
        aborted = self._ongoing.pop(pid)
        if aborted is not None and self.cleaned is not None:
            self.cleaned.add_aborted(aborted)
        return False


class Cleaner:
    """Cleans one partition at a time with one ``OffsetMap`` (Kafka's ``Cleaner``); not thread-safe."""

    def __init__(self, dedupe_buffer_size, *, io_buffer_size=512 << 10, load_factor=0.9,
                 max_io_bytes_per_second=float("inf")):
        self.dedupe_buffer_size = dedupe_buffer_size
        self.offset_map = None          # made for each pass and freed after it (see clean)
        self._transactions = None       # the CleanedTransactions of the map's fill, then of the rewrite
        self.io_buffer_size = io_buffer_size
        self.load_factor = load_factor
        self.max_io_bytes_per_second = max_io_bytes_per_second

    def clean(self, partition_log, first_dirty_offset, now_ms):
        """One pass; returns ``(the new first dirty offset, CleanerStats)``."""
        # A new map per pass, freed after it: its buffer is zeroed lazily by the kernel, so only the slots a
        # pass touches take memory, and an idle broker holds none (a broker whose only compacted topic is
        # __consumer_offsets would otherwise keep the whole dedupe buffer resident).
        self.offset_map = _core.OffsetMap(self.dedupe_buffer_size)
        try:
            return self._clean(partition_log, first_dirty_offset, now_ms)
        finally:
            self.offset_map = self._transactions = None

    def _clean(self, partition_log, first_dirty_offset, now_ms):
        stats = CleanerStats()
        throttler = Throttler(self.max_io_bytes_per_second)
        segments, log_start, active_base = partition_log.cleanable_segments()
        config = partition_log.config
        first_dirty = max(first_dirty_offset, log_start)
        uncleanable = first_uncleanable_offset(segments, active_base, partition_log.last_stable_offset, config,
                                               now_ms)
        txn_indexes = partition_log.transaction_indexes()      # after the LSO: every marker before it is indexed
        self._transactions = CleanedTransactions(txn_indexes, first_dirty)
        end = self._build_offset_map(partition_log, segments, first_dirty, uncleanable, stats, throttler)
        stats.map_utilization = self.offset_map.size / self.offset_map.slots
        if end <= first_dirty:
            stats.elapsed_secs = time.monotonic() - stats.started
            return first_dirty, stats
        to_clean = [s for s in segments if s.base_offset < end]
        self._transactions = CleanedTransactions(txn_indexes, to_clean[0].base_offset)
        while to_clean:
            cleaned = self._clean_segments(partition_log, to_clean, now_ms, stats, throttler)
            if not cleaned:
                break
            to_clean = to_clean[cleaned:]
        stats.elapsed_secs = time.monotonic() - stats.started
        return end, stats

    # --- the map --------------------------------------------------------------------------------------

    def _build_offset_map(self, partition_log, segments, first_dirty, uncleanable, stats, throttler):
        """Fill the map from ``first_dirty``; returns the offset after the last batch it covers."""
        offset_map = self.offset_map
        max_keys = int(offset_map.slots * self.load_factor)
        end = first_dirty
        for segment in segments:
            if segment.base_offset >= uncleanable:
                break
            if segment.next_offset <= first_dirty:
                continue
            for batch in self._batches(segment, throttler, stats, for_map=True):
                if batch.last_offset < first_dirty:
                    continue
                if batch.base_offset >= uncleanable:        # the last stable offset, within this segment
                    return end
                if batch.is_control_batch:
                    self._transactions.on_marker_read(batch)
                elif not self._transactions.on_batch_read(batch):
                    count = batch.records_count
                    if offset_map.size + count > max_keys:
                        if end == first_dirty:
                            raise LogCleaningError(
                                f"{partition_log.directory}: a batch of {count} records at offset "
                                f"{batch.base_offset} does not fit the key map of {max_keys} keys "
                                "(log.cleaner.dedupe.buffer.size)")
                        return end
                    section, base = _records_section(batch)
                    stats.map_records += offset_map.put_records(
                        section, count=count, base_offset=batch.base_offset, base_timestamp=batch.base_timestamp,
                        start_offset=first_dirty, base=base)
                offset_map.update_latest_offset(batch.last_offset)
                end = batch.next_offset
        return end

    def _batches(self, segment, throttler, stats, for_map=False):
        with FileRecords(segment.log_path, 0, segment.size) as records:
            position = 0
            while (window := read_entries(records, position, self.io_buffer_size)) is not None:
                view, next_position = window
                throttler.done(len(view))
                if for_map:
                    stats.map_bytes_read += len(view)
                else:
                    stats.bytes_read += len(view)
                for batch in MemoryRecords(view):
                    batch.file_position = position + batch.position
                    yield batch
                position = next_position

    # --- rewriting ------------------------------------------------------------------------------------

    def _clean_segments(self, partition_log, segments, now_ms, stats, throttler):
        """Rewrite the first of ``segments`` and those after it whose cleaned records still fit into one
        cleaned segment, and swap it in; returns how many it replaced, 0 when the log changed meanwhile."""
        config = partition_log.config
        cleaned = _CleanedSegment(partition_log.directory, segments[0].base_offset, config, self.io_buffer_size,
                                  throttler)
        self._transactions.cleaned = cleaned
        group, kept_ratio = [], 0.0
        try:
            for segment in segments:
                # The first segment of a group always goes in whole. A later one is tried if it would fit
                # keeping the share of its size the previous one kept, and taken back if what it keeps does not.
                if group and (cleaned.size + kept_ratio * segment.size > config.segment_bytes
                              or segment.next_offset - 1 - cleaned.base_offset > INT32_MAX):
                    break
                size_before, mark, counts = cleaned.size, cleaned.mark(), (stats.records_read, stats.records_kept)
                transactions = self._transactions.mark()
                if not self._clean_into(cleaned, partition_log, segment, now_ms, stats, throttler,
                                        config.segment_bytes if group else None):
                    cleaned.rewind(mark)
                    self._transactions.rewind(transactions)
                    stats.records_read, stats.records_kept = counts
                    break
                kept_ratio = (cleaned.size - size_before) / segment.size if segment.size else 0.0
                group.append(segment)
            cleaned.finish()
            stats.bytes_written += cleaned.size
        except BaseException:
            cleaned.discard()
            raise
        if not partition_log.replace_segments(group, cleaned.base_offset):
            cleaned.discard()
            log.info("%s: clean of offsets %d..%d dropped: the log changed meanwhile", partition_log.directory,
                     group[0].base_offset, group[-1].next_offset - 1)
            return 0
        # out of the partition's lock: removing large files takes time, appends need not wait for it
        remove_deleted_files(partition_log.directory, [s.base_offset for s in group])
        return len(group)

    def _clean_into(self, cleaned, partition_log, segment, now_ms, stats, throttler, max_size):
        """Append what stays of ``segment`` to ``cleaned``; False as soon as it would not fit ``max_size``
        (see ``_CleanedSegment.append``), what was appended then being the caller's to rewind."""
        for batch in self._batches(segment, throttler, stats):
            kept = self._retained(partition_log, batch, now_ms, partition_log.config, stats)
            if kept is not None and not cleaned.append(kept[0], batch.last_offset, kept[1], kept[2], max_size):
                return False
        return True

    def _retained(self, partition_log, batch, now_ms, config, stats):
        """``(bytes, max timestamp, offset of it)`` of what stays of ``batch``, or None."""
        stats.records_read += batch.records_count
        if batch.is_control_batch:
            return self._retained_marker(partition_log, batch, now_ms, config, stats)
        if batch.magic != 2:
            stats.records_kept += batch.records_count
            return bytes(batch.buffer), batch.max_timestamp, batch.last_offset
        if self._transactions.on_batch_read(batch):     # Kafka's cleaner drops the records of aborted transactions
            if self._is_last_batch_of_producer(partition_log, batch):
                return _empty_batch(batch), batch.max_timestamp, batch.last_offset
            return None
        has_horizon = bool(batch.attributes & DELETE_HORIZON_FLAG)
        retain_deletes = not has_horizon or now_ms < batch.base_timestamp
        section, base = _records_section(batch)
        kept = _core.filter_v2_records(self.offset_map, section, count=batch.records_count,
                                       base_offset=batch.base_offset, base_timestamp=batch.base_timestamp,
                                       retain_deletes=retain_deletes, base=base)
        stats.records_kept += kept.count
        if kept.count == batch.records_count and (has_horizon or not kept.has_tombstones):
            return bytes(batch.buffer), batch.max_timestamp, batch.last_offset
        if kept.count == 0:
            if batch.producer_id >= 0 and self._is_last_batch_of_producer(partition_log, batch):
                return _empty_batch(batch), batch.max_timestamp, batch.last_offset
            return None
        if has_horizon:                 # the records' timestamps are already relative to it
            horizon = batch.base_timestamp
        elif kept.has_tombstones:       # the first clean keeping a tombstone starts its delete.retention.ms
            horizon = now_ms + config.delete_retention_ms
            kept = _core.filter_v2_records(self.offset_map, section, count=batch.records_count,
                                           base_offset=batch.base_offset, base_timestamp=batch.base_timestamp,
                                           retain_deletes=retain_deletes, new_base_timestamp=horizon, base=base)
        else:
            horizon = None
        return _rebuilt_batch(batch, kept, horizon)

    def _retained_marker(self, partition_log, marker, now_ms, config, stats):
        """A transaction marker stays while a batch of its transaction is before it, then until its delete
        horizon (KIP-534: ``delete.retention.ms`` after the first clean that found it alone, stored as a
        tombstone's), then as an empty batch if it is its producer's last (it holds the producer's epoch)."""
        if not self._transactions.on_marker_read(marker):
            stats.records_kept += marker.records_count
            return bytes(marker.buffer), marker.max_timestamp, marker.last_offset
        has_horizon = bool(marker.attributes & DELETE_HORIZON_FLAG)
        if marker.records_count and not has_horizon:
            stats.records_kept += marker.records_count
            return _with_delete_horizon(marker, now_ms + config.delete_retention_ms)
        if has_horizon and now_ms < marker.base_timestamp:
            stats.records_kept += marker.records_count
            return bytes(marker.buffer), marker.max_timestamp, marker.last_offset
        if self._is_last_batch_of_producer(partition_log, marker):
            return _empty_batch(marker), marker.max_timestamp, marker.last_offset
        return None

    @staticmethod
    def _is_last_batch_of_producer(partition_log, batch):
        """Kafka's ``isBatchLastRecordOfProducer``: the batch holding the producer's last sequence, or, when the
        producer has written no data since its epoch changed, a marker of that epoch."""
        state = partition_log.producers.state(batch.producer_id)
        if state is None:
            return False
        if state.last_offset >= 0:
            return state.last_offset == batch.last_offset
        return batch.is_control_batch and batch.producer_epoch == state.epoch


def _records_section(batch):
    """A v2 batch's records (decompressed) and the file position errors name."""
    body = batch.buffer[V2_HEADER.size:]
    if batch.is_compressed:
        return codecs.decompress(batch.compression, body, 2, codecs.MAX_DECOMPRESSED_BYTES,
                                 batch.file_position), batch.file_position
    return body, batch.file_position + V2_HEADER.size


def _batch_bytes(batch, attributes, base_timestamp, max_timestamp, count, records):
    after_crc = _HEADER_AFTER_CRC.pack(attributes, batch.last_offset - batch.base_offset, base_timestamp,
                                       max_timestamp, batch.producer_id, batch.producer_epoch, batch.base_sequence,
                                       count)
    crc = _core.crc32c(records, _core.crc32c(after_crc))
    head = struct.pack(">qiiBI", batch.base_offset, 49 + len(records), batch.partition_leader_epoch, 2, crc)
    return b"".join((head, after_crc, records))


def _empty_batch(batch):
    """The header alone, no records (Kafka's ``writeEmptyHeader``): keeps the producer's last sequence."""
    attributes = batch.attributes & ~DELETE_HORIZON_FLAG & ~0x07
    return _batch_bytes(batch, attributes, batch.max_timestamp, batch.max_timestamp, 0, b"")


def _with_delete_horizon(marker, horizon):
    """``marker`` (a control batch) with the delete horizon as its base timestamp, its records' timestamps
    kept (as Kafka's ``MemoryRecordsBuilder`` given a delete horizon)."""
    records = _core.encode_v2_records([(r.offset - marker.base_offset, r.timestamp - horizon, r.key, r.value,
                                        [(k.encode(), v) for k, v in r.headers]) for r in marker])
    if marker.is_compressed:
        records = codecs.compress(marker.compression, records, 2)
    data = _batch_bytes(marker, marker.attributes | DELETE_HORIZON_FLAG, horizon, marker.max_timestamp,
                        marker.records_count, records)
    return data, marker.max_timestamp, marker.last_offset


def _rebuilt_batch(batch, kept, horizon):
    records = kept.section
    if batch.is_compressed:
        records = codecs.compress(batch.compression, records, 2)
    attributes = batch.attributes & ~DELETE_HORIZON_FLAG
    if horizon is not None:
        attributes |= DELETE_HORIZON_FLAG
    log_append = batch.attributes & 0x08
    max_timestamp = batch.max_timestamp if log_append else kept.max_timestamp
    offset_of_max = batch.last_offset if log_append else kept.offset_of_max_timestamp
    base_timestamp = batch.base_timestamp if horizon is None else horizon
    data = _batch_bytes(batch, attributes, base_timestamp, max_timestamp, kept.count, records)
    return data, max_timestamp, offset_of_max


def first_uncleanable_offset(segments, active_base, last_stable_offset, config, now_ms):
    """The active segment's base offset, the last stable offset, or the base of the first segment holding a
    record younger than ``min.compaction.lag.ms``, whichever is first (Kafka's ``cleanableOffsets``)."""
    first = min(active_base, last_stable_offset)
    if config.min_compaction_lag_ms > 0:
        for segment in segments:
            if segment.largest_timestamp > now_ms - config.min_compaction_lag_ms:
                return min(first, segment.base_offset)
    return first


@dataclass
class LogToClean:
    """A compacted partition and how dirty it is (Kafka's ``LogToClean``)."""
    key: tuple
    partition_log: object
    first_dirty_offset: int
    clean_bytes: int
    cleanable_bytes: int
    compaction_delay_ms: int

    @property
    def cleanable_ratio(self):
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0


def log_to_clean(key, partition_log, first_dirty_offset, now_ms):
    segments, log_start, active_base = partition_log.cleanable_segments()
    config = partition_log.config
    first_dirty = max(first_dirty_offset, log_start)
    uncleanable = first_uncleanable_offset(segments, active_base, partition_log.last_stable_offset, config, now_ms)
    clean = sum(s.size for s in segments if s.next_offset <= first_dirty)
    dirty = [s for s in segments if s.next_offset > first_dirty and s.base_offset < uncleanable]
    # KIP-354: how far past max.compaction.lag.ms the oldest dirty batch is
    first_timestamps = [h.max_timestamp for s in dirty for h in [next(s.heads(), None)] if h is not None]
    earliest = min((t for t in first_timestamps if t > 0), default=None)
    delay = 0
    if earliest is not None and config.max_compaction_lag_ms < now_ms:
        delay = max(now_ms - config.max_compaction_lag_ms - earliest, 0)
    return LogToClean(key, partition_log, first_dirty, clean, sum(s.size for s in dirty), delay)


class LogCleaner:
    """The cleaner of a log directory (Kafka's ``LogCleaner`` and ``LogCleanerManager``): one thread
    cleaning the compacted partition with the highest dirty ratio above its ``min.cleanable.dirty.ratio``
    (or past ``max.compaction.lag.ms``), each pass's end written to ``cleaner-offset-checkpoint``.
    ``partitions`` is the log manager's ``{(topic, partition): PartitionLog}`` (read, never changed here).

    Each pass is logged (partition, bytes before and after, records kept, duration). ``metrics`` holds
    Kafka's ``kafka.log:type=LogCleaner`` and ``LogCleanerManager`` gauges (kmem broker has no metrics
    reporter of its own: read them here):

    - ``max-dirty-percent``: the highest dirty ratio of the compacted logs at the last look for work, in %;
    - ``max-compaction-delay-secs``: how far the most overdue log is past its ``max.compaction.lag.ms``;
    - ``cleaner-recopy-percent``: bytes the last pass wrote per byte of segments it rewrote, in %;
    - ``max-buffer-utilization-percent``: the share of the key map the last pass filled, in %;
    - ``max-clean-time-secs``: how long the last pass took;
    - ``uncleanable-partitions-count``: the partitions a pass failed on, not cleaned again until a restart."""

    def __init__(self, log_dir, config, partitions, clock_ms):
        self.config = config
        self._partitions = partitions
        self._clock = clock_ms
        self.checkpoint_path = os.path.join(log_dir, checkpoints.CLEANER_OFFSET_CHECKPOINT)
        try:
            self._first_dirty = checkpoints.read_offset_checkpoint(self.checkpoint_path)
        except checkpoints.CorruptCheckpointError as e:
            log.warning("%s; every compacted partition is cleaned from its start again", e)
            self._first_dirty = {}
        self._cleaner = None            # its key map is allocated at the first pass
        self._uncleanable = set()
        self._lock = threading.Lock()   # one pass at a time
        self._stop = threading.Event()
        self._thread = None
        self._metrics = {"max-dirty-percent": 0, "cleaner-recopy-percent": 0, "max-clean-time-secs": 0,
                         "max-compaction-delay-secs": 0, "max-buffer-utilization-percent": 0}

    @property
    def metrics(self):
        """Kafka's cleaner gauges by name (see the class docstring), a copy."""
        return {**self._metrics, "uncleanable-partitions-count": len(self._uncleanable)}

    def first_dirty_offset(self, topic, partition):
        return self._first_dirty.get((topic, partition), 0)

    def start(self):
        if not self.config.log_cleaner_enable or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="kmem-log-cleaner", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            try:
                cleaned = self.clean_filthiest()
            except Exception:
                log.exception("log cleaner failed")
                cleaned = None
            if cleaned is None:
                self._stop.wait(self.config.log_cleaner_backoff_ms / 1000)

    def forget(self, keys):
        """Partitions deleted: their checkpoint entries go."""
        with self._lock:
            for key in keys:
                self._first_dirty.pop(key, None)
                self._uncleanable.discard(key)
            self._write_checkpoint()

    def _write_checkpoint(self):
        checkpoints.write_offset_checkpoint(self.checkpoint_path, self._first_dirty)

    def clean_filthiest(self, now_ms=None):
        """Clean the dirtiest compacted partition that needs it; ``(key, CleanerStats)``, or None."""
        with self._lock:
            now = self._clock() if now_ms is None else now_ms
            candidates = []
            for key, partition_log in sorted(list(self._partitions.items())):
                if not partition_log.config.compact or key in self._uncleanable:
                    continue
                try:
                    candidates.append(log_to_clean(key, partition_log, self._first_dirty.get(key, 0), now))
                except (IllegalStateError, OSError):        # deleted or closed meanwhile
                    continue
            self._metrics["max-dirty-percent"] = int(100 * max((c.cleanable_ratio for c in candidates), default=0))
            self._metrics["max-compaction-delay-secs"] = max((c.compaction_delay_ms for c in candidates),
                                                             default=0) // 1000
            due = [c for c in candidates if (c.compaction_delay_ms > 0 and c.cleanable_bytes > 0)
                   or c.cleanable_ratio > c.partition_log.config.min_cleanable_dirty_ratio]
            if not due:
                return None
            chosen = max(due, key=lambda c: c.cleanable_ratio)
            return chosen.key, self._clean(chosen, now)

    def clean(self, topic, partition, now_ms=None):
        """One pass over a partition, whatever its dirty ratio (tests, and an operator's request)."""
        with self._lock:
            now = self._clock() if now_ms is None else now_ms
            key = (topic, partition)
            return self._clean(log_to_clean(key, self._partitions[key], self._first_dirty.get(key, 0), now), now)

    def _clean(self, to_clean, now):
        if self._cleaner is None:
            self._cleaner = Cleaner(self.config.log_cleaner_dedupe_buffer_size,
                                    io_buffer_size=self.config.log_cleaner_io_buffer_size,
                                    load_factor=self.config.log_cleaner_io_buffer_load_factor,
                                    max_io_bytes_per_second=self.config.log_cleaner_io_max_bytes_per_second)
        partition_log = to_clean.partition_log
        before = partition_log.size_in_bytes
        try:
            end, stats = self._cleaner.clean(partition_log, to_clean.first_dirty_offset, now)
        except LogCleaningError as e:
            self._uncleanable.add(to_clean.key)
            log.error("%s; the partition is not cleaned again until the broker restarts", e)
            raise
        self._first_dirty[to_clean.key] = end
        self._write_checkpoint()
        after = partition_log.size_in_bytes
        self._metrics["cleaner-recopy-percent"] = int(100 * stats.bytes_written / stats.bytes_read) \
            if stats.bytes_read else 0
        self._metrics["max-clean-time-secs"] = int(stats.elapsed_secs)
        self._metrics["max-buffer-utilization-percent"] = int(100 * stats.map_utilization)
        log.info("cleaned %s-%d: %d to %d bytes, offsets up to %d (%d of %d records kept, %d keys mapped) "
                 "in %.3f s", *to_clean.key, before, after, end - 1, stats.records_kept, stats.records_read,
                 stats.map_records, stats.elapsed_secs)
        return stats
