"""PidLedger (KIP-1044): producer state on disk, found through Bloom filters, memory bounded.

The directory holds Kafka snapshot files (``<offset>.snapshot``), one Bloom sidecar per snapshot
(``<offset>.snapshot.bloom``), row orders for unsorted Kafka files (``.order``) and the active file
(``ledger-<n>.active``). Every snapshot the ledger writes holds every unexpired producer at its offset,
exactly as Kafka's ``ProducerStateManager.takeSnapshot`` would write it, since Kafka rebuilds a partition's
producers from its newest snapshot alone. So the ledger reads two files:

- the active file: the producers written since the newest snapshot (updated in place);
- the newest snapshot, through its sidecar: every other producer.

``entry_chunks()`` yields every live producer's newest entry once, a bounded chunk at a time, as the ledger
was when it was called (the broker's DescribeProducers and its load of open transactions). ``read(pid)``
checks the active file, then a file being flushed, then the newest snapshot if its filter may hold the id; an
expired entry reads as absent.
``update(entry)`` writes to the active file; ``flush(offset)`` merges the active file's rows with the newest
snapshot into the next snapshot, named ``offset`` (see ``flush``): streamed in id order, the newer entry of a
producer winning and the expired ones left out (as Kafka's ``removeExpiredProducers`` forgets them), so it
costs a pass over the live producers, as Kafka's snapshot of its whole map does, and no memory per producer.

The other files: older snapshots are Kafka's recovery points (after a truncation Kafka loads the newest
snapshot at or below the new log end and replays the log from it); the ledger reads them only for
``open_transactions_at(offset)``, the transactions open at the snapshot a log's recovery replays from, and
``entries_at(offset, pids)``, what that snapshot holds of producers whose newest entry recovery cut off.
By default a flush deletes them (``keep_snapshots=False``: Kafka's ``removeStraySnapshots`` for a log
without segments keeps only the newest); a broker keeps them (``keep_snapshots=True``) and deletes them by
Kafka's rules: ``delete_snapshots_before`` (segments deleted) and ``remove_stray_snapshots`` (at load).
Either way a flush deletes the snapshots named above its own (a log end that was truncated away, as
Kafka's ``truncateAndReload`` does), and the newest snapshot is never deleted. A sidecar stays with its
snapshot: the newest one's answers reads; an older one's serves if that snapshot becomes the newest (a
newer one unreadable). ``.order`` files and sidecars whose snapshot is gone are deleted at open.

An unreadable snapshot (a bad CRC, truncated) is skipped with a warning and the next newest read instead,
as Kafka's loader falls back; the producers written between the two are then missing, and
``fell_back_to`` says from which offset (0: no snapshot could be read; None: nothing was skipped): a
caller holding the log replays it from there, as Kafka does.

A kmem 0.1 directory (an active file of version 1) holds snapshots that each hold only the producers
written since the previous one: they are all read, newest first, and a writable open merges them into one
complete snapshot and deletes them.

Memory: the heap holds the active file's row table and filter and every 128th id of the newest snapshot
(1/16 byte per id); sidecars are memory-mapped and the snapshot is read a 128-entry stride at a time, so
memory barely grows with the number of producer ids. A flush adds a run of each file it merges (the
active rows' id order, 4 bytes a row; a 188 KB read of the snapshot) and builds the new sidecar in its
file.

A read-only ledger (``read_only=True``) writes nothing: no lock file, no active file, no sidecar or row
order (built in the heap when missing), no deletions. It takes a shared ``flock`` on ``ledger.lock`` when
that file exists, so it cannot open while a writer has the directory, nor a writer while it is open.
``lock_directory=False`` takes no lock and creates no ``ledger.lock``: for a caller that already holds an
exclusive lock covering the directory (the broker's LogManager ``flock``s ``<log.dir>/.lock``).

Descriptors: an open ledger holds one, its ``ledger.lock``, and none with ``lock_directory=False``. The active
file and the Bloom sidecars are mapped without keeping a descriptor (``_core.FileMapping``). A snapshot is
read with ``pread`` through a descriptor that the process keeps for the most recently searched snapshots of
all its ledgers, at most ``set_open_snapshots_limit`` of them (32 by default, fewer under a low RLIMIT_NOFILE;
the least recently searched is closed to open another), and for the length of a flush; so a process may keep
the ledgers of thousands of partitions open. A snapshot's descriptor is closed when its ledger closes, when a
flush supersedes it (before any deletion or replacement of its file).

A full disk is an ``OSError`` where it happens and leaves nothing half-made: a growth of the active file
or a new one reserves its blocks first, a flush that cannot write its snapshot deletes what it wrote and
keeps the filled file readable (sealed by the next flush). ``reserve(n)`` makes room ahead, so that the
next ``n`` updates need no I/O: for a caller that must not fail after it acted (the broker appends a
batch to its log, then updates the producer's entry).

Durability: everything ``update`` returned for survives a crash of the process (the mapping's writes are
in the page cache; a reopened ledger finds them, finishing any flush that was cut short by merging the
filled file again). Surviving power loss needs ``fsync=True``: flushed snapshots and sidecars are then
fsynced with their directory, and ``sync()`` msyncs the active file; without it, recent updates can be
lost with the machine.
"""
import contextlib
import fcntl
import functools
import logging
import math
import operator
import os
import threading
import time
from typing import NamedTuple

import numpy as np

from kmem import _core
from kmem.bloom import SIDECAR_SUFFIX, BloomFilter, Shape
from kmem.durable import fsync_directory
from kmem.errors import CorruptSnapshotError, IllegalStateError, InvalidArgumentError
from kmem.ledger.active import INITIAL_ROWS, ActiveFile, active_name, active_sequence, room_for
from kmem.ledger.snapshot import (
    ENTRY_DTYPE, ENTRY_SIZE, MERGE_ROWS, NO_TXN, ORDER_SUFFIX, ProducerEntry, Snapshot, entries_array, entries_of,
    id_order, kafka_view, kafka_view_array, merge_snapshot, open_transactions, scatter, snapshot_name, snapshot_offset,
    verify_snapshot, write_entries,
)

log = logging.getLogger(__name__)

DEFAULT_SHAPE = Shape.from_np(1_000_000, 0.01)
DEFAULT_EXPIRATION_MS = 86_400_000       # producer.id.expiration.ms
LOCK_NAME = "ledger.lock"                # flock()ed while a PidLedger has the directory open


def _require_path(name, value):
    try:
        return os.fspath(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be a path (str, bytes or os.PathLike): {value!r}") from None


def _require_int(name, value, low, high=2**63 - 1):
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer: {value!r}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be between {low} and {high}: {value}")
    return value


def _require_bool(name, value):
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False: {value!r}")
    return value


def _require_shape(name, value):
    if not isinstance(value, Shape):
        raise InvalidArgumentError(f"{name} must be a kmem.bloom.Shape (e.g. Shape.from_np(n, p)): {value!r}")
    return value


def write_ledger_snapshot(directory, entries, *, offset=None, shape=None, fsync=False):
    """Write ``entries`` as one sorted snapshot plus its Bloom sidecar, ready for ``PidLedger``.

    For batch jobs (e.g. one ledger per partition from a Spark stage). ``entries``: ProducerEntry
    tuples or an array with ENTRY_DTYPE's fields. ``offset`` names the file (default: the largest
    ``last_offset`` + 1); ``shape`` defaults to 1% false positives at the number of entries. The sidecar
    is written first, so a snapshot file never appears without it. Returns the snapshot's path.
    """
    directory = _require_path("directory", directory)
    if offset is not None:
        _require_int("offset", offset, 0, 10**20 - 1)
    if shape is not None:
        _require_shape("shape", shape)
    _require_bool("fsync", fsync)
    array = entries_array(entries)
    if offset is None:
        offset = int(array["last_offset"].max()) + 1 if len(array) else 0
    shape = shape or Shape.from_np(max(len(array), 1), 0.01)
    path = os.path.join(directory, snapshot_name(offset))
    order = id_order(array)             # rejects duplicates before anything is written
    bloom = BloomFilter(shape)
    bloom.add_many(array["producer_id"])
    bloom.write(path + SIDECAR_SUFFIX, fsync=fsync)
    write_entries(path, array, order, fsync=fsync)
    return path


def _producer_entry(entry):
    """``entry`` as a ProducerEntry whose offsets Kafka could have written, else InvalidArgumentError."""
    if not isinstance(entry, ProducerEntry):
        try:
            entry = ProducerEntry(*entry)
        except TypeError:
            raise InvalidArgumentError(f"entry must be a ProducerEntry or a tuple of its 8 fields: {entry!r}") from None
    # -1 is Kafka's "none" for both; below it no snapshot name fits, and Kafka never writes it.
    if entry.last_offset < -1:
        raise InvalidArgumentError(f"last_offset must be at least -1: {entry!r}")
    if entry.current_txn_first_offset < NO_TXN:
        raise InvalidArgumentError(f"current_txn_first_offset must be at least -1: {entry!r}")
    return entry


def _producer_id(pid):
    """``pid`` as an int if it is a signed 64-bit integer, else InvalidArgumentError."""
    if isinstance(pid, bool) or not isinstance(pid, (int, np.integer)) or not -2**63 <= int(pid) < 2**63:
        raise InvalidArgumentError(f"a producer id is a signed 64-bit integer, not {pid!r}")
    return int(pid)


def _producer_ids(pids):
    """Producer ids as a contiguous int64 array, from any integer array-like."""
    array = np.asarray(pids)
    if array.dtype.kind not in "iu" and array.size:
        raise InvalidArgumentError(f"pids must be an integer array, not {array.dtype}")
    if array.dtype == np.uint64 and array.size and int(array.max()) >= 2**63:
        raise InvalidArgumentError("pids must be signed 64-bit producer ids")
    return np.ascontiguousarray(array.reshape(-1), np.int64)


def _own_temporary(name):
    """A ledger write's temporary file; others (Kafka's in a partition directory) are not ours to delete."""
    target = name.removesuffix(".tmp")
    snapshot = target.removesuffix(SIDECAR_SUFFIX).removesuffix(ORDER_SUFFIX)
    return target != name and (snapshot_offset(snapshot) is not None or active_sequence(target) is not None)


class _ReadPath(NamedTuple):
    """What readers search after the active file; replaced whole, never changed in place."""

    sealing: tuple          # active files being flushed, newest first
    filters: list           # one BloomFilter per snapshot searched, newest first
    snapshots: list         # the Snapshot for each filter: the newest (all of kmem 0.1's until merged)


class PidLedger:
    """The producer-id ledger of one partition directory. Thread-safe."""

    def __init__(self, directory, shape=DEFAULT_SHAPE, *, producer_id_expiration_ms=DEFAULT_EXPIRATION_MS,
                 flush_interval_ms=None, fsync=False, clock_ms=None, read_only=False, lock_directory=True,
                 keep_snapshots=False):
        """``lock_directory=False``: no ``ledger.lock`` (no file, no descriptor, no ``flock``); the caller
        guarantees that no other ledger opens the directory meanwhile, e.g. by an exclusive lock covering
        it. Two writing ledgers on one directory would lose acknowledged updates. ``keep_snapshots``: a
        flush leaves the older snapshots for the caller to delete by Kafka's rules (see the module)."""
        self.directory = _require_path("directory", directory)
        self.shape = _require_shape("shape", shape)
        self.expiration_ms = _require_int("producer_id_expiration_ms", producer_id_expiration_ms, 1)
        if flush_interval_ms is not None:
            _require_int("flush_interval_ms", flush_interval_ms, 1)
        self.fsync = _require_bool("fsync", fsync)
        self.read_only = _require_bool("read_only", read_only)
        self.lock_directory = _require_bool("lock_directory", lock_directory)
        self.keep_snapshots = _require_bool("keep_snapshots", keep_snapshots)
        if clock_ms is not None and not callable(clock_ms):
            raise InvalidArgumentError(f"clock_ms must be a function returning milliseconds: {clock_ms!r}")
        if read_only and flush_interval_ms is not None:
            raise InvalidArgumentError("flush_interval_ms needs a writable ledger, not read_only=True")
        self.flush_interval_ms = flush_interval_ms
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        # Room for the rows the filter takes before saturating, with margin for its randomness.
        self.capacity = int(shape.estimate_max_n() * 1.25) + 64
        # What an empty active file takes with no check of its filter: the most ``reserve`` promises.
        self.max_reservation = min(self.capacity, max(1, room_for(shape, 0)))
        # update() and read() in the core: the lock, the active file's row table and the read path
        # (published by _publish) and the expiry rule in one call each; _update_decided only when needed.
        # The instance's update and read are those callables themselves: a Python frame around them cost
        # a third of update's speed and most of read's.
        self._core = _core.LedgerCore(ProducerEntry, self._update_decided, _producer_id, self.expiration_ms,
                                      clock_ms, f"ledger {self.directory}")
        self._lock = self._core.lock            # the active file and what _publish hands the core
        self.update = self._update = self._core.update
        self.read = self._core.read
        self._flush_lock = threading.Lock()    # one flush at a time
        # reserve() in the core when the active file has room; ``reserved``: the rows a new active file is
        # made with, beyond INITIAL_ROWS
        self._core.reserve_decided, self._core.flush_lock = self._reserve_decided, self._flush_lock
        self._core.max_reservation = self.max_reservation
        self.reserve = self._core.reserve
        self._closed = False
        if read_only:
            if not os.path.isdir(self.directory):
                raise InvalidArgumentError(f"directory {self.directory} does not exist (read_only=True creates nothing)")
        elif not os.path.isdir(self.directory):
            os.makedirs(self.directory, exist_ok=True)
            if fsync:                       # the new directory's name, so its files can be found
                fsync_directory(os.path.dirname(os.path.abspath(self.directory)))
        self._lock_file = self._take_directory_lock()
        try:
            self._open()
        except BaseException:
            if self._lock_file is not None:
                self._lock_file.close()
            raise
        self._stop = threading.Event()
        self._timer = None
        if flush_interval_ms is not None:
            self._timer = threading.Thread(target=self._flush_on_timer, name="kmem-ledger-flush", daemon=True)
            self._timer.start()

    # --- opening: adopt what is in the directory ----------------------------------------------------

    def _take_directory_lock(self):
        # Two ledgers on one directory would append to one active file at their own counts and lose
        # acknowledged updates; the kernel drops the lock when the process dies. Readers share the lock,
        # so a writer cannot change files under them; a directory no writer opened has no lock file.
        if not self.lock_directory:
            return None                 # the caller's lock covers the directory
        path = os.path.join(self.directory, LOCK_NAME)
        if self.read_only:
            try:
                lock_file = open(path, "rb")
            except FileNotFoundError:
                return None
        else:
            lock_file = open(path, "ab")
        try:
            fcntl.flock(lock_file.fileno(), (fcntl.LOCK_SH if self.read_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.close()
            raise IllegalStateError(
                f"ledger {self.directory} is open in another PidLedger (it holds {LOCK_NAME})") from None
        return lock_file

    def _open(self):
        for name in os.listdir(self.directory):
            if _own_temporary(name) and not self.read_only:     # a write cut short; its target was never replaced
                os.unlink(os.path.join(self.directory, name))
        names = set(os.listdir(self.directory))
        for name in names:
            base = name.removesuffix(SIDECAR_SUFFIX).removesuffix(ORDER_SUFFIX)
            if base != name and snapshot_offset(base) is not None and base not in names:
                if not self.read_only:
                    os.unlink(os.path.join(self.directory, name))   # derived file of a snapshot Kafka deleted
            elif base == name and snapshot_offset(name) is None and active_sequence(name) is None \
                    and name != LOCK_NAME and not _own_temporary(name):
                log.warning("ledger %s: ignoring foreign file %s", self.directory, name)
        actives = sorted((n for n in names if active_sequence(n) is not None), key=active_sequence)
        self._sequence = active_sequence(actives[-1]) if actives else 0
        opened = [a for a in map(self._open_active, actives) if a is not None]
        # kmem 0.1's snapshots each hold some producers: all are read until merged. Otherwise the newest
        # readable one holds them all (an unreadable one is skipped, as Kafka falls back to the previous).
        legacy = any(active.legacy for active in opened)
        filters, snapshots = [], []
        self.fell_back_to = None        # see the module docstring
        for name in sorted((n for n in names if snapshot_offset(n) is not None), key=snapshot_offset, reverse=True):
            loaded = self._load_snapshot(os.path.join(self.directory, name))
            if loaded is None:
                self.fell_back_to = None if legacy else 0
                continue
            filters.append(loaded[0])
            snapshots.append(loaded[1])
            if not legacy:
                if self.fell_back_to is not None:
                    self.fell_back_to = loaded[1].offset
                break
        if self.read_only:          # every active file is read as it is, the newest first
            self._active = None
            with self._lock:
                self._publish(_ReadPath(tuple(reversed(opened)), filters, snapshots))
            return
        # Flushes a crash or an error cut short, and kmem 0.1's files: older than the newest active file and,
        # since a flush seals pending files first, newer than every snapshot. Sealed oldest first.
        if opened and not opened[-1].legacy:
            self._active, pending = opened[-1], opened[:-1]
        else:
            self._active, pending = self._new_active(), opened
        with self._lock:
            self._publish(_ReadPath(tuple(reversed(pending)), filters, snapshots))
        self._seal_pending()

    def _load_snapshot(self, path):
        try:
            snapshot = Snapshot(path, read_only=self.read_only)
        except CorruptSnapshotError as e:
            log.warning("ledger: skipping snapshot: %s", e)
            return None
        sidecar = path + SIDECAR_SUFFIX
        try:
            bloom = BloomFilter.open(sidecar)
        except FileNotFoundError:
            bloom = None
        except CorruptSnapshotError as e:
            log.warning("ledger: rebuilding Bloom sidecar: %s", e)
            bloom = None
        ids = snapshot.entries()["producer_id"]
        # A sidecar of another snapshot under the same name (Kafka rewrote the file, or a rewrite was cut
        # short between sidecar and snapshot) would give false negatives: it must hold every id.
        if bloom is not None and not bloom.contains_many(ids).all():
            log.warning("ledger: rebuilding Bloom sidecar %s: it does not match its snapshot", sidecar)
            bloom.close()
            bloom = None
        if bloom is None:
            built = BloomFilter(Shape.from_np(max(snapshot.count, 1), 0.01))
            built.add_many(ids)
            if self.read_only:
                bloom = built           # in the heap until closed
            else:
                built.write(sidecar, fsync=self.fsync)
                bloom = BloomFilter.open(sidecar)
        snapshot.trim()
        return bloom, snapshot

    def _open_active(self, name):
        path = os.path.join(self.directory, name)
        try:
            return ActiveFile(path, self.shape, None if self.read_only else self.capacity, read_only=self.read_only)
        except CorruptSnapshotError as e:
            if self.read_only:
                log.warning("ledger: skipping an unreadable active file: %s", e)
            else:
                log.warning("ledger: setting aside an unreadable active file: %s", e)
                os.replace(path, path + ".corrupt")
            return None

    def _new_active(self):
        active = ActiveFile(os.path.join(self.directory, active_name(self._sequence + 1)),
                            self.shape, self.capacity, self.fsync, rows=max(INITIAL_ROWS, self._core.reserved))
        self._sequence += 1
        return active

    # --- the API ------------------------------------------------------------------------------------

    def _publish(self, view):
        """Make ``view`` the read path, for Python (``_view``) and the core, with the current active file
        (the caller holds ``_lock``, so readers see both of one moment)."""
        self._view = view
        self._core.publish(self._active.table if self._active is not None else None,
                           _core.ReadPath(tuple(a.table for a in view.sealing), view.filters,
                                          [s.index for s in view.snapshots]))

    def read(self, pid):
        """The newest entry of producer ``pid``, or None if unknown or expired.

        In the core (``LedgerCore.read``): the active file's row table under ``_lock``, then the files
        being flushed, then each snapshot whose filter may hold the id, newest first (false positives
        skipped), then ``expired``."""
        return self._core.read(pid)     # what ``ledger.read`` calls directly (see __init__)

    def expired(self, entry):
        """Whether ``entry`` (a ProducerEntry, or anything with its ``timestamp`` and ``current_txn_first_offset``)
        is past producer_id_expiration_ms (and in no transaction): read as absent."""
        return (entry.current_txn_first_offset < 0
                and self._clock_ms() - entry.timestamp >= self.expiration_ms)

    def update(self, entry):
        """Insert or update the producer's entry in the active file; returns it as stored.

        Flushes first when the active file is full (its filter saturated or its rows used up).
        ``entry`` is a ProducerEntry or a tuple of its eight fields. It is stored as Kafka reads it back
        (``kafka_view``: with ``last_offset`` -1 there is no batch, so sequence -1 and offset delta 0).
        The core checks and writes it; only a refused entry comes back here to be explained.
        """
        return self._update(entry)     # what ``ledger.update`` calls directly (see __init__)

    def _update_decided(self, entry, row):
        """``update`` past the core's part: no active file (closed or read-only), a new row for
        ``ActiveFile.put`` to decide on (the filter, growth; flush first when full), an entry the core
        refused, or one stored changed."""
        if row == -3:
            self._check_writable()                          # raises: closed or read-only
        while row == -1:
            with self._lock:
                written = self._current().put(entry)
            if written is None:
                self.flush()                                # full
            else:
                row = 0 if written else -2
        if row == -2:
            checked = _producer_entry(entry)                # raises InvalidArgumentError saying why
            checked.pack()                                  # so does a value out of its field's range
            # In range, but not plain ints (numpy integers, say): the core takes them as ints.
            return self.update(ProducerEntry(*map(operator.index, checked)))
        return kafka_view(_producer_entry(entry))

    def update_many(self, entries):
        """``update`` for every entry of an array, in order (a later entry of one producer wins), in the core.

        ``entries``: an ENTRY_DTYPE array (or one with its fields, or ProducerEntry tuples). The whole batch
        is checked before anything is written. Flushes whenever the active file fills, as ``update`` does.
        An ``OSError`` on the way (a full disk when the active file grows or a flush writes) leaves the
        entries before it written, as that many ``update`` calls would have.
        """
        self._check_writable()
        array = entries_array(entries)
        raw = np.ascontiguousarray(array).view(np.uint8)       # stored as Kafka reads it by the core's put
        for name in ("last_offset", "current_txn_first_offset"):
            below = _core.entries_first_below(raw, ENTRY_DTYPE.fields[name][1], -1)
            if below >= 0:
                raise InvalidArgumentError(f"{name} must be at least -1: entry {below} has {array[name][below]}")
        done = 0
        while done < len(array):
            with self._lock:
                active = self._current()
                if not active.full:
                    done += active.put_many(raw[done * ENTRY_SIZE:])
                    continue
            self.flush()

    def read_many(self, pids):
        """``read`` for an array of producer ids: (a bool array, found and not expired; an ENTRY_DTYPE array
        with each found id's newest entry, zeros elsewhere). One pass per file in the core (again for the
        ids not found when a flush replaced the read path meanwhile, as ``read`` does)."""
        pids = _producer_ids(pids)
        found = np.zeros(len(pids), np.bool_)
        out = np.zeros(len(pids), ENTRY_DTYPE)

        def take(where, finder):
            hits, entries = finder(pids[where])
            found[where[hits]] = True
            scatter(out, where[hits], entries)

        while True:
            with self._lock:
                self._check_open()
                view = self._view
                if self._active is not None:
                    take(np.flatnonzero(~found), self._active.find_many)
            for old in view.sealing:
                take(np.flatnonzero(~found), old.find_many)
            for bloom, snapshot in zip(view.filters, view.snapshots):
                missing = np.flatnonzero(~found)
                if not len(missing):
                    break
                take(missing[bloom.contains_many(pids[missing])], snapshot.find_many)
            if found.all() or self._view is view:
                break
            # A flush published a new read path meanwhile and may have deleted the snapshot searched (the
            # new one holds all it held): look again for the ids not found.
        out = kafka_view_array(out)
        # expired() as timestamp <= now - expiration: now - timestamp would overflow int64 in numpy
        threshold = self._clock_ms() - self.expiration_ms
        if threshold >= np.iinfo(np.int64).min:
            found &= ~((out["current_txn_first_offset"] < 0) & (out["timestamp"] <= threshold))
        out[~found] = 0
        return found, out

    def entry_chunks(self, *, open_transactions=False):
        """Every unexpired producer's newest entry, each once, as ENTRY_DTYPE arrays (``kafka_view``) of at
        most ``MERGE_ROWS`` entries: the active file's rows, those of files being flushed, then the
        snapshots', less the ids a newer file holds. ``open_transactions``: only the entries with an open
        transaction may matter, so a snapshot whose header pass found none is not read (the chunks may still
        hold other entries).

        The chunks are the ledger as it is at the call: the rows of the active file and of the files being
        flushed are copied then (at most ``capacity`` each) and the snapshots mapped (a mapping outlives the
        file's deletion), so updates and flushes may run while the chunks are taken; a caller serialising its
        updates (the broker's partition lock) holds its lock for the call only, not for the walk. Beyond those
        copies one chunk is in the heap at a time (pages of a snapshot read are dropped afterwards)."""
        self._check_open()
        threshold = self._clock_ms() - self.expiration_ms
        with self._lock:
            view, active = self._view, self._active
            copies = [source.entries().copy() for source in ([active] if active is not None else []) + list(
                view.sealing)]
            snapshots = [(snapshot, snapshot.entries()) for snapshot in view.snapshots
                         if not (open_transactions and not snapshot.stats.open_transactions)]
        return self._chunks(copies, snapshots, threshold)

    @staticmethod
    def _chunks(copies, snapshots, threshold):
        """``entry_chunks``' walk over what it took: row arrays newest first."""
        newer = []          # for each source walked: its ids' membership test
        for rows, snapshot in [(rows, None) for rows in copies] + [(rows, s) for s, rows in snapshots]:
            for start in range(0, len(rows), MERGE_ROWS):
                chunk = kafka_view_array(rows[start:start + MERGE_ROWS].copy())
                keep = ~((chunk["current_txn_first_offset"] < 0) & (chunk["timestamp"] <= threshold)) \
                    if threshold >= np.iinfo(np.int64).min else np.ones(len(chunk), np.bool_)
                pids = chunk["producer_id"].astype(np.int64)
                for holds in newer:
                    keep &= ~holds(pids)
                if keep.any():
                    yield chunk[keep]
            if snapshot is None:
                newer.append(functools.partial(np.isin, test_elements=rows["producer_id"].astype(np.int64)))
            else:
                newer.append(lambda pids, snapshot=snapshot: snapshot.find_many(pids)[0])
                snapshot.trim()

    def flush(self, offset=None, *, sync=False):
        """Write the next snapshot: every unexpired producer, as Kafka's ``takeSnapshot`` at ``offset``
        (the log end offset it describes; None: the end of its newest entry, above the newest snapshot's).
        KIP-1044's eight steps; returns its path, or None when there is nothing new (no update since the
        newest snapshot, and ``offset`` is None or that snapshot's own). ``sync``: fsync it as ``fsync=True``
        would (Kafka syncs the snapshot it takes at shutdown).

        1-3. A new active file takes the writes; the old one stays on the read path, read-only.
        4-5. The old file's rows and the newest snapshot are merged (``merge_snapshot``) into the sidecar
             and then the snapshot with its CRC (fsynced when the ledger syncs); without rows, the snapshot
             alone is carried to ``offset`` (Kafka takes one at each segment roll).
        6-7. The (filter, snapshot) pair replaces the newest on the read path and the old file leaves it, in
             one swap, so no reader can miss an id in between.
        8.   The snapshots it supersedes are deleted (see the module docstring), then the old file; its
             mapping goes when the last reader holding it is done.

        If sealing fails (a full disk, no file descriptors), what it wrote is deleted, the old file stays on
        the read path, pending, and the next flush seals it before anything newer, so snapshots keep the
        order of their data.
        """
        self._check_writable()
        if offset is not None:
            _require_int("offset", offset, 0, 10**20 - 1)
        with self._flush_lock:
            self._seal_pending()
            old = self._rotate()
            if old is None:
                newest = self._view.snapshots[0].offset if self._view.snapshots else 0
                if offset is None or offset == newest:
                    return None
            return self._seal(old, offset, sync=sync)

    def reserve(self, count):
        """Make room for ``count`` updates that then perform no I/O that can fail.

        After it returns, the next ``count`` ``update`` calls, each for any producer id, new or known, only
        store into the active file's mapped rows, whose blocks are allocated: no growth, no flush, no new
        file. Making room may grow the active file, or flush it when its filter or rows cannot take
        ``count`` more ids. If room cannot be made (a full disk) it raises OSError and the ledger is as it
        was: the same active file, nothing half-made, every entry readable.

        For a caller that must not fail after it acted (the broker reserves, appends a batch to its log,
        then updates the producer's entry): it serialises its updates, as the broker's partition lock
        does; a flush meanwhile (``flush_interval_ms``) makes the new active file with room for them.
        ``count``: 0 to ``max_reservation``, what an empty active file takes.
        The core answers when the active file has room (``LedgerCore.reserve``); else ``_reserve_decided``.
        """
        return self._core.reserve(count)       # what ``ledger.reserve`` calls directly (see __init__)

    def _reserve_decided(self, count):
        """``reserve`` past the core's part: the checks' errors, or an active file to grow or flush first."""
        self._check_writable()
        _require_int("count", count, 0, self.max_reservation)
        with self._flush_lock:
            self._core.reserved = count
            while True:
                with self._lock:
                    if self._current().reserve(count):      # may grow it: OSError changes nothing
                        return
                # Full for ``count`` ids, so not empty: flush it, or leave it as it was.
                self._seal_pending()
                old = self._rotate()
                try:
                    self._seal(old)
                except BaseException:
                    self._take_back(old)
                    raise

    def _rotate(self):
        """Steps 1-3 of ``flush``: a new active file takes the writes and the old one joins the sealing
        list; returns it (None when empty: nothing to flush). On failure nothing has changed."""
        with self._lock:
            old = self._current()
            if old.count == 0:
                return None
            self._active = self._new_active()
            view = self._view
            self._publish(view._replace(sealing=(old,) + view.sealing))
        return old

    def _take_back(self, old):
        """Undo ``_rotate`` after sealing ``old`` failed: ``old`` is the active file again and the new one is
        deleted. Not if an update went to the new file meanwhile (``old`` stays pending), nor if ``old``
        left the read path (sealed; only deleting its file or syncing the directory failed)."""
        with self._lock:
            new, view = self._active, self._view
            if new.count or old not in view.sealing:
                return
            self._active = old
            self._publish(view._replace(sealing=tuple(a for a in view.sealing if a is not old)))
        new.close()
        os.unlink(new.path)

    def _seal_pending(self):
        """Seal the active files an earlier flush failed to seal (or a crash left), oldest first."""
        for old in reversed(self._view.sealing):
            self._seal(old)

    def _seal(self, old, offset=None, *, sync=False):
        """Steps 4-8 for ``old``, a filled active file on the sealing list (None: no rows, a snapshot at
        ``offset`` only); on failure ``old`` stays on the sealing list. Returns the snapshot's path."""
        sync = sync or self.fsync
        view = self._view
        rows = old.entries() if old is not None else None
        if offset is None:          # as Kafka names it, the log end it holds; above the newest, read or not
            end = int(rows["last_offset"].max()) + 1 if rows is not None and len(rows) else 0
            offset = max(end, view.snapshots[0].offset + 1 if view.snapshots else 0)
        path = os.path.join(self.directory, snapshot_name(offset))
        sources = ([old.runs()] if old is not None else []) + [snapshot.runs() for snapshot in view.snapshots]
        known = sum(s.count for s in view.snapshots) + (len(rows) if rows is not None else 0)
        replacing = os.path.exists(path)        # a snapshot at this offset already (written again, or Kafka's)
        try:
            stats, fences = merge_snapshot(path, sources, Shape.from_np(max(known, 1), 0.01),        # steps 4-5
                                           expired_at=self._expired_at(), fsync=sync)
            added = (BloomFilter.open(path + SIDECAR_SUFFIX), Snapshot(path, stats, fences=fences))
        except BaseException:
            if not replacing:                   # nothing half-made; the retry writes both
                for written in (path, path + SIDECAR_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(written)
            raise
        with self._lock:                                                                # steps 6-7
            self._publish(_ReadPath(tuple(a for a in self._view.sealing if a is not old), [added[0]], [added[1]]))
        for superseded in view.snapshots:       # a reader still searching one finds nothing once it is deleted
            superseded.retire()                 # (and its descriptor is closed now)
        merged = {s.offset for s in view.snapshots} if len(view.snapshots) > 1 else set()      # kmem 0.1's
        self._delete_snapshots([o for o in self._snapshot_offsets()                     # step 8
                                if o != offset and (o > offset or o in merged or not self.keep_snapshots)])
        if old is not None:
            os.unlink(old.path)
        if sync:
            fsync_directory(self.directory)
        return path

    def _expired_at(self):
        """The timestamp at or below which a producer without an open transaction has expired now (Kafka's
        ``isProducerExpired``), in int64 for the merge; None when none can have."""
        threshold = math.floor(self._clock_ms() - self.expiration_ms)
        return None if threshold < -2**63 else min(threshold, 2**63 - 1)

    # --- Kafka's rules for older snapshots ----------------------------------------------------------

    def _snapshot_offsets(self):
        return sorted(o for o in map(snapshot_offset, os.listdir(self.directory)) if o is not None)

    def _newest_offset(self):
        return self._view.snapshots[0].offset if self._view.snapshots else None

    def _delete_snapshots(self, offsets):
        """Delete the snapshots at ``offsets`` with their sidecars and row orders (never the newest, the only
        one searched: those a reader may still search were retired when a flush superseded them)."""
        newest = self._newest_offset()
        for offset in offsets:
            if offset == newest:
                continue
            path = os.path.join(self.directory, snapshot_name(offset))
            for suffix in ("", SIDECAR_SUFFIX, ORDER_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path + suffix)

    def open_transactions_at(self, offset):
        """``{producer id: first offset of its open transaction}`` in the newest readable snapshot at or below
        ``offset``, {} when there is none: the transactions Kafka's loader knows open when it replays the log
        from there. An unreadable snapshot is skipped for the previous one, as at open."""
        path, stats = self._newest_readable_at(offset)
        return open_transactions(path, stats.count) if stats is not None and stats.open_transactions else {}

    def entries_at(self, offset, pids):
        """``{producer id: ProducerEntry}`` of those of ``pids`` the newest readable snapshot at or below
        ``offset`` holds (as Kafka's loader would load them from it); {} when there is none."""
        path, stats = self._newest_readable_at(offset)
        return entries_of(path, stats.count, pids) if stats is not None else {}

    def _newest_readable_at(self, offset):
        """``(path, SnapshotStats)`` of the newest readable snapshot at or below ``offset``, ``(None, None)``
        when there is none; an unreadable one is skipped for the previous one, as at open."""
        self._check_open()
        _require_int("offset", offset, 0)
        for older in reversed([o for o in self._snapshot_offsets() if o <= offset]):
            path = os.path.join(self.directory, snapshot_name(older))
            try:
                return path, verify_snapshot(path)
            except CorruptSnapshotError as e:
                log.warning("ledger: skipping snapshot: %s", e)
        return None, None

    def delete_snapshots_before(self, offset):
        """Kafka's ``deleteSnapshotsBefore``: delete the snapshots below ``offset`` (the log start offset,
        when segments are deleted), except the newest, which holds every producer."""
        self._check_writable()
        _require_int("offset", offset, 0)
        with self._flush_lock:
            self._delete_snapshots([o for o in self._snapshot_offsets() if o < offset])

    def remove_stray_snapshots(self, segment_base_offsets):
        """Kafka's ``removeStraySnapshots`` (run at every load): delete the snapshots whose offset is no
        segment's base, except the newest of those when it lies above every base (a clean shutdown's, at the
        log end). The newest snapshot is never deleted: take one at the log end first, as Kafka's load does."""
        self._check_writable()
        bases = set(segment_base_offsets)
        with self._flush_lock:
            strays = [o for o in self._snapshot_offsets() if o not in bases]
            if strays and (not bases or strays[-1] > max(bases)):
                strays.pop()
            self._delete_snapshots(strays)

    def _flush_on_timer(self):
        interval = self.flush_interval_ms / 1000
        while not self._stop.wait(interval):
            try:
                self.flush()
            except Exception:        # keep the timer alive; the next update reports a lasting problem
                log.exception("ledger %s: timed flush failed", self.directory)

    def sync(self):
        """Make the active file's rows durable against power loss (msync)."""
        self._check_writable()
        with self._lock:
            self._current().sync()

    def _check_open(self):
        if self._closed:
            raise IllegalStateError(f"ledger {self.directory} is closed")

    def _check_writable(self):
        self._check_open()
        if self.read_only:
            raise IllegalStateError(f"ledger {self.directory} is open read-only: it cannot be updated or flushed")

    def _current(self):
        """The active file (the caller holds ``_lock``); IllegalStateError once the ledger is closed."""
        self._check_writable()
        return self._active

    def close(self):
        """Stop the flush timer, release the files and the directory lock; later calls raise.

        The active file stays as it is and is reopened next time. Call it once readers are done.
        """
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        with self._flush_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            self._core.close()
            active, self._active = self._active, None
            if self.fsync and active is not None:
                active.sync()
            view, self._view = self._view, _ReadPath((), [], [])
        for opened in (*([active] if active is not None else []), *view.sealing, *view.filters, *view.snapshots):
            opened.close()
        if self._lock_file is not None:
            self._lock_file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def snapshot_paths(self):
        """The snapshot files searched, newest first: the newest (all of a kmem 0.1 directory opened read-only)."""
        return [s.path for s in self._view.snapshots]

    def __len__(self):
        """Entries across the active file and the snapshots (an id updated since a snapshot counts twice)."""
        self._check_open()
        view, active = self._view, self._active
        return (active.count if active is not None else 0) + sum(a.count for a in view.sealing) \
            + sum(s.count for s in view.snapshots)
