"""The log side of transactions on the wire: Produce of transactional batches (a transactional id needed, each
partition verified with the transaction coordinator as KIP-890 part 1, a marker voiding a verification under
way), WriteTxnMarkers and DescribeProducers. The coordinator is a small test double here; raw requests use
kafka-python's codec."""
import time

import pytest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from broker_helpers import RawConnection
from kmem.broker import Broker
from kmem.broker.codes import ErrorCode
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
