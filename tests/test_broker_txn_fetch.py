"""Reading transactional data (KIP-98) from the broker: Fetch read_committed answers up to the last stable
offset with the aborted transactions of the range read (from the ``.txnindex`` files), a parked
read_committed Fetch completes when the last stable offset moves, ListOffsets read_committed answers the last
stable offset, and Fetch v0-v3 never see a transaction marker, raw and from real old clients (kafka-python
at api_version 0.8.2 to 0.10.1, librdkafka with broker.version.fallback 0.9.0). Raw requests use
kafka-python's codec."""
import os
import time

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse

from broker_helpers import RawConnection, entry_magics, wait_for
from kmem.broker import Broker
from kmem.records import MemoryRecords, RecordsBuilder

READ_UNCOMMITTED, READ_COMMITTED = 0, 1


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "logs", num_partitions=1) as running:
        yield running


def produce(partition_log, producer_id, values, transactional=True, sequence=0):
    builder = RecordsBuilder(2, "none", producer_id=producer_id, producer_epoch=0, base_sequence=sequence,
                             transactional=transactional)
    for value in values:
        builder.append(value, timestamp=time.time_ns() // 1_000_000)
    result = partition_log.append(builder.build())
    assert result.error_code == 0, result
    return result


def fetch(broker, topic, offset, isolation, version=11, max_wait_ms=0, min_bytes=0):
    request = FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20,
                           isolation_level=isolation, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                               FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset,
                                                                      partition_max_bytes=1 << 20)])])
    with RawConnection(broker.bootstrap_servers) as connection:
        return connection.request(request, FetchResponse, version).responses[0].partitions[0]


def batches_of(data):
    return [(b.base_offset, b.last_offset, b.producer_id, b.is_control_batch)
            for b in MemoryRecords(data.records).batches()]


def aborted(data):
    return [(txn.producer_id, txn.first_offset) for txn in data.aborted_transactions or []]


@pytest.fixture
def transactions(broker):
    """Producer 1 aborts (0-1, marker 2), producer 2 commits (3, marker 4), producer 3 is open (5)."""
    broker.logs.create_topic("txn")
    partition_log = broker.logs.get_partition("txn", 0)
    produce(partition_log, 1, [b"a0", b"a1"])
    partition_log.write_txn_marker(1, 0, 0, False)
    produce(partition_log, 2, [b"c3"])
    partition_log.write_txn_marker(2, 0, 0, True)
    produce(partition_log, 3, [b"open5"])
    return partition_log


def test_read_committed_stops_at_the_last_stable_offset_with_the_aborted_transactions(broker, transactions):
    committed = fetch(broker, "txn", 0, READ_COMMITTED)
    assert (committed.error_code, committed.high_watermark, committed.last_stable_offset) == (0, 6, 5)
    assert batches_of(committed) == [(0, 1, 1, False), (2, 2, 1, True), (3, 3, 2, False), (4, 4, 2, True)]
    assert aborted(committed) == [(1, 0)]
    assert aborted(fetch(broker, "txn", 3, READ_COMMITTED)) == []        # producer 1's ended before offset 3
    assert fetch(broker, "txn", 5, READ_COMMITTED).records in (None, b"")
    uncommitted = fetch(broker, "txn", 0, READ_UNCOMMITTED)
    assert [b[0] for b in batches_of(uncommitted)] == [0, 2, 3, 4, 5]
    assert not uncommitted.aborted_transactions


def test_an_abort_whose_marker_is_in_a_later_segment_is_found(broker, transactions):
    transactions.write_txn_marker(3, 0, 0, True)              # offset 6
    produce(transactions, 4, [b"abort7"])
    transactions.roll()
    produce(transactions, 5, [b"plain8"], transactional=False)
    transactions.write_txn_marker(4, 0, 0, False)             # offset 9, in the next segment's .txnindex
    data = fetch(broker, "txn", 7, READ_COMMITTED)
    assert batches_of(data) == [(7, 7, 4, False)]           # one segment at a time
    assert aborted(data) == [(4, 7)]



def test_a_read_committed_fetch_opens_no_txnindex_until_a_segment_has_an_aborted_transaction(tmp_path, monkeypatch):
    """Whether a segment has a ``.txnindex`` is remembered: a read_committed read of a segment without aborted
    transactions opens none; the first abort's entry is read at once, and after a restart (found on disk)."""
    from kmem.broker.log import txn_index
    opened = []
    real_open = os.open
    monkeypatch.setattr(txn_index.os, "open", lambda path, *args, **kwargs: opened.append(str(path))
                        or real_open(path, *args, **kwargs))
    with Broker(tmp_path / "logs", num_partitions=1) as running:
        running.logs.create_topic("t")
        partition_log = running.logs.get_partition("t", 0)
        produce(partition_log, 1, [b"plain"], transactional=False)
        read = partition_log.read(0, 1 << 20, isolation=READ_COMMITTED, copy_below=1 << 20)
        assert read.aborted_transactions == [] and read.records
        assert not [path for path in opened if path.endswith(".txnindex")]
        produce(partition_log, 2, [b"doomed"])
        partition_log.write_txn_marker(2, 0, 0, False)
        assert [txn.producer_id for txn in partition_log.read(
            0, 1 << 20, isolation=READ_COMMITTED, copy_below=1 << 20).aborted_transactions] == [2]
    with Broker(tmp_path / "logs", num_partitions=1) as running:
        assert [txn.producer_id for txn in running.logs.get_partition("t", 0).read(
            0, 1 << 20, isolation=READ_COMMITTED, copy_below=1 << 20).aborted_transactions] == [2]


def test_the_aborted_transactions_answered_are_those_of_the_bytes_read(broker):
    """Kafka's ``fetchUpperBoundOffset``: the aborted transactions answered overlap what the fetch read (to the
    offset index's granularity), not the rest of the segment, however many transactions it aborted."""
    broker.logs.create_topic("many", configs={"index.interval.bytes": 0})
    partition_log = broker.logs.get_partition("many", 0)
    for producer_id in range(1, 201):
        produce(partition_log, producer_id, [b"x" * 100])
        partition_log.write_txn_marker(producer_id, 0, 0, False)
    read = partition_log.read(0, 1, isolation=READ_COMMITTED)           # its first batch (min_one_message)
    read.records.close()
    assert [txn.producer_id for txn in read.aborted_transactions] in ([1], [1, 2])

def test_a_parked_read_committed_fetch_completes_when_the_last_stable_offset_moves(broker, transactions):
    connection = RawConnection(broker.bootstrap_servers)
    try:
        request = FetchRequest(replica_id=-1, max_wait_ms=60_000, min_bytes=1, max_bytes=1 << 20, isolation_level=1,
                               topics=[FetchRequest.FetchTopic(topic="txn", partitions=[
                                   FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=5,
                                                                          partition_max_bytes=1 << 20)])])
        request.with_header(correlation_id=3, client_id="parked")
        connection.send_frame(request.encode(version=11, header=True))
        wait_for(lambda: len(broker.handlers.fetch_purgatory) == 1, "the fetch to be parked")
        produce(transactions, 9, [b"beyond"], transactional=False)     # above the LSO: not enough
        assert len(broker.handlers.fetch_purgatory) == 1
        transactions.write_txn_marker(3, 0, 0, True)
        data = FetchResponse.decode(connection.receive_frame(), version=11, header=True).responses[0].partitions[0]
        assert data.last_stable_offset == 8
        assert [b[0] for b in batches_of(data)] == [5, 6, 7]
    finally:
        connection.close()


def list_latest(broker, isolation):
    request = ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name="txn", partitions=[
            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1)])])
    with RawConnection(broker.bootstrap_servers) as connection:
        return connection.request(request, ListOffsetsResponse, 5).topics[0].partitions[0].offset


def test_list_offsets_latest_is_the_last_stable_offset_for_read_committed(broker, transactions):
    assert (list_latest(broker, READ_COMMITTED), list_latest(broker, READ_UNCOMMITTED)) == (5, 6)
    transactions.write_txn_marker(3, 0, 0, False)
    assert (list_latest(broker, READ_COMMITTED), list_latest(broker, READ_UNCOMMITTED)) == (7, 7)



def test_list_offsets_by_timestamp_finds_nothing_past_the_last_stable_offset_for_read_committed(broker):
    """Kafka's ``Partition.fetchOffsetForTimestamp``: a timestamp lookup (and the max timestamp's, -3) answers
    only offsets below the last fetchable one, the last stable offset for read_committed."""
    broker.logs.create_topic("ts")
    partition_log = broker.logs.get_partition("ts", 0)
    now = time.time_ns() // 1_000_000
    for producer_id, timestamp, transactional in ((-1, now - 10_000, False), (7, now - 5_000, True)):
        builder = RecordsBuilder(2, "none", producer_id=producer_id, producer_epoch=0 if transactional else -1,
                                 base_sequence=0 if transactional else -1, transactional=transactional)
        builder.append(b"v", timestamp=timestamp)
        assert partition_log.append(builder.build()).error_code == 0      # offsets 0, then 1 (open)

    def lookup(timestamp, isolation):
        request = ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name="ts", partitions=[
                ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=timestamp)])])
        with RawConnection(broker.bootstrap_servers) as connection:
            return connection.request(request, ListOffsetsResponse, 7).topics[0].partitions[0].offset
    assert [lookup(t, READ_UNCOMMITTED) for t in (now - 7_000, -3, now - 20_000)] == [1, 1, 0]
    assert [lookup(t, READ_COMMITTED) for t in (now - 7_000, -3, now - 20_000)] == [-1, -1, 0]
    partition_log.write_txn_marker(7, 0, 0, True)
    assert lookup(now - 7_000, READ_COMMITTED) == 1

@pytest.mark.parametrize("version, magic", [(0, 0), (1, 0), (2, 1), (3, 1)])
def test_old_fetches_read_uncommitted_and_never_see_a_marker(broker, transactions, version, magic):
    data = fetch(broker, "txn", 0, READ_UNCOMMITTED, version=version)
    assert entry_magics(data.records) == [magic] * 4                 # a0, a1, c3, open5: no marker
    assert [b.last_offset for b in MemoryRecords(data.records).batches()] == [0, 1, 3, 5]
    after_marker = fetch(broker, "txn", 4, READ_UNCOMMITTED, version=version)
    assert [b.last_offset for b in MemoryRecords(after_marker.records).batches()] == [5]


FETCH = 1


@pytest.mark.parametrize("client, api_version, fetch_version", [
    ("kafka-python", (0, 10, 1), 3), ("kafka-python", (0, 10), 2), ("kafka-python", (0, 9), 1),
    ("kafka-python", (0, 8, 2), 0), ("librdkafka", "0.9.0", 1)])
def test_old_clients_read_aborted_and_open_data_and_no_marker(broker, transactions, client, api_version,
                                                               fetch_version):
    """Real old clients (Fetch v0-v3, no isolation level) read as Kafka serves them: every data record,
    aborted and open ones included, at its offset, and never a marker (offsets 2 and 4)."""
    before = {key: count for key, count in broker.requests_served.items() if key[0] == FETCH}
    expected = [(0, b"a0"), (1, b"a1"), (3, b"c3"), (5, b"open5")]
    received = []
    if client == "kafka-python":
        from kafka import KafkaConsumer, TopicPartition
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, api_version=api_version,
                                 auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
        consumer.assign([TopicPartition("txn", 0)])

        def poll():
            received.extend((r.offset, r.value) for records in consumer.poll(100).values() for r in records)
            return len(received) >= len(expected)
    else:
        import confluent_kafka
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": broker.bootstrap_servers, "api.version.request": False,
            "broker.version.fallback": api_version, "group.id": "unused", "enable.auto.commit": False})
        consumer.assign([confluent_kafka.TopicPartition("txn", 0, confluent_kafka.OFFSET_BEGINNING)])

        def poll():
            message = consumer.poll(0.1)
            if message is not None:
                assert message.error() is None, message.error()
                received.append((message.offset(), message.value()))
            return len(received) >= len(expected)
    try:
        wait_for(poll, f"{client} {api_version} to read the partition")
    finally:
        consumer.close()
    assert received == expected
    assert {version for (key, version), count in broker.requests_served.items()
            if key == FETCH and count > before.get((FETCH, version), 0)} == {fetch_version}
