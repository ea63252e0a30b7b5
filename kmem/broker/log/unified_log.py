"""A partition's log: Kafka's ``UnifiedLog`` on one node.

``PartitionLog`` of ``<log.dir>/<topic>-<partition>/``:

- ``append(records, origin="client")`` validates and assigns offsets (``kmem.broker.log.validator``),
  checks idempotent producers (``kmem.broker.log.producer_state``), rolls the segment when Kafka would
  (``segment.bytes``, ``segment.ms`` measured from the first batch's timestamp, a full index, an offset
  beyond the segment's 32-bit range), writes, and returns an ``AppendResult`` carrying Kafka's error code
  instead of raising; the lock, these steps and the listeners are one core call
  (``_core.LogAppender.append_to``), calling back here for what is rare (a transaction's verification, errors,
  the roll itself). An append is all or nothing: the producers' ledger rows are reserved before the batch is
  written and a failed write is taken out again, so a full disk or a lack of descriptors is
  KAFKA_STORAGE_ERROR with nothing of the append kept (and its retry is stored once). At each roll the
  old segment's indexes are trimmed and a producer snapshot of every producer taken at the new segment's
  base offset, as Kafka's ``roll``; the fsync of what precedes the new segment is left to ``schedule``
  (the log manager's flusher thread, as Kafka's roll schedules ``flushUptoOffsetExclusive``), so no
  request waits for the disk, and the recovery point moves to the new segment's base only once that
  flush is done (``flush_up_to``).
- ``write_txn_marker(producer_id, producer_epoch, coordinator_epoch, commit)``: a transaction marker (Kafka's
  ``EndTransactionMarker``) appended as the coordinator's write (origin COORDINATOR): the producer's open
  transaction closes, so the last stable offset (the first offset of the oldest open transaction, else the
  high watermark) moves; an ABORT that closes a transaction adds Kafka's ``AbortedTxn`` (its first offset, the
  marker's offset, the last stable offset at completion) to the active segment's ``.txnindex``
  (``kmem.broker.log.txn_index``) before the marker is written, taken out again if the write fails.
- ``read(fetch_offset, max_bytes)`` returns ``FetchData``: a ``FileRecords`` slice (its own file descriptor:
  close it once sent) from the batch holding ``fetch_offset``, at most ``max_bytes`` long but holding the
  first batch whole when ``min_one_message``; a slice shorter than ``copy_below`` bytes comes as ``bytes``
  read at once instead (a descriptor and a ``sendfile`` cost more than a small copy); OFFSET_OUT_OF_RANGE
  outside ``[log_start_offset, log_end_offset]``, KAFKA_STORAGE_ERROR when a file cannot be opened. On one
  node the high watermark is the log end offset. READ_COMMITTED reads up to the last stable offset, and its
  ``aborted_transactions`` are the ``AbortedTxn`` entries of the ``.txnindex`` files (of the segment read and
  the later ones, until one's last stable offset reaches the bound) overlapping the range from
  ``fetch_offset`` to the first indexed offset past the bytes read (Kafka's ``fetchUpperBoundOffset``), the
  bound or the segment's end, whichever is first: Kafka's ``collectAbortedTransactions``.
- ``batches_from_start(partition_log)`` (a function): every batch from the log start, a read at a time, for
  the coordinators' loads.
- ``offset_for_timestamp(ts)``: ListOffsets, -2 earliest, -1 latest, -3 the record with the largest
  timestamp, -4 earliest local, else the first record with a timestamp at or after ``ts`` (time index,
  offset index, then the segment) or None.
- ``add_listener(fn)``: ``fn(log)`` after every append (outside the lock), to wake parked fetches.
- ``offset_metadata(offset)``, ``fetch_upper_bound(isolation)``: where an offset sits (segment, file
  position), so a parked fetch can count the bytes that arrived (Kafka's ``LogOffsetMetadata``).
- ``cleanable_segments()``, ``transaction_indexes()``, ``replace_segments(old, base)``: what
  ``kmem.broker.log.cleaner`` cleans, the ``.txnindex`` files it reads and the swap of its cleaned segment
  (at load, ``.cleaned``/``.swap``/``.deleted`` files an interrupted clean left are completed or removed
  first).
- ``delete_old_segments(now)``: when ``cleanup.policy`` holds ``delete``, retention as Kafka's
  ``deleteOldSegments``: by ``retention.ms`` (a
  segment's largest timestamp, else its file's mtime), then ``retention.bytes``, oldest first; when every
  segment goes the active one goes last, after a roll (deleting the others first frees the room the roll's
  producer snapshot takes on a full disk; a roll that fails all the same leaves it to the next pass, logged);
  the log start offset moves to the first segment left and the producer snapshots below it are deleted
  (Kafka's ``deleteSnapshotsBefore``; never the newest, which holds every producer).

On open, a log directory without the clean-shutdown marker is recovered as Kafka's ``LogLoader``: every
segment holding offsets at or past the partition's recovery point is revalidated batch by batch,
truncated at the first invalid or partial batch (later segments are deleted) and its indexes rebuilt;
the revalidated batches are replayed into the producer state, from the transactions open in the producer
snapshot at the first replayed segment's base (Kafka's loader loads it first), so an ABORT replayed past
its segment's ``.txnindex`` entries is indexed as at run time, with the same last stable offset. Segments
with a missing or failing index are rebuilt the same way after a clean shutdown too, and those after the
producer snapshot read when a newer one was unreadable (its producers come from the log then, as Kafka's
loader replays it). Then the producer snapshots are left as Kafka's load leaves them: one at the log end
offset (``close`` takes it; after a crash the load does), stray ones removed. So a Kafka broker reading the
directory finds every producer in the snapshot it loads.

Threads: one re-entrant lock per partition serialises appends, reads' index lookups, rolls and retention;
``active_producers`` (DescribeProducers) holds it only to take its view of the producers' ledger, and a
roll's flush only to open the files it syncs (their descriptors stay valid if the segments are deleted or
the log closed meanwhile). A flush that fails (EIO, a full disk) is logged as a storage error and the
recovery point stays, so the next flush, the close (which then fails: no clean-shutdown marker) or the
next start's recovery covers those segments again.
"""
import bisect
import functools
import logging
import os
import random
import shutil
import threading
import time
import uuid
from typing import NamedTuple

from kmem import _core
from kmem.broker.codes import ErrorCode, LogError, storage_error
from kmem.broker.log import checkpoints
from kmem.broker.log.cleaner import complete_interrupted_swaps, swap_in_cleaned_files
from kmem.broker.log.index import CorruptIndexError
from kmem.broker.log.producer_state import ProducerStateManager
from kmem.ledger import NO_TXN
from kmem.broker.log.segment import (
    INDEX_SUFFIX, TIME_INDEX_SUFFIX, LogSegment, delete_segment_files, fsync_and_close,
)
from kmem.broker.log.txn_index import AbortedTxn
from kmem.broker.log.validator import (
    CLIENT, COORDINATOR, BatchInfo, finish_common_case, validate_and_assign, validate_each_batch,
)
from kmem.durable import fsync_directory
from kmem.metrics import Tallies
from kmem.errors import IllegalStateError, InvalidArgumentError
from kmem.records import ControlRecordType, FileRecords, build_control_batch, log_segments
from kmem.records.batches import INT64_MAX, INT64_MIN

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP = -2, -1, -3, -4
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
LOAD_CHUNK_BYTES = 1 << 20        # each read of batches_from_start


class AppendResult(NamedTuple):
    """Kafka's ``LogAppendInfo`` as a produce response needs it."""
    error_code: ErrorCode
    base_offset: int
    last_offset: int
    log_append_time: int
    log_start_offset: int
    error_message: str | None = None
    duplicate: bool = False
    record_errors: tuple = ()           # KIP-467: [(batch index, message)] of the records refused


class FetchData(NamedTuple):
    records: FileRecords | bytes | None        # None when nothing is returned
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int
    error_code: ErrorCode = ErrorCode.NONE
    aborted_transactions: list | None = None        # READ_COMMITTED: [AbortedTxn] overlapping what is read


class LogOffsetMetadata(NamedTuple):
    """Where an offset sits (Kafka's ``LogOffsetMetadata``): the segment's base offset and the file
    position of the batch holding it (for the log end offset, the active segment's size)."""
    offset: int
    segment_base_offset: int
    position: int


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


class VerificationGuard:
    """Kafka's ``VerificationGuard``: one verification of a producer's transaction, matched by identity."""
    __slots__ = ("producer_id",)

    def __init__(self, producer_id):
        self.producer_id = producer_id


# Kafka's VerificationGuard.SENTINEL: the producer's transaction was open on the partition when checked, so
# the coordinator was not asked; the append checks that it still is.
TRANSACTION_OPEN = VerificationGuard(-1)

_APPENDER = _core.LogAppender(AppendResult, ErrorCode.NONE, BatchInfo, finish_common_case, validate_each_batch,
                              validate_and_assign, LogError, TRANSACTION_OPEN)


def _check_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, not {value!r}")


def wall_clock_ms():
    return time.time_ns() // 1_000_000


class PartitionLog:
    """The log of one partition directory (see the module docstring)."""

    def __init__(self, directory, topic, partition, config, broker, *, topic_id=None, recovery_point=0,
                 log_start_offset=0, clean=True, clock_ms=None, schedule=None, flush_stats=None, on_full_disk=None):
        """``schedule(task)``: runs ``task()`` later on another thread (a roll's flush); None: at once, on
        the rolling thread. ``flush_stats``: the ``kmem.metrics.Tallies`` (2 wide) the flushes are counted in
        (Kafka's ``LogFlushStats``: [flushes, nanoseconds] in row None), the log manager's; one of its own if
        not given. ``on_full_disk()``: called, outside the log's lock, after an append found no room on the
        disk (the log manager frees the blocks its partitions reserved ahead); None: this log's only."""
        self.directory = os.fspath(directory)
        self._schedule = schedule
        self._on_full_disk = on_full_disk or self.release_reserved_blocks
        self.flush_stats = Tallies(2) if flush_stats is None else flush_stats
        self.topic, self.partition = topic, partition
        self.config = config
        self._clock = clock_ms or wall_clock_ms
        self._lock = threading.RLock()
        self._listeners = []
        self._verifications = {}        # producer id -> guard of a transaction verification under way
        self.leader_epoch = 0
        self._closed = False
        self._directory_synced = True
        os.makedirs(self.directory, exist_ok=True)
        metadata = os.path.join(self.directory, checkpoints.PARTITION_METADATA)
        if os.path.exists(metadata):
            self.topic_id = checkpoints.read_partition_metadata(metadata)
            if topic_id is not None and topic_id != self.topic_id:
                raise IllegalStateError(f"{metadata} holds topic id {self.topic_id}, expected {topic_id}")
        else:
            self.topic_id = topic_id or checkpoints.random_uuid()
            # A new partition: its directory is synced once, after its other files (_load) are there too.
            checkpoints.write_partition_metadata(metadata, self.topic_id, sync_directory=False)
            self._directory_synced = False
        self._epochs_path = os.path.join(self.directory, checkpoints.LEADER_EPOCH_CHECKPOINT)
        self._epochs = checkpoints.read_leader_epoch_checkpoint(self._epochs_path)
        self.producers = ProducerStateManager(
            self.directory, ledger_ids=broker.producer_ledger_ids, cache_entries=broker.producer_state_cache_entries,
            expiration_ms=broker.producer_id_expiration_ms, clock_ms=self._clock)
        try:
            self._load(recovery_point, log_start_offset, clean)
            if not self._directory_synced:
                fsync_directory(self.directory)
        except BaseException:
            for segment in getattr(self, "segments", ()):
                segment.close()
            self.producers.close()
            raise

    # --- loading and recovery -------------------------------------------------------------------------

    def _new_segment(self, base_offset, *, active):
        segment = LogSegment(self.directory, base_offset, self.config, active=active, now_ms=self._clock())
        jitter = self.config.segment_jitter_ms
        segment.roll_jitter_ms = random.randrange(min(jitter, self.config.segment_ms)) if jitter else 0
        return segment

    def _replay(self, segment, indexed_up_to, batch):
        if batch.magic == 2 and batch.partition_leader_epoch >= 0:
            self._assign_epoch(batch.partition_leader_epoch, batch.base_offset)
        completed = self.producers.replay(batch)
        # Kafka's recovery rebuilds the segment's .txnindex; here the entries written before the crash stay
        # (recover() cut those of the lost part) and an abort replayed past them is added.
        if completed is not None and completed.is_aborted and completed.last_offset > indexed_up_to:
            segment.txn_index.append(AbortedTxn(completed.producer_id, completed.first_offset,
                                                completed.last_offset,
                                                self.producers.last_stable_offset_after(completed)))

    def _load(self, recovery_point, log_start_offset, clean):
        complete_interrupted_swaps(self.directory)
        if self.producers.snapshot_fallback is not None:
            # A newer producer snapshot was unreadable: the producers written after the one read come from
            # the log, revalidated and replayed from there (Kafka replays it after falling back too).
            recovery_point, clean = min(recovery_point, self.producers.snapshot_fallback), False
        found = log_segments(self.directory)
        self.segments = []
        recovered = []
        for i, (base, path) in enumerate(found):
            stem = path[:-len(".log")]
            indexes_present = os.path.exists(stem + INDEX_SUFFIX) and os.path.exists(stem + TIME_INDEX_SUFFIX)
            segment = self._new_segment(base, active=False)
            self.segments.append(segment)
            next_base = found[i + 1][0] if i + 1 < len(found) else None
            unflushed = not clean and (next_base is None or next_base > recovery_point)
            if indexes_present and not unflushed:
                segment.load()
                try:
                    segment.sanity_check()
                    continue
                except CorruptIndexError as e:
                    log.warning("%s: rebuilding the indexes: %s", segment.log_path, e)
            if not recovered or recovered[-1] is not self.segments[-2]:
                self.producers.start_replay(base)       # the replay does not go on from the segment before
            try:
                indexed_up_to = segment.txn_index.last_offset()
            except CorruptIndexError as e:          # not Kafka's entries: rebuilt from the markers replayed
                log.warning("%s: rebuilding: %s", segment.txn_index.path, e)
                segment.txn_index.rewind(None)
                indexed_up_to = None
            truncated = segment.recover(functools.partial(self._replay, segment, -1 if indexed_up_to is None
                                                          else indexed_up_to))
            recovered.append(segment)
            if truncated:
                log.warning("%s: truncated %d bytes of invalid or partial batches", segment.log_path, truncated)
                for later, path in found[i + 1:]:
                    log.warning("%s: deleted: it follows a truncated segment", path)
                    delete_segment_files(self.directory, later)
                break
        if not self.segments:
            self.segments.append(self._new_segment(log_start_offset, active=True))
        self.active.make_active()
        self.log_end_offset = self.active.next_offset
        # Before the snapshot at the log end is taken: whatever the ledger holds from after it (a tail cut off
        # here, or one that never reached the disk) goes.
        self.producers.discard_after(self.log_end_offset)
        if recovered:
            self.producers.finish_replay()
        self.producers.load_ongoing()
        self.log_start_offset = min(max(log_start_offset, self.segments[0].base_offset), self.log_end_offset)
        for segment in recovered:
            segment.flush()
        if self._epochs and self._epochs[-1][1] >= self.log_end_offset:
            self._epochs = [(e, o) for e, o in self._epochs if o < self.log_end_offset]
            checkpoints.write_leader_epoch_checkpoint(self._epochs_path, self._epochs)
        if self._epochs:        # a directory Kafka wrote: its leader carries on at the latest epoch
            self.leader_epoch = max(self.leader_epoch, self._epochs[-1][0])
        self._assign_epoch(self.leader_epoch, self.log_end_offset)
        self._load_snapshots()
        self.recovery_point = self.log_end_offset if recovered or clean else min(recovery_point, self.log_end_offset)

    def _load_snapshots(self):
        """What Kafka's load does with producer snapshots: one at the log end offset unless there is one
        (a clean shutdown left it; after a crash this merges what recovery replayed), which also deletes any
        above it (a log end truncated away), then ``removeStraySnapshots`` and the snapshots below the log
        start offset. A failure (a full disk) is logged: the ledger still holds every producer, only a Kafka
        broker taking the directory over would replay the log from an older snapshot."""
        try:
            self.producers.take_snapshot(self.log_end_offset)
            self.producers.remove_stray_snapshots([segment.base_offset for segment in self.segments])
            self.producers.delete_snapshots_before(self.log_start_offset)
        except OSError as e:
            log.warning("%s: producer snapshot at the log end offset %d not taken: %s", self.directory,
                        self.log_end_offset, e)

    def _assign_epoch(self, epoch, start_offset):
        """Kafka's ``LeaderEpochFileCache.assign``: a new epoch starts at ``start_offset``."""
        if epoch < 0 or (self._epochs and epoch <= self._epochs[-1][0]):
            return
        self._epochs.append((epoch, start_offset))
        checkpoints.write_leader_epoch_checkpoint(self._epochs_path, self._epochs)
        self._directory_synced = True           # its rename synced the directory

    @property
    def active(self):
        return self.segments[-1]

    @property
    def high_watermark(self):
        return self.log_end_offset          # one replica: everything appended is replicated

    @property
    def last_stable_offset(self):
        first_unstable = self.producers.first_unstable_offset
        return self.high_watermark if first_unstable is None else min(first_unstable, self.high_watermark)

    @property
    def size_in_bytes(self):
        return sum(s.size for s in self.segments)

    @property
    def leader_epochs(self):
        """``[(epoch, start offset)]``, as in ``leader-epoch-checkpoint``."""
        return list(self._epochs)

    def _check_open(self):
        if self._closed:
            raise IllegalStateError(f"log {self.directory} is closed")

    # --- appends ------------------------------------------------------------------------------------

    def append(self, records, *, origin=CLIENT, now_ms=None, verification_guard=None):
        """Validate, assign offsets and append ``records`` (bytes-like or ``MemoryRecords``); see the module
        docstring. Never raises for bad records: the ``AppendResult`` carries the error code.
        ``verification_guard``: what ``start_txn_verification`` returned for these (transactional) records.
        The lock, the validation, the producer-state check, the roll, the write, the producers' new states and
        the listeners: one core call (``LogAppender.append_to``), which calls back for what is rare."""
        return _APPENDER.append_to(self, records, origin, now_ms, verification_guard)

    def _check_verification(self, guard):
        """A marker written since ``guard`` was made voids it (Kafka's ``VerificationGuard``)."""
        if self._verifications.pop(guard.producer_id, None) is not guard:
            raise LogError(ErrorCode.INVALID_TXN_STATE, f"the transaction of producer {guard.producer_id} ended "
                                                        f"while its records were verified")

    def _refused(self, error):
        """The answer to records refused (a ``LogError``): nothing appended."""
        return AppendResult(error.code, -1, -1, -1, self.log_start_offset, str(error),
                            record_errors=error.record_errors)

    def _storage_failed(self, error):
        """The answer to an append whose write failed (an ``OSError``): nothing appended; logged."""
        failure = storage_error(error, f"appending to {self.topic}-{self.partition}")
        log.error("%s: %s", self.directory, failure)
        return AppendResult(failure.code, -1, -1, -1, self.log_start_offset, str(failure))

    def release_reserved_blocks(self):
        """Free the blocks the active segment reserved ahead of its appends (the disk is full)."""
        with self._lock:
            if not self._closed:
                self.active.release_reserved()

    def _index_aborted(self, segment, completed):
        """Add the aborted transactions among ``completed`` to ``segment``'s ``.txnindex`` with the last stable
        offset at their completion (Kafka's ``updateTxnIndex``); returns what ``rewind`` needs, or False when
        nothing was added."""
        previous = False
        try:
            for txn in completed:
                if txn.is_aborted:
                    lso = self.producers.last_stable_offset_after(txn)
                    size = segment.txn_index.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset,
                                                               lso))
                    previous = size if previous is False else previous
        except OSError:
            if previous is not False:
                segment.txn_index.rewind(previous)
            raise
        return previous

    def start_txn_verification(self, producer_id, producer_epoch):
        """Kafka's ``maybeStartTransactionVerification`` (KIP-890): ``TRANSACTION_OPEN`` when the producer has a
        transaction open here at this epoch (no verification needed), else a guard to pass to ``append`` once
        the coordinator verified the transaction. Either goes to ``append``, which answers INVALID_TXN_STATE
        when a marker came meanwhile (it voids the guard; it closes the transaction that was open), so a batch
        checked just before its transaction ended cannot open a new one."""
        with self._lock:
            if self._transaction_open(producer_id, producer_epoch):
                return TRANSACTION_OPEN
            guard = self._verifications[producer_id] = VerificationGuard(producer_id)
            return guard

    def _transaction_open(self, producer_id, producer_epoch):
        state = self.producers.state(producer_id)
        return state is not None and state.epoch == producer_epoch and state.current_txn_first_offset != NO_TXN

    def _check_transactions_open(self, batches):
        """``append`` with ``TRANSACTION_OPEN``: the transaction of each transactional batch (a ``BatchInfo``)
        must still be open."""
        for batch in batches:
            if batch.is_transactional and not batch.is_control \
                    and not self._transaction_open(batch.producer_id, batch.producer_epoch):
                raise LogError(ErrorCode.INVALID_TXN_STATE, f"the transaction of producer {batch.producer_id} "
                                                            f"ended before its records were appended")

    def cancel_txn_verification(self, producer_id, guard):
        """Forget ``guard`` (its verification failed)."""
        with self._lock:
            if self._verifications.get(producer_id) is guard:
                del self._verifications[producer_id]

    def write_txn_marker(self, producer_id, producer_epoch, coordinator_epoch, commit, *, now_ms=None):
        """Append a transaction marker (Kafka's ``EndTransactionMarker``, a v2 control batch) as the transaction
        coordinator's write: the producer's open transaction closes (the last stable offset moves), an abort
        goes into the active segment's ``.txnindex``, listeners are told. Errors come back in the
        ``AppendResult``: INVALID_PRODUCER_EPOCH (an epoch below the producer's), TRANSACTION_COORDINATOR_FENCED
        (a coordinator epoch below the producer's last marker's), KAFKA_STORAGE_ERROR. A marker for a producer
        with no open transaction here is written too, as Kafka writes it."""
        now = self._clock() if now_ms is None else now_ms
        try:
            marker = build_control_batch(ControlRecordType.COMMIT if commit else ControlRecordType.ABORT, 0,
                                         producer_id, producer_epoch, now, coordinator_epoch)
        except InvalidArgumentError as e:
            return AppendResult(ErrorCode.INVALID_REQUEST, -1, -1, -1, self.log_start_offset, str(e))
        with self._lock:
            self._verifications.pop(producer_id, None)
        return self.append(marker, origin=COORDINATOR, now_ms=now)

    def roll(self):
        """Start a new segment at the log end offset (nothing happens while the active one is empty)."""
        with self._lock:
            old = self.active
            if old.size == 0:
                return old
            new = self._new_segment(self.log_end_offset, active=True)
            try:
                old.on_become_inactive()
            except BaseException:                 # still the active segment: the new one goes
                new.close()
                delete_segment_files(self.directory, new.base_offset)
                raise
            self.segments.append(new)
            self.producers.take_snapshot(new.base_offset)       # at the new segment's base, as Kafka's roll
            flush = functools.partial(self._flush_after_roll, new.base_offset)
            if self._schedule is None:
                flush()
            else:
                self._schedule(flush)
            return self.active

    def flush_up_to(self, offset):
        """Kafka's ``flushUptoOffsetExclusive``: fsync the segments holding offsets from the recovery point up
        to ``offset`` and the directory (their names), then move the recovery point to ``offset``. The
        partition's lock is held only to open the files (unless the caller holds it): appends go on during
        the fsyncs. Raises OSError, the recovery point unchanged."""
        with self._lock:
            if self._closed or offset <= self.recovery_point:
                return
            fds = self._open_unflushed(offset)
        started = time.perf_counter_ns()
        fsync_and_close(fds)
        flushes = self.flush_stats.row(None)
        flushes[0] += 1
        flushes[1] += time.perf_counter_ns() - started
        with self._lock:
            self.recovery_point = max(self.recovery_point, offset)

    def _open_unflushed(self, offset):
        """Descriptors of the files of the segments holding offsets in ``[recovery_point, offset)`` and of the
        directory, for ``fsync_and_close`` (under the lock)."""
        fds = []
        try:
            for segment in self.segments:
                if segment.base_offset < offset and segment.next_offset > self.recovery_point:
                    fds += segment.open_for_flush()
            fds.append(os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def _flush_after_roll(self, offset):
        """A roll's flush: a failure is logged as the log's storage errors are, the recovery point stays."""
        try:
            self.flush_up_to(offset)
        except OSError as e:
            if not self._closed:        # else deleted, or closed, which flushed everything (or failed itself)
                log.error("%s: %s", self.directory, storage_error(
                    e, f"flushing {self.topic}-{self.partition} up to offset {offset}"))

    def add_listener(self, listener):
        with self._lock:
            self._listeners.append(listener)

    # --- reads --------------------------------------------------------------------------------------

    def read(self, fetch_offset, max_bytes, *, min_one_message=True, isolation=READ_UNCOMMITTED, copy_below=0):
        """The records from ``fetch_offset`` on (see the module docstring)."""
        if not type(fetch_offset) is type(max_bytes) is type(copy_below) is int:    # checked once on the fetch path
            _check_int("fetch_offset", fetch_offset)
            _check_int("max_bytes", max_bytes)
            _check_int("copy_below", copy_below)
        if isolation not in (READ_UNCOMMITTED, READ_COMMITTED):
            raise InvalidArgumentError(f"isolation must be READ_UNCOMMITTED (0) or READ_COMMITTED (1): {isolation!r}")
        # the core's bounds are int64: beyond them max_bytes bounds nothing (or everything), and nothing is
        # copied below 0 bytes
        max_bytes = min(max(max_bytes, INT64_MIN), INT64_MAX)
        copy_below = min(max(copy_below, 0), INT64_MAX)
        with self._lock:
            self._check_open()
            hw, lso, start = self.high_watermark, self.last_stable_offset, self.log_start_offset
            upper = lso if isolation == READ_COMMITTED else hw
            if fetch_offset < start or fetch_offset > self.log_end_offset:
                return FetchData(None, hw, start, lso, ErrorCode.OFFSET_OUT_OF_RANGE)
            no_aborted = [] if isolation == READ_COMMITTED else None
            try:
                if fetch_offset >= self.active.base_offset:         # a reader at the tail: no search
                    first_segment = len(self.segments) - 1
                else:
                    bases = [s.base_offset for s in self.segments]
                    first_segment = max(bisect.bisect_right(bases, fetch_offset) - 1, 0)
                for i, segment in enumerate(self.segments[first_segment:], first_segment):
                    if fetch_offset >= upper:
                        break
                    max_position = segment.size
                    if upper < segment.next_offset:
                        bound = segment.translate_offset(upper)
                        max_position = bound.position if bound is not None else segment.size
                    found = segment.fetch_slice(fetch_offset, max_position, max_bytes, min_one_message, copy_below)
                    if found is None:
                        continue
                    position, size, data = found
                    if size <= 0:
                        break
                    aborted = no_aborted
                    if isolation == READ_COMMITTED and not all(s.txn_index.absent for s in self.segments[i:]):
                        # The range read ends before the first indexed offset past the bytes read (Kafka's
                        # fetchUpperBoundOffset), else at the upper bound or this segment's end: a superset of
                        # what the records hold (consumers ignore aborted transactions they do not reach).
                        bound = segment.offset_index.fetch_upper_bound_offset(position + size)
                        aborted = self._collect_aborted(i, fetch_offset, min(
                            upper, segment.next_offset if bound is None else bound))
                    records = data if data is not None else segment.records(position, position + size)
                    return FetchData(records, hw, start, lso, aborted_transactions=aborted)
                return FetchData(None, hw, start, lso, aborted_transactions=no_aborted)
            except OSError as e:        # no descriptor left, an I/O error
                log.error("%s: %s", self.directory, storage_error(e, f"reading {self.topic}-{self.partition}"))
                return FetchData(None, hw, start, lso, ErrorCode.KAFKA_STORAGE_ERROR)

    def _collect_aborted(self, first_segment, fetch_offset, upper_bound):
        """Kafka's ``collectAbortedTransactions``: the ``AbortedTxn`` entries overlapping ``[fetch_offset,
        upper_bound)`` from the ``.txnindex`` of the segment read and the later ones (a transaction's entry
        is in its marker's segment), until an entry's last stable offset reaches ``upper_bound``."""
        found = []
        for segment in self.segments[first_segment:]:
            entries, complete = segment.txn_index.collect(fetch_offset, upper_bound)
            found += entries
            if complete:
                break
        return found

    def offset_metadata(self, offset):
        """The ``LogOffsetMetadata`` of ``offset``, or None when it is outside the log."""
        with self._lock:
            self._check_open()
            if offset == self.log_end_offset:
                return LogOffsetMetadata(offset, self.active.base_offset, self.active.size)
            if not self.log_start_offset <= offset < self.log_end_offset:
                return None
            bases = [s.base_offset for s in self.segments]
            for segment in self.segments[max(bisect.bisect_right(bases, offset) - 1, 0):]:
                batch = segment.translate_offset(offset)
                if batch is not None:
                    return LogOffsetMetadata(offset, segment.base_offset, batch.position)
            return None

    def fetch_upper_bound(self, isolation):
        """The ``LogOffsetMetadata`` a fetch reads up to: the high watermark, or for READ_COMMITTED the last
        stable offset."""
        with self._lock:
            return self.offset_metadata(self.last_stable_offset if isolation == READ_COMMITTED
                                        else self.high_watermark)

    def offset_for_timestamp(self, timestamp):
        """ListOffsets for one partition: an ``OffsetAndTimestamp``, or None when no record qualifies."""
        _check_int("timestamp", timestamp)
        with self._lock:
            self._check_open()
            if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
                return OffsetAndTimestamp(self.log_start_offset, -1)
            if timestamp == LATEST_TIMESTAMP:
                return OffsetAndTimestamp(self.high_watermark, -1)
            if timestamp == MAX_TIMESTAMP:
                newest = max(self.segments, key=lambda s: s.max_timestamp_so_far)
                found = newest.record_at_max_timestamp()
                return OffsetAndTimestamp(*found) if found else OffsetAndTimestamp(-1, -1)
            if timestamp < 0:
                return None
            for segment in self.segments:
                if segment.largest_timestamp >= timestamp:
                    found = segment.find_offset_by_timestamp(timestamp, self.log_start_offset)
                    if found is not None:
                        return OffsetAndTimestamp(*found)
            return None

    # --- retention ----------------------------------------------------------------------------------

    def delete_old_segments(self, now_ms=None):
        """Retention by time, then by size; returns the number of segments deleted."""
        with self._lock:
            self._check_open()
            now = self._clock() if now_ms is None else now_ms
            deleted = 0
            if not self.config.delete:          # cleanup.policy=compact: the log cleaner's, not retention's
                return deleted
            retention_ms = self.config.retention_ms
            if retention_ms >= 0:
                deleted += self._delete_segments(lambda s: now - s.largest_timestamp > retention_ms)
            retention_bytes = self.config.retention_bytes
            if retention_bytes >= 0 and self.size_in_bytes >= retention_bytes:
                excess = [self.size_in_bytes - retention_bytes]

                def over_size(segment):
                    if excess[0] - segment.size >= 0:
                        excess[0] -= segment.size
                        return True
                    return False
                deleted += self._delete_segments(over_size)
            return deleted

    def _delete_segments(self, predicate):
        deletable = []
        for i, segment in enumerate(self.segments):
            upper = self.segments[i + 1].base_offset if i + 1 < len(self.segments) else self.log_end_offset
            last_and_empty = i + 1 == len(self.segments) and segment.size == 0
            if self.high_watermark >= upper and not last_and_empty and predicate(segment):
                deletable.append(segment)
            else:
                break
        if not deletable:
            return 0
        active = deletable.pop() if len(deletable) == len(self.segments) else None
        # The others go before the roll an active segment needs: on a full disk they free the room its producer
        # snapshot takes.
        if deletable:
            self._remove_segments(deletable)
        if active is None:
            return len(deletable)
        try:
            self.roll()
        except OSError as e:        # nothing lost: the segment goes at the next deletion
            log.error("%s: %s; its segment at offset %d stays for now", self.directory,
                      storage_error(e, f"rolling {self.topic}-{self.partition} to delete every segment"),
                      active.base_offset)
            return len(deletable)
        self._remove_segments([active])
        return len(deletable) + 1

    def _remove_segments(self, segments):
        for segment in segments:
            self.segments.remove(segment)
            segment.delete()
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        self.producers.delete_snapshots_before(self.log_start_offset)

    def active_producers(self):
        """Kafka's ``activeProducers`` (DescribeProducers): an iterator of the ``ProducerEntry`` of every producer
        not expired at the last ``remove_expired_producers``, as they are at the call. The partition's lock is
        held for the call only: the ledger is then walked a chunk at a time while appends go on."""
        with self._lock:
            self._check_open()
            return self.producers.producers()

    def remove_expired_producers(self, now_ms=None):
        """Kafka's periodic ``removeExpiredProducers`` (see ``kmem.broker.log.producer_state``)."""
        with self._lock:
            self._check_open()
            self.producers.remove_expired(self._clock() if now_ms is None else now_ms)

    def delete_records_before(self, offset):
        """Kafka's ``deleteRecords`` (DeleteRecords, KIP-107): the log start offset moves to ``offset``
        (-1: the high watermark) and the segments wholly before it are deleted; returns the new log start
        offset. OFFSET_OUT_OF_RANGE (``LogError``) beyond the high watermark."""
        _check_int("offset", offset)
        with self._lock:
            self._check_open()
            if offset == -1:
                offset = self.high_watermark
            if not 0 <= offset <= self.high_watermark:
                raise LogError(ErrorCode.OFFSET_OUT_OF_RANGE, f"cannot delete records of {self.topic}-"
                               f"{self.partition} before offset {offset}: the high watermark is {self.high_watermark}")
            self.log_start_offset = max(self.log_start_offset, offset)
            self._delete_segments(lambda segment: segment.next_offset <= offset)
            return self.log_start_offset

    # --- compaction (kmem.broker.log.cleaner) ------------------------------------------------------------

    def cleanable_segments(self):
        """``(the segments before the active one, log start offset, active segment's base offset)``."""
        with self._lock:
            self._check_open()
            return list(self.segments[:-1]), self.log_start_offset, self.active.base_offset

    def transaction_indexes(self):
        """The ``TransactionIndex`` of every segment, oldest first: the cleaner reads the aborted transactions
        of what it cleans from them, a few entries at a time."""
        with self._lock:
            self._check_open()
            return [s.txn_index for s in self.segments]

    def replace_segments(self, old_segments, cleaned_base):
        """Swap in the cleaned segment ``<cleaned_base>.log.cleaned`` (with its indexes) for
        ``old_segments`` (Kafka's ``replaceSegments``); False, nothing changed, when they are no longer
        all in the log (retention or DeleteRecords removed one meanwhile)."""
        with self._lock:
            self._check_open()
            inactive = self.segments[:-1]
            if not all(any(s is old for s in inactive) for old in old_segments):
                return False
            swap_in_cleaned_files(self.directory, cleaned_base, [s.base_offset for s in old_segments])
            for old in old_segments:
                old.close()
            new = self._new_segment(cleaned_base, active=False)
            new.load()
            first = next(i for i, s in enumerate(self.segments) if s is old_segments[0])
            self.segments[first:first + len(old_segments)] = [new]
            return True

    # --- shutdown -----------------------------------------------------------------------------------

    def flush(self):
        """fsync every segment not flushed yet and move the recovery point to the log end offset."""
        with self._lock:
            self._check_open()
            self.flush_up_to(self.log_end_offset)

    def close(self, *, snapshot=True):
        """Trim the active segment's indexes, flush every segment not flushed yet (a roll's flush still
        pending then finds nothing to do), take a producer snapshot at the log end offset (as Kafka's
        ``UnifiedLog.close``, fsynced: a Kafka broker taking the directory over then scans nothing), close
        the files and the producer ledger. ``snapshot=False``: no flush, no snapshot (the log is being
        deleted)."""
        with self._lock:
            if self._closed:
                return
            try:
                self.active.on_become_inactive()
                if snapshot:
                    self.flush_up_to(self.log_end_offset)
                    self.producers.take_snapshot(self.log_end_offset, sync=True)
            finally:                    # the files are closed also when the last writes fail (a full disk)
                self._closed = True
                for segment in self.segments:
                    segment.close()
                self.producers.close()

    def delete(self):
        """Close the log and remove its directory (Kafka renames it ``-delete`` first, as done here)."""
        with self._lock:
            self.close(snapshot=False)
            doomed = f"{self.directory}.{uuid.uuid4().hex}-delete"
            os.rename(self.directory, doomed)
            shutil.rmtree(doomed)


def batches_from_start(partition_log):
    """Every batch of ``partition_log`` from its log start, in offset order, read ``LOAD_CHUNK_BYTES`` at a time
    (the group and transaction coordinators replay ``__consumer_offsets`` and ``__transaction_state`` with it).
    Each batch is valid until the next one is asked for."""
    offset = partition_log.log_start_offset
    while True:
        data = partition_log.read(offset, LOAD_CHUNK_BYTES)
        if data.records is None:
            return
        with data.records as records:
            batches = list(records.batches())
            for batch in batches:
                yield batch
                offset = batch.next_offset
        if not batches:
            return
