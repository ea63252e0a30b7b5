"""The transaction coordinator of ``kmem broker``: Kafka 3.9's ``TransactionCoordinator`` and
``TransactionStateManager`` on one node (KIP-98, KIP-360, KIP-664, KIP-890 part 1).

APIs: InitProducerId with a transactional id (through ``Handlers.init_producer_id``), AddPartitionsToTxn
0-5, AddOffsetsToTxn 0-4, EndTxn 0-4, DescribeTransactions 0, ListTransactions 0-1; FindCoordinator for
a transactional id names this broker. Each id moves through the states of
``kmem.broker.txn.metadata.TransactionMetadata`` and answers a wrong move with Kafka's error code:

- InitProducerId: a new id gets a producer id (``LogManager.allocate_producer_id``) and epoch 0; a known
  one gets its epoch bumped, which fences the previous producer (PRODUCER_FENCED for its requests; before
  v4 of a request, INVALID_PRODUCER_EPOCH). A transaction the previous epoch left open is aborted first
  (epoch fenced, PrepareAbort, markers) and the request answered CONCURRENT_TRANSACTIONS, which clients
  retry. An exhausted epoch (32766) moves the id to a new producer id at epoch 0. KIP-360 (v3+): a
  producer naming its producer id and epoch gets its epoch bumped if they are the current ones, the same
  answer again if they are the previous ones (a retry), else PRODUCER_FENCED; naming an older epoch of an
  exhausted one is answered UNKNOWN_SERVER_ERROR, as Kafka 3.9 answers the IllegalStateException its
  ``prepareIncrementProducerEpoch`` throws there. ``transaction.max.timeout.ms`` bounds the timeout
  (INVALID_TRANSACTION_TIMEOUT).
- AddPartitionsToTxn and AddOffsetsToTxn (the group's ``__consumer_offsets`` partition) start or extend
  the transaction (Ongoing); INVALID_PRODUCER_ID_MAPPING for an unknown id or another producer id,
  PRODUCER_FENCED for another epoch, CONCURRENT_TRANSACTIONS while the previous transaction's markers are
  being written (a request that finds them still to write writes them itself first, or waits, up to 20 ms,
  for the thread writing them: the next transaction's first request comes as soon as EndTxn is answered,
  and clients retry that answer only after 20 ms).
  v4+ (Kafka's broker-to-broker form) carries several transactions; ``verify_only`` checks each partition
  (NONE or TRANSACTION_ABORTABLE) without adding it. A partition of an unknown topic is
  UNKNOWN_TOPIC_OR_PARTITION and the others of its transaction OPERATION_NOT_ATTEMPTED. Until
  ``__transaction_state`` exists (FindCoordinator and InitProducerId create it) AddPartitionsToTxn,
  AddOffsetsToTxn, EndTxn and DescribeTransactions answer NOT_COORDINATOR, as Kafka answers for a partition
  it does not lead.
- EndTxn writes PrepareCommit or PrepareAbort to ``__transaction_state`` and is answered then; the
  markers (``kmem.broker.txn.markers.TxnMarkerWriter``) are written to every partition of the transaction
  by the network thread once the response is out (``Request.after_response``; the timer thread writes
  those of the aborts the coordinator starts itself), or by the id's next request (see above), then
  CompleteCommit or CompleteAbort is written. A marker that fails (a storage error) is written again after a
  backoff, as Kafka's marker channel retries, until it is in; an unexpected exception while writing the
  markers or Complete* is logged and counts as such a failure of every partition still missing.
  A retried EndTxn is answered NONE once complete, CONCURRENT_TRANSACTIONS meanwhile, INVALID_TXN_STATE
  for the other outcome or without a transaction.
- ``verify_transaction`` answers the KIP-890 check of Produce and TxnOffsetCommit
  (``transaction.partition.verification.enable``) as Kafka's ``AddPartitionsToTxnManager`` hands the
  coordinator's ``verify_only`` answer on.

State: every transition is a ``TransactionLogValue`` record (``kmem.broker.txn.state_log``) written with
origin COORDINATOR to ``__transaction_state`` before it takes effect; the topic (created on first need,
``transaction.state.log.num.partitions`` partitions, ``cleanup.policy=compact``, uncompressed) is
compacted by the broker's log cleaner. At start the coordinator replays it: a transaction found in
PrepareCommit or PrepareAbort (the broker stopped before its markers were all written) has its markers
written again and is completed; an Ongoing one is aborted at its timeout.

Deadlines (the broker's ``Timer``): every ``transaction.abort.timed.out.transaction.cleanup.interval.ms``
the open transactions (only those: idle ids are not looked at) past their timeout are aborted and their
producer fenced (epoch bump, Kafka's ``abortTimedOutTransactions``); every
``transaction.remove.expired.transaction.cleanup.interval.ms`` the idle ids not used for
``transactional.id.expiration.ms`` are removed (a tombstone each).

Memory: an idle transactional id costs its name, a dict entry and 41 packed bytes (well under 256 bytes);
only ids with a transaction under way are ``TransactionMetadata`` objects.
"""
import dataclasses
import itertools
import logging
import threading
import time

from kmem.broker.codes import ErrorCode, LogError
from kmem.broker.group.coordinator import GROUP_WRITE_ERRORS
from kmem.broker.group.offsets import OFFSETS_TOPIC, partition_for
from kmem.broker.log.config import INT32_MAX, at_least, boolean, config_from_properties
from kmem.broker.log.unified_log import batches_from_start, wall_clock_ms
from kmem.broker.log.validator import COORDINATOR
from kmem.broker.txn.metadata import (
    COMPLETE_ABORT, COMPLETE_COMMIT, DEAD, EMPTY, IDLE_STATES, NO_PRODUCER_EPOCH, ONGOING, PREPARE_ABORT,
    PREPARE_COMMIT, PREPARE_EPOCH_FENCE, STATE_IDS, STATE_NAMES, TransactionMetadata, epoch_exhausted,
)
from kmem.broker.txn.state_log import (
    INTERNAL_TOPICS, TRANSACTION_STATE_TOPIC, read_key, read_value, transaction_log_key, transaction_log_value,
)
from kmem.errors import CorruptRecordError, IllegalStateError
from kmem.protocol import ApiKey, messages
from kmem.records import build_coordinator_records

log = logging.getLogger(__name__)

# api key -> TransactionCoordinator method (InitProducerId and FindCoordinator stay with the other handlers)
TXN_APIS = {
    ApiKey.ADD_PARTITIONS_TO_TXN: "add_partitions_to_txn", ApiKey.ADD_OFFSETS_TO_TXN: "add_offsets_to_txn",
    ApiKey.END_TXN: "end_txn", ApiKey.DESCRIBE_TRANSACTIONS: "describe_transactions",
    ApiKey.LIST_TRANSACTIONS: "list_transactions",
}
TOMBSTONES_PER_BATCH = 1000          # when ids expire
MARKER_RETRY_SECONDS = (0.1, 10.0)   # the first and the longest wait before a failed marker is written again
# How long AddPartitionsToTxn waits for another thread writing the markers of the id's previous transaction
# before it answers CONCURRENT_TRANSACTIONS: librdkafka and Kafka's Java client retry that answer after 20 ms,
# so waiting longer gains nothing.
MARKER_AWAIT_SECONDS = 0.02

# A failed write to __transaction_state is answered as Kafka's TransactionStateManager.appendTransactionToLog
# maps the append's error, which is the group coordinator's mapping for __consumer_offsets.
STATE_WRITE_ERRORS = GROUP_WRITE_ERRORS
# The coordinator's verify_only answers as Kafka's AddPartitionsToTxnManager hands them to the produce path: no
# coordinator to ask (no __transaction_state) is COORDINATOR_NOT_AVAILABLE, and PRODUCER_FENCED, which producers
# do not expect from a Produce, INVALID_PRODUCER_EPOCH.
VERIFICATION_ERRORS = {ErrorCode.NOT_COORDINATOR: ErrorCode.COORDINATOR_NOT_AVAILABLE,
                       ErrorCode.PRODUCER_FENCED: ErrorCode.INVALID_PRODUCER_EPOCH}
# marker results after which a partition needs no marker: written, its topic gone (Kafka skips a partition
# without a leader), or a newer producer or coordinator epoch there (nothing this coordinator writes can go in).
# Kafka's marker channel stops there without completing the transaction, and leaves it to the coordinator that
# took over; a single node has no other coordinator, so the transaction completes (else its id would answer
# CONCURRENT_TRANSACTIONS until the broker restarts).
MARKER_DONE = frozenset({ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_PRODUCER_EPOCH,
                         ErrorCode.TRANSACTION_COORDINATOR_FENCED})


# Kafka's transaction coordinator settings: name -> (TxnConfig field, parser)
TXN_SETTINGS = {
    "transaction.max.timeout.ms": ("max_timeout_ms", at_least(1, INT32_MAX)),
    "transactional.id.expiration.ms": ("id_expiration_ms", at_least(1, INT32_MAX)),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": ("abort_timed_out_interval_ms",
                                                                    at_least(1, INT32_MAX)),
    "transaction.remove.expired.transaction.cleanup.interval.ms": ("remove_expired_interval_ms",
                                                                   at_least(1, INT32_MAX)),
    "transaction.partition.verification.enable": ("partition_verification_enable", boolean),
    "transaction.state.log.num.partitions": ("state_log_partitions", at_least(1, INT32_MAX)),
    "transaction.state.log.segment.bytes": ("state_log_segment_bytes", at_least(14, INT32_MAX)),
}


@dataclasses.dataclass(frozen=True)
class TxnConfig:
    """The coordinator's settings, Kafka's names and defaults (``from_properties`` takes dotted names)."""
    max_timeout_ms: int = 900_000
    id_expiration_ms: int = 604_800_000
    abort_timed_out_interval_ms: int = 10_000
    remove_expired_interval_ms: int = 3_600_000
    partition_verification_enable: bool = True
    state_log_partitions: int = 50
    state_log_segment_bytes: int = 100 * 1024 * 1024

    @classmethod
    def from_properties(cls, properties):
        return config_from_properties(cls, TXN_SETTINGS, properties)


class _MarkerJob:
    """The markers of one ended transaction still to write, then its Complete* transit to write."""
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "commit", "remaining", "transit", "wait",
                 "task", "writing", "retrying")

    def __init__(self, meta, commit, transit):
        self.transactional_id = meta.transactional_id
        self.producer_id, self.producer_epoch = meta.producer_id, meta.producer_epoch
        self.commit = commit
        self.remaining = set(meta.partitions)
        self.transit = transit
        self.wait = MARKER_RETRY_SECONDS[0]
        self.task = None
        self.writing = False        # a thread is writing the markers (the timer's, or a request's)
        self.retrying = False       # a write failed: the next one waits for its backoff


class TransactionCoordinator:
    """See the module docstring. ``markers``: the ``TxnMarkerWriter``; ``groups``: the broker's
    ``GroupCoordinator`` (AddOffsetsToTxn creates ``__consumer_offsets`` through it when missing)."""

    def __init__(self, logs, config=None, *, timer, markers, groups=None, clock=wall_clock_ms):
        self.logs = logs
        self.config = config or TxnConfig()
        self._timer = timer
        self._markers = markers
        self._groups = groups
        self._clock = clock
        self._lock = threading.RLock()
        self._markers_done = threading.Condition(self._lock)      # a marker job completed or failed
        self._closed = False
        self._live = {}           # transactional id -> TransactionMetadata, for ids not idle
        self._idle = {}           # transactional id -> TransactionMetadata.pack() of an idle id
        self._jobs = {}           # transactional id -> _MarkerJob under way
        self._tasks = {}          # name -> the periodic TimerTask
        self._load()
        with self._lock:
            for meta in list(self._live.values()):
                if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
                    log.info("transactional id %r: writing the markers of its %s (found at start)",
                             meta.transactional_id, STATE_NAMES[meta.state])
                    self._send_markers(meta)
            self._every("abort", self.config.abort_timed_out_interval_ms, self.abort_timed_out_transactions)
            self._every("expire", self.config.remove_expired_interval_ms, self.remove_expired_transactional_ids)

    # --- ids in memory ----------------------------------------------------------------------------------

    def __len__(self):
        """Transactional ids known."""
        with self._lock:
            return len(self._live) + len(self._idle)

    def _get(self, transactional_id):
        """The id's metadata (made live), or None. Under the lock; ``_release`` it after."""
        meta = self._live.get(transactional_id)
        if meta is None:
            packed = self._idle.pop(transactional_id, None)
            if packed is None:
                return None
            meta = self._live[transactional_id] = TransactionMetadata.unpack(transactional_id, packed)
        return meta

    def _release(self, meta):
        """After a request: an idle id goes back to its packed form; one never written is forgotten."""
        if meta is None or self._live.get(meta.transactional_id) is not meta:
            return
        if meta.producer_epoch == NO_PRODUCER_EPOCH and meta.pending_state is None:
            del self._live[meta.transactional_id]
        elif meta.idle:
            del self._live[meta.transactional_id]
            self._idle[meta.transactional_id] = meta.pack()

    # --- __transaction_state ----------------------------------------------------------------------------

    def _partition_count(self):
        """``__transaction_state``'s partition count (``transaction.state.log.num.partitions`` until it exists)."""
        return self.logs.partition_count(TRANSACTION_STATE_TOPIC) or self.config.state_log_partitions

    def create_state_topic(self):
        """Create ``__transaction_state`` if it is missing (FindCoordinator and InitProducerId do, as Kafka's
        first FindCoordinator for a transactional id does); a failure is logged and left to the requests.
        Whether the topic is there."""
        try:
            self._create_state_topic()
        except (LogError, OSError) as e:
            log.error("cannot create %s: %s", TRANSACTION_STATE_TOPIC, e)
            return False
        return True

    def _create_state_topic(self):
        if self.logs.get_partition(TRANSACTION_STATE_TOPIC, 0) is not None:
            return
        try:
            self.logs.create_topic(TRANSACTION_STATE_TOPIC, self.config.state_log_partitions, {
                "cleanup.policy": "compact", "compression.type": "uncompressed",
                "segment.bytes": self.config.state_log_segment_bytes})
        except LogError as e:
            if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise

    def state_topic_exists(self):
        return self.logs.get_partition(TRANSACTION_STATE_TOPIC, 0) is not None

    def _coordinator_error(self):
        """COORDINATOR_NOT_AVAILABLE once closed; NOT_COORDINATOR while ``__transaction_state`` does not exist
        (Kafka's ``getTransactionState`` for a partition it does not lead: the client looks the coordinator up
        again, and FindCoordinator creates the topic); else NONE. Under the lock."""
        if self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return ErrorCode.NONE if self.state_topic_exists() else ErrorCode.NOT_COORDINATOR

    def partition_for(self, transactional_id):
        return partition_for(transactional_id, self._partition_count())

    def _append(self, partition, entries):
        """Write ``[(key, value or None)]`` to a partition of ``__transaction_state``: the Kafka error code to
        answer (``STATE_WRITE_ERRORS``)."""
        batch = build_coordinator_records(entries, self._clock())
        partition_log = self.logs.get_partition(TRANSACTION_STATE_TOPIC, partition)
        if partition_log is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        try:
            result = partition_log.append(batch, origin=COORDINATOR)
            error, message = result.error_code, result.error_message
        except IllegalStateError as e:              # the topic was deleted meanwhile
            error, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, str(e)
        except OSError as e:
            error, message = ErrorCode.KAFKA_STORAGE_ERROR, str(e)
        if not error:
            return ErrorCode.NONE
        answer = ErrorCode(STATE_WRITE_ERRORS.get(error, error))
        log.error("writing to %s-%d failed (answered %s): %s", TRANSACTION_STATE_TOPIC, partition, answer.name,
                  message)
        return answer

    def _write(self, meta, transit, keep_pending=False):
        """Write ``transit`` and apply it; on failure the pending state is cleared (unless ``keep_pending``:
        the write is retried). Returns the error code."""
        error = self._append(self.partition_for(meta.transactional_id),
                             [(transaction_log_key(meta.transactional_id), transaction_log_value(transit))])
        if error:
            if not keep_pending:
                meta.pending_state = None
            return error
        meta.complete(transit)
        return ErrorCode.NONE

    def _load(self):
        """Replay ``__transaction_state`` (the last record of each id wins; a tombstone removes it). Each id
        is placed as its record is read, packed when idle: the load never holds more than the ids will."""
        for index in range(self.logs.partition_count(TRANSACTION_STATE_TOPIC)):
            partition_log = self.logs.get_partition(TRANSACTION_STATE_TOPIC, index)
            records = (record for batch in batches_from_start(partition_log)
                       if not batch.is_control_batch for record in batch)
            for record in records:
                try:
                    transactional_id, value = read_key(record.key), read_value(record.value)
                except CorruptRecordError as e:
                    log.warning("skipping a record of %s-%d: %s", TRANSACTION_STATE_TOPIC, index, e)
                    continue
                self._idle.pop(transactional_id, None)
                self._live.pop(transactional_id, None)
                if value is not None:
                    self._place(transactional_id, value)
        if self._idle or self._live:
            log.info("loaded %d transactional ids from %s (%d with a transaction under way)",
                     len(self._idle) + len(self._live), TRANSACTION_STATE_TOPIC, len(self._live))

    def _place(self, transactional_id, record):
        """An id's loaded ``TransactionLogValue`` in memory (a later record of the id replaces it)."""
        if record.state in (DEAD, PREPARE_EPOCH_FENCE):       # never written by Kafka: nothing to resume
            log.warning("transactional id %r: ignoring its %s state record", transactional_id,
                        STATE_NAMES[record.state])
            return
        meta = TransactionMetadata(transactional_id, record.producer_id, record.producer_epoch, record.timeout_ms,
                                   record.state, partitions=record.partitions, start_ms=record.start_ms,
                                   last_update_ms=record.last_update_ms)
        if meta.idle:
            self._idle[transactional_id] = meta.pack()
        else:
            self._live[transactional_id] = meta

    # --- deadlines ----------------------------------------------------------------------------------------

    def _every(self, name, interval_ms, action):
        """Run ``action`` on the timer every ``interval_ms``; under the lock."""
        def run():
            try:
                action()
            finally:
                with self._lock:
                    if not self._closed:
                        self._tasks[name] = self._timer.schedule(time.monotonic() + interval_ms / 1000, run)
        self._tasks[name] = self._timer.schedule(time.monotonic() + interval_ms / 1000, run)

    def abort_timed_out_transactions(self):
        """Abort every open transaction past its timeout and fence its producer (Kafka's
        ``abortTimedOutTransactions``): only the ids with a transaction under way are looked at."""
        now = self._clock()
        with self._lock:
            if self._closed:
                return
            for meta in [m for m in self._live.values() if m.state == ONGOING and m.pending_state is None
                         and m.start_ms + m.timeout_ms < now]:
                transit = meta.prepare_fence_producer_epoch()
                error = self._end_transaction(meta, transit.producer_id, transit.producer_epoch, False, False)
                log.info("transactional id %r: transaction open for over %d ms aborted and producer %d fenced "
                         "(epoch %d): %s", meta.transactional_id, meta.timeout_ms, meta.producer_id,
                         transit.producer_epoch, ErrorCode(error).name)
                self._release(meta)

    def remove_expired_transactional_ids(self):
        """Forget the idle ids unused for ``transactional.id.expiration.ms``, writing a tombstone for each."""
        deadline = self._clock() - self.config.id_expiration_ms
        with self._lock:
            if self._closed:
                return
            by_partition, count = {}, self._partition_count()
            for transactional_id, packed in self._idle.items():
                if TransactionMetadata.packed_last_update_ms(packed) <= deadline:
                    by_partition.setdefault(partition_for(transactional_id, count), []).append(transactional_id)
            for partition, expired in by_partition.items():
                for start in range(0, len(expired), TOMBSTONES_PER_BATCH):
                    chunk = expired[start:start + TOMBSTONES_PER_BATCH]
                    if self._append(partition, [(transaction_log_key(t), None) for t in chunk]):
                        continue                    # logged; tried again at the next check
                    for transactional_id in chunk:
                        del self._idle[transactional_id]
                    log.info("%d transactional ids expired (transactional.id.expiration.ms)", len(chunk))

    # --- markers ------------------------------------------------------------------------------------------

    def _send_markers(self, meta, write_markers=None):
        """After Prepare* is written: the markers go out, then Complete* is written. On the timer thread, or
        handed to ``write_markers`` (which runs it unless the broker stops: then the next start completes the
        transaction from its Prepare* record). Scheduling no timer task then also keeps the timer thread
        asleep while the response goes out."""
        job = _MarkerJob(meta, meta.state == PREPARE_COMMIT, meta.prepare_complete(self._clock()))
        self._jobs[meta.transactional_id] = job
        if write_markers is None:
            job.task = self._timer.schedule(time.monotonic(), lambda: self._write_markers(job))
        else:
            write_markers(lambda: self._write_markers(job))

    def _write_markers(self, job):
        """Nothing to do when a request wrote the markers or is writing them."""
        with self._lock:
            if job.writing or self._jobs.get(job.transactional_id) is not job:
                return
            job.writing = True
        self._write_claimed(job)

    def _write_claimed(self, job):
        """Write the markers still missing, then Complete*, for ``job`` claimed (``writing``); not under the lock.
        Whatever happens, ``writing`` is cleared, waiters are woken and, unless the job is done (or the
        coordinator closed), it is tried again after its backoff: an exception that escapes the marker writer
        or the Complete* write counts as a failure of every partition still missing or of the completion."""
        try:
            results = self._write_missing_markers(job)
        except Exception:
            log.exception("transactional id %r: writing its markers raised", job.transactional_id)
            results = None
        with self._lock:
            job.writing = False
            self._markers_done.notify_all()
            if self._closed:
                return
            if results is None:
                results = dict.fromkeys(job.remaining, ErrorCode.UNKNOWN_SERVER_ERROR)
            meta = self._live[job.transactional_id]
            for partition, error in results.items():
                if error in MARKER_DONE:
                    job.remaining.discard(partition)
                    meta.partitions.discard(partition)
                    if error:
                        log.warning("transactional id %r: no marker written to %s-%d (%s)", job.transactional_id,
                                    *partition, ErrorCode(error).name)
            failed = {partition: ErrorCode(error).name for partition, error in results.items() if error not in
                      MARKER_DONE}
            if not job.remaining:
                try:
                    error = self._write(meta, job.transit, keep_pending=True)
                except Exception:
                    log.exception("transactional id %r: writing its %s raised", job.transactional_id,
                                  STATE_NAMES[job.transit.state])
                    error = ErrorCode.UNKNOWN_SERVER_ERROR
                if not error:
                    del self._jobs[job.transactional_id]
                    self._release(meta)
                    return
                failed[TRANSACTION_STATE_TOPIC] = "write failed"
            job.retrying = True
            log.warning("transactional id %r: %s failed (%s); trying again in %.1f s", job.transactional_id,
                        "markers" if job.remaining else "completing", failed, job.wait)
            job.task = self._timer.schedule(time.monotonic() + job.wait, lambda: self._write_markers(job))
            job.wait = min(job.wait * 2, MARKER_RETRY_SECONDS[1])

    def _write_missing_markers(self, job):
        """The markers ``job`` still misses, written: ``{(topic, partition): error code}`` (empty once closed)."""
        with self._lock:
            if self._closed:
                return {}
            partition_log = self.logs.get_partition(TRANSACTION_STATE_TOPIC, self.partition_for(job.transactional_id))
            coordinator_epoch = partition_log.leader_epoch if partition_log is not None else 0
            partitions = sorted(job.remaining)
        if not partitions:
            return {}
        return self._markers.write(job.producer_id, job.producer_epoch, coordinator_epoch, job.commit, partitions)

    def _finish_markers(self, transactional_id):
        """Not under the lock. The markers of the id's ended transaction are written now, on this thread, or,
        while another thread is writing them, waited for (up to ``MARKER_AWAIT_SECONDS``): answered
        CONCURRENT_TRANSACTIONS, the client would retry only after its backoff. After a failed write
        neither: the job waits for its backoff."""
        with self._lock:
            job = self._jobs.get(transactional_id)
            if job is None or job.retrying or self._closed:
                return
            if job.writing:
                self._markers_done.wait_for(lambda: self._closed or not job.writing, MARKER_AWAIT_SECONDS)
                return
            job.writing = True
            if job.task is not None:
                job.task.cancel()
        self._write_claimed(job)

    def markers_pending(self):
        """Transactional ids whose markers or completion are still to be written."""
        with self._lock:
            return len(self._jobs)

    def close(self):
        """Stop the deadlines and the markers under way (the next start resumes them from the log)."""
        with self._lock:
            self._closed = True
            self._markers_done.notify_all()
            for task in self._tasks.values():
                task.cancel()
            for job in self._jobs.values():
                if job.task is not None:
                    job.task.cancel()

    # --- InitProducerId ------------------------------------------------------------------------------------

    def init_producer_id(self, header, request):
        """InitProducerId with a transactional id (``Handlers.init_producer_id`` passes it on)."""
        version = header.api_version
        producer_id, epoch = (request.producer_id, request.producer_epoch) if version >= 3 else (-1, -1)
        if (producer_id == -1) != (epoch == -1):
            error, producer_id, epoch = ErrorCode.INVALID_REQUEST, -1, -1
        else:
            expected = None if producer_id == -1 else (producer_id, epoch)
            error, producer_id, epoch = self.init_producer(request.transactional_id, request.transaction_timeout_ms,
                                                           expected)
        if version < 4 and error == ErrorCode.PRODUCER_FENCED:
            error = ErrorCode.INVALID_PRODUCER_EPOCH        # older clients know no PRODUCER_FENCED
        return messages.InitProducerIdResponse(throttle_time_ms=0, error_code=error, producer_id=producer_id,
                                               producer_epoch=epoch)

    def init_producer(self, transactional_id, timeout_ms, expected=None):
        """Kafka's ``handleInitProducerId``: ``(error code, producer id, epoch)``; ``expected`` is the
        request's ``(producer id, epoch)`` (KIP-360) or None."""
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST, -1, -1
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return ErrorCode.INVALID_TRANSACTION_TIMEOUT, -1, -1
        with self._lock:
            if self._closed:
                return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, -1
            if not self.create_state_topic():
                return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, -1
            meta = self._get(transactional_id)
            if meta is None:
                try:
                    producer_id = self.logs.allocate_producer_id()
                except OSError as e:
                    log.error("InitProducerId: reserving producer ids failed: %s", e)
                    return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, -1, -1
                meta = self._live[transactional_id] = TransactionMetadata(
                    transactional_id, producer_id, NO_PRODUCER_EPOCH, timeout_ms, last_update_ms=self._clock())
            try:
                transit = self._prepare_init(meta, timeout_ms, expected)
                if isinstance(transit, int):
                    return transit, -1, -1
                if transit.state == PREPARE_EPOCH_FENCE:
                    # abort the open transaction first; the client retries and gets the epoch after it
                    error = self._end_transaction(meta, transit.producer_id, transit.producer_epoch, False, False)
                    return error or ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1
                error = self._write(meta, transit)
                if error:
                    return error, -1, -1
                log.info("transactional id %r: producer id %d, epoch %d", transactional_id, meta.producer_id,
                         meta.producer_epoch)
                return ErrorCode.NONE, meta.producer_id, meta.producer_epoch
            finally:
                self._release(meta)

    def _prepare_init(self, meta, timeout_ms, expected):
        """Kafka's ``prepareInitProducerIdTransit``: the transit to write, or an error code."""
        if meta.pending_state is not None:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if expected is not None and not (
                meta.producer_epoch == NO_PRODUCER_EPOCH or expected[0] == meta.producer_id
                or (expected[0] == meta.last_producer_id and epoch_exhausted(expected[1]))):
            return ErrorCode.PRODUCER_FENCED
        if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if meta.state == ONGOING:
            return meta.prepare_fence_producer_epoch()
        if meta.state not in IDLE_STATES:
            raise IllegalStateError(f"transactional id {meta.transactional_id!r} in state {STATE_NAMES[meta.state]}")
        now = self._clock()
        if meta.epoch_exhausted and expected is not None and expected[1] != meta.producer_epoch:
            # Kafka's prepareIncrementProducerEpoch throws IllegalStateException here, answered by KafkaApis
            log.error("transactional id %r: InitProducerId expects epoch %d of producer id %d, whose epochs are "
                      "exhausted (%d)", meta.transactional_id, expected[1], meta.producer_id, meta.producer_epoch)
            return ErrorCode.UNKNOWN_SERVER_ERROR
        if meta.epoch_exhausted:
            try:
                producer_id = self.logs.allocate_producer_id()
            except OSError as e:
                log.error("InitProducerId: reserving producer ids failed: %s", e)
                return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
            return meta.prepare_producer_id_rotation(producer_id, timeout_ms, now, expected is not None)
        transit = meta.prepare_increment_producer_epoch(timeout_ms, None if expected is None else expected[1], now)
        return ErrorCode.PRODUCER_FENCED if transit is None else transit

    # --- AddPartitionsToTxn, AddOffsetsToTxn -------------------------------------------------------------

    def add_partitions_to_txn(self, header, request):
        version = header.api_version
        Response = messages.AddPartitionsToTxnResponse
        if version < 4:
            transactions = [(request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
                             request.v3_and_below_producer_epoch, False, request.v3_and_below_topics)]
        else:
            transactions = [(t.transactional_id, t.producer_id, t.producer_epoch, t.verify_only, t.topics)
                            for t in request.transactions]
        results = []
        for transactional_id, producer_id, epoch, verify_only, topics in transactions:
            errors = self._add_partitions_errors(version, transactional_id, producer_id, epoch, verify_only,
                                                 [(topic.name, p) for topic in topics for p in topic.partitions])
            by_topic = {}
            for (topic, partition), error in errors.items():
                by_topic.setdefault(topic, []).append(Response.AddPartitionsToTxnPartitionResult(
                    partition_index=partition, partition_error_code=error))
            Topic = Response.AddPartitionsToTxnTopicResult
            results.append((transactional_id, [Topic(name=topic, results_by_partition=partitions)
                                               for topic, partitions in by_topic.items()]))
        if version < 4:
            return Response(throttle_time_ms=0, results_by_topic_v3_and_below=results[0][1])
        return Response(throttle_time_ms=0, error_code=ErrorCode.NONE, results_by_transaction=[
            Response.AddPartitionsToTxnResult(transactional_id=t, topic_results=topics) for t, topics in results])

    def _add_partitions_errors(self, version, transactional_id, producer_id, epoch, verify_only, partitions):
        """``{(topic, partition): error code}`` of one transaction of an AddPartitionsToTxn request."""
        refused = {}
        for topic, partition in partitions:
            if version < 4 and topic in INTERNAL_TOPICS:     # Kafka never lets a client write them
                refused[(topic, partition)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif self.logs.get_partition(topic, partition) is None:
                refused[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if refused:
            return {tp: refused.get(tp, ErrorCode.OPERATION_NOT_ATTEMPTED) for tp in partitions}
        if verify_only:
            return self._verify_partitions(transactional_id, producer_id, epoch, partitions)
        error = self.add_partitions(transactional_id, producer_id, epoch, set(partitions))
        if version < 2 and error == ErrorCode.PRODUCER_FENCED:
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        return {tp: error for tp in partitions}

    def _verify_partitions(self, transactional_id, producer_id, epoch, partitions):
        """AddPartitionsToTxn v4+ ``verify_only`` (Kafka's ``handleVerifyPartitionsInTransaction``):
        ``{partition: error code}``, each partition NONE or TRANSACTION_ABORTABLE when the producer's transaction
        is open, else all one error. An idle id is read in its packed form, not made live."""
        if not transactional_id:
            return dict.fromkeys(partitions, ErrorCode.INVALID_REQUEST)
        with self._lock:
            error = self._coordinator_error()
            if error:
                return dict.fromkeys(partitions, error)
            meta = self._peek(transactional_id)
            if meta is None or meta.producer_id != producer_id:
                error = ErrorCode.INVALID_PRODUCER_ID_MAPPING
            elif meta.producer_epoch != epoch:
                error = ErrorCode.PRODUCER_FENCED
            elif meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
                error = ErrorCode.CONCURRENT_TRANSACTIONS
            else:
                return {tp: ErrorCode.NONE if tp in meta.partitions else ErrorCode.TRANSACTION_ABORTABLE
                        for tp in partitions}
            return dict.fromkeys(partitions, error)

    def add_partitions(self, transactional_id, producer_id, epoch, partitions):
        """Kafka's ``handleAddPartitionsToTransaction``: the error code."""
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST
        self._finish_markers(transactional_id)
        return self._with_metadata(transactional_id,
                                   lambda meta: self._add_partitions(meta, producer_id, epoch, partitions))

    def _add_partitions(self, meta, producer_id, epoch, partitions):
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if meta.producer_epoch != epoch:
            return ErrorCode.PRODUCER_FENCED
        if meta.pending_state is not None or meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if meta.state == ONGOING and partitions <= meta.partitions:
            return ErrorCode.NONE
        return self._write(meta, meta.prepare_add_partitions(partitions, self._clock()))

    def _with_metadata(self, transactional_id, action):
        """``action(metadata of the id, or None)`` under the lock, the metadata released after: its error code,
        or ``_coordinator_error``'s."""
        with self._lock:
            error = self._coordinator_error()
            if error:
                return error
            meta = self._get(transactional_id)
            try:
                return action(meta)
            finally:
                self._release(meta)

    def add_offsets_to_txn(self, header, request):
        """The group's ``__consumer_offsets`` partition joins the transaction, so that its markers complete
        the transaction's offsets (``GroupCoordinator.handle_txn_completion``)."""
        if self._groups is not None and self.logs.get_partition(OFFSETS_TOPIC, 0) is None:
            self._groups.create_offsets_topic()
        count = self.logs.partition_count(OFFSETS_TOPIC)
        if not count:
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        else:
            partition = (OFFSETS_TOPIC, partition_for(request.group_id, count))
            error = self.add_partitions(request.transactional_id, request.producer_id, request.producer_epoch,
                                        {partition})
        if header.api_version < 2 and error == ErrorCode.PRODUCER_FENCED:
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        return messages.AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=error)

    # --- EndTxn ----------------------------------------------------------------------------------------------

    def end_txn(self, header, request, write_markers=None):
        """``write_markers(job)``: where the markers are written once the response is out (the network
        thread's ``Request.after_response``); by default the timer thread writes them."""
        error = self.end_transaction(request.transactional_id, request.producer_id, request.producer_epoch,
                                     request.committed, write_markers)
        if header.api_version < 2 and error == ErrorCode.PRODUCER_FENCED:
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        return messages.EndTxnResponse(throttle_time_ms=0, error_code=error)

    def end_transaction(self, transactional_id, producer_id, epoch, commit, write_markers=None):
        """Kafka's ``handleEndTransaction``: the error code (NONE once Prepare* is written)."""
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST
        return self._with_metadata(transactional_id, lambda meta: self._end_transaction(
            meta, producer_id, epoch, commit, True, write_markers))

    def _end_transaction(self, meta, producer_id, epoch, commit, from_client, write_markers=None):
        """Under the lock. From the client the epoch must be the current one; from the coordinator (a fence)
        it is the bumped epoch, with PrepareEpochFence pending."""
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if (from_client and epoch != meta.producer_epoch) or epoch < meta.producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        if meta.pending_state is not None and meta.pending_state != PREPARE_EPOCH_FENCE:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        state = meta.state
        if state == ONGOING:
            fence = not commit and meta.pending_state == PREPARE_EPOCH_FENCE
            if fence:
                meta.pending_state = None
                meta.producer_epoch, meta.last_producer_epoch = epoch, NO_PRODUCER_EPOCH
            transit = meta.prepare_abort_or_commit(PREPARE_COMMIT if commit else PREPARE_ABORT, self._clock())
            error = self._write(meta, transit)
            if error:
                meta.failed_epoch_fence = meta.failed_epoch_fence or fence
                return error
            self._send_markers(meta, write_markers)
            return ErrorCode.NONE
        if state in (COMPLETE_COMMIT, COMPLETE_ABORT):
            return ErrorCode.NONE if commit == (state == COMPLETE_COMMIT) else ErrorCode.INVALID_TXN_STATE
        if state in (PREPARE_COMMIT, PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS if commit == (state == PREPARE_COMMIT) \
                else ErrorCode.INVALID_TXN_STATE
        if state == EMPTY:
            return ErrorCode.INVALID_TXN_STATE
        raise IllegalStateError(f"transactional id {meta.transactional_id!r} in state {STATE_NAMES[state]}")

    # --- the produce path's check (KIP-890 part 1) -----------------------------------------------------------

    def verify_transaction(self, transactional_id, producer_id, producer_epoch, topic, partition,
                           transaction_abortable=False):
        """The produce path's check of one partition (KIP-890 part 1): what Kafka's ``AddPartitionsToTxnManager``
        hands the append after asking ``verify_only``. NONE when verification is off or the partition is in the
        producer's open transaction; COORDINATOR_NOT_AVAILABLE without ``__transaction_state`` (no coordinator
        to ask) or once closed; INVALID_REQUEST for an empty id; INVALID_PRODUCER_ID_MAPPING for an unknown id
        or another producer id; INVALID_PRODUCER_EPOCH for another epoch (see ``VERIFICATION_ERRORS``);
        CONCURRENT_TRANSACTIONS while the transaction ends; a partition not in the transaction is
        TRANSACTION_ABORTABLE if the request's version knows it (``transaction_abortable``: Produce v11+,
        TxnOffsetCommit v4+), else INVALID_TXN_STATE."""
        if not self.config.partition_verification_enable:
            return ErrorCode.NONE
        error = self._verify_partitions(transactional_id, producer_id, producer_epoch, [(topic, partition)])[
            (topic, partition)]
        if error == ErrorCode.TRANSACTION_ABORTABLE and not transaction_abortable:
            return ErrorCode.INVALID_TXN_STATE
        return VERIFICATION_ERRORS.get(error, error)

    # --- DescribeTransactions, ListTransactions ---------------------------------------------------------------

    def _peek(self, transactional_id):
        """The id's metadata without making it live (a copy for a packed one), or None. Under the lock."""
        meta = self._live.get(transactional_id)
        if meta is None:
            packed = self._idle.get(transactional_id)
            meta = TransactionMetadata.unpack(transactional_id, packed) if packed is not None else None
        return meta

    def state_counts(self):
        """``{state name: transactional ids in it}`` for every state, of the ids this coordinator holds (for the
        metrics endpoint: the lock is held while the ids are listed, not while they are counted)."""
        with self._lock:
            live = [meta.state for meta in self._live.values()]
            idle = list(self._idle.values())
        counts = dict.fromkeys(STATE_NAMES, 0)
        for state in itertools.chain(live, (TransactionMetadata.packed_summary(packed)[1] for packed in idle)):
            counts[STATE_NAMES[state]] += 1
        return counts

    def describe_transactions(self, header, request):
        Response = messages.DescribeTransactionsResponse
        response = Response(throttle_time_ms=0, transaction_states=[])
        for transactional_id in request.transactional_ids:
            # an error leaves the other fields at the schema's defaults, as Kafka's answer does
            state = Response.TransactionState(error_code=ErrorCode.NONE, transactional_id=transactional_id,
                                              transaction_state="", transaction_timeout_ms=0,
                                              transaction_start_time_ms=0, producer_id=0, producer_epoch=0,
                                              topics=[])
            response.transaction_states.append(state)
            with self._lock:
                meta = self._peek(transactional_id) if transactional_id else None
                if self._closed:
                    state.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE
                elif not transactional_id:
                    state.error_code = ErrorCode.INVALID_REQUEST
                elif not self.state_topic_exists():
                    state.error_code = ErrorCode.NOT_COORDINATOR
                elif meta is None:
                    state.error_code = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
                else:
                    by_topic = {}
                    for topic, partition in sorted(meta.partitions):
                        by_topic.setdefault(topic, []).append(partition)
                    state.transaction_state = STATE_NAMES[meta.state]
                    state.transaction_timeout_ms, state.transaction_start_time_ms = meta.timeout_ms, meta.start_ms
                    state.producer_id, state.producer_epoch = meta.producer_id, meta.producer_epoch
                    state.topics = [Response.TopicData(topic=topic, partitions=partitions)
                                    for topic, partitions in by_topic.items()]
        return response

    def list_transactions(self, header, request):
        """Kafka's ``listTransactionStates``: state filters (unknown names are reported back), producer id
        filters and, from v1, transactions running longer than ``duration_filter`` ms."""
        Response = messages.ListTransactionsResponse
        states = {STATE_IDS[name] for name in request.state_filters if name in STATE_IDS}
        unknown = [name for name in request.state_filters if name not in STATE_IDS]
        producer_ids = set(request.producer_id_filters)
        duration = request.duration_filter if header.api_version >= 1 else -1
        now = self._clock()
        listed = []
        with self._lock:
            if self._closed:
                return Response(throttle_time_ms=0, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                unknown_state_filters=[], transaction_states=[])
            entries = [(t, m.producer_id, m.state, m.start_ms) for t, m in self._live.items()]
            entries += [(t, *TransactionMetadata.packed_summary(p)) for t, p in self._idle.items()]
        for transactional_id, producer_id, state, start_ms in entries:
            if (producer_ids and producer_id not in producer_ids) or (request.state_filters and state not in states) \
                    or (duration >= 0 and now - start_ms <= duration):
                continue
            listed.append(Response.TransactionState(transactional_id=transactional_id, producer_id=producer_id,
                                                    transaction_state=STATE_NAMES[state]))
        return Response(throttle_time_ms=0, error_code=ErrorCode.NONE, unknown_state_filters=unknown,
                        transaction_states=listed)
