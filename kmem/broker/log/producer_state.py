"""Idempotent-producer state of one partition: Kafka's ``ProducerStateManager`` over a ``PidLedger``
(KIP-1044), so that memory stays flat however many producer ids write to the partition.

Where the state lives:

- the partition directory's ``PidLedger`` holds each producer's newest entry (epoch, last sequence,
  last offset, offset delta, timestamp, coordinator epoch, open transaction): exactly what a Kafka
  snapshot entry holds. Its snapshots are Kafka's ``<offset>.snapshot`` files, taken where Kafka takes
  them (``take_snapshot``): at each segment roll, named by the new segment's base offset
  (``UnifiedLog.roll``), at the log end offset when the log closes (``UnifiedLog.close``, fsynced) and
  when it loads after a crash (``LogLoader``'s rebuild of the producer state). Each holds every producer
  not expired at the last ``remove_expired`` check, as Kafka's map does, so a Kafka broker that takes
  the directory over (it loads its newest snapshot at or below the log end offset alone, and after a
  clean shutdown scans nothing) knows every producer. Older snapshots are deleted by Kafka's rules:
  those below the log start offset when segments are deleted (``delete_snapshots_before``), and at each
  load those at no segment's base except the newest above them all (``remove_stray_snapshots``); the
  ledger never deletes its newest. A ledger flush between rolls (its active file full:
  ``producer.ledger.ids`` new producers) also writes a complete snapshot, named by its newest entry's
  end: a stray that the next load removes. Each such snapshot costs a pass over the live producers, as
  Kafka's does. The ledger's own files (``ledger-<n>.active``, ``<offset>.snapshot.bloom``,
  ``<offset>.snapshot.order``) sit beside Kafka's, which Kafka ignores; it takes no ``ledger.lock``
  (the log manager's lock on the log directory covers it) and holds no descriptor between calls. Before
  a batch is written, ``reserve`` makes room for its producers' entries, so that a full disk fails the
  append before anything of it is kept, never after. Expiry is Kafka's
  ``removeExpiredProducers``: ``remove_expired(now)``, run every
  ``producer.id.expiration.check.interval.ms`` (and when the partition opens), forgets the producers
  whose last batch's max timestamp is ``producer.id.expiration.ms`` older than ``now`` (none with an
  open transaction). Between checks every producer is kept, also one writing CreateTime timestamps
  older than the expiration (a backfill): until the next check its duplicates and sequences are
  checked, as in Kafka. (The ledger judges expiry by the time of the last check; the few producers
  written since then with such old timestamps are held in memory until the next one, and a snapshot
  taken meanwhile leaves them out: Kafka's load would drop them from it too.);
- an LRU of at most ``producer.state.cache.entries`` producers keeps the metadata of their last five
  batches, as Kafka's ``ProducerStateEntry`` does. A producer read back from the ledger (evicted, or
  after a restart) knows its last batch only, which is all a Kafka snapshot keeps too.

Checks, for each v2 batch with a producer id, as Kafka's ``ProducerAppendInfo`` (client appends):

- a batch of the current epoch whose first and last sequence equal one of the remembered batches is a
  duplicate: it is not appended and the append answers with that batch's original offsets;
- an epoch below the current one: INVALID_PRODUCER_EPOCH (47);
- a new epoch must start at sequence 0 unless the producer is unknown; otherwise the first sequence must
  follow the last one (wrapping after 2**31 - 1): else OUT_OF_ORDER_SEQUENCE_NUMBER (45). An unknown or
  expired producer may start at any sequence (Kafka 2.5+ no longer answers UNKNOWN_PRODUCER_ID).

A transaction marker (from the coordinator) closes its producer's open transaction and records the
coordinator epoch it carries; one of an older epoch is INVALID_PRODUCER_EPOCH, one of an older coordinator
epoch TRANSACTION_COORDINATOR_FENCED (52), as Kafka's ``appendEndTxnMarker``. ``check`` returns the
transactions the markers close (Kafka's ``CompletedTxn``) for the log's ``.txnindex``.

After an unclean shutdown the log replays the batches it revalidated (those past the recovery point)
through ``replay``, which brings the ledger up to date with batches a crash left out of it and
rebuilds the last-five metadata of their producers. Each run of replayed segments starts
(``start_replay``) from the transactions open in the producer snapshot at its first segment's base, as
Kafka's loader loads the snapshot before replaying: a replayed marker then closes a transaction opened
before the replay, and the ``CompletedTxn`` of an abort has the last stable offset it had at run time.
A process crash never leaves the ledger ahead of the log (a batch is written before its producer's
entry). When recovery truncates batches that were written whole (a bad CRC, power loss), ``discard``
rolls back every producer whose entry points into the lost part, to the state replayed from the batches
kept or else to an unknown producer, so a retry of a lost batch is appended again (Kafka reloads an
older snapshot for the same purpose).
"""
import collections
import logging
import re
from typing import NamedTuple

from kmem import _core
from kmem.bloom import Shape
from kmem.broker.codes import ErrorCode, LogError
from kmem.broker.log.validator import BatchInfo
from kmem.ledger import NO_TXN, PidLedger, ProducerEntry
from kmem.records.batches import INT32_MAX, ControlRecordType

# Files a Kafka partition directory holds beside the ledger's: the ledger need not warn about them.
KAFKA_PARTITION_FILE = re.compile(r"^(\d{20}\.(log|index|timeindex|txnindex)|partition\.metadata|"
                                  r"leader-epoch-checkpoint(\.tmp)?|partition\.metadata\.tmp)$")
NO_SEQUENCE = -1


class CompletedTxn(NamedTuple):
    """A transaction a marker closed (Kafka's ``CompletedTxn``): its first offset, the marker's offset."""
    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


class BatchMetadata(NamedTuple):
    first_seq: int
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_offset(self):
        return self.last_offset - self.offset_delta


class ProducerState(_core.ProducerStateCore):
    """One producer's epoch, last batches and transaction (Kafka's ``ProducerStateEntry``); its fields, the
    batches kept and the check and addition of a client's data batch are the core's."""
    __slots__ = ()

    @classmethod
    def from_entry(cls, entry):
        batches = ()
        if entry.last_sequence != NO_SEQUENCE:
            first = (entry.last_sequence - entry.offset_delta) % (INT32_MAX + 1)
            batches = ((first, entry.last_sequence, entry.last_offset, entry.offset_delta, entry.timestamp),)
        return cls(entry.producer_id, entry.epoch, batches, entry.coordinator_epoch,
                   entry.current_txn_first_offset, entry.timestamp)

    @property
    def batches(self):
        """The last batches' ``BatchMetadata``, oldest first."""
        return tuple(BatchMetadata(*fields) for fields in self.batch_fields())

    def to_entry(self):
        return tuple.__new__(ProducerEntry, self.entry_fields())     # a namedtuple's __new__ is a Python frame

    def add(self, batch):
        """Record ``batch`` (a ``BatchInfo``) as this producer's newest, unchecked; for a transaction marker
        closing an open transaction, returns its ``CompletedTxn`` (a marker without one changes no offset)."""
        if not batch.is_control:
            self.check_and_add(batch, False, True, False)      # neither a client's nor checked: always added
            return None
        self.start_epoch(batch.producer_epoch)
        self.timestamp = batch.max_timestamp
        completed = None
        if self.current_txn_first_offset != NO_TXN:
            completed = CompletedTxn(self.producer_id, self.current_txn_first_offset, batch.base_offset,
                                     batch.control_type == ControlRecordType.ABORT)
        self.current_txn_first_offset = NO_TXN
        self.coordinator_epoch = batch.coordinator_epoch
        return completed


class _KafkaFilesAreExpected(logging.Filter):
    def filter(self, record):
        return not (record.msg.endswith("ignoring foreign file %s")
                    and KAFKA_PARTITION_FILE.match(str(record.args[-1])))


logging.getLogger("kmem.ledger.ledger").addFilter(_KafkaFilesAreExpected())


def _fenced_epoch(state, batch):
    return LogError(ErrorCode.INVALID_PRODUCER_EPOCH, f"epoch {batch.producer_epoch} of producer {state.producer_id} "
                                                      f"is smaller than the last seen epoch {state.epoch}")


class ProducerStateManager(_core.ProducerStatesCore):
    """Producer state of one partition directory. Calls are serialised by the partition's lock. Where states are
    kept, and the check, reservation and storing of an append's states, are the core's (``ProducerStatesCore``);
    transaction markers, the errors and recovery are here."""

    def __init__(self, directory, *, ledger_ids, cache_entries, expiration_ms, clock_ms):
        self._checked_at = clock_ms()       # Kafka removes expired producers when it loads them
        # The log manager's flock on the log directory covers the ledger: no ledger.lock, no descriptor.
        ledger = PidLedger(directory, Shape.from_np(ledger_ids, 0.01), producer_id_expiration_ms=expiration_ms,
                           clock_ms=lambda: self._checked_at, lock_directory=False, keep_snapshots=True)
        super().__init__(ledger, collections.OrderedDict(), ProducerState, ProducerEntry, self._checked_at,
                         ledger.expiration_ms, cache_entries)

    def remove_expired(self, now_ms):
        """Kafka's ``removeExpiredProducers``: from now on, producers whose last timestamp is
        ``producer.id.expiration.ms`` older than ``now_ms`` (and no transaction open) are unknown."""
        with self._lock:
            self._checked_at = now_ms
            self._stale.clear()
            for pid in [pid for pid, state in self._cache.items() if self.expired(state)]:
                del self._cache[pid]

    def _marker(self, state, batch, replication):
        """``check`` of a transaction marker (``batch``) against ``state``: its ``CompletedTxn`` or None."""
        if batch.producer_epoch < state.epoch and not replication:
            raise _fenced_epoch(state, batch)
        if batch.coordinator_epoch < state.coordinator_epoch and not replication:
            raise LogError(ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                           f"marker of coordinator epoch {batch.coordinator_epoch} for producer {state.producer_id}: "
                           f"the current coordinator epoch is {state.coordinator_epoch}")
        return state.add(batch)

    @staticmethod
    def _refused(state, batch, verdict):
        """The ``LogError`` of what ``check_and_add`` refused (``verdict``)."""
        if verdict == _core.PRODUCER_EPOCH_FENCED:
            return _fenced_epoch(state, batch)
        first = batch.base_sequence
        if verdict == _core.NEW_EPOCH_NOT_AT_ZERO:
            return LogError(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                            f"invalid sequence number {first} for new epoch {batch.producer_epoch} of producer "
                            f"{state.producer_id} (current epoch {state.epoch})")
        return LogError(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                        f"out of order sequence number for producer {state.producer_id}: {first} (incoming), "
                        f"{state.last_seq} (current end sequence number)")

    def last_stable_offset_after(self, completed):
        """Kafka's ``lastStableOffset(completedTxn)``: the first offset of the oldest transaction still open
        once ``completed`` (a ``CompletedTxn``) is, or the offset after its marker."""
        with self._lock:
            others = [first for pid, first in self._ongoing.items() if pid != completed.producer_id]
        return min(others, default=completed.last_offset + 1)

    def start_replay(self, offset):
        """Before recovery replays the log from ``offset``: the open transactions are those of the newest
        producer snapshot at or below it, as Kafka's loader loads that snapshot before replaying, so that a
        replayed marker closes a transaction opened before ``offset`` and its ``CompletedTxn`` has the last
        stable offset it had at run time. States remembered from an earlier replay are forgotten (the log
        between the two was not replayed)."""
        ongoing = self.ledger.open_transactions_at(offset)
        with self._lock:
            self._cache.clear()
            self._ongoing = ongoing

    def replay(self, batch):
        """Bring the state up to date with ``batch`` (a ``RecordBatch`` of the log, during recovery, after
        ``start_replay``); returns the ``CompletedTxn`` a marker closes, if known, else None."""
        pid = batch.producer_id
        if batch.magic != 2 or pid < 0 or (batch.is_control_batch and batch.records_count == 0):
            return None         # an empty marker: its transaction was cleaned away, nothing to replay (Kafka)
        with self._lock:
            state = self._cache.get(pid)
            txn_first_offset = self._ongoing.get(pid, NO_TXN)
        entry = self.ledger.read(pid)
        if state is None:
            state = ProducerState.from_entry(entry) if entry is not None and entry.last_offset < batch.last_offset \
                else ProducerState(pid)
            # The ledger may hold a later state (a marker leaves the last offset as it was): the open
            # transactions are those the replay has followed since the snapshot it started from.
            state.current_txn_first_offset = txn_first_offset
        control = batch.is_control_batch
        completed = state.add(BatchInfo(pid, batch.producer_epoch, batch.base_sequence, batch.last_sequence,
                                        batch.base_offset, batch.last_offset, batch.max_timestamp,
                                        batch.is_transactional, control, batch.control_type if control else None,
                                        batch.coordinator_epoch if control else -1))
        if entry is None or entry.last_offset < batch.last_offset:
            self.ledger.update(state.to_entry())
        self._remember(state)
        return completed

    def discard_after(self, log_end_offset):
        """Recovery found the log ending at ``log_end_offset`` (a torn or damaged tail cut off, or bytes that
        never reached the disk): every producer whose entry points at or past it goes back to the state of
        the log kept, as Kafka's load of the newest snapshot at or below the log end and replay of the log
        after it gives: the state replayed from the batches kept, else that snapshot's entry, else none (an
        expired entry: unknown, any sequence accepted, as to Kafka, whose snapshot would not hold it), so that
        the snapshot taken at the log end holds nothing from after it, and a retry of a lost batch is appended
        again rather than answered with offsets that no longer hold it. A pass over the ledger's producers."""
        lost = [pid for chunk in self.ledger.entry_chunks()
                for pid in chunk["producer_id"][chunk["last_offset"] >= log_end_offset].tolist()]
        if not lost:
            return
        in_snapshot = self.ledger.entries_at(log_end_offset, lost)
        for pid in lost:
            with self._lock:
                state = self._cache.pop(pid, None)
                self._stale.pop(pid, None)
            if state is None or state.last_offset >= log_end_offset:
                kept = in_snapshot.get(pid)
                state = ProducerState.from_entry(kept) if kept is not None and kept.last_offset < log_end_offset \
                    else ProducerState(pid)
            self.ledger.update(state.to_entry())
            if state.batches:
                self._remember(state)

    def finish_replay(self):
        """After recovery: forget remembered states a replay left behind the ledger (it replayed a segment
        that is not the last, e.g. to rebuild its index), and the expired producers replayed (Kafka removes
        them once loaded)."""
        with self._lock:
            self._stale.clear()
            remembered = list(self._cache.values())
        for state in remembered:
            entry = self.ledger.read(state.producer_id)
            if entry is not None and entry.last_offset > state.last_offset:
                with self._lock:
                    self._cache.pop(state.producer_id, None)

    def load_ongoing(self):
        """Learn the open transactions from the ledger (once the partition is loaded): they bound the last
        stable offset until their markers come, also across restarts."""
        ongoing = {}
        for chunk in self.ledger.entry_chunks(open_transactions=True):
            for pid, first in zip(chunk["producer_id"].tolist(), chunk["current_txn_first_offset"].tolist()):
                if first != NO_TXN:
                    ongoing[pid] = first
        with self._lock:
            self._ongoing = ongoing

    def producers(self):
        """Every known producer's ``ProducerEntry``, an iterator over the ledger as it is at the call (read a
        chunk at a time: nothing is loaded whole, and appends may go on while it is walked)."""
        chunks = self.ledger.entry_chunks()
        return (ProducerEntry(*fields) for chunk in chunks for fields in chunk.tolist())

    @property
    def first_unstable_offset(self):
        """The first offset of the oldest open transaction, or None."""
        if not self._ongoing:           # read on every fetch: no lock when no transaction is open
            return None
        with self._lock:
            return min(self._ongoing.values(), default=None)

    @property
    def snapshot_fallback(self):
        """None, or when a newer snapshot was unreadable at open the offset of the one read instead (0:
        none could be): the log after it must be replayed, as Kafka's loader replays it after falling back."""
        return self.ledger.fell_back_to

    def take_snapshot(self, offset, *, sync=False):
        """Kafka's ``takeSnapshot`` at ``offset``: ``<offset>.snapshot`` of every producer, unless the newest
        snapshot is there already and no producer was written since; returns its path or None."""
        return self.ledger.flush(offset, sync=sync)

    def remove_stray_snapshots(self, segment_base_offsets):
        """Kafka's ``removeStraySnapshots`` (see ``PidLedger.remove_stray_snapshots``)."""
        self.ledger.remove_stray_snapshots(segment_base_offsets)

    def delete_snapshots_before(self, offset):
        """Kafka's ``deleteSnapshotsBefore``: the snapshots below ``offset``, never the newest."""
        self.ledger.delete_snapshots_before(offset)

    def close(self):
        self.ledger.close()
