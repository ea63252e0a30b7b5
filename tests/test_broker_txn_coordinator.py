"""The transaction coordinator on its own: Kafka 3.9's state machine and error codes, the
``__transaction_state`` records byte for byte, loading them back (a PrepareCommit completes after a restart),
timeouts and expiry, with the recording double of ``TxnMarkerWriter`` of ``txn_helpers``."""
import contextlib
import struct
import sys
import threading
import tracemalloc

import pytest

from broker_helpers import wait_for
from txn_helpers import begin, coordinator_env, describe, settle
from kmem.broker.codes import ErrorCode
from kmem.broker.group.offsets import partition_for
from kmem.broker.log.unified_log import batches_from_start
from kmem.broker.txn import coordinator as coordinator_module
from kmem.broker.txn.coordinator import TxnConfig
from kmem.broker.txn.metadata import (
    COMPLETE_ABORT, COMPLETE_COMMIT, EMPTY, ONGOING, PREPARE_COMMIT, TransactionMetadata, TxnTransit,
)
from kmem.broker.txn.state_log import (
    TRANSACTION_STATE_TOPIC, read_key, read_value, transaction_log_key, transaction_log_value,
)
from kmem.errors import ConfigError, CorruptRecordError, IllegalStateError
from kmem.protocol import ApiKey, RequestHeader, decode_request, encode_request, messages

E = ErrorCode


@pytest.fixture
def env(tmp_path):
    with coordinator_env(tmp_path) as made:
        yield made


# --- the state machine -----------------------------------------------------------------------------------

def test_transitions_follow_kafka_and_refuse_the_others():
    meta = TransactionMetadata("tx", 7, -1, 1000, last_update_ms=0)
    meta.complete(meta.prepare_increment_producer_epoch(1000, None, 1))
    assert (meta.state, meta.producer_epoch) == (EMPTY, 0)
    with pytest.raises(IllegalStateError):
        meta.prepare_abort_or_commit(PREPARE_COMMIT, 2)          # Empty -> PrepareCommit is not a transition
    meta.complete(meta.prepare_add_partitions({("t", 0)}, 2))
    assert (meta.state, meta.start_ms, meta.partitions) == (ONGOING, 2, {("t", 0)})
    transit = meta.prepare_abort_or_commit(PREPARE_COMMIT, 3)
    with pytest.raises(IllegalStateError):
        meta.prepare_add_partitions({("t", 1)}, 3)               # a transition is pending
    meta.complete(transit)
    meta.complete(meta.prepare_complete(4))
    assert (meta.state, meta.partitions, meta.idle) == (COMPLETE_COMMIT, set(), True)
    copy = TransactionMetadata.unpack("tx", meta.pack())
    assert (copy.producer_id, copy.producer_epoch, copy.state, copy.start_ms, copy.last_update_ms) == (7, 0, 4, 2, 4)


def test_kip_360_epoch_bumps():
    meta = TransactionMetadata("tx", 7, 3, 1000, last_update_ms=0)
    assert meta.prepare_increment_producer_epoch(1000, 2, 1) is None          # neither current nor last: fenced
    transit = meta.prepare_increment_producer_epoch(1000, 3, 1)
    assert (transit.producer_epoch, transit.last_producer_epoch) == (4, 3)
    meta.complete(transit)
    retry = meta.prepare_increment_producer_epoch(1000, 3, 2)                 # the retry of the bump
    assert (retry.producer_epoch, retry.last_producer_epoch) == (4, 3)


# --- the records -------------------------------------------------------------------------------------------

def test_records_are_kafkas_layout():
    assert transaction_log_key("tx") == b"\x00\x00\x00\x02tx"
    transit = TxnTransit(5, -1, 2, -1, 60000, ONGOING, frozenset({("b", 1), ("a", 0), ("b", 0)}), 111, 222)
    value = transaction_log_value(transit)
    expected = struct.pack(">hqhib", 0, 5, 2, 60000, 1) + struct.pack(">i", 2) \
        + b"\x00\x01a" + struct.pack(">ii", 1, 0) + b"\x00\x01b" + struct.pack(">iii", 2, 0, 1) \
        + struct.pack(">qq", 222, 111)
    assert value == expected
    assert read_key(transaction_log_key("tx")) == "tx"
    record = read_value(value)
    assert (record.producer_id, record.producer_epoch, record.state, record.partitions, record.last_update_ms,
            record.start_ms) == (5, 2, ONGOING, transit.partitions, 222, 111)
    empty = transaction_log_value(TxnTransit(5, -1, 3, -1, 60000, EMPTY, frozenset(), -1, 333))
    assert empty == struct.pack(">hqhibiqq", 0, 5, 3, 60000, 0, -1, 333, -1)
    assert read_value(None) is None


def test_flexible_value_v1_is_read():
    # v1 (Kafka 4 with transaction.version 1): compact arrays and strings, tagged fields (one of them set)
    value = struct.pack(">hqhib", 1, 9, 1, 5000, 2) + bytes([2, 2]) + b"t" + bytes([2]) + struct.pack(">i", 4) \
        + bytes([0]) + struct.pack(">qq", 20, 10) + bytes([1, 0, 8]) + struct.pack(">q", 3)
    record = read_value(value)
    assert (record.producer_id, record.state, record.partitions, record.start_ms) == (9, 2, {("t", 4)}, 10)


# --- the coordinator ---------------------------------------------------------------------------------------

def test_init_add_end_commit_writes_markers_and_completes(env):
    logs, make = env
    coordinator = make()
    pid, epoch = begin(coordinator, partitions=(("t", 0), ("t", 2)))
    assert coordinator.verify_transaction("tx", pid, epoch, "t", 0) == E.NONE
    assert coordinator.verify_transaction("tx", pid, epoch, "t", 1) == E.INVALID_TXN_STATE
    assert coordinator.end_transaction("tx", pid, epoch, True) == E.NONE
    settle(coordinator)
    assert coordinator._markers.writes == [(pid, epoch, True, (("t", 0), ("t", 2)))]
    assert describe(coordinator, "tx").transaction_state == "CompleteCommit"
    assert coordinator.end_transaction("tx", pid, epoch, True) == E.NONE             # a retry
    assert coordinator.end_transaction("tx", pid, epoch, False) == E.INVALID_TXN_STATE
    assert coordinator.verify_transaction("tx", pid, epoch, "t", 0) == E.INVALID_TXN_STATE


def test_wrong_requests_get_kafkas_errors(env):
    logs, make = env
    coordinator = make(max_timeout_ms=1000)
    assert coordinator.init_producer("tx", 1001)[0] == E.INVALID_TRANSACTION_TIMEOUT
    assert coordinator.init_producer("", 100)[0] == E.INVALID_REQUEST
    # no __transaction_state yet: no coordinator for any id (the client looks it up again, which creates it)
    assert coordinator.add_partitions("nobody", 1, 0, {("t", 0)}) == E.NOT_COORDINATOR
    assert coordinator.end_transaction("nobody", 1, 0, True) == E.NOT_COORDINATOR
    assert (describe(coordinator, "nobody").error_code, describe(coordinator, "").error_code) == (
        E.NOT_COORDINATOR, E.INVALID_REQUEST)
    assert coordinator.create_state_topic()
    assert coordinator.add_partitions("nobody", 1, 0, {("t", 0)}) == E.INVALID_PRODUCER_ID_MAPPING
    assert describe(coordinator, "nobody").error_code == E.TRANSACTIONAL_ID_NOT_FOUND
    error, pid, epoch = coordinator.init_producer("tx", 1000)
    assert coordinator.end_transaction("tx", pid, epoch, True) == E.INVALID_TXN_STATE    # nothing open
    assert coordinator.add_partitions("tx", pid + 1, epoch, {("t", 0)}) == E.INVALID_PRODUCER_ID_MAPPING
    assert coordinator.add_partitions("tx", pid, epoch + 1, {("t", 0)}) == E.PRODUCER_FENCED
    header = RequestHeader(ApiKey.ADD_PARTITIONS_TO_TXN, 1, 1, "c")
    request = messages.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="tx", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch + 1,
        v3_and_below_topics=[messages.AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name="t", partitions=[0])])
    result = coordinator.add_partitions_to_txn(header, request).results_by_topic_v3_and_below[0]
    assert result.results_by_partition[0].partition_error_code == E.INVALID_PRODUCER_EPOCH     # v0-1: old code
    request.v3_and_below_topics.append(messages.AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name="nope",
                                                                                                  partitions=[0]))
    header.api_version = 3
    results = {t.name: t.results_by_partition[0].partition_error_code
               for t in coordinator.add_partitions_to_txn(header, request).results_by_topic_v3_and_below}
    assert results == {"t": E.OPERATION_NOT_ATTEMPTED, "nope": E.UNKNOWN_TOPIC_OR_PARTITION}


def test_a_new_producer_fences_the_old_one_and_aborts_its_transaction_first(env):
    logs, make = env
    coordinator = make()
    pid, epoch = begin(coordinator)
    error, _, _ = coordinator.init_producer("tx", 60000)
    assert error == E.CONCURRENT_TRANSACTIONS                          # the open transaction is being aborted
    settle(coordinator)
    assert coordinator._markers.writes == [(pid, epoch + 1, False, (("t", 0),))]     # abort at the fenced epoch
    error, pid2, epoch2 = coordinator.init_producer("tx", 60000)
    assert (error, pid2, epoch2) == (E.NONE, pid, epoch + 2)
    assert coordinator.add_partitions("tx", pid, epoch, {("t", 1)}) == E.PRODUCER_FENCED
    assert coordinator.end_transaction("tx", pid, epoch, True) == E.PRODUCER_FENCED
    assert coordinator.verify_transaction("tx", pid, epoch, "t", 0) == E.INVALID_PRODUCER_EPOCH


def test_exhausted_epoch_moves_to_a_new_producer_id(env):
    logs, make = env
    coordinator = make()
    error, pid, _ = coordinator.init_producer("tx", 60000)
    meta = coordinator._get("tx")
    meta.producer_epoch = 32766
    coordinator._release(meta)
    error, pid2, epoch2 = coordinator.init_producer("tx", 60000)
    assert error == E.NONE and pid2 != pid and epoch2 == 0


def test_timed_out_transaction_is_aborted_and_its_producer_fenced(env):
    logs, make = env
    coordinator = make(abort_timed_out_interval_ms=20)
    error, pid, epoch = coordinator.init_producer("tx", 1000)
    assert coordinator.add_partitions("tx", pid, epoch, {("t", 1)}) == E.NONE
    coordinator.clock.now += 1001
    wait_for(lambda: describe(coordinator, "tx").transaction_state == "CompleteAbort", "the timed out abort")
    assert coordinator._markers.writes == [(pid, epoch + 1, False, (("t", 1),))]
    assert coordinator.end_transaction("tx", pid, epoch, True) == E.PRODUCER_FENCED


def test_failed_markers_are_written_again(env):
    logs, make = env
    coordinator = make()
    coordinator._markers.fail.add(("t", 2))
    pid, epoch = begin(coordinator, partitions=(("t", 0), ("t", 2)))
    assert coordinator.end_transaction("tx", pid, epoch, False) == E.NONE
    wait_for(lambda: len(coordinator._markers.writes) >= 2, "a retry")
    state = describe(coordinator, "tx")
    assert state.transaction_state == "PrepareAbort" and [(t.topic, t.partitions) for t in state.topics] == [
        ("t", [2])]                                                  # only the partition still without its marker
    assert coordinator.add_partitions("tx", pid, epoch, {("t", 0)}) == E.CONCURRENT_TRANSACTIONS
    coordinator._markers.fail.clear()
    settle(coordinator)
    assert coordinator._markers.writes[-1] == (pid, epoch, False, (("t", 2),))
    assert describe(coordinator, "tx").transaction_state == "CompleteAbort"


@contextlib.contextmanager
def timer_held(coordinator):
    """The timer thread is busy (with a task of the test's) for the block: what it would run waits."""
    timer_busy, release = threading.Event(), threading.Event()
    coordinator._timer.schedule(0, lambda: (timer_busy.set(), release.wait(60)))
    try:
        assert timer_busy.wait(10)
        yield
    finally:
        release.set()


def raise_once(monkeypatch, target, name):
    """``target.name`` raises RuntimeError at its first call, then behaves; returns the list of its calls."""
    original, calls = getattr(target, name), []

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("a bug in the marker path")
        return original(*args, **kwargs)
    monkeypatch.setattr(target, name, flaky)
    return calls


def test_a_marker_writer_that_raises_on_the_timer_is_tried_again(env, monkeypatch, caplog):
    """An unexpected exception counts as a failed write of every partition still missing: the job is tried
    again after its backoff (before, it was never rescheduled and the id answered CONCURRENT_TRANSACTIONS)."""
    logs, make = env
    coordinator = make()
    calls = raise_once(monkeypatch, coordinator._markers, "write")
    pid, epoch = begin(coordinator, partitions=(("t", 0), ("t", 1)))
    assert coordinator.end_transaction("tx", pid, epoch, True) == E.NONE
    settle(coordinator)
    assert len(calls) == 2 and coordinator._markers.writes == [(pid, epoch, True, (("t", 0), ("t", 1)))]
    assert describe(coordinator, "tx").transaction_state == "CompleteCommit"
    assert [r for r in caplog.records if r.exc_info and "a bug in the marker path" in str(r.exc_info[1])]
    assert coordinator.add_partitions("tx", pid, epoch, {("t", 2)}) == E.NONE


def test_a_complete_write_that_raises_is_tried_again(env, monkeypatch):
    logs, make = env
    coordinator = make()
    pid, epoch = begin(coordinator)
    write, raised = coordinator._write, []

    def write_raising_once_for_complete(meta, transit, keep_pending=False):
        if transit.state == COMPLETE_ABORT and not raised:
            raised.append(transit)
            raise RuntimeError("a bug in the completion")
        return write(meta, transit, keep_pending)
    monkeypatch.setattr(coordinator, "_write", write_raising_once_for_complete)
    assert coordinator.end_transaction("tx", pid, epoch, False) == E.NONE
    settle(coordinator)
    assert raised and describe(coordinator, "tx").transaction_state == "CompleteAbort"


def test_a_marker_writer_that_raises_on_a_request_thread_is_tried_again(env, monkeypatch):
    """The next transaction's AddPartitionsToTxn writing the markers itself: the exception does not reach the
    request, which is answered CONCURRENT_TRANSACTIONS, and the timer writes them after the backoff."""
    logs, make = env
    coordinator = make()
    calls = raise_once(monkeypatch, coordinator._markers, "write")
    with timer_held(coordinator):
        pid, epoch = begin(coordinator)
        assert coordinator.end_transaction("tx", pid, epoch, True) == E.NONE
        assert coordinator.add_partitions("tx", pid, epoch, {("t", 1)}) == E.CONCURRENT_TRANSACTIONS
        assert len(calls) == 1 and coordinator.markers_pending() == 1
    settle(coordinator)
    assert coordinator._markers.writes == [(pid, epoch, True, (("t", 0),))]
    assert coordinator.add_partitions("tx", pid, epoch, {("t", 1)}) == E.NONE


def test_the_next_transaction_writes_the_markers_the_timer_has_not_written(env):
    """A client starts its next transaction as soon as EndTxn is answered: when its AddPartitionsToTxn comes
    before the timer thread wrote the last transaction's markers, the request writes them and is answered NONE,
    not CONCURRENT_TRANSACTIONS (which librdkafka and the Java client retry only after 20 ms)."""
    logs, make = env
    coordinator = make()
    with timer_held(coordinator):
        pid, epoch = begin(coordinator)
        assert coordinator.end_transaction("tx", pid, epoch, True) == E.NONE
        assert coordinator.add_partitions("tx", pid, epoch, {("t", 1)}) == E.NONE
        assert coordinator._markers.writes == [(pid, epoch, True, (("t", 0),))]
        state = describe(coordinator, "tx")
        assert state.transaction_state == "Ongoing" and [(t.topic, t.partitions) for t in state.topics] == [
            ("t", [1])]


def test_the_next_transaction_waits_for_the_markers_the_timer_is_writing(env, monkeypatch):
    """The same while the timer thread is writing them: the request waits for them."""
    logs, make = env
    coordinator = make()
    monkeypatch.setattr(coordinator_module, "MARKER_AWAIT_SECONDS", 60)       # however slow this machine is
    writing, gate = threading.Event(), threading.Event()
    write = coordinator._markers.write

    def gated_write(*args):
        writing.set()
        assert gate.wait(60)
        return write(*args)
    coordinator._markers.write = gated_write
    pid, epoch = begin(coordinator)
    assert coordinator.end_transaction("tx", pid, epoch, True) == E.NONE
    assert writing.wait(10)                                                  # held at the gate
    finish_markers = coordinator._finish_markers

    def open_gate_then_finish(transactional_id):
        gate.set()                                  # the markers go in only once the request is under way
        finish_markers(transactional_id)
    monkeypatch.setattr(coordinator, "_finish_markers", open_gate_then_finish)
    assert coordinator.add_partitions("tx", pid, epoch, {("t", 1)}) == E.NONE
    assert coordinator._markers.writes == [(pid, epoch, True, (("t", 0),))]
    assert describe(coordinator, "tx").transaction_state == "Ongoing"


def test_state_is_loaded_and_a_prepared_commit_completes_after_a_restart(env):
    logs, make = env
    first = make()
    first._markers.fail.add(("t", 0))                       # the markers never get written before the "crash"
    pid, epoch = begin(first)
    begin(first, "idle", partitions=(("t", 1),))
    assert first.end_transaction("tx", pid, epoch, True) == E.NONE
    first.close()
    second = make()
    settle(second)
    assert second._markers.writes == [(pid, epoch, True, (("t", 0),))]
    assert describe(second, "tx").transaction_state == "CompleteCommit"
    assert describe(second, "idle").transaction_state == "Ongoing"
    records = [read_value(v) for k, v in _records(logs, "tx")]
    assert [r.state for r in records] == [EMPTY, ONGOING, PREPARE_COMMIT, COMPLETE_COMMIT]


def _records(logs, tid):
    partition = logs.get_partition(TRANSACTION_STATE_TOPIC, partition_for(tid, 50))
    return [(r.key, r.value) for batch in batches_from_start(partition) for r in batch
            if read_key(r.key) == tid]


def test_expired_ids_get_a_tombstone(env):
    logs, make = env
    coordinator = make(remove_expired_interval_ms=20, id_expiration_ms=1000)
    begin(coordinator, "open")
    coordinator.init_producer("idle", 60000)
    coordinator.clock.now += 1001
    wait_for(lambda: len(coordinator) == 1, "the idle id to expire")
    assert describe(coordinator, "idle").error_code == E.TRANSACTIONAL_ID_NOT_FOUND
    assert _records(logs, "idle")[-1][1] is None
    assert describe(coordinator, "open").transaction_state == "Ongoing"



def test_expiry_looks_the_state_topic_up_once_not_per_id(env):
    """``LogManager.topics()`` costs a pass over every partition of the broker: the expiry, which runs
    under the coordinator's lock, asks for it once per check, not once per expiring id."""
    logs, make = env
    coordinator = make(id_expiration_ms=1000)
    for i in range(200):
        coordinator.init_producer(f"idle-{i}", 60000)
    coordinator.clock.now += 1001
    topics, asked = logs.topics, []
    logs.topics = lambda: asked.append(1) or topics()
    coordinator.remove_expired_transactional_ids()
    assert len(coordinator) == 0
    assert len(asked) <= 2

def test_a_transaction_does_not_look_every_topic_up(env):
    """``LogManager.topics()`` passes over every partition of the broker: the state topic's partition count is
    kept, so the writes of a transaction, under the coordinator's lock, do not pay for it."""
    logs, make = env
    coordinator = make()
    begin(coordinator, "warm")
    topics, asked = logs.topics, []
    logs.topics = lambda: asked.append(1) or topics()
    pid, epoch = begin(coordinator)
    assert coordinator.end_transaction("tx", pid, epoch, True) == E.NONE
    settle(coordinator)
    assert describe(coordinator, "tx").transaction_state == "CompleteCommit" and asked == []


def test_list_transactions_filters(env):
    logs, make = env
    coordinator = make()
    pid, _ = begin(coordinator, "a")
    coordinator.init_producer("b", 60000)
    header = RequestHeader(ApiKey.LIST_TRANSACTIONS, 1, 1, "c")

    def listed(**filters):
        request = messages.ListTransactionsRequest(state_filters=[], producer_id_filters=[], duration_filter=-1)
        for name, value in filters.items():
            setattr(request, name, value)
        response = coordinator.list_transactions(header, request)
        return sorted((s.transactional_id, s.transaction_state) for s in response.transaction_states), \
            response.unknown_state_filters

    assert listed() == ([("a", "Ongoing"), ("b", "Empty")], [])
    assert listed(state_filters=["Ongoing", "Nope"]) == ([("a", "Ongoing")], ["Nope"])
    assert listed(producer_id_filters=[pid]) == ([("a", "Ongoing")], [])
    coordinator.clock.now += 500
    assert listed(duration_filter=1000)[0] == [("b", "Empty")]     # Kafka's filter: start -1 is "long ago"


def test_settings_are_validated():
    with pytest.raises(ConfigError, match="transaction.max.timeout.ms"):
        TxnConfig.from_properties({"transaction.max.timeout.ms": "0"})
    with pytest.raises(ConfigError, match="transaction.partition.verification.enable"):
        TxnConfig.from_properties({"transaction.partition.verification.enable": "maybe"})
    assert TxnConfig.from_properties({"transactional.id.expiration.ms": "5"}).id_expiration_ms == 5


def test_an_idle_id_costs_under_256_bytes(env):
    logs, make = env
    coordinator = make()
    ids = [f"transactional-id-{i:06d}" for i in range(20000)]
    for tid in ids[:100]:                                       # warm up (dict growth, caches)
        coordinator.init_producer(tid, 60000)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for tid in ids[100:]:
        coordinator._idle[tid] = TransactionMetadata(tid, 10**9, 0, 60000, last_update_ms=coordinator.clock()).pack()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    grown += sum(sys.getsizeof(tid) for tid in ids[100:])       # the names were made before the snapshot
    assert grown / len(ids[100:]) < 256



def test_loading_idle_ids_costs_under_256_bytes_each_at_its_peak(env):
    """The replay of ``__transaction_state`` packs each id as its record is read: the load's peak is what the
    ids cost once loaded, not a copy of every id's record on top."""
    logs, make = env
    first = make()
    ids = [f"transactional-id-{i:06d}" for i in range(10000)]
    for tid in ids:
        assert first.init_producer(tid, 60000)[0] == E.NONE
    first.close()
    tracemalloc.start()
    second = make()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(second) == len(ids)
    assert peak / len(ids) < 256

def test_add_partitions_to_txn_requests_decode_at_every_version():
    """Its topics' struct serves both the v0-3 and the v4+ fields (one common struct in Kafka's schema)."""
    Request = messages.AddPartitionsToTxnRequest
    topics = [Request.AddPartitionsToTxnTopic(name="t", partitions=[0, 1])]
    for version in range(6):
        if version < 4:
            request = Request(v3_and_below_transactional_id="tx", v3_and_below_producer_id=1,
                              v3_and_below_producer_epoch=0, v3_and_below_topics=topics)
        else:
            request = Request(transactions=[Request.AddPartitionsToTxnTransaction(
                transactional_id="tx", producer_id=1, producer_epoch=0, verify_only=True, topics=topics)])
        assert decode_request(encode_request(request, version, 1, client_id="c"))[1] == request


def test_kip_360_recovery_through_init_producer_id(env):
    logs, make = env
    coordinator = make()
    error, pid, epoch = coordinator.init_producer("tx", 60000)
    assert coordinator.init_producer("tx", 60000, (pid, epoch)) == (E.NONE, pid, epoch + 1)
    assert coordinator.init_producer("tx", 60000, (pid, epoch)) == (E.NONE, pid, epoch + 1)     # a retry
    assert coordinator.init_producer("tx", 60000, (pid + 1, epoch))[0] == E.PRODUCER_FENCED
    Request = messages.InitProducerIdRequest
    for version, fenced in ((3, E.INVALID_PRODUCER_EPOCH), (4, E.PRODUCER_FENCED)):
        response = coordinator.init_producer_id(RequestHeader(ApiKey.INIT_PRODUCER_ID, version, 1, "c"), Request(
            transactional_id="tx", transaction_timeout_ms=60000, producer_id=pid + 1, producer_epoch=0))
        assert (response.error_code, response.producer_id, response.producer_epoch) == (fenced, -1, -1)
    response = coordinator.init_producer_id(RequestHeader(ApiKey.INIT_PRODUCER_ID, 4, 1, "c"), Request(
        transactional_id="tx", transaction_timeout_ms=60000, producer_id=pid, producer_epoch=-1))
    assert response.error_code == E.INVALID_REQUEST


def test_add_offsets_adds_the_groups_offsets_partition(env):
    logs, make = env
    logs.create_topic("__consumer_offsets", 50)
    coordinator = make()
    pid, epoch = begin(coordinator)
    response = coordinator.add_offsets_to_txn(RequestHeader(ApiKey.ADD_OFFSETS_TO_TXN, 3, 1, "c"),
                                              messages.AddOffsetsToTxnRequest(transactional_id="tx", producer_id=pid,
                                                                              producer_epoch=epoch, group_id="g"))
    assert response.error_code == E.NONE
    assert coordinator.end_transaction("tx", pid, epoch, True) == E.NONE
    settle(coordinator)
    assert coordinator._markers.writes == [(pid, epoch, True, (("__consumer_offsets", partition_for("g", 50)),
                                                               ("t", 0)))]


def test_verification_can_be_switched_off(env):
    logs, make = env
    coordinator = make(partition_verification_enable=False)
    assert coordinator.verify_transaction("unknown", 1, 0, "t", 0) == E.NONE


def test_damaged_state_records_raise_corrupt_record_error_only():
    """Every cut of a v0 and a v1 value, and bytes flipped anywhere, either read or raise CorruptRecordError
    (never an IndexError, struct.error or a loop over a count the bytes do not hold)."""
    import random

    transit = TxnTransit(5, -1, 2, -1, 60000, ONGOING, frozenset({("b", 1), ("a", 0)}), 111, 222)
    flexible = struct.pack(">hqhib", 1, 9, 1, 5000, 2) + bytes([2, 2]) + b"t" + bytes([2]) \
        + struct.pack(">i", 4) + bytes([0]) + struct.pack(">qq", 20, 10) + bytes([1, 0, 8]) + struct.pack(">q", 3)
    rng = random.Random(29)
    for value in (transaction_log_value(transit), flexible):
        for cut in range(len(value)):
            with pytest.raises(CorruptRecordError):
                read_value(value[:cut])
        for _ in range(500):
            damaged = bytearray(value)
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            try:
                read_value(bytes(damaged))
            except CorruptRecordError:
                pass
    for key in (b"", b"\x00", b"\x00\x05tx", b"\x00\x00\x00\x09tx", b"\x00\x00\xff\xfe\xff\xfe"):
        with pytest.raises(CorruptRecordError):
            read_key(key)
