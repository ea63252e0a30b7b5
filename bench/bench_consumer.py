"""Consumer benchmarks (KIP-81), side by side in one run, against librdkafka's mock cluster:

1. Throughput: records/s and MB/s reading the same topic (4 partitions, 1 KiB and 100 B values) from the
   beginning: kmem vs confluent-kafka (librdkafka, C), aiokafka, kafka-python, each on its defaults
   (kafka-python needs ``api_version=(2, 3)`` against the mock cluster). One operation = one record.
2. Memory: peak RSS growth while a slow application (20 ms per batch) reads a backlog of 16, 64 and 256 MiB
   (``KMEM_BENCH_CONSUMER_BACKLOGS_MIB``) in 64 partitions of 1 KiB lz4-compressed records, each client in
   its own process (``tests/consumer_memory.py``); kmem with ``buffer.memory`` = 4 MiB, the peers on their
   defaults. Asserts kmem's growth stays within ``buffer.memory`` + 4 MiB at every backlog.

Run: ``.venv/bin/pytest bench/bench_consumer.py -s``.
"""
import asyncio
import os
import random
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))
import consumer_memory  # noqa: E402
from mock_cluster import MockCluster  # noqa: E402

THROUGHPUT_BYTES = 16 << 20          # per topic
BACKLOGS_MIB = [int(m) for m in os.environ.get("KMEM_BENCH_CONSUMER_BACKLOGS_MIB", "16,64,256").split(",")]
MEMORY_BUFFER = 4 << 20
results = []


@pytest.fixture(scope="module")
def cluster():
    mock = MockCluster()
    for size in (1024, 100):
        topic = f"throughput-{size}"
        mock.create_topic(topic, 4)
        mock.produce(topic, [b"x" * size] * (THROUGHPUT_BYTES // size), partitions=4)
    yield mock
    print("\n" + "\n".join(results))
    mock.close()


def read_kmem(bootstrap, topic, count):
    from kmem.consumer import Consumer

    with Consumer(bootstrap, auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        consumer.assign([(topic, p) for p in range(4)])
        n = 0
        while n < count:
            n += len(consumer.poll(1000))


def read_confluent(bootstrap, topic, count):
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(4)])
    n = 0
    while n < count:
        n += sum(1 for m in consumer.consume(min(500, count - n), 1.0) if m.error() is None)
    consumer.close()


def read_kafka_python(bootstrap, topic, count):
    import kafka

    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, api_version=(2, 3), auto_offset_reset="earliest",
                                   enable_auto_commit=False)
    consumer.assign([kafka.TopicPartition(topic, p) for p in range(4)])
    n = 0
    while n < count:
        n += sum(len(rs) for rs in consumer.poll(1000).values())
    consumer.close()


def read_aiokafka(bootstrap, topic, count):
    import aiokafka

    async def run():
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                             enable_auto_commit=False)
        await consumer.start()
        consumer.assign([aiokafka.TopicPartition(topic, p) for p in range(4)])
        n = 0
        while n < count:
            batches = await consumer.getmany(timeout_ms=1000)
            n += sum(len(rs) for rs in batches.values())
        await consumer.stop()
    asyncio.run(run())


READERS = {"kmem": read_kmem, "confluent-kafka": read_confluent, "aiokafka": read_aiokafka,
           "kafka-python": read_kafka_python}


@pytest.mark.parametrize("size", [1024, 100])
@pytest.mark.parametrize("client", list(READERS))
def test_throughput(compare, cluster, client, size):
    count = THROUGHPUT_BYTES // size
    topic = f"throughput-{size}"
    compare(f"consume {size} B records (4 partitions)", client,
            lambda: READERS[client](cluster.bootstrap, topic, count), ops_per_call=count, unit_bytes=size)


@pytest.mark.parametrize("backlog_mib", BACKLOGS_MIB)
def test_peak_rss_slow_application(backlog_mib):
    per_partition = (backlog_mib << 20) // (64 * 1024)
    total = 64 * per_partition
    noise = random.Random(0).randbytes(1 << 16)     # half of each value random: lz4 halves it
    values = [noise[i * 512 % 65000:][:512] + b"v" * 512 for i in range(total)]
    mock = MockCluster()
    try:
        mock.create_topic("backlog", 64)
        mock.create_topic("backlog-warmup", 1)
        mock.produce("backlog-warmup", [b"w"] * 10, **{"compression.type": "lz4"})
        mock.produce("backlog", values, partitions=64, **{"compression.type": "lz4"})
        del values
        print(f"\npeak RSS growth, {backlog_mib} MiB backlog (64 partitions x {per_partition} x 1 KiB, lz4), "
              f"application 20 ms per batch (kmem buffer.memory = {MEMORY_BUFFER >> 20} MiB):")
        growth = {}
        for client in consumer_memory.CLIENTS:
            started = time.monotonic()
            r = consumer_memory.run(client, mock.bootstrap, "backlog", 64, total, 20, MEMORY_BUFFER)
            growth[client] = r["growth"]
            print(f"    {client:<16} {r['growth'] / 2**20:7.1f} MiB   {r['records']:>7} records in "
                  f"{r['seconds']:6.2f} s ({time.monotonic() - started:.0f} s with startup)")
            assert r["records"] == total
    finally:
        mock.close()
    # Issue 27's goal: the pool, and what the application holds (two polls of decoded records), within 4 MiB.
    assert growth["kmem"] <= MEMORY_BUFFER + (4 << 20)
