"""KIP-81's point, measured: a consumer reading a 64-partition backlog for a slow application grows by
about buffer.memory, whatever the backlog, also as a member of a KIP-848 group. Each client runs in its own
process (RSS high-water mark), kmem next to confluent-kafka, kafka-python and aiokafka on their default settings."""
import pytest

import consumer_memory
from mock_cluster import MockCluster

PARTITIONS, PER_PARTITION, VALUE = 64, 300, b"v" * 1024
BUFFER_MEMORY = 2 << 20


@pytest.fixture(scope="module")
def backlog():
    mock = MockCluster()
    mock.create_topic("memory", PARTITIONS)
    mock.create_topic("memory-warmup", 1)
    mock.produce("memory-warmup", [b"w"] * 10)
    mock.produce("memory", [VALUE] * (PARTITIONS * PER_PARTITION), partitions=PARTITIONS)
    yield mock
    mock.close()


def test_rss_growth_stays_near_buffer_memory(backlog):
    total = PARTITIONS * PER_PARTITION
    results = {client: consumer_memory.run(client, backlog.bootstrap, "memory", PARTITIONS, total, 20, BUFFER_MEMORY)
               for client in consumer_memory.CLIENTS}
    for r in results.values():
        print(f"{r['client']:16} {r['records']:6} records in {r['seconds']:5.2f} s, "
              f"RSS growth {r['growth'] / 2**20:6.1f} MiB")
    assert all(r["records"] == total for r in results.values())
    kmem = results["kmem"]["growth"]
    # The pool (its blocks are mappings, so freed ones leave no heap holes behind that varied with timing)
    # and twice max.poll.records decoded records: the application holds a batch while it polls the next.
    assert kmem <= BUFFER_MEMORY + (3 << 19)
    assert results["kmem-consumer-protocol"]["growth"] <= BUFFER_MEMORY + (3 << 19)
    # The backlog is 19 MiB: librdkafka prefetches it (queued.max.messages.kbytes is 64 MiB).
    assert results["confluent-kafka"]["growth"] > 2 * kmem
