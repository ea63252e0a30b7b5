"""Consumer groups on kmem broker with real clients: kafka-python, aiokafka and confluent-kafka each run
three consumer processes in one group over six partitions; one leaves, one is killed, the survivor takes
every partition within the session timeout; after a broker restart a new consumer resumes at the
committed offsets."""
import signal
import time

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from broker_helpers import wait_for
from group_helpers import ConsumerProcess, split_evenly, start_broker

CLIENTS = ["kafka-python", "aiokafka", "confluent-kafka"]
PARTITIONS = range(6)
SESSION_TIMEOUT_S = 6


def produce(bootstrap, topic, values):
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i, value in enumerate(values):
        producer.send(topic, value.encode(), partition=i % len(PARTITIONS))
    producer.flush()
    producer.close()


def committed_values(consumers):
    return {value for c in consumers for _, _, value in c.state()[1]}


@pytest.mark.parametrize("client", CLIENTS)
def test_group_splits_rebalances_and_resumes_after_restart(tmp_path, client):
    broker = start_broker(tmp_path)
    port = int(broker.bootstrap_servers.rsplit(":", 1)[1])
    consumers = []
    try:
        bootstrap = broker.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic("orders", len(PARTITIONS), 1)])
        admin.close()
        first = [f"a{i}" for i in range(60)]
        produce(bootstrap, "orders", first)
        consumers = [ConsumerProcess(client, bootstrap, "workers", "orders") for _ in range(3)]
        wait_for(lambda: split_evenly(consumers, PARTITIONS) and all(len(c.state()[0]) == 2 for c in consumers),
                 "three consumers with two partitions each", timeout=60)

        consumers[0].stop(signal.SIGTERM)                     # a clean close: LeaveGroup
        wait_for(lambda: split_evenly(consumers[1:], PARTITIONS), "the two others taking its partitions",
                 timeout=SESSION_TIMEOUT_S * 2)

        consumers[1].stop(signal.SIGKILL)                     # a crash: only the session timeout tells
        killed_at = time.monotonic()
        wait_for(lambda: consumers[2].state()[0] == set(PARTITIONS), "the survivor taking every partition",
                 timeout=SESSION_TIMEOUT_S * 3)
        # the crash is noticed by the session timeout, then the survivor rejoins (rebalance timeout bounded)
        assert time.monotonic() - killed_at < SESSION_TIMEOUT_S * 3
        wait_for(lambda: committed_values(consumers) >= set(first), "every record committed")
        consumers[2].stop(signal.SIGTERM)
    finally:
        for c in consumers:
            c.stop(signal.SIGKILL)
        broker.close()

    broker = start_broker(tmp_path, port)
    try:
        group = broker.coordinator.groups["workers"]
        assert sum(o.offset for o in group.offsets.values()) == len(first)       # replayed from __consumer_offsets
        second = [f"b{i}" for i in range(30)]
        produce(broker.bootstrap_servers, "orders", second)
        resumed = ConsumerProcess(client, broker.bootstrap_servers, "workers", "orders")
        try:
            wait_for(lambda: {v for _, _, v in resumed.state()[1]} >= set(second), "the new records", timeout=60)
            values = [v for _, _, v in resumed.state()[1]]
            assert sorted(values) == sorted(second)          # nothing read twice, nothing skipped
        finally:
            resumed.stop()
    finally:
        broker.close()
