"""One log segment: ``<base>.log`` with its ``.index``, ``.timeindex`` and, once a transaction aborted in it,
``.txnindex`` (Kafka's ``LogSegment``; ``kmem.broker.log.txn_index``).

Appends write whole batches at the end of the ``.log`` file with ``pwritev`` (the batch bytes are passed
as views, never copied in Python) and add an offset index entry, and maybe a time index entry, once more
than ``index.interval.bytes`` were appended since the last one: the entry maps the append's largest
offset to the position where the append began, as Kafka's ``LogSegment.append`` does. The batches and the
entries due (an index holds its entries until they fill ``index.PENDING_BYTES``) are written by one core
call, the write without the GIL (``_core.SegmentCore.append``, whose state ``LogSegment`` and the indexes extend).

Once the active segment holds ``RESERVE_FROM_BYTES``, an append past the blocks reserved first reserves the next
ones (``_core.reserve_blocks``: Linux's ``fallocate`` keeping the file's size, so no reader sees them): as many
again as the segment will then hold, at most ``RESERVE_AHEAD_BYTES``, not past ``segment.bytes``. A write into
reserved blocks skips the file system's reservation of each page it adds (ext4's delayed allocation: about a
quarter of the CPU of a write into the page cache, ``bench/reserve_ahead.py``). Reserving is best effort and
never takes the disk's last room: nothing is reserved while the file system has less than
``RESERVE_HEADROOM_BYTES`` free beyond it; a reservation that fails (a full disk, a file system without it) is
given back at once, and the appends allocate as they write, as before. The blocks left past the end are freed
when the segment rolls or closes, when the disk fills (``release_reserved``: the log manager frees every
partition's after an append finds no room, at most once a second, so the retry finds it), and, after a broker
was killed, when the segment opens again (more than ``LEFTOVER_BYTES`` past its end). Freeing keeps the file's
modification time, by which Kafka retains a segment without timestamps; a file the broker does not own (it could
not set that time) reserves nothing.

``recover`` revalidates the file batch by batch (sizes, magic, CRC, offsets inside the segment and
increasing), truncates it at the first invalid or partial batch and rebuilds both indexes, as Kafka's
``LogSegment.recover``; the indexes it writes are the ones the appends wrote when each append held one
batch (what clients send). The transaction index loses the entries of the part cut off; the log replays
the batches kept and adds the aborted transactions it lacks.

Only the active segment keeps a file open, its ``.log`` (the indexes are opened for each use); an older
segment opens its files for each use (under the partition's lock), so a partition holds one descriptor
however long its log is.
"""
import contextlib
import errno
import logging
import os
import struct

from kmem import _core
from kmem.broker.log.index import NO_TIMESTAMP, OffsetIndex, TimeIndex
from kmem.broker.log.txn_index import TXN_INDEX_SUFFIX, TransactionIndex
from kmem.errors import CorruptRecordError
from kmem.records import FileRecords, segment_file_name
from kmem.records.batches import LOG_OVERHEAD

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
HEAD = struct.Struct(">qiiB")             # offset, size, partition leader epoch (v2) / crc, magic
V2_LAST_DELTA_AT, V2_MAX_TIMESTAMP_AT = 23, 35
HEAD_READ = 61                            # enough for every field read here
INDEX_SUFFIX, TIME_INDEX_SUFFIX = ".index", ".timeindex"
RESERVE_FROM_BYTES = 1 << 20
RESERVE_AHEAD_BYTES = 4 << 20
RESERVE_HEADROOM_BYTES = 256 << 20
LEFTOVER_BYTES = 64 << 10          # past the end's block: more than a file system's own metadata blocks
_NO_RESERVATION = 2**63 - 1      # past any append's end

log = logging.getLogger(__name__)


class BatchHead:
    """Header fields of a batch in a segment file, read without its records."""
    __slots__ = ("position", "size", "magic", "last_offset", "max_timestamp")

    def __init__(self, head, position):
        offset, length, _, self.magic = HEAD.unpack_from(head)
        self.position = position
        self.size = LOG_OVERHEAD + length
        if self.magic == 2:
            self.last_offset = offset + struct.unpack_from(">i", head, V2_LAST_DELTA_AT)[0]
            self.max_timestamp = struct.unpack_from(">q", head, V2_MAX_TIMESTAMP_AT)[0]
        else:       # a v0/v1 entry's offset is its last (inner) offset; v1 has the timestamp at byte 18
            self.last_offset = offset
            self.max_timestamp = struct.unpack_from(">q", head, 18)[0] if self.magic == 1 else NO_TIMESTAMP


class LogSegment(_core.SegmentCore):
    """A segment of a partition's log. Appends and recovery are serialised by the partition's lock; an append is
    the core's (``SegmentCore.append``)."""

    def __init__(self, directory, base_offset, config, *, active, now_ms):
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.log_path = os.path.join(directory, segment_file_name(base_offset))
        stem = self.log_path[:-len(".log")]
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o644)
        self.size = self._reserved_to = 0       # blocks up to ``_reserved_to`` may be reserved past the end
        self._reserve_at = RESERVE_FROM_BYTES      # an append ending past this reserves more
        try:
            stat = os.fstat(self._fd)
            self.size = stat.st_size
            if not _owned(stat):
                self._reserve_at = _NO_RESERVATION
            elif stat.st_blocks * 512 > _block_end(self.size) + LEFTOVER_BYTES:      # left by a broker killed
                self._release_reserved(self._fd)
            self.offset_index = OffsetIndex(stem + INDEX_SUFFIX, base_offset, config.segment_index_bytes,
                                            writable=active)
            self.time_index = TimeIndex(stem + TIME_INDEX_SUFFIX, base_offset, config.segment_index_bytes,
                                        writable=active)
            self.txn_index = TransactionIndex(stem + TXN_INDEX_SUFFIX, base_offset)
        except BaseException:
            self._release_log()
            raise
        if not active:          # an older segment's log is opened for each use
            self._release_log()
        self.created_ms = now_ms
        self.rolling_based_timestamp = None     # largest timestamp of the first append (Kafka's)
        self.max_timestamp_so_far = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self.bytes_since_last_index_entry = 0
        self.next_offset = base_offset
        # (offset, position) where the last append began: every batch before that position ends below that
        # offset, so a reader at the tail scans from there, with no index search (None: not known)
        self._last_append = None

    def __repr__(self):
        return f"<LogSegment {self.log_path} {self.size} bytes, offsets {self.base_offset}..{self.next_offset - 1}>"

    # --- files ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _log_file(self):
        if self._fd is not None:
            yield self._fd
            return
        fd = os.open(self.log_path, os.O_RDWR | _CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    def _release_log(self):
        if self._fd is not None:
            self.release_reserved()
            os.close(self._fd)
            self._fd = None

    def release_reserved(self):
        """Free the blocks the active segment reserved past its end (the disk is full, or it closes); it may
        reserve again once the disk has room."""
        if self._fd is not None and self._reserved_to > self.size:
            self._release_reserved(self._fd)

    def _release_reserved(self, fd):
        """Free the blocks past the end, keeping the file's modification time (a warning when that fails)."""
        try:
            stat = os.fstat(fd)
            os.ftruncate(fd, self.size)
            os.utime(fd, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        except OSError as e:
            log.warning("%s: freeing the blocks reserved past its end: %s", self.log_path, e)
        self._reserved_to = 0

    # --- reading headers ------------------------------------------------------------------------------

    def heads(self, position=0, end=None):
        """``BatchHead`` of each complete batch from ``position`` to ``end`` (default: the segment's end)."""
        end = self.size if end is None else end
        with self._log_file() as fd:
            while end - position >= LOG_OVERHEAD:
                head = os.pread(fd, HEAD_READ, position)
                size = LOG_OVERHEAD + struct.unpack_from(">i", head, 8)[0]
                # Only validated data is read here; a damaged tail just ends the scan.
                if len(head) <= 16 or position + size > end or size < (HEAD_READ if head[16] == 2 else 26):
                    return
                batch = BatchHead(head, position)
                yield batch
                position += batch.size

    def load(self):
        """After a clean shutdown: the next offset and largest timestamp from the indexes and the tail."""
        _, position = self.offset_index.lookup(2**63 - 1)
        timestamp, offset = self.time_index.last_entry
        self.max_timestamp_so_far, self.offset_of_max_timestamp = (timestamp, offset) if timestamp >= 0 else (-1, -1)
        self.next_offset = max(self.base_offset, self.offset_index.last_offset)
        for batch in self.heads(position):
            self.next_offset = batch.last_offset + 1
            if batch.max_timestamp > self.max_timestamp_so_far:
                self.max_timestamp_so_far, self.offset_of_max_timestamp = batch.max_timestamp, batch.last_offset

    def sanity_check(self):
        self.offset_index.sanity_check(max(self.size, 1))
        self.time_index.sanity_check(self.next_offset)
        self.txn_index.sanity_check()

    def translate_offset(self, offset, starting_position=0):
        """The first batch whose last offset is at least ``offset`` (Kafka's translateOffset), or None."""
        start = max(self._scan_start(offset), starting_position)
        if self._fd is not None:        # the active segment (most reads): no context manager on the fetch path
            found = _core.first_batch_reaching(self._fd, start, self.size, offset, HEAD_READ)
        else:
            with self._log_file() as fd:
                found = _core.first_batch_reaching(fd, start, self.size, offset, HEAD_READ)
        return None if found is None else BatchHead(found[1], found[0])

    def fetch_slice(self, offset, max_end, max_bytes, min_one_message, copy_below):
        """What a fetch at ``offset`` reads of this segment (Kafka's ``LogSegment.read``): ``(position, size,
        data)``, the slice from the batch holding ``offset`` of at most ``max_bytes`` (that batch whole with
        ``min_one_message``) ending by the position ``max_end``, ``size`` 0 or less when nothing fits; ``data``
        its bytes when shorter than ``copy_below``, else None (``records`` sends it from the file). None when no
        batch holds ``offset``."""
        start = self._scan_start(offset)
        if self._fd is not None:        # the active segment (most reads): no context manager on the fetch path
            return _core.fetch_slice(self._fd, start, self.size, offset, max_end, max_bytes, min_one_message,
                                     copy_below)
        with self._log_file() as fd:
            return _core.fetch_slice(fd, start, self.size, offset, max_end, max_bytes, min_one_message, copy_below)

    def _scan_start(self, offset):
        """Where a scan for ``offset`` starts: where the last append began for its offsets (every batch before
        it ends below them), else the offset index's floor."""
        if self._last_append is not None and offset >= self._last_append[0]:
            return self._last_append[1]
        return self.offset_index.lookup(offset)[1]

    def records(self, start, end):
        """``FileRecords`` of the bytes ``[start, end)`` of the log, with a descriptor of their own: the
        active segment's duplicated (cheaper than opening the file again), an older one's opened."""
        if self._fd is None:
            return FileRecords(self.log_path, start, end)
        # what may be read ends at the active segment's size (an append counts once written whole): no fstat
        return FileRecords.of_descriptor(os.dup(self._fd), self.log_path, start, end, file_size=self.size)

    def find_offset_by_timestamp(self, timestamp, starting_offset):
        """``(offset, timestamp)`` of the first record at or after ``starting_offset`` with a timestamp of at
        least ``timestamp``, or None (Kafka's findOffsetByTimestamp)."""
        _, indexed_offset = self.time_index.lookup(timestamp)
        _, position = self.offset_index.lookup(max(indexed_offset, starting_offset))
        with FileRecords(self.log_path, 0, self.size) as records:
            for batch in records.batches(position):
                if batch.max_timestamp >= timestamp:
                    for record in batch:
                        if record.timestamp >= timestamp and record.offset >= starting_offset:
                            return record.offset, record.timestamp
        return None

    def record_at_max_timestamp(self):
        """``(offset, timestamp)`` of the first record carrying the segment's largest timestamp, or None."""
        if self.max_timestamp_so_far < 0:
            return None
        return self.find_offset_by_timestamp(self.max_timestamp_so_far, self.base_offset)

    @property
    def largest_timestamp(self):
        """The largest timestamp, or the file's modification time when there is none (Kafka's)."""
        if self.max_timestamp_so_far >= 0:
            return self.max_timestamp_so_far
        return os.stat(self.log_path).st_mtime_ns // 1_000_000

    def time_waited_for_roll(self, now_ms, message_timestamp):
        if self.rolling_based_timestamp is None and self.size:
            first = next(self.heads(), None)
            if first is not None:
                self.rolling_based_timestamp = first.max_timestamp
        if self.rolling_based_timestamp is not None and self.rolling_based_timestamp >= 0:
            return message_timestamp - self.rolling_based_timestamp
        return now_ms - self.created_ms

    # --- writing --------------------------------------------------------------------------------------

    def _write_failed(self, position):
        """An append's write at ``position`` failed (the core's ``append`` cut the file back there): the blocks
        past it were freed, so the next append past ``RESERVE_FROM_BYTES`` reserves."""
        self._reserved_to = 0
        self._reserve_at = min(self._reserve_at, max(position, RESERVE_FROM_BYTES))

    def _reserve_ahead(self, end):
        """Reserve blocks for an append ending at ``end``, and ahead (see the module docstring)."""
        stop = min(end + min(end, RESERVE_AHEAD_BYTES), self.config.segment_bytes)
        if stop <= end:             # the segment rolls at one of its next appends
            self._reserve_at = _NO_RESERVATION
            return
        self._reserve_at = stop     # not reserved now: tried again past ``stop``
        start = max(self.size, self._reserved_to)
        disk = os.fstatvfs(self._fd)
        if disk.f_bavail * disk.f_frsize < RESERVE_HEADROOM_BYTES + stop - start:
            return
        error = _core.reserve_blocks(self._fd, start, stop - start)
        if not error:
            self._reserved_to = stop
        elif error != errno.EOPNOTSUPP:     # a file system may have reserved a part of it (ext4 does): freed now
            self._release_reserved(self._fd)

    def recover(self, on_batch=None):
        """Revalidate the file, truncate it at the first bad batch, rebuild the indexes; returns the bytes
        truncated. ``on_batch(batch)`` sees every valid batch (a ``RecordBatch``), in order."""
        self.offset_index.reset()
        self.time_index.reset()
        self._last_append = None
        self.max_timestamp_so_far, self.offset_of_max_timestamp = NO_TIMESTAMP, -1
        valid_bytes = last_index_entry = 0
        previous_last = self.base_offset - 1
        with FileRecords(self.log_path) as records:
            try:
                for batch in records.batches():
                    if batch.file_position != valid_bytes:
                        break
                    batch.ensure_valid()
                    last = batch.last_offset
                    if last <= previous_last or not self.can_convert_to_relative_offset(last):
                        break
                    if batch.magic == 2 and batch.base_offset <= previous_last:
                        break
                    if batch.max_timestamp > self.max_timestamp_so_far:
                        self.max_timestamp_so_far, self.offset_of_max_timestamp = batch.max_timestamp, last
                    if valid_bytes - last_index_entry > self.config.index_interval_bytes:
                        self.offset_index.append(last, valid_bytes)
                        self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp)
                        last_index_entry = valid_bytes
                    valid_bytes += batch.size_in_bytes
                    previous_last = last
                    if on_batch is not None:
                        on_batch(batch)
            except CorruptRecordError:
                pass
        truncated = self.size - valid_bytes
        if truncated:
            os.truncate(self.log_path, valid_bytes)
            self.size = valid_bytes
        self.next_offset = previous_last + 1
        self.bytes_since_last_index_entry = 0        # as a segment Kafka just loaded: counting restarts
        self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp, skip_full_check=True)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        self.txn_index.truncate_to(self.next_offset)
        self.rolling_based_timestamp = None
        return truncated

    def make_active(self):
        """Keep the files open and preallocate the indexes again (the segment takes appends)."""
        if self._fd is None:
            self._fd = os.open(self.log_path, os.O_RDWR | _CLOEXEC)
        for index in (self.offset_index, self.time_index):
            index.resize(index.max_index_size)

    def on_become_inactive(self):
        """At roll (and close): the largest timestamp goes into the time index, the indexes are trimmed and
        the log file is no longer kept open. The files are synced later (``open_for_flush``), as Kafka's
        roll schedules their flush."""
        self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp, skip_full_check=True)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        self.close()

    def open_for_flush(self):
        """Descriptors of the segment's files (``.txnindex`` when there is one) for ``fsync_and_close``: taken
        under the partition's lock, they stay valid when the segment is deleted or the log closed meanwhile.
        The index entries held in memory are written first."""
        self.offset_index.write_pending()
        self.time_index.write_pending()
        fds = []
        try:
            for path in (self.log_path, self.offset_index.path, self.time_index.path, self.txn_index.path):
                try:
                    fds.append(os.open(path, os.O_RDONLY | _CLOEXEC))
                except FileNotFoundError:
                    if path != self.txn_index.path:         # made with the segment's first aborted transaction
                        raise
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def flush(self):
        fsync_and_close(self.open_for_flush())

    def close(self):
        self._release_log()

    def delete(self):
        self.close()
        delete_segment_files(self.directory, self.base_offset)


def _owned(stat):
    """Whether this process may set the file's times (its owner, or root): else it cannot free reserved blocks
    and keep the modification time."""
    return stat.st_uid == os.geteuid() or os.geteuid() == 0


def _block_end(size):
    """``size`` rounded up to whole 4 KiB blocks."""
    return -(-size // 4096) * 4096


def fsync_and_close(fds):
    """fsync each descriptor, then close them all (also when an fsync fails: its OSError is raised)."""
    try:
        for fd in fds:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)


def delete_segment_files(directory, base_offset):
    """Remove a segment's ``.log``, ``.index``, ``.timeindex`` and ``.txnindex`` files (those that exist)."""
    stem = os.path.join(directory, segment_file_name(base_offset))[:-len(".log")]
    for suffix in (".log", INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
        try:
            os.unlink(stem + suffix)
        except FileNotFoundError:
            pass

