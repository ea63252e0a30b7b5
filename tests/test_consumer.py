"""kmem.consumer in assign mode against librdkafka's mock cluster (third-party C code) and a fake broker
for hand-built data: every record once and in order, the KIP-81 memory bound, codecs, record formats,
transactions, corrupt data, configuration."""
import time

import confluent_kafka
import pytest

from consumer_fake_broker import FakeBroker
from consumer_helpers import consume, read_slowly
from kmem.consumer import Consumer, ConsumerRecord, KafkaError, OffsetOutOfRangeError, TopicPartition
from kmem.errors import ConfigError, CorruptRecordError, IllegalStateError, InvalidArgumentError
from kmem.records import build_control_batch, build_records
from mock_cluster import MockCluster


@pytest.fixture(scope="module")
def cluster():
    mock = MockCluster()
    yield mock
    mock.close()


def by_partition(records):
    result = {}
    for r in records:
        result.setdefault(r.partition, []).append(r)
    return result


def test_assign_hands_out_every_record_once_in_order(cluster):
    cluster.create_topic("orders", 4)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(2000):
        producer.produce("orders", b"value-%d" % i, key=b"k%d" % i, partition=i % 4, headers=[("h", b"%d" % i)])
    producer.flush()
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest", buffer_memory=1 << 20,
                  fetch_max_bytes=256 << 10) as consumer:
        consumer.assign([("orders", p) for p in range(4)])       # plain tuples work
        records = consume(consumer, 2000)
        assert consumer.poll(200) == []
        assert consumer.position(TopicPartition("orders", 0)) == 500
    assert len(records) == 2000
    assert all(isinstance(r, ConsumerRecord) for r in records)
    for partition, rs in by_partition(records).items():
        assert [r.offset for r in rs] == list(range(500))
        for r in rs:
            i = int(r.key[1:])
            assert i % 4 == partition
            assert r.value == b"value-%d" % i and r.headers == [("h", b"%d" % i)] and r.topic == "orders"
            assert r.timestamp > 1_600_000_000_000


def test_fetch_keeps_pool_memory_until_its_last_record_is_handed_out(cluster):
    # KIP-81's failed attempt released a response's memory when it was parsed; here the pool still
    # counts the response while any of its records waits to be handed out.
    cluster.create_topic("held", 1)
    cluster.produce("held", [b"x" * 1000] * 200)
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest", buffer_memory=1 << 20,
                        fetch_max_bytes=1 << 20, max_poll_records=1)
    consumer.assign([("held", 0)])
    first = consume(consumer, 1)
    assert [r.offset for r in first] == [0]
    buffered = consumer.metrics()["buffered-bytes"]
    assert buffered > 1000              # the rest of the fetched records wait in pool memory
    assert consumer.pool.outstanding_bytes >= buffered
    assert consumer.metrics()["MemoryPoolUsed"] >= buffered
    consumer.seek(("held", 0), 150)     # seeking away releases the buffered fetch
    assert consumer.metrics()["buffered-bytes"] == 0
    rest = consume(consumer, 50)
    assert [r.offset for r in rest] == list(range(150, 200))
    while consumer.metrics()["buffered-bytes"]:
        consumer.poll(50)
    consumer.close()
    assert consumer.pool.outstanding_bytes == 0


def test_pool_bound_and_fairness_with_64_partitions_and_a_slow_application(cluster):
    partitions, per_partition, value = 64, 100, b"v" * 1024
    cluster.create_topic("backlog", partitions)
    cluster.produce("backlog", [value] * (partitions * per_partition), partitions=partitions)
    buffer_memory, fetch_max = 512 << 10, 256 << 10
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest", buffer_memory=buffer_memory,
                        fetch_max_bytes=fetch_max, max_partition_fetch_bytes=32 << 10, max_poll_records=50)
    consumer.assign([("backlog", p) for p in range(partitions)])
    total = partitions * per_partition
    records, peak = read_slowly(consumer, total)
    metrics = consumer.metrics()
    consumer.close()
    assert len(records) == total
    assert len({(r.partition, r.offset) for r in records}) == total
    # One response beyond buffer.memory at most (a non-strict pool grants one more while memory is left).
    assert peak <= buffer_memory + fetch_max + (64 << 10)
    assert metrics["MemoryPoolDepletedTimeTotal"] > 0 or peak >= buffer_memory   # the bound was reached
    # Round-robin (KIP-74): every partition is served before any partition is finished.
    first_seen, counts, first_finished = {}, {}, None
    for i, r in enumerate(records):
        first_seen.setdefault(r.partition, i)
        counts[r.partition] = counts.get(r.partition, 0) + 1
        if first_finished is None and counts[r.partition] == per_partition:
            first_finished = i
    assert max(first_seen.values()) < first_finished


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_every_codec(cluster, codec):
    topic = f"codec-{codec}"
    cluster.create_topic(topic, 1)
    values = [b"%d:" % i + b"compressible " * (i % 50) for i in range(3000)]
    cluster.produce(topic, values, **{"compression.type": codec})
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest", buffer_memory=1 << 20,
                  fetch_max_bytes=512 << 10, max_poll_records=100) as consumer:
        consumer.assign([(topic, 0)])
        records = consume(consumer, len(values))
    assert [r.value for r in records] == values
    assert [r.offset for r in records] == list(range(len(values)))


@pytest.mark.parametrize("magic", [0, 1, 2])
@pytest.mark.parametrize("codec", ["none", "gzip"])
def test_v0_v1_v2_data(magic, codec):
    # Kafka-built layouts (as a broker stores them: v1 wrappers carry the last inner offset); the mock
    # cluster cannot serve these, as it does not assign offsets inside legacy message sets.
    values = [b"old-%d" % i for i in range(300)]
    data = b"".join(build_records(values[i:i + 100], magic=magic, compression=codec, base_offset=i)
                    for i in range(0, 300, 100))
    broker = FakeBroker("legacy", data, 300)
    try:
        with Consumer(broker.bootstrap, auto_offset_reset="earliest", buffer_memory=1 << 20,
                      fetch_max_bytes=512 << 10, max_poll_records=70) as consumer:
            consumer.assign([("legacy", 0)])
            records = consume(consumer, 300, timeout=10)
            consumer.seek(("legacy", 0), 150)          # into the middle of a batch
            again = consume(consumer, 150, timeout=10)
    finally:
        broker.close()
    assert [r.value for r in records] == values
    assert [r.offset for r in records] == list(range(300))
    assert [r.offset for r in again] == list(range(150, 300))


def transactional_log():
    """Offsets 0-1 committed (pid 7), 3-4 aborted (pid 8), 6 plain; markers at 2 and 5."""
    return (build_records([b"c0", b"c1"], base_offset=0, producer_id=7, producer_epoch=0, base_sequence=0,
                          transactional=True)
            + build_control_batch(1, offset=2, producer_id=7, producer_epoch=0, timestamp=0)
            + build_records([b"a3", b"a4"], base_offset=3, producer_id=8, producer_epoch=0, base_sequence=0,
                            transactional=True)
            + build_control_batch(0, offset=5, producer_id=8, producer_epoch=0, timestamp=0)
            + build_records([b"p6"], base_offset=6))


@pytest.mark.parametrize("isolation, expected", [
    ("read_committed", [(0, b"c0"), (1, b"c1"), (6, b"p6")]),
    ("read_uncommitted", [(0, b"c0"), (1, b"c1"), (3, b"a3"), (4, b"a4"), (6, b"p6")]),
])
def test_control_batches_and_aborted_data_are_skipped(isolation, expected):
    broker = FakeBroker("txn", transactional_log(), 7, aborted=[(8, 3)])
    try:
        with Consumer(broker.bootstrap, auto_offset_reset="earliest", isolation_level=isolation,
                      buffer_memory=1 << 20, fetch_max_bytes=1 << 20) as consumer:
            consumer.assign([("txn", 0)])
            records = consume(consumer, len(expected), timeout=10)
            assert consumer.poll(100) == []
            assert consumer.position(("txn", 0)) == 7      # past the last marker too
    finally:
        broker.close()
    assert [(r.offset, r.value) for r in records] == expected


@pytest.mark.parametrize("damage, message", [
    (lambda bad: bad.__setitem__(-3, bad[-3] ^ 0xFF), "CRC"),        # inside a record
    (lambda bad: bad.__setitem__(16, 7), "magic"),                   # the batch's magic byte
])
def test_corrupt_fetch_data_names_partition_and_offset(damage, message):
    good = build_records([b"r0", b"r1"], base_offset=0)
    bad = bytearray(build_records([b"r2-payload", b"r3"], base_offset=2))
    damage(bad)
    broker = FakeBroker("bad", good + bytes(bad), 4)
    try:
        with Consumer(broker.bootstrap, auto_offset_reset="earliest", buffer_memory=1 << 20,
                      fetch_max_bytes=1 << 20) as consumer:
            consumer.assign([("bad", 0)])
            records = consume(consumer, 2, timeout=10)
            assert [r.value for r in records] == [b"r0", b"r1"]
            for _ in range(2):          # raised again until the application seeks past it
                with pytest.raises(CorruptRecordError, match=rf"bad-0 at offset 2.*{message}"):
                    consumer.poll(100)
            consumer.seek(("bad", 0), 4)
            assert consumer.poll(200) == []
    finally:
        broker.close()


def test_configuration():
    with pytest.raises(ConfigError, match="buffer.memory"):
        Consumer("localhost:9092", buffer_memory=1 << 20)      # below the default fetch.max.bytes (50 MiB)
    with pytest.raises(ConfigError, match="buffer.memory"):
        Consumer.from_properties({"bootstrap.servers": "localhost:9092", "buffer.memory": "1000",
                                  "fetch.max.bytes": "2000"})
    with pytest.raises(ConfigError, match="unknown consumer properties: fetch.max.byte"):
        Consumer.from_properties({"bootstrap.servers": "h:1", "fetch.max.byte": 1})
    with pytest.raises(ConfigError, match="auto.offset.reset"):
        Consumer("h:1", auto_offset_reset="smallest")
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        Consumer()
    with pytest.raises(ConfigError, match="max.poll.records"):
        Consumer("h:1", max_poll_records=0)
    consumer = Consumer.from_properties({"bootstrap.servers": "127.0.0.1:1", "buffer.memory": str(64 << 20),
                                         "enable.auto.commit": "false", "max.poll.records": "7"})
    assert consumer.config["max.poll.records"] == 7 and consumer.config["enable.auto.commit"] is False
    assert consumer.config["fetch.max.bytes"] == 50 << 20 and consumer.config["session.timeout.ms"] == 45000
    assert consumer.pool.size == 64 << 20
    with pytest.raises(InvalidArgumentError):
        consumer.assign(["topic-without-partition"])
    with pytest.raises(InvalidArgumentError):
        consumer.assign([("t", -1)])
    with pytest.raises(InvalidArgumentError):
        consumer.poll(-1)
    with pytest.raises(IllegalStateError, match="group.id"):
        consumer.subscribe(["t"])
    consumer.assign([("t", 0)])
    with pytest.raises(InvalidArgumentError):
        consumer.seek(("t", 0), -5)
    with pytest.raises(IllegalStateError, match="not assigned"):
        consumer.seek(("t", 1), 0)
    consumer.close()
    with pytest.raises(IllegalStateError, match="closed"):
        consumer.poll()


def test_response_larger_than_buffer_memory_is_a_clear_error():
    big = build_records([b"x" * (100 << 10)], base_offset=0)       # one 100 KiB batch, returned whole
    broker = FakeBroker("big", big, 1)
    try:
        with Consumer(broker.bootstrap, auto_offset_reset="earliest", buffer_memory=64 << 10,
                      fetch_max_bytes=32 << 10) as consumer:
            consumer.assign([("big", 0)])
            with pytest.raises(KafkaError, match="does not fit in buffer.memory"):
                consume(consumer, 1, timeout=10)
    finally:
        broker.close()


def test_tls(tmp_path):
    from network_helpers import make_tls_contexts

    server_context, _ = make_tls_contexts(str(tmp_path))
    broker = FakeBroker("secure", build_records([b"s0", b"s1"], base_offset=0), 2, ssl_context=server_context)
    try:
        with Consumer.from_properties({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest",
                                       "buffer.memory": 1 << 20, "fetch.max.bytes": 1 << 20,
                                       "security.protocol": "SSL",
                                       "ssl.truststore.location": str(tmp_path / "cert.pem")}) as consumer:
            consumer.assign([("secure", 0)])
            assert [r.value for r in consume(consumer, 2, timeout=10)] == [b"s0", b"s1"]
    finally:
        broker.close()


def test_offset_reset_seek_pause_iteration_and_metrics(cluster):
    cluster.create_topic("positions", 2)
    cluster.produce("positions", [b"p%d" % i for i in range(200)], partitions=2)
    tp0, tp1 = TopicPartition("positions", 0), TopicPartition("positions", 1)
    with Consumer(cluster.bootstrap, buffer_memory=1 << 20, fetch_max_bytes=1 << 20) as consumer:
        consumer.assign([tp0, tp1])
        assert consumer.position(tp0) == 100                 # auto.offset.reset=latest (Kafka's default)
        assert consumer.poll(200) == []
        consumer.seek_to_beginning(tp0)
        consumer.pause(tp1)
        consumer.seek(tp1, 0)
        records = consume(consumer, 100)
        assert {r.partition for r in records} == {0} and [r.offset for r in records] == list(range(100))
        assert consumer.poll(200) == []                     # tp1 is paused
        consumer.resume(tp1)
        iterated = []
        for record in consumer:                              # iteration polls as needed
            iterated.append(record)
            if len(iterated) == 100:
                break
        assert [(r.partition, r.offset) for r in iterated] == [(1, i) for i in range(100)]
        consumer.seek(tp0, 10 ** 9)                          # out of range: reset to latest
        deadline = time.monotonic() + 10
        while consumer.position(tp0) != 100 and time.monotonic() < deadline:
            assert consumer.poll(50) == []
        assert consumer.position(tp0) == 100
        metrics = consumer.metrics()
        assert metrics["records-consumed-total"] == 200 and metrics["fetch-total"] > 0
        assert metrics["bytes-consumed-total"] > 200 * 2 and metrics["records-consumed-rate"] > 0
        assert {"MemoryPoolAvailable", "MemoryPoolUsed", "MemoryPoolAvgDepletedPercent",
                "MemoryPoolDepletedTimeTotal", "fetch-rate", "bytes-consumed-rate"} <= set(metrics)
    with Consumer(cluster.bootstrap, auto_offset_reset="none", buffer_memory=1 << 20,
                  fetch_max_bytes=1 << 20) as strict:
        strict.assign([tp0])
        with pytest.raises(KafkaError, match="auto.offset.reset is none"):
            consume(strict, 1, timeout=5)
        strict.seek(tp0, 10 ** 9)
        with pytest.raises(OffsetOutOfRangeError, match="positions-0"):
            consume(strict, 1, timeout=5)


def test_commit_async_and_committed_in_assign_mode(cluster):
    cluster.create_topic("commits", 1)
    cluster.produce("commits", [b"c%d" % i for i in range(10)])
    done = []
    with Consumer(cluster.bootstrap, group_id="assign-commits", auto_offset_reset="earliest",
                  buffer_memory=1 << 20, fetch_max_bytes=1 << 20) as consumer:
        consumer.assign([("commits", 0)])
        assert len(consume(consumer, 10)) == 10
        consumer.commit_async(callback=lambda offsets, error: done.append((offsets, error)))
        deadline = time.monotonic() + 10
        while not done and time.monotonic() < deadline:
            consumer.poll(50)
        assert done == [({TopicPartition("commits", 0): 10}, None)]
        assert consumer.committed(("commits", 0)) == 10
    with Consumer(cluster.bootstrap, group_id="assign-commits", buffer_memory=1 << 20,
                  fetch_max_bytes=1 << 20) as again:
        again.assign([("commits", 0)])
        assert again.position(("commits", 0)) == 10            # from the committed offset
