"""The log side of transactions on the wire: Produce of transactional batches (a transactional id needed, each
partition verified with the transaction coordinator as KIP-890 part 1, a marker voiding a verification under
way), WriteTxnMarkers and DescribeProducers, with a small test double of the coordinator; then the broker's
own coordinator answering Kafka 3.9's error codes (the verification's as Produce and TxnOffsetCommit map them,
NOT_COORDINATOR before ``__transaction_state`` exists). Raw requests use kafka-python's codec."""
import itertools
import threading
import time

import numpy as np
import pytest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from broker_helpers import TIMEOUT, RawConnection, fail_appends, wait_for
from kmem.broker import Broker
from kmem.broker.codes import ErrorCode
from kmem.broker.log import PartitionLog
from kmem.ledger import ENTRY_DTYPE
from kmem.records import RecordsBuilder


class CoordinatorDouble:
    """``verify_transaction`` answering ``answer``; ``during`` runs inside it (a marker racing the append)."""

    def __init__(self, answer=ErrorCode.NONE, during=None):
        self.answer, self.during, self.calls = answer, during, []

    def verify_transaction(self, transactional_id, producer_id, producer_epoch, topic, partition,
                           transaction_abortable=False):
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


# --- the transaction coordinator's answers on the wire (Kafka 3.9's codes) ---------------------------------------

def txn_request(broker, name, version, **fields):
    """A raw request of kafka-python's ``<name>Request`` at ``version``; returns its response."""
    from kafka.protocol.admin import transactions as admin
    from kafka.protocol.producer import transaction

    module = admin if name == "DescribeTransactions" else transaction
    request = getattr(module, f"{name}Request")(**fields)
    with RawConnection(broker.bootstrap_servers) as connection:
        return connection.request(request, getattr(module, f"{name}Response"), version)


def test_a_request_whose_handler_fails_is_answered_unknown_server_error(broker, monkeypatch, caplog):
    """A bug in a handler (EndTxn's here) is answered as Kafka's ``KafkaApis.handleError`` answers it, and the
    connection stays open for the next request. A Produce, whose errors are per partition, cannot be answered
    so: its connection is closed, as before."""
    from kafka.protocol.producer.transaction import EndTxnRequest, EndTxnResponse

    def fails(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(broker.transactions, "end_transaction", fails)
    request = EndTxnRequest(transactional_id="tx", producer_id=1, producer_epoch=0, committed=True)
    with RawConnection(broker.bootstrap_servers) as connection:
        for correlation_id in (1, 2):
            response = connection.request(request, EndTxnResponse, 3, correlation_id)
            assert response.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert "END_TXN v3 from 'raw' failed; answered UNKNOWN_SERVER_ERROR" in caplog.text
    monkeypatch.setattr(PartitionLog, "append", fails)
    with RawConnection(broker.bootstrap_servers) as connection:
        records = txn_batch(1, 0, transactional=False)
        request = ProduceRequest(acks=-1, timeout_ms=1000, topic_data=[ProduceRequest.TopicProduceData(
            name="t", partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])])
        request.with_header(correlation_id=3, client_id="raw")
        connection.send_frame(request.encode(version=9, header=True))
        assert connection.receive_frame() is None


def init_producer(broker, transactional_id="tx"):
    response = txn_request(broker, "InitProducerId", 4, transactional_id=transactional_id,
                           transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1)
    assert response.error_code == ErrorCode.NONE
    return response.producer_id, response.producer_epoch


def add_partitions(broker, producer_id, epoch, topics, transactional_id="tx", version=3, verify_only=False):
    """AddPartitionsToTxn of ``topics`` ({topic: [partitions]}); returns {(topic, partition): error code}."""
    from kafka.protocol.producer.transaction import AddPartitionsToTxnRequest as Request

    if version < 4:
        response = txn_request(broker, "AddPartitionsToTxn", version, v3_and_below_transactional_id=transactional_id,
                               v3_and_below_producer_id=producer_id, v3_and_below_producer_epoch=epoch,
                               v3_and_below_topics=[Request.AddPartitionsToTxnTopic(name=t, partitions=p)
                                                    for t, p in topics.items()])
        results = response.results_by_topic_v3_and_below
    else:
        Transaction = Request.AddPartitionsToTxnTransaction
        response = txn_request(broker, "AddPartitionsToTxn", version, transactions=[Transaction(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch, verify_only=verify_only,
            topics=[Transaction.AddPartitionsToTxnTopic(name=t, partitions=p) for t, p in topics.items()])])
        results = response.results_by_transaction[0].topic_results
    return {(t.name, p.partition_index): p.partition_error_code for t in results for p in t.results_by_partition}


def end_txn(broker, producer_id, epoch, commit=True, version=3):
    return txn_request(broker, "EndTxn", version, transactional_id="tx", producer_id=producer_id,
                       producer_epoch=epoch, committed=commit).error_code


def describe_txn(broker, transactional_id="tx"):
    state, = txn_request(broker, "DescribeTransactions", 0, transactional_ids=[transactional_id]).transaction_states
    return state


def test_before_the_state_topic_exists_the_coordinator_apis_answer_not_coordinator(broker):
    """Kafka answers NOT_COORDINATOR for an id whose ``__transaction_state`` partition it does not lead (the
    client finds the coordinator again, which creates the topic), not INVALID_PRODUCER_ID_MAPPING; a produce's
    verification finds no coordinator to ask (COORDINATOR_NOT_AVAILABLE), answered NOT_ENOUGH_REPLICAS."""
    assert add_partitions(broker, 5, 0, {"t": [0]}) == {("t", 0): ErrorCode.NOT_COORDINATOR}
    assert add_partitions(broker, 5, 0, {"t": [0]}, version=4, verify_only=True) == {
        ("t", 0): ErrorCode.NOT_COORDINATOR}
    assert end_txn(broker, 5, 0) == ErrorCode.NOT_COORDINATOR
    state = describe_txn(broker)
    assert (state.error_code, state.producer_id, state.producer_epoch, state.transaction_start_time_ms,
            state.transaction_state) == (ErrorCode.NOT_COORDINATOR, 0, 0, 0, "")     # the schema's defaults
    assert produce(broker, {0: txn_batch(5, 0)}) == {0: (ErrorCode.NOT_ENOUGH_REPLICAS, -1)}
    assert not broker.logs.get_partition("t", 0)._verifications
    init_producer(broker)
    state = describe_txn(broker, "unknown")
    assert (state.error_code, state.producer_id, state.producer_epoch) == (ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, 0, 0)


@pytest.mark.parametrize("version", [9, 11])
def test_a_produce_is_answered_the_verifications_codes_as_kafka_maps_them(broker, monkeypatch, version):
    """What Kafka's coordinator answers ``verify_only`` and its ``AddPartitionsToTxnManager`` and
    ``ReplicaManager`` make of it for the producer: an unknown id or another producer id is
    INVALID_PRODUCER_ID_MAPPING, another epoch INVALID_PRODUCER_EPOCH, a partition not in the transaction
    INVALID_TXN_STATE (TRANSACTION_ABORTABLE from Produce v11), a transaction being ended NOT_ENOUGH_REPLICAS."""
    broker.logs.create_topic("u", 1)
    init_producer(broker)
    pid, epoch = init_producer(broker)              # epoch 1: the producer before it had epoch 0
    init_producer(broker, "other")
    not_added = ErrorCode.TRANSACTION_ABORTABLE if version >= 11 else ErrorCode.INVALID_TXN_STATE
    assert produce(broker, {0: txn_batch(pid, 0, epoch=epoch)}, transactional_id="unknown", version=version) == {
        0: (ErrorCode.INVALID_PRODUCER_ID_MAPPING, -1)}
    assert produce(broker, {0: txn_batch(pid, 0, epoch=epoch)}, transactional_id="other", version=version) == {
        0: (ErrorCode.INVALID_PRODUCER_ID_MAPPING, -1)}
    for wrong_epoch in (epoch + 1, epoch - 1):
        assert produce(broker, {0: txn_batch(pid, 0, epoch=wrong_epoch)}, version=version) == {
            0: (ErrorCode.INVALID_PRODUCER_EPOCH, -1)}
    assert produce(broker, {0: txn_batch(pid, 0, epoch=epoch)}, version=version) == {0: (not_added, -1)}
    assert add_partitions(broker, pid, epoch, {"t": [1], "u": [0]}) == {("t", 1): 0, ("u", 0): 0}
    assert produce(broker, {0: txn_batch(pid, 0, epoch=epoch), 1: txn_batch(pid, 0, epoch=epoch)},
                   version=version) == {0: (not_added, -1), 1: (ErrorCode.NONE, 0)}
    # The marker of "u" cannot be written (a full disk): the transaction stays in PrepareCommit.
    fail_appends(monkeypatch, broker.logs, "u", "result")
    assert end_txn(broker, pid, epoch) == ErrorCode.NONE
    assert produce(broker, {0: txn_batch(pid, 0, epoch=epoch)}, version=version) == {
        0: (ErrorCode.NOT_ENOUGH_REPLICAS, -1)}
    assert describe_txn(broker).transaction_state == "PrepareCommit"
    assert log_end(broker, 0) == 0


def test_transactional_batches_of_two_producers_refuse_the_whole_produce(broker):
    """Kafka's ``handleProduceAppend``: one Produce carries the batches of one producer id and epoch; else every
    partition is INVALID_PRODUCER_ID_MAPPING and nothing is verified or appended."""
    broker.handlers.transactions = coordinator = CoordinatorDouble()
    refused = (ErrorCode.INVALID_PRODUCER_ID_MAPPING, -1)
    assert produce(broker, {0: txn_batch(7, 0), 1: txn_batch(8, 0)}) == {0: refused, 1: refused}
    assert produce(broker, {0: txn_batch(7, 0), 1: txn_batch(7, 0, epoch=1)}) == {0: refused, 1: refused}
    assert coordinator.calls == [] and (log_end(broker, 0), log_end(broker, 1)) == (0, 0)
    assert produce(broker, {0: txn_batch(7, 0), 1: txn_batch(9, 0, transactional=False)}) == {
        0: (ErrorCode.NONE, 0), 1: (ErrorCode.NONE, 0)}


def test_txn_offset_commit_outside_the_transaction_is_answered_by_version(broker):
    """TxnOffsetCommit v4 (KIP-890) knows TRANSACTION_ABORTABLE; before it Kafka answers INVALID_TXN_STATE."""
    from kafka.protocol.producer.transaction import TxnOffsetCommitRequest as Request

    pid, epoch = init_producer(broker)
    Partition = Request.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition
    topics = [Request.TxnOffsetCommitRequestTopic(name="t", partitions=[Partition(
        partition_index=0, committed_offset=5, committed_leader_epoch=-1, committed_metadata="")])]
    answers = {}
    for version in (3, 4):
        response = txn_request(broker, "TxnOffsetCommit", version, transactional_id="tx", group_id="g",
                               producer_id=pid, producer_epoch=epoch, generation_id=-1, member_id="",
                               group_instance_id=None, topics=topics)
        answers[version] = response.topics[0].partitions[0].error_code
    assert answers == {3: ErrorCode.INVALID_TXN_STATE, 4: ErrorCode.TRANSACTION_ABORTABLE}


def test_markers_refused_for_a_newer_epoch_end_the_transaction_on_a_single_node(broker):
    """INVALID_PRODUCER_EPOCH (a newer epoch is in the partition) makes that partition need no marker: the
    transaction completes and its id serves its next request, rather than staying in PrepareCommit (Kafka's
    marker channel leaves that to another coordinator, which a single node does not have)."""
    pid, epoch = init_producer(broker)
    assert add_partitions(broker, pid, epoch, {"t": [0, 1]}) == {("t", 0): 0, ("t", 1): 0}
    broker.logs.get_partition("t", 1).append(txn_batch(pid, 0, epoch=epoch + 1))     # not verified: the log's
    assert end_txn(broker, pid, epoch) == ErrorCode.NONE
    wait_for(lambda: broker.transactions.markers_pending() == 0, "the markers written")
    assert describe_txn(broker).transaction_state == "CompleteCommit"
    assert end_txn(broker, pid, epoch) == ErrorCode.NONE                        # a retry of the commit
    assert add_partitions(broker, pid, epoch, {"t": [0]}) == {("t", 0): ErrorCode.NONE}
    assert broker.logs.get_partition("t", 0).last_stable_offset == 1            # its marker is in


def test_a_produce_is_transactional_as_its_first_batch_reads_whatever_its_bytes():
    # Kafka's RequestUtils.hasTransactionalRecords reads the first batch alone; the header is read from its bytes
    # before a RecordBatch is made of it, so this holds it to the batch's own reading, on hostile bytes too
    from kmem.broker.apis.handlers import check_produce_records
    from kmem.errors import CorruptRecordError
    from kmem.records import MemoryRecords, build_records

    def as_batch_reads(data):
        try:
            first = next(MemoryRecords(data).batches(), None)
        except CorruptRecordError:
            return None
        return first.position if first is not None and first.is_transactional else None

    transactional = build_records([b"v"], producer_id=3, producer_epoch=0, base_sequence=0, transactional=True)
    plain = build_records([b"v"], producer_id=3, producer_epoch=0, base_sequence=0)
    legacy = build_records([b"v"], magic=1)
    negative_count = bytearray(transactional)
    negative_count[57:61] = b"\xff\xff\xff\xff"
    inputs = [transactional + plain, plain + transactional, legacy + transactional, bytes(negative_count),
              b"\0" * 30, b""] + [transactional[:end] for end in range(len(transactional))]
    for version in (2, 3, 9):
        found = [check_produce_records(version, data)[0] for data in inputs]
        assert [None if batch is None else batch.position for batch in found] == [as_batch_reads(d) for d in inputs]
        assert found[0] is not None and (found[0].producer_id, found[0].producer_epoch) == (3, 0)
        assert check_produce_records(version, None) == (None, None)


def test_a_produce_carries_one_batch_a_partition_as_its_batches_read_whatever_its_bytes():
    # Kafka's ProduceRequest.validateRecords; only a second complete entry has the batches made, so this holds the
    # answer to what reading them as batches says, on hostile bytes too
    from kmem.broker.apis.handlers import check_produce_records
    from kmem.errors import CorruptRecordError
    from kmem.records import MemoryRecords, build_records

    def as_batches_read(version, data):
        try:
            batches = list(itertools.islice(MemoryRecords(data).batches(), 2)) if version >= 3 else []
        except CorruptRecordError:
            return None
        return ErrorCode.INVALID_RECORD if len(batches) > 1 else None

    one = build_records([b"v"], producer_id=3, producer_epoch=0, base_sequence=0)
    negative_count = bytearray(one)
    negative_count[57:61] = b"\xff\xff\xff\xff"
    inputs = [one, one + one, one + bytes(negative_count), bytes(negative_count) + one, one + one[:-1],
              one + b"\0" * 30, one + one + b"\0" * 30]
    for version in (3, 9):
        answers = [check_produce_records(version, data)[1] for data in inputs]
        assert [None if answer is None else answer[0] for answer in answers] == \
            [as_batches_read(version, data) for data in inputs]
    assert check_produce_records(9, one + one)[1] == (ErrorCode.INVALID_RECORD,
                                                      "Produce v9 carries exactly one record batch a partition")
    assert check_produce_records(2, one + one)[1] is None


def test_the_cores_plain_produce_records_are_those_the_produce_checks_find_nothing_in():
    # The core answers the common case (one plain v2 batch, Produce v7+) before check_produce_records reads any
    # batch: on edited and hostile bytes, whatever it calls plain, the checks alone find nothing in
    import random
    from unittest import mock

    from kmem import _core
    from kmem.broker.apis.handlers import check_produce_records
    from kmem.records import build_records

    plain = build_records([b"v" * 40] * 3, producer_id=3, producer_epoch=0, base_sequence=0)
    transactional = build_records([b"v"], producer_id=3, producer_epoch=0, base_sequence=0, transactional=True)
    zstd = build_records([b"v"], compression="zstd")
    legacy = build_records([b"v"], magic=1)
    bases = [plain, transactional, zstd, legacy, plain + plain, plain + plain[:30], plain + b"\0" * 11,
             plain + b"\0" * 12, plain + b"\xff" * 12, legacy + plain, b""]
    rng = random.Random(11)
    inputs = list(bases) + [base[:rng.randrange(len(base) + 1)] for base in bases for _ in range(20)]
    for base in bases:
        for _ in range(60):
            edited = bytearray(base)
            for _ in range(rng.randrange(1, 4)):
                if edited:
                    edited[rng.randrange(len(edited))] = rng.randrange(256)
            inputs.append(bytes(edited))
    inputs += [memoryview(plain), bytearray(plain), memoryview(bytearray(plain)), memoryview(plain).cast("c")]
    called_plain = 0
    for version in (2, 3, 6, 7, 9, 11):
        for data in inputs:
            if _core.plain_produce_records(data, version):
                called_plain += 1
                with mock.patch.object(_core, "plain_produce_records", lambda records, version: False):
                    assert check_produce_records(version, data) == (None, None), (version, bytes(data))
    assert _core.plain_produce_records(plain, 9) and _core.plain_produce_records(None, 2)
    assert not _core.plain_produce_records(transactional, 9) and not _core.plain_produce_records(plain, 6)
    assert not _core.plain_produce_records(plain + plain, 9) and called_plain > 100
