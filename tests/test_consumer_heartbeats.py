"""Heartbeats from a background thread (KIP-62) over the coordinator's priority channel (KIP-81), against
librdkafka's mock cluster and kmem broker: an application slower than session.timeout.ms keeps its
partitions with the pool full; one slower than max.poll.interval.ms leaves the group and rejoins."""
import time

import pytest

from kmem.broker import Broker
from kmem.consumer import CommitFailedError, Consumer
from mock_cluster import MockCluster

PARTITIONS = 8
SESSION_TIMEOUT_MS = 3000    # librdkafka's mock cluster expires members joining with less


class _Kmem:
    def __init__(self, tmp):
        self._broker = Broker(tmp, port=0, num_partitions=PARTITIONS, properties={
            "group.min.session.timeout.ms": "1000", "group.initial.rebalance.delay.ms": "0"})
        self._broker.start()
        self.bootstrap = self._broker.bootstrap_servers

    def produce(self, topic, values):
        import kafka
        producer = kafka.KafkaProducer(bootstrap_servers=self.bootstrap)
        for i, value in enumerate(values):
            producer.send(topic, value, partition=i % PARTITIONS)
        producer.flush()
        producer.close()

    def close(self):
        self._broker.close()


class _Mock:
    def __init__(self, tmp):
        self._mock = MockCluster()
        self.bootstrap = self._mock.bootstrap
        self._mock.create_topic("slow", PARTITIONS)
        self._mock.create_topic("stalled", PARTITIONS)

    def produce(self, topic, values):
        self._mock.produce(topic, values, partitions=PARTITIONS)

    def close(self):
        self._mock.close()


@pytest.fixture(scope="module", params=["mock", "kmem"])
def cluster(request, tmp_path_factory):
    running = {"mock": _Mock, "kmem": _Kmem}[request.param](str(tmp_path_factory.mktemp("logs")))
    running.produce("slow", [b"x" * 1024] * 4000)
    running.produce("stalled", [b"y" * 100] * 400)
    yield running
    running.close()


def joined(consumer, timeout=30.0):
    """Poll until the consumer holds partitions; its first records."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = consumer.poll(100)
        if records:
            return records
    raise AssertionError("the consumer never got records")


def test_an_application_slower_than_the_session_keeps_its_partitions_with_the_pool_full(cluster):
    with Consumer(cluster.bootstrap, group_id="slow-app", auto_offset_reset="earliest", enable_auto_commit=False,
                  buffer_memory=128 << 10, fetch_max_bytes=64 << 10, max_poll_records=10,
                  session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=300) as consumer:
        consumer.subscribe(["slow"])
        joined(consumer)
        # the first records may empty their response: poll until one is held with more to hand out, so that
        # the next fetch goes out now and the pool holds both while the application works
        deadline = time.monotonic() + 30
        while consumer.metrics()["buffered-bytes"] == 0 and time.monotonic() < deadline:
            consumer.poll(100)
        assert consumer.metrics()["buffered-bytes"] > 0
        generation, assignment = consumer.generation, consumer.assignment()
        answered = consumer.metrics()["heartbeat-total"]
        for _ in range(2):
            time.sleep(3 * SESSION_TIMEOUT_MS / 1000)       # the application handles one batch
            assert consumer.pool.is_out_of_memory            # the prefetch filled the pool meanwhile
            assert consumer.poll(0)
            assert consumer.generation == generation
        assert consumer.assignment() == assignment == {("slow", p) for p in range(PARTITIONS)}
        # heartbeats every 300 ms for 18 s, their answers read while the pool was full
        assert consumer.metrics()["heartbeat-total"] - answered >= 30
        consumer.commit()


def test_an_application_beyond_max_poll_interval_leaves_and_rejoins(cluster):
    with Consumer(cluster.bootstrap, group_id="stalled-app", auto_offset_reset="earliest", enable_auto_commit=False,
                  max_poll_records=10, session_timeout_ms=30000, heartbeat_interval_ms=300,
                  max_poll_interval_ms=1000) as consumer:
        consumer.subscribe(["stalled"])
        records = joined(consumer)
        generation = consumer.generation
        assert generation >= 0
        deadline = time.monotonic() + 20
        while consumer.generation >= 0 and time.monotonic() < deadline:
            time.sleep(0.05)                # the application is stuck, no poll(): the heartbeat thread leaves
        assert consumer.generation == -1
        with pytest.raises(CommitFailedError, match="max.poll.interval.ms"):
            consumer.commit()
        # The next poll rejoins: the group, emptied by LeaveGroup (not by the 30 s session timeout),
        # forms a new generation, and the partitions start again from their (missing) commits.
        again = joined(consumer)
        assert consumer.generation > generation
        assert consumer.assignment() == {("stalled", p) for p in range(PARTITIONS)}
        assert min(r.offset for r in again) == 0 and records
