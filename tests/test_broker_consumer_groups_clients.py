"""KIP-848 consumer groups on kmem broker with real clients: confluent-kafka (librdkafka) consumer processes with
``group.protocol=consumer`` and each server assignor share six partitions, as members join, leave cleanly and
crash; every record is committed once. Then Apache's Java consumer 3.9.1 with ``group.protocol=consumer`` reads in
a group and commits (OffsetCommit and OffsetFetch at its member epoch), shares a group with kmem's consumer on
the same protocol, each one's rebalance listener hearing exactly what moves, and, on the classic protocol,
follows the assignment of a group a consumer-protocol member upgraded (KIP-848's online migration)."""
import signal

import pytest

from broker_helpers import wait_for
from consumer_helpers import Recorder
from group_helpers import ConsumerProcess, split_evenly, start_broker
from java_probes import KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256, client_properties, start_probe, wheel_jar
from kmem.consumer import Consumer, TopicPartition
from kmem.protocol import ApiKey, RequestHeader, messages
from test_broker_consumer_groups import H
from test_broker_groups import PARTITIONS, produce
from test_broker_java_client import COOPERATIVE_STICKY, RUNTIME_JARS

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
        for epoch in (0, -1):               # another member joins and leaves: the group moves to epoch 3
            broker.coordinator.consumer_group_heartbeat(RequestHeader(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, 1, "t"), H(
                group_id="workers", member_id="other", member_epoch=epoch, rebalance_timeout_ms=1000,
                subscribed_topic_names=["orders"], topic_partitions=[]))
        wait_for(lambda: _members(broker) == (3, "Stable", [3]), "the member at the group's epoch 3")
        member_id = _describe_group(broker).members[0].member_id
        broker.close()
        broker = start_broker(tmp_path, port, **SETTINGS)
        produce(broker.bootstrap_servers, "orders", [f"b{i}" for i in range(30)])
        wait_for(lambda: len(committed([consumer])) >= 60, "the member carried on and committed the rest")
        assert sorted(committed([consumer])) == sorted(set(committed([consumer])))
        assert consumer.process.poll() is None
        # it carried on at its epoch: no rejoin, no new epoch (a restart that forgot the group would be at 1)
        assert _members(broker) == (3, "Stable", [3]) and _describe_group(broker).members[0].member_id == member_id
    finally:
        if consumer is not None:
            consumer.stop(signal.SIGKILL)
        broker.close()


def _describe_group(broker, group_id="workers"):
    return broker.coordinator.consumer_group_describe(*_describe(group_id)).groups[0]


def _members(broker):
    """The group's epoch, state and its members' epochs."""
    group = _describe_group(broker)
    return group.group_epoch, group.group_state, [m.member_epoch for m in group.members]


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


def test_the_java_admin_lists_and_describes_classic_and_consumer_groups(tmp_path, probe):
    """What ``kafka-consumer-groups.sh --list --type`` and ``--describe --members`` show through Apache's Admin
    3.9.1: ListGroups v5 with type and state filters, ConsumerGroupDescribe for a KIP-848 group, and its fallback
    to DescribeGroups for a classic group (the Admin retries there on GROUP_ID_NOT_FOUND)."""
    broker = start_broker(tmp_path, **SETTINGS)
    consumers = []
    try:
        bootstrap = broker.bootstrap_servers
        for topic in ("orders", "payments"):
            broker.logs.create_topic(topic, len(PARTITIONS))
        consumers = [ConsumerProcess(CLIENT, bootstrap, "new", "orders", "range") for _ in range(2)]
        consumers.append(ConsumerProcess("confluent-kafka", bootstrap, "old", "payments"))
        wait_for(lambda: split_evenly(consumers[:2], PARTITIONS) and consumers[2].state()[0] == set(PARTITIONS),
                 "both groups assigned")
        wait_for(lambda: broker.coordinator.consumer_group_describe(*_describe("new")).groups[0].group_state
                 == "Stable", "the consumer group reconciled")

        def listed(types, states="-"):
            return [(g["group_id"], g["type"], g["state"])
                    for g in probe("groups-list", bootstrap, types, states)["groups"]]

        assert listed("-") == [("new", "Consumer", "Stable"), ("old", "Classic", "Stable")]
        assert listed("consumer") == [("new", "Consumer", "Stable")]
        assert listed("classic") == [("old", "Classic", "Stable")]
        assert listed("-", "Empty") == []

        described = probe("groups-describe", bootstrap, "new", "old", "nobody")
        new, old = described["new"], described["old"]
        assert (new["type"], new["state"], new["assignor"]) == ("Consumer", "Stable", "range")
        assert (old["type"], old["state"]) == ("Classic", "Stable")
        # each member's assignment as its own client sees it, "orders-0" being the Admin's TopicPartition
        assert sorted(tuple(m["assigned"]) for m in new["members"]) == sorted(
            tuple(sorted(f"orders-{p}" for p in c.state()[0])) for c in consumers[:2])
        assert all(m["target"] == m["assigned"] for m in new["members"])
        assert [m["assigned"] for m in old["members"]] == [sorted(f"payments-{p}" for p in PARTITIONS)]
        assert described["nobody"]["state"] == "Dead"
    finally:
        for c in consumers:
            c.stop(signal.SIGKILL)


def test_a_java_classic_member_follows_the_assignment_of_an_upgraded_group(tmp_path, probe):
    """Apache's Java consumer 3.9.1 on the classic protocol (cooperative-sticky) shares a group with a
    ``group.protocol=consumer`` member that upgraded it: it gives up half its partitions by revoking them, never
    losing them, and its leaving hands them to the other."""
    broker = start_broker(tmp_path, **SETTINGS)
    consumer = java = None
    try:
        broker.logs.create_topic("orders", len(PARTITIONS))
        java = probe("member-start", broker.bootstrap_servers, "orders", "workers", COOPERATIVE_STICKY)["member"]
        wait_for(lambda: probe("member-state", java)["owned"] == list(PARTITIONS), "the Java member owning all")
        consumer = ConsumerProcess(CLIENT, broker.bootstrap_servers, "workers", "orders", "uniform")

        def shared():
            theirs, ours = set(probe("member-state", java)["owned"]), consumer.state()[0]
            return ours is not None and len(theirs) == len(ours) == 3 and theirs | ours == set(PARTITIONS)
        wait_for(shared, "the Java member and the consumer-protocol member three partitions each")
        members = broker.coordinator.consumer_groups.groups["workers"].members.values()
        assert sorted(m.classic is not None for m in members) == [False, True]
        events = probe("member-stop", java)["events"]
        java = None
        assert [name for name, _ in events if name == "lost"] == [], events
        wait_for(lambda: consumer.state()[0] == set(PARTITIONS), "the other member taking every partition")
    finally:
        if java is not None:
            probe("member-stop", java)
        if consumer is not None:
            consumer.stop(signal.SIGKILL)
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
