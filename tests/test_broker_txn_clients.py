"""Transactions end to end with clients nobody here wrote (confluent-kafka, aiokafka), read back also with
``kmem.consumer`` (read_committed skips aborted data and stops at an open transaction): commit and abort
interleaved with plain producers, fencing, a producer abandoned mid-transaction aborted at its timeout,
and a broker killed (SIGKILL) at each step of a commit, restarted on its log directory: after
AddPartitionsToTxn (the transaction is aborted at its timeout), after PrepareCommit and between the markers
(the commit is completed on every partition)."""
import asyncio
import os
import signal

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from broker_helpers import TIMEOUT, consume_to_end, start_broker_process, wait_for
from kmem.broker import Broker
from kmem.broker.txn.metadata import COMPLETE_ABORT
from kmem.consumer import Consumer as KmemConsumer
from kmem.records import FileRecords, log_segments

ABORT_CHECK_MS = 50


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "logs", properties={
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": ABORT_CHECK_MS}) as running:
        running.logs.create_topic("t", 2)
        yield running


def transactional(bootstrap, transactional_id, **config):
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **config})
    producer.init_transactions(TIMEOUT)
    return producer


def read_all(bootstrap, isolation, topic="t", partitions=2):
    """Every value of ``topic`` up to the end a consumer at ``isolation`` sees (the LSO for read_committed)."""
    return sorted(value for *_, value in consume_to_end(bootstrap, topic, partitions, isolation))


def _poll_into(consumer, values, ended):
    message = consumer.poll(0.2)
    if message is not None:
        if message.error():
            if message.error().code() != KafkaError._PARTITION_EOF:
                raise KafkaException(message.error())
            ended.add(message.partition())
        else:
            values.append(message.value())
            ended.discard(message.partition())
    return True


def read_all_kmem(broker, isolation, topic="t", partitions=2, **config):
    """What ``kmem.consumer`` at ``isolation`` reads of ``topic`` up to the end (the LSO for read_committed);
    it checks no record is handed out from a marker's offset."""
    logs = [broker.logs.get_partition(topic, p) for p in range(partitions)]
    ends = [log.last_stable_offset if isolation == "read_committed" else log.log_end_offset for log in logs]
    records = []
    with KmemConsumer(broker.bootstrap_servers, isolation_level=isolation, auto_offset_reset="earliest",
                      fetch_max_wait_ms=50, **config) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        wait_for(lambda: records.extend(consumer.poll(50)) or
                 [consumer.position((topic, p)) for p in range(partitions)] == ends, f"the end of {topic}")
    markers = {(p, offset) for p in range(partitions) for offset in marker_offsets(broker.log_dir, topic, p)}
    assert not markers & {(r.partition, r.offset) for r in records}
    return sorted(r.value for r in records)


def marker_offsets(log_dir, topic, partition):
    offsets = []
    for _, path in log_segments(os.path.join(log_dir, f"{topic}-{partition}")):
        with FileRecords(path) as records:
            offsets += [batch.base_offset for batch in records.batches() if batch.is_control_batch]
    return offsets


def settled(broker):
    wait_for(lambda: broker.transactions.markers_pending() == 0, "every transaction's markers")


def test_commit_and_abort_interleaved_with_plain_producers(broker):
    bootstrap = broker.bootstrap_servers
    producer = transactional(bootstrap, "tx")
    plain = Producer({"bootstrap.servers": bootstrap})
    committed, aborted, plains = [], [], []
    for round_ in range(3):
        for commit in (True, False):
            producer.begin_transaction()
            values = [f"{'c' if commit else 'a'}-{round_}-{i}".encode() for i in range(4)]
            for i, value in enumerate(values):
                producer.produce("t", value, partition=i % 2)
                plain_value = f"p-{round_}-{commit}-{i}".encode()
                plain.produce("t", plain_value, partition=i % 2)
                plains.append(plain_value)
            plain.flush(TIMEOUT)
            producer.flush(TIMEOUT)                    # abort_transaction drops what was not sent yet
            if commit:
                producer.commit_transaction(TIMEOUT)
                committed += values
            else:
                producer.abort_transaction(TIMEOUT)
                aborted += values
    settled(broker)
    assert read_all(bootstrap, "read_committed") == sorted(committed + plains)
    assert read_all(bootstrap, "read_uncommitted") == sorted(committed + aborted + plains)
    assert read_all_kmem(broker, "read_committed") == sorted(committed + plains)
    assert read_all_kmem(broker, "read_uncommitted") == sorted(committed + aborted + plains)
    # a batch a fetch: the aborted transactions of each response are those of its own range
    assert read_all_kmem(broker, "read_committed", max_partition_fetch_bytes=1) == sorted(committed + plains)
    assert len(marker_offsets(broker.log_dir, "t", 0)) == 6
    for partition in range(2):
        partition_log = broker.logs.get_partition("t", partition)
        assert partition_log.last_stable_offset == partition_log.log_end_offset


def test_a_second_producer_fences_the_first(broker):
    bootstrap = broker.bootstrap_servers
    first = transactional(bootstrap, "fenced")
    first.begin_transaction()
    first.produce("t", b"from-the-first", partition=0)
    first.flush(TIMEOUT)
    second = transactional(bootstrap, "fenced")        # aborts the first's transaction, bumps the epoch
    second.begin_transaction()
    second.produce("t", b"from-the-second", partition=1)
    second.commit_transaction(TIMEOUT)
    with pytest.raises(KafkaException) as fenced:
        first.produce("t", b"too-late", partition=0)
        first.commit_transaction(TIMEOUT)
    assert fenced.value.args[0].fatal()
    settled(broker)
    assert read_all(bootstrap, "read_committed") == [b"from-the-second"]


def test_an_abandoned_transaction_is_aborted_at_its_timeout_and_the_lso_moves(broker):
    bootstrap = broker.bootstrap_servers
    abandoned = transactional(bootstrap, "abandoned", **{"transaction.timeout.ms": 1000})
    abandoned.begin_transaction()
    abandoned.produce("t", b"never-committed", partition=0)
    abandoned.flush(TIMEOUT)
    partition_log = broker.logs.get_partition("t", 0)
    assert partition_log.last_stable_offset < partition_log.log_end_offset         # held by the open transaction
    wait_for(lambda: broker.transactions._peek("abandoned").state == COMPLETE_ABORT, "the timed out abort")
    settled(broker)
    assert partition_log.last_stable_offset == partition_log.log_end_offset
    assert read_all(bootstrap, "read_committed") == []
    with pytest.raises(KafkaException):
        abandoned.commit_transaction(TIMEOUT)                # fenced by the abort's epoch bump


def test_aiokafka_transactional_producer(broker):
    from aiokafka import AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, transactional_id="aio")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait("t", b"aio-committed", partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait("t", b"aio-aborted", partition=1)
            await producer.abort_transaction()
        finally:
            await producer.stop()
    asyncio.run(run())
    settled(broker)
    assert read_all(broker.bootstrap_servers, "read_committed") == [b"aio-committed"]
    assert read_all(broker.bootstrap_servers, "read_uncommitted") == [b"aio-aborted", b"aio-committed"]


# the first broker never gets a marker written: its commit stops after PrepareCommit
MARKERS_FAIL = """
from kmem.broker.codes import ErrorCode
from kmem.broker.txn.markers import TxnMarkerWriter
TxnMarkerWriter.write = lambda self, pid, epoch, coordinator_epoch, commit, partitions: {
    tp: ErrorCode.KAFKA_STORAGE_ERROR for tp in partitions}
"""


def test_a_broker_killed_after_prepare_commit_completes_the_commit_when_it_restarts(tmp_path):
    log_dir = tmp_path / "logs"
    process, bootstrap = start_broker_process(log_dir, before=MARKERS_FAIL)
    try:
        producer = transactional(bootstrap, "killed")
        producer.begin_transaction()
        producer.produce("t", b"committed-before-the-kill", partition=0)
        producer.commit_transaction(TIMEOUT)         # answered once PrepareCommit is written
        assert read_all(bootstrap, "read_committed", partitions=1) == []       # no marker: the LSO stays
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    process, bootstrap = start_broker_process(log_dir)
    try:
        wait_for(lambda: read_all(bootstrap, "read_committed", partitions=1) == [b"committed-before-the-kill"],
                 "the commit completed after the restart")
        assert any("PrepareCommit (found at start)" in line for line in process.log_lines)
    finally:
        process.terminate()
        process.wait()


def kill(process):
    process.send_signal(signal.SIGKILL)
    process.wait()


def test_a_broker_killed_after_add_partitions_aborts_the_transaction_at_its_timeout(tmp_path):
    """No EndTxn came: the restarted coordinator finds the transaction Ongoing and aborts it at its timeout, so
    the LSO moves past it (the first broker never checks timeouts, so it is the restarted one that aborts)."""
    log_dir = tmp_path / "logs"
    process, bootstrap = start_broker_process(
        log_dir, "--override", "transaction.abort.timed.out.transaction.cleanup.interval.ms=3600000")
    try:
        producer = transactional(bootstrap, "killed-open", **{"transaction.timeout.ms": 1000})
        producer.begin_transaction()
        producer.produce("t", b"open-at-the-kill", partition=0)
        producer.flush(TIMEOUT)                     # AddPartitionsToTxn answered, the batch written
        plain = Producer({"bootstrap.servers": bootstrap})
        plain.produce("t", b"plain-after-it", partition=0)
        plain.flush(TIMEOUT)
        assert read_all(bootstrap, "read_committed", partitions=1) == []         # held by the open transaction
    finally:
        kill(process)
    process, bootstrap = start_broker_process(
        log_dir, "--override", f"transaction.abort.timed.out.transaction.cleanup.interval.ms={ABORT_CHECK_MS}")
    try:
        wait_for(lambda: read_all(bootstrap, "read_committed", partitions=1) == [b"plain-after-it"],
                 "the open transaction aborted at its timeout after the restart")
        assert read_all(bootstrap, "read_uncommitted", partitions=1) == [b"open-at-the-kill", b"plain-after-it"]
    finally:
        process.terminate()
        process.wait()


# the marker of partition 1 of "t" fails (as on a full disk): the commit stops between its markers
SECOND_MARKER_FAILS = """
from kmem.broker.codes import ErrorCode
from kmem.broker.log import AppendResult
from kmem.broker.log.unified_log import PartitionLog
write_txn_marker = PartitionLog.write_txn_marker
def first_marker_only(self, *args, **kwargs):
    if (self.topic, self.partition) == ("t", 1):
        return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, -1, -1, -1, 0, "stopped between the markers")
    return write_txn_marker(self, *args, **kwargs)
PartitionLog.write_txn_marker = first_marker_only
"""


def test_a_broker_killed_between_the_markers_completes_the_commit_on_every_partition(tmp_path):
    log_dir = tmp_path / "logs"
    process, bootstrap = start_broker_process(log_dir, "--override", "num.partitions=2", before=SECOND_MARKER_FAILS)
    try:
        producer = transactional(bootstrap, "killed-between")
        producer.begin_transaction()
        producer.produce("t", b"committed-0", partition=0)
        producer.produce("t", b"committed-1", partition=1)
        producer.commit_transaction(TIMEOUT)
        plain = Producer({"bootstrap.servers": bootstrap})
        plain.produce("t", b"plain-1", partition=1)
        plain.flush(TIMEOUT)
        # partition 0's marker is in, partition 1's is not: its LSO stays at the transaction's first offset
        wait_for(lambda: read_all(bootstrap, "read_committed") == [b"committed-0"], "the first marker")
    finally:
        kill(process)
    process, bootstrap = start_broker_process(log_dir)
    try:
        wait_for(lambda: read_all(bootstrap, "read_committed") == [b"committed-0", b"committed-1", b"plain-1"],
                 "the commit completed on every partition after the restart")
        assert read_all(bootstrap, "read_uncommitted") == [b"committed-0", b"committed-1", b"plain-1"]
        assert any("PrepareCommit (found at start)" in line for line in process.log_lines)
    finally:
        process.terminate()
        process.wait()


# the marker of __consumer_offsets fails: the transaction's offsets stay pending while its records are committed
OFFSETS_MARKER_FAILS = SECOND_MARKER_FAILS.replace('("t", 1)', '("__consumer_offsets", self.partition)')


def test_a_broker_killed_before_the_offsets_marker_commits_the_offsets_when_it_restarts(tmp_path):
    """Consume-transform-produce stopped between the markers: the output partition's is in, the group's
    ``__consumer_offsets`` one is not. After the restart the pending offset commit is loaded, the marker
    written, and the group's offset moves."""
    log_dir = tmp_path / "logs"
    process, bootstrap = start_broker_process(log_dir, before=OFFSETS_MARKER_FAILS)
    try:
        source = Producer({"bootstrap.servers": bootstrap})
        source.produce("in", b"input", partition=0)                     # creates the input topic
        source.flush(TIMEOUT)
        producer = transactional(bootstrap, "killed-offsets")
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "killed-group"})
        producer.begin_transaction()
        producer.produce("t", b"output", partition=0)
        producer.send_offsets_to_transaction([TopicPartition("in", 0, 7)], consumer.consumer_group_metadata(),
                                             TIMEOUT)
        producer.commit_transaction(TIMEOUT)
        consumer.close()
        wait_for(lambda: read_all(bootstrap, "read_committed", partitions=1) == [b"output"], "the output's marker")
        assert committed_offsets(AdminClient({"bootstrap.servers": bootstrap}), "killed-group", False) == {}
    finally:
        kill(process)
    process, bootstrap = start_broker_process(log_dir)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        wait_for(lambda: committed_offsets(admin, "killed-group") == {("in", 0): 7},
                 "the group's offset committed after the restart")
    finally:
        process.terminate()
        process.wait()


def committed_offsets(admin, group, require_stable=True):
    """The group's committed offsets (None: OffsetFetch with require_stable refused while a commit is
    pending; without, the pending commit is left out)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    try:
        listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                   require_stable=require_stable)[group].result(TIMEOUT)
    except KafkaException:
        return None
    return {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions if tp.offset >= 0}


def test_consume_transform_produce_offsets_move_only_on_commit(broker):
    """``send_offsets_to_transaction`` (AddOffsetsToTxn, TxnOffsetCommit): the input offsets become the
    group's committed offsets with the output records, and not at all when the transaction aborts."""
    bootstrap = broker.bootstrap_servers
    broker.logs.create_topic("in", 1)
    source = Producer({"bootstrap.servers": bootstrap})
    for i in range(5):
        source.produce("in", f"in-{i}".encode())
    source.flush(TIMEOUT)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ctp", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.assign([TopicPartition("in", 0, OFFSET_BEGINNING)])
    producer = transactional(bootstrap, "ctp-tx")
    inputs = []
    wait_for(lambda: _poll_into(consumer, inputs, set()) and len(inputs) == 5, "the input")
    try:
        for commit in (False, True):
            producer.begin_transaction()
            for value in inputs:
                producer.produce("t", value.replace(b"in", b"out"), partition=0)
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), TIMEOUT)
            if commit:
                producer.commit_transaction(TIMEOUT)
            else:
                producer.flush(TIMEOUT)
                producer.abort_transaction(TIMEOUT)
                settled(broker)
                assert consumer.committed([TopicPartition("in", 0)], TIMEOUT)[0].offset < 0     # nothing moved
        settled(broker)
        assert consumer.committed([TopicPartition("in", 0)], TIMEOUT)[0].offset == 5
    finally:
        consumer.close()
    assert read_all(bootstrap, "read_committed") == sorted(v.replace(b"in", b"out") for v in inputs)


def test_no_client_appends_to_deletes_from_or_grows_the_transaction_state_topic(broker):
    transactional(broker.bootstrap_servers, "creates-the-topic")
    ends = [broker.logs.get_partition("__transaction_state", p).log_end_offset for p in range(50)]
    delivered = []
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce("__transaction_state", b"forged", partition=0, on_delivery=lambda e, m: delivered.append(e))
    producer.flush(TIMEOUT)
    assert [e.code() for e in delivered] == [KafkaError.TOPIC_EXCEPTION]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    deleted = admin.delete_records([TopicPartition("__transaction_state", 0, 0)])
    with pytest.raises(KafkaException) as refused:
        [future.result(TIMEOUT) for future in deleted.values()]
    assert refused.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
    grown = admin.create_partitions([NewPartitions("__transaction_state", 60)])
    with pytest.raises(KafkaException) as refused:
        [future.result(TIMEOUT) for future in grown.values()]
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST
    assert [broker.logs.get_partition("__transaction_state", p).log_end_offset for p in range(50)] == ends
    assert broker.logs.topics()["__transaction_state"].partitions == 50


FETCH = 1


def test_kmem_consumer_read_committed_stops_at_an_open_transaction_until_it_ends(broker):
    """The last stable offset is the open transaction's first offset: a read_committed ``kmem.consumer`` gets
    the records before it, then stays there however often it fetches (the plain record after it too), and
    gets the rest once the transaction commits."""
    bootstrap = broker.bootstrap_servers
    plain = Producer({"bootstrap.servers": bootstrap})
    for value in (b"before-0", b"before-1"):
        plain.produce("t", value, partition=0)
    plain.flush(TIMEOUT)
    producer = transactional(bootstrap, "open")
    producer.begin_transaction()
    producer.produce("t", b"in-the-transaction", partition=0)          # offset 2
    producer.flush(TIMEOUT)
    plain.produce("t", b"after-it", partition=0)                       # offset 3
    plain.flush(TIMEOUT)
    records = []

    def fetches():
        return sum(count for (key, _), count in broker.requests_served.items() if key == FETCH)
    with KmemConsumer(bootstrap, isolation_level="read_committed", auto_offset_reset="earliest",
                      fetch_max_wait_ms=50) as consumer:
        consumer.assign([("t", 0)])
        wait_for(lambda: records.extend(consumer.poll(50)) or len(records) == 2, "the records before the LSO")
        seen = fetches()
        wait_for(lambda: records.extend(consumer.poll(50)) or fetches() > seen + 5, "more fetches")
        assert [r.value for r in records] == [b"before-0", b"before-1"]
        assert consumer.position(("t", 0)) == 2
        producer.commit_transaction(TIMEOUT)
        wait_for(lambda: records.extend(consumer.poll(50)) or len(records) == 4, "the records after the commit")
        assert [(r.offset, r.value) for r in records[2:]] == [(2, b"in-the-transaction"), (3, b"after-it")]
        wait_for(lambda: consumer.poll(50) == [] and consumer.position(("t", 0)) == 5, "the position past the marker")
