"""KIP-848 consumer groups on kmem broker with real clients: confluent-kafka (librdkafka) consumer processes with
``group.protocol=consumer`` and each server assignor share six partitions, as members join, leave cleanly and
crash; every record is committed once. Then Apache's Java consumer 3.9.1 with ``group.protocol=consumer`` reads in
a group and commits (OffsetCommit and OffsetFetch at its member epoch), and shares a group with kmem's consumer on
the same protocol, each one's rebalance listener hearing exactly what moves."""
import signal

import pytest

from broker_helpers import wait_for
from consumer_helpers import Recorder
from group_helpers import ConsumerProcess, split_evenly, start_broker
from java_probes import KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256, client_properties, start_probe, wheel_jar
from kmem.consumer import Consumer, TopicPartition
from kmem.protocol import ApiKey, RequestHeader, messages
from test_broker_groups import PARTITIONS, produce
from test_broker_java_client import RUNTIME_JARS

CLIENT = "confluent-kafka-consumer-protocol"
# a short heartbeat interval: a partition moves within a few heartbeats of its old and new owners
SETTINGS = {"group.consumer.heartbeat.interval.ms": 200, "group.consumer.session.timeout.ms": 3000}


def committed(consumers):
    return [(partition, offset) for c in consumers for partition, offset, _ in c.state()[1]]


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_members_join_leave_and_crash_and_every_record_is_committed_once(tmp_path, assignor):
    broker = start_broker(tmp_path, **SETTINGS)
    consumers = []
    try:
        bootstrap = broker.bootstrap_servers
        broker.logs.create_topic("orders", len(PARTITIONS))
        produce(bootstrap, "orders", [f"a{i}" for i in range(60)])
        consumers = [ConsumerProcess(CLIENT, bootstrap, "workers", "orders", assignor) for _ in range(2)]
        wait_for(lambda: split_evenly(consumers, PARTITIONS), "two members with three partitions each")
        consumers.append(ConsumerProcess(CLIENT, bootstrap, "workers", "orders", assignor))
        wait_for(lambda: split_evenly(consumers, PARTITIONS), "a third member taking its share")
        produce(bootstrap, "orders", [f"b{i}" for i in range(60)])
        described = broker.coordinator.consumer_group_describe(*_describe("workers")).groups[0]
        assert (described.group_state, described.assignor_name, len(described.members)) == ("Stable", assignor, 3)

        consumers[0].stop(signal.SIGTERM)                 # leaves with epoch -1
        wait_for(lambda: split_evenly(consumers[1:], PARTITIONS), "the two others taking its partitions")
        consumers[1].stop(signal.SIGKILL)                 # a crash: the session timeout fences it
        wait_for(lambda: consumers[2].state()[0] == set(PARTITIONS), "the survivor taking every partition")
        produce(bootstrap, "orders", [f"c{i}" for i in range(60)])
        wait_for(lambda: len(set(committed(consumers))) == 180, "every record committed")
        consumers[2].stop(signal.SIGTERM)
        # the killed member may have consumed records it could not commit: those are read again, nothing else
        seen = committed(consumers)
        assert len(seen) == len(set(seen)), "a committed record was read twice"
    finally:
        for c in consumers:
            c.stop(signal.SIGKILL)
        broker.close()


def test_a_member_carries_on_over_a_broker_restart(tmp_path):
    broker = start_broker(tmp_path, **SETTINGS)
    port = int(broker.bootstrap_servers.rsplit(":", 1)[1])
    consumer = None
    try:
        broker.logs.create_topic("orders", len(PARTITIONS))
        produce(broker.bootstrap_servers, "orders", [f"a{i}" for i in range(30)])
        consumer = ConsumerProcess(CLIENT, broker.bootstrap_servers, "workers", "orders", "uniform")
        wait_for(lambda: len(committed([consumer])) == 30, "the first records committed")
        broker.close()
        broker = start_broker(tmp_path, port, **SETTINGS)
        produce(broker.bootstrap_servers, "orders", [f"b{i}" for i in range(30)])
        wait_for(lambda: len(committed([consumer])) >= 60, "the member rejoined and committed the rest")
        assert sorted(committed([consumer])) == sorted(set(committed([consumer])))
        assert consumer.process.poll() is None
    finally:
        if consumer is not None:
            consumer.stop(signal.SIGKILL)
        broker.close()


def _describe(group_id):
    return (RequestHeader(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1, "test"),
            messages.ConsumerGroupDescribeRequest(group_ids=[group_id], include_authorized_operations=False))


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    classpath = [wheel_jar(KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256), *map(wheel_jar, RUNTIME_JARS)]
    running = start_probe(tmp_path_factory.mktemp("java-848-probe"), "KafkaClientProbe.java", classpath)
    yield running
    running.close()


def test_the_java_consumer_reads_and_commits_with_the_consumer_protocol(tmp_path, probe):
    broker = start_broker(tmp_path, **SETTINGS)
    try:
        broker.logs.create_topic("orders", len(PARTITIONS))
        produce(broker.bootstrap_servers, "orders", [f"v{i}" for i in range(30)])
        client = client_properties(tmp_path / "client.properties", broker.bootstrap_servers,
                                   **{"group.protocol": "consumer"})
        first = probe("group-read", client, "orders", "java", 20)
        assert len(first["values"]) >= 20, first
        rest = probe("group-read", client, "orders", "java", 30 - len(first["values"]))
        # the second member resumes at the first one's commits: every value once
        assert sorted(first["values"] + rest["values"]) == sorted(f"v{i}" for i in range(30))
        assert "java" in broker.coordinator.consumer_groups.groups
    finally:
        broker.close()


def test_a_kmem_and_a_java_member_share_and_hear_exactly_what_moves(tmp_path, probe):
    broker = start_broker(tmp_path, **SETTINGS)
    java = None
    try:
        broker.logs.create_topic("orders", len(PARTITIONS))
        events = Recorder()
        with Consumer(broker.bootstrap_servers, group_id="mixed", group_protocol="consumer") as kmem:
            kmem.subscribe(["orders"], listener=events)
            every = {TopicPartition("orders", p) for p in PARTITIONS}
            wait_for(lambda: kmem.poll(20) is not None and kmem.assignment() == every, "kmem holding every partition")
            java = probe("member-start", broker.bootstrap_servers, "orders", "mixed", "consumer:uniform")["member"]

            def shared():
                kmem.poll(20)
                owned = set(probe("member-state", java)["owned"])
                return len(owned) == 3 and {tp.partition for tp in kmem.assignment()} == set(PARTITIONS) - owned
            wait_for(shared, "the Java member taking half")
            moved = every - kmem.assignment()
            assert events.events == [("assigned", every), ("revoked", moved), ("assigned", set())]
            state = probe("member-stop", java)
            java = None
            partitions = sorted(tp.partition for tp in moved)
            changes = [event for event in state["events"] if event[1]]
            assert changes == [["assigned", partitions], ["revoked", partitions]]
            wait_for(lambda: kmem.poll(20) is not None and kmem.assignment() == every, "kmem taking them back")
            assert events.events[3:] == [("assigned", moved)]
    finally:
        if java is not None:
            probe("member-stop", java)
        broker.close()
