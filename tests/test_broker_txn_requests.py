"""The log side of transactions on the wire: Produce of transactional batches (a transactional id needed, each
partition verified with the transaction coordinator as KIP-890 part 1, a marker voiding a verification under
way), WriteTxnMarkers and DescribeProducers. The coordinator is a small test double here; raw requests use
kafka-python's codec."""
import threading
import time

import numpy as np
import pytest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from broker_helpers import TIMEOUT, RawConnection
from kmem.broker import Broker
from kmem.broker.codes import ErrorCode
from kmem.ledger import ENTRY_DTYPE
from kmem.records import RecordsBuilder


class CoordinatorDouble:
    """``verify_transaction`` answering ``answer``; ``during`` runs inside it (a marker racing the append)."""

    def __init__(self, answer=ErrorCode.NONE, during=None):
        self.answer, self.during, self.calls = answer, during, []

    def verify_transaction(self, transactional_id, producer_id, producer_epoch, topic, partition):
        self.calls.append((transactional_id, producer_id, producer_epoch, topic, partition))
        if self.during is not None:
            self.during()
        return self.answer


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "logs", num_partitions=2) as running:
        running.logs.create_topic("t", 2)
        yield running


def txn_batch(producer_id, sequence, value=b"v", epoch=0, transactional=True):
    builder = RecordsBuilder(2, "none", producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                             transactional=transactional)
    builder.append(value, timestamp=time.time_ns() // 1_000_000)
    return builder.build()


def produce(broker, partitions, transactional_id="tx", version=9):
    """``partitions``: {partition of "t": records}; returns {partition: (error code, base offset)}."""
    request = ProduceRequest(transactional_id=transactional_id, acks=-1, timeout_ms=1000, topic_data=[
        ProduceRequest.TopicProduceData(name="t", partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=records)
            for p, records in partitions.items()])])
    with RawConnection(broker.bootstrap_servers) as connection:
        response = connection.request(request, ProduceResponse, version)
    return {p.index: (p.error_code, p.base_offset) for p in response.responses[0].partition_responses}


def log_end(broker, partition=0):
    return broker.logs.get_partition("t", partition).log_end_offset


def test_transactional_batches_need_a_transactional_id_and_a_coordinator(broker):
    failed = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    mixed = {0: txn_batch(1, 0), 1: txn_batch(2, 0, transactional=False)}
    broker.handlers.transactions = None
    assert produce(broker, mixed) == {0: (failed, -1), 1: (failed, -1)}         # no coordinator: refused
    broker.handlers.transactions = CoordinatorDouble()
    assert produce(broker, mixed, transactional_id=None) == {0: (failed, -1), 1: (failed, -1)}
    assert (log_end(broker, 0), log_end(broker, 1)) == (0, 0)
    assert broker.handlers.transactions.calls == []
    assert produce(broker, mixed) == {0: (ErrorCode.NONE, 0), 1: (ErrorCode.NONE, 0)}


def test_a_partition_is_verified_until_its_transaction_is_open_there(broker):
    coordinator = broker.handlers.transactions = CoordinatorDouble()
    partition_log = broker.logs.get_partition("t", 0)
    assert produce(broker, {0: txn_batch(7, 0)}) == {0: (ErrorCode.NONE, 0)}
    assert produce(broker, {0: txn_batch(7, 1)}) == {0: (ErrorCode.NONE, 1)}
    assert coordinator.calls == [("tx", 7, 0, "t", 0)]                  # the open transaction needs no check
    assert partition_log.last_stable_offset == 0
    partition_log.write_txn_marker(7, 0, 0, True)
    assert produce(broker, {0: txn_batch(7, 2)}) == {0: (ErrorCode.NONE, 3)}
    assert len(coordinator.calls) == 2                                  # a new transaction: verified again


@pytest.mark.parametrize("answer", [ErrorCode.INVALID_TXN_STATE, ErrorCode.INVALID_PRODUCER_EPOCH])
def test_a_refused_verification_answers_the_partition_and_appends_nothing(broker, answer):
    broker.handlers.transactions = CoordinatorDouble(answer)
    assert produce(broker, {0: txn_batch(7, 0), 1: txn_batch(8, 0, transactional=False)}) == {
        0: (answer, -1), 1: (ErrorCode.NONE, 0)}
    assert log_end(broker, 0) == 0 and not broker.logs.get_partition("t", 0)._verifications


def test_a_marker_written_during_the_verification_voids_it(broker):
    partition_log = broker.logs.get_partition("t", 0)
    broker.handlers.transactions = CoordinatorDouble(during=lambda: partition_log.write_txn_marker(7, 0, 0, False))
    assert produce(broker, {0: txn_batch(7, 0)}) == {0: (ErrorCode.INVALID_TXN_STATE, -1)}
    # Only the marker is in the log: no transaction was left open to hold the last stable offset back.
    assert partition_log.log_end_offset == partition_log.last_stable_offset == 1



def test_a_marker_after_the_open_transaction_was_seen_refuses_the_append(broker):
    """A producer whose transaction is open on the partition is not verified again; should a marker close it
    before the append, the batch is INVALID_TXN_STATE (Kafka's append-time check of the sentinel
    VerificationGuard), not the start of a transaction no coordinator knows, which would hold the last stable
    offset back for good."""
    broker.handlers.transactions = coordinator = CoordinatorDouble()
    partition_log = broker.logs.get_partition("t", 0)
    assert produce(broker, {0: txn_batch(7, 0)}) == {0: (ErrorCode.NONE, 0)}
    seen = partition_log.start_txn_verification

    def marker_after_the_check(producer_id, producer_epoch):
        guard = seen(producer_id, producer_epoch)
        partition_log.write_txn_marker(7, 0, 0, True)
        return guard
    partition_log.start_txn_verification = marker_after_the_check
    assert produce(broker, {0: txn_batch(7, 1)}) == {0: (ErrorCode.INVALID_TXN_STATE, -1)}
    assert len(coordinator.calls) == 1
    assert partition_log.log_end_offset == partition_log.last_stable_offset == 2     # the batch, the marker

# --- WriteTxnMarkers --------------------------------------------------------------------------------------------

def write_markers(broker, markers, version):
    """``markers``: [(producer id, epoch, commit, coordinator epoch, {topic: [partitions]})]; returns
    {producer id: {(topic, partition): error code}}."""
    from kafka.protocol.producer.transaction import WriteTxnMarkersRequest, WriteTxnMarkersResponse

    Marker = WriteTxnMarkersRequest.WritableTxnMarker
    request = WriteTxnMarkersRequest(markers=[
        Marker(producer_id=pid, producer_epoch=epoch, transaction_result=commit, coordinator_epoch=coordinator_epoch,
               topics=[Marker.WritableTxnMarkerTopic(name=name, partition_indexes=indexes)
                       for name, indexes in topics.items()])
        for pid, epoch, commit, coordinator_epoch, topics in markers])
    with RawConnection(broker.bootstrap_servers) as connection:
        response = connection.request(request, WriteTxnMarkersResponse, version)
    return {marker.producer_id: {(topic.name, p.partition_index): p.error_code
                                 for topic in marker.topics for p in topic.partitions}
            for marker in response.markers}


@pytest.mark.parametrize("version", [0, 1])
def test_write_txn_markers_answers_each_producer_and_partition(broker, version):
    commit_log, abort_log = broker.logs.get_partition("t", 0), broker.logs.get_partition("t", 1)
    commit_log.append(txn_batch(5, 0))
    abort_log.append(txn_batch(6, 0, epoch=3))
    answer = write_markers(broker, [(5, 0, True, 0, {"t": [0, 1, 9], "missing": [0]}),
                                    (6, 2, False, 0, {"t": [1]}),           # an older epoch: fenced
                                    (6, 3, False, 0, {"t": [1]})], version)
    assert answer == {5: {("t", 0): 0, ("t", 1): 0, ("t", 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                          ("missing", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION},
                      6: {("t", 1): 0}}                 # producer 6 listed twice: answered once, the last code
    assert commit_log.last_stable_offset == commit_log.log_end_offset == 2
    assert abort_log.last_stable_offset == abort_log.log_end_offset == 3       # 6's batch, 5's and 6's markers
    assert list(abort_log.active.txn_index.entries()) == [(6, 0, 2, 3)]


def test_admin_finds_and_aborts_a_hanging_transaction(broker):
    """What ``kafka-transactions.sh find-hanging`` and ``abort`` do: DescribeProducers, then WriteTxnMarkers."""
    from kafka import TopicPartition
    from kafka.admin import AbortTransactionSpec, KafkaAdminClient

    partition_log = broker.logs.get_partition("t", 0)
    partition_log.append(txn_batch(9, 0, epoch=4))
    partition_log.append(txn_batch(9, 1, epoch=4))
    partition_log.append(txn_batch(10, 0, transactional=False))
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        tp = TopicPartition("t", 0)
        states = {p.producer_id: p for p in admin.describe_producers([tp])[tp].active_producers}
        assert set(states) == {9, 10}
        hanging = states[9]
        assert (hanging.producer_epoch, hanging.last_sequence, hanging.coordinator_epoch,
                hanging.current_transaction_start_offset) == (4, 1, -1, 0)
        assert states[10].current_transaction_start_offset == -1 and states[10].last_sequence == 0
        admin.abort_transaction(AbortTransactionSpec(tp, 9, 4, hanging.coordinator_epoch))
        assert partition_log.last_stable_offset == partition_log.log_end_offset == 4
        after = {p.producer_id: p for p in admin.describe_producers([tp])[tp].active_producers}
        assert after[9].current_transaction_start_offset == -1
    finally:
        admin.close()


# --- DescribeProducers --------------------------------------------------------------------------------------------

def test_describe_producers_answers_kafkas_errors(broker):
    from kafka.protocol.admin.transactions import DescribeProducersRequest, DescribeProducersResponse

    request = DescribeProducersRequest(topics=[
        DescribeProducersRequest.TopicRequest(name="t", partition_indexes=[0, 7]),
        DescribeProducersRequest.TopicRequest(name="missing", partition_indexes=[0]),
        DescribeProducersRequest.TopicRequest(name="bad/name", partition_indexes=[0])])
    with RawConnection(broker.bootstrap_servers) as connection:
        response = connection.request(request, DescribeProducersResponse, 0)
    assert [(t.name, p.partition_index, p.error_code, p.active_producers) for t in response.topics
            for p in t.partitions] == [("t", 0, 0, []), ("t", 7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, []),
                                       ("missing", 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, []),
                                       ("bad/name", 0, ErrorCode.INVALID_TOPIC_EXCEPTION, [])]


def test_describe_producers_lists_every_producer_while_appends_go_on(broker, monkeypatch):
    """20,000 producers (in the ledger's snapshot and active file): the answer holds each one not expired, as
    it was when the request came, and an append to the partition completes while the ledger is walked."""
    from kafka.protocol.admin.transactions import DescribeProducersRequest, DescribeProducersResponse

    partition_log = broker.logs.get_partition("t", 1)
    ledger = partition_log.producers.ledger
    now = time.time_ns() // 1_000_000
    day = 86_400_000                                                       # producer.id.expiration.ms
    entries = np.zeros(20_000, ENTRY_DTYPE)
    entries["producer_id"] = np.arange(1000, 21_000)
    entries["epoch"] = entries["producer_id"] % 7
    entries["last_sequence"] = entries["producer_id"] % 1000
    entries["last_offset"] = np.arange(20_000)
    entries["timestamp"] = now - 1000
    entries["coordinator_epoch"] = -1
    entries["current_txn_first_offset"] = -1
    entries["timestamp"][::10] = now - 2 * day                             # expired: not listed ...
    entries["current_txn_first_offset"][::20] = 5                          # ... unless in a transaction
    ledger.update_many(entries)
    partition_log.remove_expired_producers(now)
    assert ledger.snapshot_paths                 # more than the active file holds: a snapshot is walked too
    expected = {int(e["producer_id"]): (int(e["epoch"]), int(e["last_sequence"]), int(e["timestamp"]), -1,
                                        int(e["current_txn_first_offset"]))
                for e in entries if e["timestamp"] == now - 1000 or e["current_txn_first_offset"] == 5}

    # a new producer, and one whose entry is in the snapshot (its next entry goes to the active file)
    later_batches = [txn_batch(99, 0), txn_batch(1001, 2, epoch=1001 % 7)]
    entry_chunks, appended = ledger.entry_chunks, []

    def entry_chunks_appending_after_the_first(**options):
        chunks = entry_chunks(**options)

        def walk():
            for index, chunk in enumerate(chunks):
                yield chunk
                if index == 0:
                    appender = threading.Thread(target=lambda: appended.extend(partition_log.append(batch).error_code
                                                                               for batch in later_batches))
                    appender.start()
                    appender.join(TIMEOUT)
                    appended.append(appender.is_alive())
        return walk()
    monkeypatch.setattr(ledger, "entry_chunks", entry_chunks_appending_after_the_first)

    def describe():
        request = DescribeProducersRequest(topics=[DescribeProducersRequest.TopicRequest(name="t",
                                                                                         partition_indexes=[1])])
        with RawConnection(broker.bootstrap_servers) as connection:
            partition, = connection.request(request, DescribeProducersResponse, 0).topics[0].partitions
        assert partition.error_code == ErrorCode.NONE
        return {p.producer_id: (p.producer_epoch, p.last_sequence, p.last_timestamp, p.coordinator_epoch,
                                p.current_txn_start_offset) for p in partition.active_producers}
    assert describe() == expected                                       # as it was when the request came
    assert appended == [ErrorCode.NONE, ErrorCode.NONE, False]          # both appended during the walk
    monkeypatch.setattr(ledger, "entry_chunks", entry_chunks)
    after = describe()
    assert set(after) == set(expected) | {99} and after[1001][1] == 2
