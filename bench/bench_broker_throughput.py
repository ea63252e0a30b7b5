"""Produce and consume throughput with the broker's CPU per GB, and produce-to-consume latency: kmem
broker vs Tansu vs librdkafka's mock cluster in the same run
(``.venv/bin/pytest bench/bench_broker_throughput.py -s``).

Throughput: for 100 B, 1 KiB and 100 KiB records, 1 and 8 partitions, no compression and lz4, a
confluent-kafka producer (acks=all, idempotent, ``linger.ms`` 5) sends ``KMEM_BENCH_THROUGHPUT_MB``
(default 64) MB of random bytes to a topic created beforehand, round-robin over its partitions; then a
confluent-kafka consumer reads back all the broker holds (all of it, but the mock cluster keeps only
the last few MB of a partition). Printed per row and broker: MB/s of record values and the broker
process's CPU seconds per GB over each phase, and kmem's ratio to the mock cluster.

Latency: a producer sends 2,000 messages/s (100 B, ``linger.ms`` 0) for ``KMEM_BENCH_LATENCY_SECONDS``
(default 5) s while a consumer with librdkafka's defaults (``fetch.wait.max.ms`` 500) reads them; p50 and
p99 of the time from send to receipt.

Tansu and the mock cluster keep their data in memory; kmem writes its log directory to disk.
"""
import os
import struct
import time

import pytest

from peers import BrokerProcess, MockCluster, Tansu, create_topics

TOTAL_MB = int(os.environ.get("KMEM_BENCH_THROUGHPUT_MB", "64"))
LATENCY_SECONDS = float(os.environ.get("KMEM_BENCH_LATENCY_SECONDS", "5"))
SIZES = [100, 1024, 100 * 1024]
GB = 1e9

rows = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print(f"\nThroughput, {TOTAL_MB} MB of record values (MB/s; broker CPU s per GB):")
    print(f"{'record':>7} {'parts':>5} {'codec':>5} {'broker':>6} {'produce':>8} {'cpu/GB':>7} {'consume':>8} "
          f"{'cpu/GB':>7} {'produce vs mock':>16}")
    mock = {row[:3]: row for row in rows if row[3] == "mock"}
    for row in rows:
        ratio = row[4] / mock[row[:3]][4] if row[:3] in mock and row[3] != "mock" else float("nan")
        print(f"{row[0]:>7} {row[1]:>5} {row[2]:>5} {row[3]:>6} {row[4]:>8.1f} {row[5]:>7.2f} {row[6]:>8.1f} "
              f"{row[7]:>7.2f} {ratio:>16.2f}")
    for line in latency_rows:
        print(line)


def peers():
    yield lambda tmp: BrokerProcess(tmp / "kmem", {"message_max_bytes": 4 << 20})
    if Tansu.available():
        yield lambda tmp: Tansu()
    yield lambda tmp: MockCluster()


def produce(bootstrap, topic, partitions, size, codec):
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                         "linger.ms": 5, "compression.type": codec,
                                         "message.max.bytes": 4 << 20, "queue.buffering.max.kbytes": 1 << 20})
    payload = os.urandom(size)
    count = max(TOTAL_MB * 1_000_000 // size, partitions)
    for i in range(count):
        while True:
            try:
                producer.produce(topic, payload, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.005)
    assert producer.flush(300) == 0
    return count


def consume(bootstrap, topic, partitions):
    """Read every record the broker holds (the mock cluster keeps only the last few MB of a partition);
    returns how many."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                                         "enable.auto.commit": False, "fetch.max.bytes": 64 << 20,
                                         "max.partition.fetch.bytes": 16 << 20})
    assigned = [confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)]
    count = sum(high - low for low, high in (consumer.get_watermark_offsets(tp, timeout=10) for tp in assigned))
    consumer.assign(assigned)
    received, deadline = 0, time.perf_counter() + 300
    while received < count:
        assert time.perf_counter() < deadline, f"consumed {received} of {count}"
        for message in consumer.consume(10_000, timeout=0.1):
            assert message.error() is None, message.error()
            received += 1
    consumer.close()
    return count


def timed(broker, action):
    cpu, started = broker.cpu_seconds(), time.perf_counter()
    result = action()
    return result, time.perf_counter() - started, broker.cpu_seconds() - cpu


@pytest.mark.parametrize("codec", ["none", "lz4"])
@pytest.mark.parametrize("partitions", [1, 8])
@pytest.mark.parametrize("size", SIZES, ids=["100B", "1KiB", "100KiB"])
def test_throughput(tmp_path, size, partitions, codec):
    for start in peers():
        with start(tmp_path) as broker:
            topic = f"t-{size}-{partitions}-{codec}"
            create_topics(broker.bootstrap, [topic], partitions)
            count, produce_seconds, produce_cpu = timed(
                broker, lambda: produce(broker.bootstrap, topic, partitions, size, codec))
            held, consume_seconds, consume_cpu = timed(broker, lambda: consume(broker.bootstrap, topic, partitions))
            produced, consumed = count * size / GB, held * size / GB
            rows.append((size, partitions, codec, broker.name, produced * 1000 / produce_seconds,
                         produce_cpu / produced, consumed * 1000 / consume_seconds, consume_cpu / consumed))


latency_rows = []


def produce_to_consume(bootstrap):
    import confluent_kafka

    create_topics(bootstrap, ["latency"])
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "latency",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition("latency", 0, confluent_kafka.OFFSET_END)])
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})
    producer.produce("latency", b"warm-up", partition=0)
    producer.flush(30)
    consumer.consume(10, timeout=2)                 # connected and positioned before the clock
    latencies, rate, total = [], 2000, int(2000 * LATENCY_SECONDS)
    padding = b"\0" * 92
    started = time.perf_counter()
    sent = 0
    while len(latencies) < total:
        now = time.perf_counter()
        while sent < total and started + sent / rate <= now:
            producer.produce("latency", struct.pack(">d", time.perf_counter()) + padding, partition=0)
            sent += 1
        producer.poll(0)
        for message in consumer.consume(1000, timeout=0.0005):
            if message.error() is None and len(message.value()) == 100:
                latencies.append(time.perf_counter() - struct.unpack_from(">d", message.value())[0])
        assert now - started < LATENCY_SECONDS + 60, f"received {len(latencies)} of {total}"
    producer.flush(30)
    consumer.close()
    latencies.sort()
    return latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.99)] * 1000


def test_produce_to_consume_latency(tmp_path):
    for start in peers():
        with start(tmp_path) as broker:
            p50, p99 = produce_to_consume(broker.bootstrap)
            latency_rows.append(f"produce-to-consume latency at 2,000 msg/s, {broker.name}: "
                                f"p50 {p50:.2f} ms, p99 {p99:.2f} ms")
