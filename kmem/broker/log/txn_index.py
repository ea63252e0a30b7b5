"""A segment's aborted transactions: Kafka's ``TransactionIndex`` (``<base>.txnindex``) of ``AbortedTxn`` entries.

Each entry is 34 bytes, big-endian: version (int16, 0), producer id (int64), the first offset of the
aborted transaction, its last offset (the ABORT marker's) and the partition's last stable offset when the
abort completed (all int64). Entries are appended in the order of their markers, so last offsets increase.
The file is created by the first entry, as Kafka creates it lazily; a segment without aborted transactions
has none, and whether it has one is remembered (looked up when the segment opens, kept by the writes here), so a
read_committed fetch of a segment without aborted transactions opens nothing. The file is opened for each use
(a partition keeps one descriptor, its active ``.log``) and read ``READ_ENTRIES`` entries at a time, so a
read_committed fetch costs a bounded buffer however many transactions a segment aborted.
"""
import os
import struct
from typing import NamedTuple

from kmem.broker.log.index import CorruptIndexError

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size                 # 34, Kafka's AbortedTxn.TOTAL_SIZE
CURRENT_VERSION = 0
READ_ENTRIES = 1024
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    """``<base>.txnindex`` of one segment (see the module docstring). Calls are serialised by the
    partition's lock."""

    def __init__(self, path, base_offset):
        self.path = path
        self.base_offset = base_offset
        self._absent = not os.path.exists(path)

    @property
    def absent(self):
        """Whether the segment has no ``.txnindex`` (no aborted transaction), as last looked up or written here."""
        return self._absent

    def append(self, txn):
        """Add ``txn`` (an ``AbortedTxn``); returns the file's previous size (None: it did not exist) for
        ``rewind``. Raises OSError, leaving the file as it was."""
        try:
            previous = os.stat(self.path).st_size
        except FileNotFoundError:
            previous = None
        try:
            self._write(ENTRY.pack(CURRENT_VERSION, *txn))
        except OSError:
            self.rewind(previous)
            raise
        return previous

    def extend(self, txns):
        """Append every ``AbortedTxn`` of the iterable ``txns``, ``READ_ENTRIES`` at a time (the cleaner
        writes the aborted transactions a cleaned segment keeps); creates the file only if there is one."""
        chunk = []
        for txn in txns:
            chunk.append(ENTRY.pack(CURRENT_VERSION, *txn))
            if len(chunk) == READ_ENTRIES:
                self._write(b"".join(chunk))
                chunk = []
        if chunk:
            self._write(b"".join(chunk))

    def _write(self, data):
        self._absent = False
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    def rewind(self, previous):
        """Undo the ``append`` that returned ``previous`` (the append it belonged to failed)."""
        if previous is None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self._absent = True
        else:
            os.truncate(self.path, previous)

    def entries(self):
        """Every ``AbortedTxn``, in order (a trailing partial entry is ignored, as Kafka's reader does)."""
        first = 0
        while True:
            chunk = self.read(first, READ_ENTRIES)
            yield from chunk
            if len(chunk) < READ_ENTRIES:
                return
            first += READ_ENTRIES

    def entry_count(self):
        """How many whole entries the file holds (0 when it does not exist)."""
        try:
            return os.stat(self.path).st_size // ENTRY_SIZE
        except FileNotFoundError:
            return 0

    def read(self, first, count):
        """The ``AbortedTxn`` entries numbered ``first`` to ``first + count - 1`` (fewer at the file's end)."""
        if self._absent:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY | _CLOEXEC)
        except FileNotFoundError:
            return []
        try:
            chunk = os.pread(fd, count * ENTRY_SIZE, first * ENTRY_SIZE)
        finally:
            os.close(fd)
        found = []
        for version, *fields in ENTRY.iter_unpack(memoryview(chunk)[:len(chunk) - len(chunk) % ENTRY_SIZE]):
            if version > CURRENT_VERSION:
                raise CorruptIndexError(f"{self.path}: aborted transaction of version {version}")
            found.append(AbortedTxn(*fields))
        return found

    def collect(self, fetch_offset, upper_bound):
        """Kafka's ``collectAbortedTxns``: ``(the entries overlapping [fetch_offset, upper_bound), complete)``,
        ``complete`` when an entry's last stable offset reaches ``upper_bound`` (no later segment can hold
        an aborted transaction overlapping the range)."""
        found = []
        for txn in self.entries():
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound:
                found.append(txn)
            if txn.last_stable_offset >= upper_bound:
                return found, True
        return found, False

    def last_offset(self):
        """The last offset of the newest entry, or None."""
        last = None
        for txn in self.entries():
            last = txn.last_offset
        return last

    def truncate_to(self, offset):
        """Drop the entries whose last offset is at least ``offset`` (Kafka's ``truncateTo``)."""
        kept = 0
        for txn in self.entries():
            if txn.last_offset >= offset:
                os.truncate(self.path, kept)
                return
            kept += ENTRY_SIZE
        if os.path.exists(self.path) and os.path.getsize(self.path) != kept:
            os.truncate(self.path, kept)        # a partial entry at the end

    def sanity_check(self):
        """Kafka's ``sanityCheck``: no entry may end before the segment's base offset."""
        for txn in self.entries():
            if txn.last_offset < self.base_offset:
                raise CorruptIndexError(f"{self.path}: aborted transaction {txn} ends before the segment's base "
                                        f"offset {self.base_offset}")

    def flush(self):
        try:
            fd = os.open(self.path, os.O_RDONLY | _CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
