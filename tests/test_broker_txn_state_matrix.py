"""The transaction coordinator's answers, state by state: for every state a transactional id can be in and
every request a client (or, for the verify-only AddPartitionsToTxn v4 and the KIP-890 check, a broker) can
send in it, the error code and the state, producer id and epoch after, as Kafka 3.9 answers them with
transaction version 0/1 (its default; no KIP-890 part 2).

The expectations come from Kafka 3.9's ``TransactionCoordinator`` (``handleInitProducerId`` and
``prepareInitProducerIdTransit``, ``handleAddPartitionsToTransaction``, ``handleVerifyPartitionsInTransaction``,
``endTransaction``), ``TransactionMetadata`` (``prepareIncrementProducerEpoch``, ``prepareProducerIdRotation``,
``prepareFenceProducerEpoch``), ``KafkaApis`` (each ``handle*Request``: PRODUCER_FENCED is answered
INVALID_PRODUCER_EPOCH below InitProducerId v4 and below v2 of AddPartitionsToTxn, AddOffsetsToTxn and EndTxn;
an exception is answered UNKNOWN_SERVER_ERROR) and ``AddPartitionsToTxnManager`` (how Produce and
TxnOffsetCommit hand the verify-only answer on). Each cell cites the method it comes from. A cell where kmem
answers otherwise on purpose (a choice documented in ``kmem.broker.txn.coordinator``) asserts kmem's answer
and says in ``kafka=`` what Kafka answers and why kmem differs.

Requests, relative to the id's producer id P and its epoch e at the coordinator:

- ``init``: InitProducerId without producer id and epoch; ``init(cur)``, ``init(old)``, ``init(pid)``: with
  (P, e), (P, e - 1) and (another producer id, e) (KIP-360), each at v3 and v4;
- ``add(...)``: AddPartitionsToTxn v1 and v2 adding partition t-1 with (P, e), (P, e - 1), (P, e + 1) or
  another producer id; ``offsets(...)``: AddOffsetsToTxn v1 and v2;
- ``commit(...)``, ``abort(...)``: EndTxn v1 and v2;
- ``verify(in)``, ``verify(out)``, ``verify(old)``, ``verify(pid)``: AddPartitionsToTxn v4 ``verify_only`` of
  t-0 (the partition the transaction has, if any) or t-1 (one it has not);
- ``check(...)``: the KIP-890 check of a transactional Produce or TxnOffsetCommit (``verify_transaction``):
  ``check(out, old client)`` for a Produce up to v10 or a TxnOffsetCommit up to v3, which know no
  TRANSACTION_ABORTABLE.

Each cell runs every version on a transactional id of its own, brought to the state by the requests (or
records loaded at start) that bring a Kafka id there; the cells of a state share one coordinator.
"""
import contextlib
import functools
from typing import NamedTuple

import pytest

from broker_helpers import fail_appends
from kmem.broker.codes import ErrorCode
from kmem.broker.group.offsets import OFFSETS_TOPIC
from kmem.broker.log.config import INT32_MAX
from kmem.broker.log.validator import COORDINATOR
from kmem.broker.txn.metadata import EMPTY, ONGOING, TxnTransit
from kmem.broker.txn.state_log import TRANSACTION_STATE_TOPIC, transaction_log_key, transaction_log_value
from kmem.protocol import ApiKey, RequestHeader, messages
from kmem.records import build_coordinator_records
from txn_helpers import coordinator_env, describe, settle

E = ErrorCode
TIMEOUT_MS = 60000
T0, T1 = ("t", 0), ("t", 1)
EXHAUSTED = (1 << 15) - 2           # Short.MaxValue - 1: TransactionMetadata.isEpochExhausted
OTHER_PID = 1 << 40                 # never allocated here
SAME = "same"                       # the state, producer id and epoch the request found


class Cell(NamedTuple):
    error: ErrorCode                # at the newest version (PRODUCER_FENCED: see Request.fenced_below)
    after: str = SAME               # "<state> <P or new> <epoch: e, e+1 or a number>", "absent" or SAME
    kafka: str = ""                 # set when kmem answers otherwise on purpose: Kafka's answer and why


# --- the states ---------------------------------------------------------------------------------------------

class Setup:
    """What a state's setup uses: the coordinator, the markers held back (``held``), the producer ids of
    the records loaded at start (``loaded``) and pytest's ``monkeypatch``."""

    def __init__(self, coordinator, loaded, monkeypatch):
        self.coordinator = coordinator
        self.loaded = loaded
        self.monkeypatch = monkeypatch
        self.held = []

    def init(self, tid, expected=None):
        error, pid, epoch = self.coordinator.init_producer(tid, TIMEOUT_MS, expected)
        assert error == E.NONE
        return pid, epoch

    def ongoing(self, tid):
        """The id's second epoch (so that an old epoch exists) with t-0 in its transaction."""
        self.init(tid)
        pid, epoch = self.init(tid)
        assert self.coordinator.add_partitions(tid, pid, epoch, {T0}) == E.NONE
        return pid, epoch

    def end(self, tid, commit, markers="written"):
        pid, epoch = self.ongoing(tid)
        if markers == "failing":
            self.coordinator._markers.fail.add(T0)
        elif markers == "refused":           # a newer producer epoch is in the partition
            self.coordinator._markers.refused[T0] = E.INVALID_PRODUCER_EPOCH
        write_markers = self.held.append if markers == "held" else None
        assert self.coordinator.end_transaction(tid, pid, epoch, commit, write_markers) == E.NONE
        if markers in ("written", "refused"):
            settle(self.coordinator)
        return pid, epoch

    def fence(self, tid, markers="written", start=None):
        """InitProducerId while a transaction is open: it is aborted at the bumped epoch."""
        pid, epoch = start(tid) if start else self.ongoing(tid)
        if markers == "failing":
            self.coordinator._markers.fail.add(T0)
        assert self.coordinator.init_producer(tid, TIMEOUT_MS)[0] == E.CONCURRENT_TRANSACTIONS
        if markers == "written":
            settle(self.coordinator)
        return pid, epoch + 1

    def failed_fence(self, tid):
        """InitProducerId while a transaction is open, the PrepareAbort of its fence not written (a full
        disk): the bumped epoch stays in memory (Kafka's hasFailedEpochFence)."""
        pid, epoch = self.ongoing(tid)
        logs = self.coordinator.logs
        fail_appends(self.monkeypatch, logs, TRANSACTION_STATE_TOPIC, "result")
        assert self.coordinator.init_producer(tid, TIMEOUT_MS)[0] == E.NOT_COORDINATOR     # KAFKA_STORAGE_ERROR
        self.monkeypatch.undo()
        return pid, epoch + 1

    def timed_out(self, tid):
        pid, epoch = self.ongoing(tid)
        self.coordinator.clock.now += TIMEOUT_MS + 1
        return pid, epoch

    def aborted_at_timeout(self, tid):
        pid, epoch = self.timed_out(tid)
        self.coordinator.abort_timed_out_transactions()           # Kafka's abortTimedOutTransactions
        settle(self.coordinator)
        return pid, epoch + 1


def kip_360_bump(s, tid):
    pid, epoch = s.init(tid)
    return s.init(tid, (pid, epoch))


def empty_after_commit(s, tid):
    pid, epoch = s.init(tid)
    assert s.coordinator.add_partitions(tid, pid, epoch, {T0}) == E.NONE
    assert s.coordinator.end_transaction(tid, pid, epoch, True) == E.NONE
    settle(s.coordinator)
    return s.init(tid)


class State(NamedTuple):
    state: str                      # the state of the id, Kafka's unless the cells say otherwise (None: none)
    setup: object                   # (Setup, transactional id) -> (producer id, epoch)
    markers: str = "written"        # "failing" or "held": the transaction's markers are never written
    loaded: tuple = None            # (state, epoch, partitions) of a record the coordinator loads at start


STATES = {
    "absent": State(None, lambda s, tid: (OTHER_PID + 1, 0)),
    "Empty (first InitProducerId)": State("Empty", Setup.init),
    "Empty (KIP-360 epoch bump)": State("Empty", kip_360_bump),
    "Empty after CompleteCommit": State("Empty", empty_after_commit),
    "Ongoing": State("Ongoing", Setup.ongoing),
    "Ongoing past its timeout": State("Ongoing", Setup.timed_out),
    "Ongoing after a failed epoch fence": State("Ongoing", Setup.failed_fence),
    "CompleteAbort at its timeout": State("CompleteAbort", Setup.aborted_at_timeout),
    "PrepareCommit (markers failing)": State("PrepareCommit", functools.partial(Setup.end, commit=True,
                                                                                 markers="failing"), "failing"),
    "PrepareAbort (markers failing)": State("PrepareAbort", functools.partial(Setup.end, commit=False,
                                                                               markers="failing"), "failing"),
    "PrepareCommit (markers not sent yet)": State("PrepareCommit", functools.partial(Setup.end, commit=True,
                                                                                      markers="held"), "held"),
    "PrepareAbort (epoch fence, markers failing)": State("PrepareAbort", functools.partial(Setup.fence,
                                                                                            markers="failing"),
                                                         "failing"),
    "CompleteCommit": State("CompleteCommit", functools.partial(Setup.end, commit=True)),
    # Kafka's id stays in PrepareCommit (its marker channel gives up); kmem's completes: see the cells
    "PrepareCommit (markers refused for a newer epoch)": State(
        "CompleteCommit", functools.partial(Setup.end, commit=True, markers="refused")),
    "CompleteAbort": State("CompleteAbort", functools.partial(Setup.end, commit=False)),
    "Empty at an exhausted epoch": State("Empty", lambda s, tid: (s.loaded[tid], EXHAUSTED),
                                         loaded=(EMPTY, EXHAUSTED, ())),
    "Ongoing at an exhausted epoch": State("Ongoing", lambda s, tid: (s.loaded[tid], EXHAUSTED),
                                           loaded=(ONGOING, EXHAUSTED, (T0,))),
    "CompleteAbort at Short.MaxValue (fenced)": State(
        "CompleteAbort", lambda s, tid: s.fence(tid, start=lambda t: (s.loaded[t], EXHAUSTED)),
        loaded=(ONGOING, EXHAUSTED, (T0,))),
}


# --- the requests -------------------------------------------------------------------------------------------

def header(api, version):
    return RequestHeader(api, version, 1, "c")


def init_request(coordinator, tid, pid, epoch, version, expected):
    """``(error, (producer id, epoch) answered)``."""
    producer_id, producer_epoch = (pid, epoch) if expected else (-1, -1)
    response = coordinator.init_producer_id(header(ApiKey.INIT_PRODUCER_ID, version), messages.InitProducerIdRequest(
        transactional_id=tid, transaction_timeout_ms=TIMEOUT_MS, producer_id=producer_id,
        producer_epoch=producer_epoch))
    return response.error_code, (response.producer_id, response.producer_epoch)


def add_request(coordinator, tid, pid, epoch, version):
    Request = messages.AddPartitionsToTxnRequest
    response = coordinator.add_partitions_to_txn(header(ApiKey.ADD_PARTITIONS_TO_TXN, version), Request(
        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[Request.AddPartitionsToTxnTopic(name="t", partitions=[T1[1]])]))
    return response.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code


def offsets_request(coordinator, tid, pid, epoch, version):
    return coordinator.add_offsets_to_txn(header(ApiKey.ADD_OFFSETS_TO_TXN, version), messages.AddOffsetsToTxnRequest(
        transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id="g")).error_code


def end_request(coordinator, tid, pid, epoch, version, commit):
    return coordinator.end_txn(header(ApiKey.END_TXN, version), messages.EndTxnRequest(
        transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit)).error_code


def verify_request(coordinator, tid, pid, epoch, version, partition):
    Request = messages.AddPartitionsToTxnRequest
    response = coordinator.add_partitions_to_txn(header(ApiKey.ADD_PARTITIONS_TO_TXN, version), Request(
        transactions=[Request.AddPartitionsToTxnTransaction(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, verify_only=True,
            topics=[Request.AddPartitionsToTxnTopic(name="t", partitions=[partition[1]])])]))
    return response.results_by_transaction[0].topic_results[0].results_by_partition[0].partition_error_code


def check(coordinator, tid, pid, epoch, version, partition, abortable):
    return coordinator.verify_transaction(tid, pid, epoch, *partition, transaction_abortable=abortable)


class Request(NamedTuple):
    run: object                     # (coordinator, tid, pid, epoch, version) -> error (init: with its answer)
    producer: object                # (P, e) -> the (producer id, epoch) the request names
    versions: tuple                 # each is run
    fenced_below: int = 0           # below it, KafkaApis answers PRODUCER_FENCED as INVALID_PRODUCER_EPOCH


def cur(pid, epoch):
    return pid, epoch


def old(pid, epoch):
    return pid, epoch - 1


def new(pid, epoch):
    return pid, epoch + 1


def other_pid(pid, epoch):
    return OTHER_PID, epoch


REQUESTS = {
    "init": Request(functools.partial(init_request, expected=False), cur, (3, 4), 4),
    **{f"init({name})": Request(functools.partial(init_request, expected=True), producer, (3, 4), 4)
       for name, producer in (("cur", cur), ("old", old), ("pid", other_pid))},
    **{f"add({name})": Request(add_request, producer, (1, 2), 2)
       for name, producer in (("cur", cur), ("old", old), ("new", new), ("pid", other_pid))},
    "offsets(cur)": Request(offsets_request, cur, (1, 2), 2),
    "offsets(old)": Request(offsets_request, old, (1, 2), 2),
    **{f"{name}({which})": Request(functools.partial(end_request, commit=name == "commit"), producer, (1, 2), 2)
       for name in ("commit", "abort")
       for which, producer in (("cur", cur), ("old", old), ("new", new), ("pid", other_pid))},
    "verify(in)": Request(functools.partial(verify_request, partition=T0), cur, (4, 5)),
    "verify(out)": Request(functools.partial(verify_request, partition=T1), cur, (4, 5)),
    "verify(old)": Request(functools.partial(verify_request, partition=T0), old, (4, 5)),
    "verify(pid)": Request(functools.partial(verify_request, partition=T0), other_pid, (4, 5)),
    "check(in)": Request(functools.partial(check, partition=T0, abortable=True), cur, (None,)),
    "check(out)": Request(functools.partial(check, partition=T1, abortable=True), cur, (None,)),
    "check(out, old client)": Request(functools.partial(check, partition=T1, abortable=False), cur, (None,)),
    "check(old)": Request(functools.partial(check, partition=T0, abortable=True), old, (None,)),
}


# --- what Kafka 3.9 answers ----------------------------------------------------------------------------------

FENCED, MAPPING, CONCURRENT = E.PRODUCER_FENCED, E.INVALID_PRODUCER_ID_MAPPING, E.CONCURRENT_TRANSACTIONS

# No metadata: getTransactionState answers None.
ABSENT = {
    # handleInitProducerId: new TransactionMetadata at NO_PRODUCER_EPOCH, prepareIncrementProducerEpoch -> 0;
    # with an expected producer (KIP-360, the id expired), isValidProducerId accepts any at NO_PRODUCER_EPOCH
    "init": Cell(E.NONE, "Empty new 0"),
    "init(cur)": Cell(E.NONE, "Empty new 0"),
    "init(pid)": Cell(E.NONE, "Empty new 0"),
    "init(old)": Cell(E.INVALID_REQUEST),       # handleInitProducerIdRequest: a producer id with epoch -1
    # handleAddPartitionsToTransaction, endTransaction, handleVerifyPartitionsInTransaction: None
    **{name: Cell(MAPPING) for name in REQUESTS if not name.startswith("init")},
}

# A producer that is not the id's: the producer id is compared first, then the epoch (EndTxn from a client:
# strict equality), in handleAddPartitionsToTransaction, endTransaction and handleVerifyPartitionsInTransaction;
# AddPartitionsToTxnManager hands a PRODUCER_FENCED verification on as INVALID_PRODUCER_EPOCH.
WRONG_PRODUCER = {
    **{f"{request}({which})": Cell(FENCED) for request in ("add", "commit", "abort") for which in ("old", "new")},
    **{f"{request}(pid)": Cell(MAPPING) for request in ("add", "commit", "abort", "verify")},
    "offsets(old)": Cell(FENCED), "verify(old)": Cell(FENCED), "check(old)": Cell(E.INVALID_PRODUCER_EPOCH),
}


def idle(commit, abort):
    """Empty, CompleteCommit, CompleteAbort: no transaction open. EndTxn per endTransaction's state match
    (``commit``, ``abort``: the retry of the outcome reached is NONE, anything else INVALID_TXN_STATE)."""
    return {
        **WRONG_PRODUCER,
        "add(cur)": Cell(E.NONE, "Ongoing P e"),          # prepareAddPartitions: a new transaction
        "offsets(cur)": Cell(E.NONE, "Ongoing P e"),
        "commit(cur)": Cell(commit), "abort(cur)": Cell(abort),
        # handleVerifyPartitionsInTransaction: no partition is in the transaction; TRANSACTION_ABORTABLE is
        # INVALID_TXN_STATE to the clients that do not know it (AddPartitionsToTxnManager, defaultError)
        "verify(in)": Cell(E.TRANSACTION_ABORTABLE), "verify(out)": Cell(E.TRANSACTION_ABORTABLE),
        "check(in)": Cell(E.TRANSACTION_ABORTABLE), "check(out)": Cell(E.TRANSACTION_ABORTABLE),
        "check(out, old client)": Cell(E.INVALID_TXN_STATE),
    }


def bump_or_fenced(old):
    """InitProducerId from an idle state (prepareInitProducerIdTransit -> prepareIncrementProducerEpoch):
    ``old`` answers the request naming the previous epoch."""
    return {"init": Cell(E.NONE, "Empty P e+1"), "init(cur)": Cell(E.NONE, "Empty P e+1"), "init(old)": old,
            "init(pid)": Cell(FENCED)}                # isValidProducerId


EMPTY_STATE = idle(E.INVALID_TXN_STATE, E.INVALID_TXN_STATE)    # endTransaction: Empty
COMPLETE_COMMIT = idle(E.NONE, E.INVALID_TXN_STATE)
COMPLETE_ABORT = idle(E.INVALID_TXN_STATE, E.NONE)
# lastProducerEpoch is NO_PRODUCER_EPOCH (no KIP-360 bump, or cleared by a fence): the old epoch is fenced
OLD_FENCED = Cell(FENCED)

# Ongoing: InitProducerId of any producer of the id (isValidProducerId compares the producer id only) fences
# it, prepareFenceProducerEpoch, and aborts the transaction at the bumped epoch (endTransaction with
# isFromClient = false), answering CONCURRENT_TRANSACTIONS; the client retries.
ONGOING_STATE = {
    **WRONG_PRODUCER,
    "init": Cell(CONCURRENT, "CompleteAbort P e+1"), "init(cur)": Cell(CONCURRENT, "CompleteAbort P e+1"),
    "init(old)": Cell(CONCURRENT, "CompleteAbort P e+1"), "init(pid)": Cell(FENCED),
    "add(cur)": Cell(E.NONE, "Ongoing P e"), "offsets(cur)": Cell(E.NONE, "Ongoing P e"),
    "commit(cur)": Cell(E.NONE, "CompleteCommit P e"), "abort(cur)": Cell(E.NONE, "CompleteAbort P e"),
    "verify(in)": Cell(E.NONE), "verify(out)": Cell(E.TRANSACTION_ABORTABLE),
    "check(in)": Cell(E.NONE), "check(out)": Cell(E.TRANSACTION_ABORTABLE),
    "check(out, old client)": Cell(E.INVALID_TXN_STATE),
}

# PrepareCommit / PrepareAbort while the markers are written: prepareComplete has set the pending state.
# prepareInitProducerIdTransit checks pendingTransitionInProgress before the producer; endTransaction before the
# state (so the other outcome is CONCURRENT_TRANSACTIONS too); handleVerifyPartitionsInTransaction checks the
# state (PrepareCommit, PrepareAbort).
ENDING = {
    **WRONG_PRODUCER,
    **{name: Cell(CONCURRENT) for name in ("init", "init(cur)", "init(old)", "init(pid)", "add(cur)",
                                           "offsets(cur)", "commit(cur)", "abort(cur)", "verify(in)", "verify(out)",
                                           "check(in)", "check(out)", "check(out, old client)")},
}

# kmem.broker.txn.coordinator: a request adding partitions that finds the markers of the previous transaction
# still to write (no thread writing them, none failed) writes them itself first, instead of answering
# CONCURRENT_TRANSACTIONS and leaving them to the marker channel: clients retry that answer only after 20 ms.
MARKERS_WRITTEN_BY_THE_REQUEST = ("CONCURRENT_TRANSACTIONS, PrepareCommit unchanged (markers to the marker "
                                  "channel); kmem writes the markers and CompleteCommit on the request's thread")
HELD = {
    **ENDING,
    "add(cur)": Cell(E.NONE, "Ongoing P e", MARKERS_WRITTEN_BY_THE_REQUEST),
    "offsets(cur)": Cell(E.NONE, "Ongoing P e", MARKERS_WRITTEN_BY_THE_REQUEST),
    **{name: Cell(error, "CompleteCommit P e", f"{error.name}, PrepareCommit unchanged; kmem wrote the markers "
                                                "first, then checked the producer")
       for name, error in (("add(old)", FENCED), ("add(new)", FENCED), ("add(pid)", MAPPING),
                           ("offsets(old)", FENCED))},
}

# kmem.broker.txn.coordinator's MARKER_DONE: a partition refusing the marker for a newer producer epoch needs none
MARKERS_REFUSED = ("Kafka's TransactionMarkerRequestCompletionHandler stops there and leaves the transaction to "
                   "the coordinator that took over; a single node has none, so kmem completes it")

# KIP-360's epoch exhaustion (isEpochExhausted: epoch >= Short.MaxValue - 1): InitProducerId moves the id to a new
# producer id at epoch 0 (prepareProducerIdRotation) when no epoch is expected or the expected one is the
# current one; an expected older epoch reaches prepareIncrementProducerEpoch, which throws
# IllegalStateException on an exhausted epoch: KafkaApis answers it UNKNOWN_SERVER_ERROR.
ROTATION = {"init": Cell(E.NONE, "Empty new 0"), "init(cur)": Cell(E.NONE, "Empty new 0"),
            "init(old)": Cell(E.UNKNOWN_SERVER_ERROR), "init(pid)": Cell(FENCED)}
OVERFLOW = ("add(new)", "commit(new)", "abort(new)")      # epoch Short.MaxValue + 1: no request carries it

EXPECTED = {
    "absent": ABSENT,
    "Empty (first InitProducerId)": {**EMPTY_STATE, **bump_or_fenced(Cell(E.INVALID_REQUEST))},  # epoch -1
    # prepareIncrementProducerEpoch: the expected epoch is lastProducerEpoch, a retry: the current epoch again
    "Empty (KIP-360 epoch bump)": {**EMPTY_STATE, **bump_or_fenced(Cell(E.NONE))},
    "Empty after CompleteCommit": {**EMPTY_STATE, **bump_or_fenced(OLD_FENCED)},
    "Ongoing": ONGOING_STATE,
    # only abortTimedOutTransactions looks at the timeout: until it runs, the transaction is Ongoing
    "Ongoing past its timeout": ONGOING_STATE,
    # prepareFenceProducerEpoch does not bump again after a failed fence (hasFailedEpochFence): the epoch in
    # memory, never answered, is the one the fence writes; the producer that was fenced is old
    "Ongoing after a failed epoch fence": {**ONGOING_STATE, **{name: Cell(CONCURRENT, "CompleteAbort P e")
                                                               for name in ("init", "init(cur)", "init(old)")}},
    # abortTimedOutTransactions: prepareFenceProducerEpoch and an abort at the bumped epoch; the producer that
    # timed out is old
    "CompleteAbort at its timeout": {**COMPLETE_ABORT, **bump_or_fenced(OLD_FENCED)},
    "PrepareCommit (markers failing)": ENDING,
    "PrepareAbort (markers failing)": ENDING,
    "PrepareCommit (markers not sent yet)": HELD,
    # InitProducerId's fence: the retry waits for the abort at the bumped epoch; the fenced producer is old
    "PrepareAbort (epoch fence, markers failing)": ENDING,
    "CompleteCommit": {**COMPLETE_COMMIT, **bump_or_fenced(OLD_FENCED)},
    "PrepareCommit (markers refused for a newer epoch)": {
        name: cell._replace(kafka=f"{ENDING[name].error.name}, PrepareCommit unchanged: {MARKERS_REFUSED}")
        for name, cell in {**COMPLETE_COMMIT, **bump_or_fenced(OLD_FENCED)}.items()},
    "CompleteAbort": {**COMPLETE_ABORT, **bump_or_fenced(OLD_FENCED)},
    "Empty at an exhausted epoch": {**EMPTY_STATE, **ROTATION},
    # prepareFenceProducerEpoch refuses only Short.MaxValue itself: the fence takes the last epoch
    "Ongoing at an exhausted epoch": ONGOING_STATE,
    "CompleteAbort at Short.MaxValue (fenced)": {name: cell for name, cell in {**COMPLETE_ABORT, **ROTATION}.items()
                                                 if name not in OVERFLOW},
}
CELLS = [(state, request) for state, cells in EXPECTED.items() for request in cells]


# --- running a cell -----------------------------------------------------------------------------------------

def seed(logs, make, state, tids):
    """Records putting each of ``tids`` in ``state.loaded``, written to ``__transaction_state`` before the
    coordinator starts (as Kafka's coordinator finds them when it loads the partition): ``{tid: producer id}``."""
    seeder = make(state_log_partitions=1)
    assert seeder.create_state_topic()
    seeder.close()
    kafka_state, epoch, partitions = state.loaded
    now = seeder.clock()
    pids = {}
    for tid in tids:
        pids[tid] = logs.allocate_producer_id()
        transit = TxnTransit(pids[tid], -1, epoch, -1, TIMEOUT_MS, kafka_state, frozenset(partitions),
                             now if partitions else -1, now)
        batch = build_coordinator_records([(transaction_log_key(tid), transaction_log_value(transit))], now)
        assert logs.get_partition(TRANSACTION_STATE_TOPIC, 0).append(batch, origin=COORDINATOR).error_code == E.NONE
    return pids


def observed(coordinator, tid, pid):
    """``(state or "absent", "P" or "new", epoch)`` of ``tid``, once the markers are written."""
    described = describe(coordinator, tid)
    if described.error_code == E.TRANSACTIONAL_ID_NOT_FOUND:
        return "absent", None, None
    assert described.error_code == E.NONE
    return described.transaction_state, "P" if described.producer_id == pid else "new", described.producer_epoch


def expected_after(cell, state, epoch):
    if cell.after == SAME:
        return (state, "P", epoch) if state else ("absent", None, None)
    if cell.after == "absent":
        return "absent", None, None
    state, pid, epoch_text = cell.after.split()
    return state, pid, epoch + int(epoch_text[2:] or 0) if epoch_text.startswith("e") else int(epoch_text)


def answered(cell, version, fenced_below):
    """KafkaApis answers PRODUCER_FENCED as INVALID_PRODUCER_EPOCH to versions that do not know it."""
    if cell.error == FENCED and version is not None and version < fenced_below:
        return E.INVALID_PRODUCER_EPOCH
    return cell.error


def cell_tid(request_name, version):
    return f"{request_name} v{version}"


@pytest.fixture(scope="module")
def coordinators(tmp_path_factory):
    """``get(state name)``: ``(coordinator, {tid: loaded producer id})``, one coordinator per state, made on its
    first use: each cell uses transactional ids of its own (``cell_tid``). No timed out transaction is aborted
    but by a setup (the timer's check would be every INT32_MAX ms)."""
    made = {}
    with contextlib.ExitStack() as stack:
        def get(state_name):
            if state_name not in made:
                logs, make = stack.enter_context(coordinator_env(tmp_path_factory.mktemp("txn")))
                logs.create_topic(OFFSETS_TOPIC, 1)
                state = STATES[state_name]
                tids = [cell_tid(name, version) for name in EXPECTED[state_name]
                        for version in REQUESTS[name].versions]
                loaded = seed(logs, make, state, tids) if state.loaded else {}
                coordinator = make(state_log_partitions=1, abort_timed_out_interval_ms=INT32_MAX)
                assert coordinator.create_state_topic()
                made[state_name] = coordinator, loaded
            return made[state_name]
        yield get


@pytest.mark.parametrize("state_name, request_name", CELLS)
def test_the_coordinator_answers_as_kafka(coordinators, monkeypatch, state_name, request_name):
    state, request, cell = STATES[state_name], REQUESTS[request_name], EXPECTED[state_name][request_name]
    coordinator, loaded = coordinators(state_name)
    setup = Setup(coordinator, loaded, monkeypatch)
    for version in request.versions:
        tid = cell_tid(request_name, version)
        pid, epoch = state.setup(setup, tid)
        assert observed(coordinator, tid, pid) == expected_after(Cell(E.NONE), state.state, epoch)
        result = request.run(coordinator, tid, *request.producer(pid, epoch), version)
        error, answer = result if isinstance(result, tuple) else (result, None)
        if state.markers == "written":
            settle(coordinator)
        after = observed(coordinator, tid, pid)
        assert (error, after) == (answered(cell, version, request.fenced_below),
                                  expected_after(cell, state.state, epoch)), f"v{version} {cell.kafka}"
        if answer is not None:           # InitProducerId answers the producer id and epoch it wrote
            assert answer == ((coordinator._peek(tid).producer_id, after[2]) if error == E.NONE else (-1, -1))


def test_the_table_has_every_request_in_every_state():
    for state, cells in EXPECTED.items():
        missing = set(REQUESTS) - set(cells) - (set(OVERFLOW) if "Short.MaxValue" in state else set())
        assert not missing, state
    assert set(EXPECTED) == set(STATES)


def test_kip_360_rotation_is_answered_again_to_the_previous_producer(tmp_path):
    """A producer at the exhausted epoch gets a new producer id; its retry (the answer was lost) gets the same
    one (isValidProducerId: the previous producer id with an exhausted epoch; prepareIncrementProducerEpoch: the
    lastProducerEpoch), an older epoch of the previous producer id is fenced."""
    with coordinator_env(tmp_path) as (logs, make):
        pid = seed(logs, make, STATES["Empty at an exhausted epoch"], ["tx"])["tx"]
        coordinator = make(state_log_partitions=1)
        error, new_pid, epoch = coordinator.init_producer("tx", TIMEOUT_MS, (pid, EXHAUSTED))
        assert (error, epoch) == (E.NONE, 0) and new_pid != pid
        assert coordinator.init_producer("tx", TIMEOUT_MS, (pid, EXHAUSTED)) == (E.NONE, new_pid, 0)
        assert coordinator.init_producer("tx", TIMEOUT_MS, (pid, EXHAUSTED - 1))[0] == FENCED
        assert coordinator.init_producer("tx", TIMEOUT_MS, (new_pid, 0)) == (E.NONE, new_pid, 1)
