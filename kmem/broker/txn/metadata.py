"""``TransactionMetadata``: one transactional id's state in the transaction coordinator, with Kafka 3.9's
state machine (``kafka.coordinator.transaction.TransactionMetadata``).

States and the states each may follow (an id's first state is Empty):

- Empty (0): after InitProducerId; from Empty, CompleteCommit, CompleteAbort;
- Ongoing (1): partitions added (AddPartitionsToTxn, AddOffsetsToTxn); from Ongoing, Empty, CompleteCommit,
  CompleteAbort;
- PrepareCommit (2) / PrepareAbort (3): EndTxn written, markers to write; from Ongoing (PrepareAbort also
  from PrepareEpochFence);
- CompleteCommit (4) / CompleteAbort (5): every marker written; from PrepareCommit / PrepareAbort;
- Dead (6): Kafka's state of an expiring id (``transactional.id.expiration.ms``), from Empty,
  CompleteCommit, CompleteAbort; the coordinator here writes the expired id's tombstone directly, so no id
  is ever in it;
- PrepareEpochFence (7): the epoch is being bumped to fence the producer before aborting its transaction
  (a pending state only: never written to the log).

A change is made in two steps, as Kafka makes it: ``prepare_*`` checks the transition, sets
``pending_state`` and returns the ``TxnTransit`` (the state to write to ``__transaction_state``); once the
record is written, ``complete(transit)`` applies it (or ``pending_state`` is cleared when the write failed).
An invalid transition raises ``IllegalStateError``: the coordinator checks the request first and answers
its error code, so one reaching here is a bug.

Memory: an idle id (Empty, CompleteCommit or CompleteAbort, nothing pending) is kept by the coordinator as
``pack()``'s 41 bytes, not as this object; ``unpack`` makes the object again when a request needs it.
"""
import struct
from typing import NamedTuple

from kmem.errors import IllegalStateError

EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT, DEAD, PREPARE_EPOCH_FENCE = range(8)
STATE_NAMES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead",
               "PrepareEpochFence")
STATE_IDS = {name: state for state, name in enumerate(STATE_NAMES)}
VALID_PREVIOUS_STATES = {
    EMPTY: {EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT},
    ONGOING: {ONGOING, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT},
    PREPARE_COMMIT: {ONGOING},
    PREPARE_ABORT: {ONGOING, PREPARE_EPOCH_FENCE},
    COMPLETE_COMMIT: {PREPARE_COMMIT},
    COMPLETE_ABORT: {PREPARE_ABORT},
    DEAD: {EMPTY, COMPLETE_ABORT, COMPLETE_COMMIT},
    PREPARE_EPOCH_FENCE: {ONGOING},
}
IDLE_STATES = frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT})      # Kafka's isExpirationAllowed
NO_PRODUCER_ID = NO_PRODUCER_EPOCH = -1
MAX_EPOCH = (1 << 15) - 1

# an idle id: producer id, last producer id, epoch, last epoch, timeout, state, start, last update
_PACKED = struct.Struct(">qqhhiBqq")
LAST_UPDATE_OFFSET = _PACKED.size - 8


def epoch_exhausted(epoch):
    """Kafka's ``isEpochExhausted``: a client never gets Short.MaxValue, so the coordinator can always fence."""
    return epoch >= MAX_EPOCH - 1


class TxnTransit(NamedTuple):
    """The state a transition writes (Kafka's ``TxnTransitMetadata``)."""
    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: int
    partitions: frozenset          # {(topic, partition)}
    start_ms: int                  # -1: no transaction started
    last_update_ms: int


class TransactionMetadata:
    """See the module docstring. Not thread-safe: the coordinator holds its lock."""
    __slots__ = ("transactional_id", "producer_id", "last_producer_id", "producer_epoch", "last_producer_epoch",
                 "timeout_ms", "state", "pending_state", "partitions", "start_ms", "last_update_ms",
                 "failed_epoch_fence")

    def __init__(self, transactional_id, producer_id, producer_epoch, timeout_ms, state=EMPTY, *,
                 last_producer_id=NO_PRODUCER_ID, last_producer_epoch=NO_PRODUCER_EPOCH, partitions=(),
                 start_ms=-1, last_update_ms=-1):
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.last_producer_id = last_producer_id
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = last_producer_epoch
        self.timeout_ms = timeout_ms
        self.state = state
        self.pending_state = None
        self.partitions = set(partitions)
        self.start_ms = start_ms
        self.last_update_ms = last_update_ms
        self.failed_epoch_fence = False        # a fence's bumped epoch may not be written: do not bump again

    # --- compact form ---------------------------------------------------------------------------------

    @property
    def idle(self):
        return self.state in IDLE_STATES and self.pending_state is None and not self.partitions

    def pack(self):
        return _PACKED.pack(self.producer_id, self.last_producer_id, self.producer_epoch, self.last_producer_epoch,
                            self.timeout_ms, self.state, self.start_ms, self.last_update_ms)

    @classmethod
    def unpack(cls, transactional_id, packed):
        pid, last_pid, epoch, last_epoch, timeout, state, start, update = _PACKED.unpack(packed)
        return cls(transactional_id, pid, epoch, timeout, state, last_producer_id=last_pid,
                   last_producer_epoch=last_epoch, start_ms=start, last_update_ms=update)

    @staticmethod
    def packed_summary(packed):
        """``(producer id, state, start ms)`` of a packed id, without making the object."""
        pid, _, _, _, _, state, start, _ = _PACKED.unpack(packed)
        return pid, state, start

    @staticmethod
    def packed_last_update_ms(packed):
        return struct.unpack_from(">q", packed, LAST_UPDATE_OFFSET)[0]

    # --- transitions (Kafka's prepare* methods) -------------------------------------------------------

    @property
    def epoch_exhausted(self):
        return epoch_exhausted(self.producer_epoch)

    @property
    def has_pending_transaction(self):
        return self.state in (ONGOING, PREPARE_ABORT, PREPARE_COMMIT)

    def prepare_fence_producer_epoch(self):
        if self.producer_epoch == MAX_EPOCH:
            raise IllegalStateError(f"{self.transactional_id}: cannot fence epoch {MAX_EPOCH} (it would overflow)")
        epoch = self.producer_epoch if self.failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(PREPARE_EPOCH_FENCE, self.producer_id, epoch, NO_PRODUCER_EPOCH, self.timeout_ms,
                             frozenset(self.partitions), self.start_ms, self.last_update_ms)

    def prepare_increment_producer_epoch(self, timeout_ms, expected_epoch, now_ms):
        """The transit of an epoch bump, or None when ``expected_epoch`` (KIP-360, None if not given) is
        neither the current epoch nor the last one: the producer is fenced."""
        if self.epoch_exhausted:
            raise IllegalStateError(f"{self.transactional_id}: producer id {self.producer_id} has no epochs left")
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epoch, last_epoch = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last_epoch = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch     # a retry of a bump that worked
        else:
            return None
        return self._prepare(EMPTY, self.producer_id, epoch, last_epoch, timeout_ms, frozenset(), -1, now_ms)

    def prepare_producer_id_rotation(self, producer_id, timeout_ms, now_ms, record_last_epoch):
        if self.has_pending_transaction:
            raise IllegalStateError(f"{self.transactional_id}: cannot rotate the producer id of an open transaction")
        return self._prepare(EMPTY, producer_id, 0, self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
                             timeout_ms, frozenset(), -1, now_ms)

    def prepare_add_partitions(self, partitions, now_ms):
        start = now_ms if self.state in (EMPTY, COMPLETE_ABORT, COMPLETE_COMMIT) else self.start_ms
        return self._prepare(ONGOING, self.producer_id, self.producer_epoch, self.last_producer_epoch, self.timeout_ms,
                             frozenset(self.partitions) | frozenset(partitions), start, now_ms)

    def prepare_abort_or_commit(self, state, now_ms):
        return self._prepare(state, self.producer_id, self.producer_epoch, self.last_producer_epoch, self.timeout_ms,
                             frozenset(self.partitions), self.start_ms, now_ms)

    def prepare_complete(self, now_ms):
        state = COMPLETE_COMMIT if self.state == PREPARE_COMMIT else COMPLETE_ABORT
        self.failed_epoch_fence = False
        return self._prepare(state, self.producer_id, self.producer_epoch, self.last_producer_epoch, self.timeout_ms,
                             frozenset(), self.start_ms, now_ms)

    def _prepare(self, state, producer_id, epoch, last_epoch, timeout_ms, partitions, start_ms, now_ms):
        if self.pending_state is not None:
            raise IllegalStateError(f"{self.transactional_id}: transition to {STATE_NAMES[state]} while "
                                    f"{STATE_NAMES[self.pending_state]} is pending")
        if producer_id < 0 or (state != DEAD and epoch < 0):
            raise IllegalStateError(f"{self.transactional_id}: invalid producer id {producer_id} or epoch {epoch}")
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise IllegalStateError(f"{self.transactional_id}: {STATE_NAMES[state]} cannot follow "
                                    f"{STATE_NAMES[self.state]}")
        self.pending_state = state
        return TxnTransit(producer_id, self.producer_id, epoch, last_epoch, timeout_ms, state, partitions, start_ms,
                          now_ms)

    def complete(self, transit):
        """Apply ``transit`` once its record is written (Kafka's ``completeTransitionTo``)."""
        state = self.pending_state
        if state is None or state != transit.state or state in (DEAD, PREPARE_EPOCH_FENCE):
            raise IllegalStateError(f"{self.transactional_id}: cannot complete a transition to "
                                    f"{STATE_NAMES[transit.state]} (pending: {state})")
        same_producer = transit.producer_id == self.producer_id and transit.producer_epoch == self.producer_epoch
        if state == EMPTY:
            bump = transit.producer_epoch == self.producer_epoch + 1 or (
                transit.producer_epoch == 0 and transit.producer_id != self.producer_id)
            if (transit.producer_epoch != self.producer_epoch and not bump) or transit.partitions \
                    or transit.start_ms != -1:
                self._invalid(transit)
            self.timeout_ms, self.producer_epoch = transit.timeout_ms, transit.producer_epoch
            self.last_producer_epoch = transit.last_producer_epoch
            self.producer_id, self.last_producer_id = transit.producer_id, transit.last_producer_id
        elif state == ONGOING:
            if not same_producer or not self.partitions <= transit.partitions or self.timeout_ms != transit.timeout_ms:
                self._invalid(transit)
            self.start_ms = transit.start_ms
            self.partitions |= transit.partitions
        elif state in (PREPARE_COMMIT, PREPARE_ABORT):
            if not same_producer or self.partitions != transit.partitions or self.timeout_ms != transit.timeout_ms \
                    or self.start_ms != transit.start_ms:
                self._invalid(transit)
        else:                                   # CompleteCommit, CompleteAbort
            if not same_producer or self.timeout_ms != transit.timeout_ms or transit.start_ms == -1:
                self._invalid(transit)
            self.start_ms = transit.start_ms
            self.partitions.clear()
        self.last_update_ms = transit.last_update_ms
        self.pending_state = None
        self.state = state

    def _invalid(self, transit):
        raise IllegalStateError(f"{self.transactional_id}: unexpected transition of {self!r} to {transit!r}")

    def __repr__(self):
        pending = f" pending={STATE_NAMES[self.pending_state]}" if self.pending_state is not None else ""
        return (f"<TransactionMetadata {self.transactional_id!r} {STATE_NAMES[self.state]}{pending} "
                f"producer={self.producer_id}/{self.producer_epoch} partitions={len(self.partitions)}>")
