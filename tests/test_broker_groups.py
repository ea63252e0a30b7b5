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
# longer than kafka-python's first metadata refresh: its first leader assigns knowing the topic, so it does
# not rejoin by itself at once, a rejoin kafka-python 3.0.12 can lose (see the README, Consumer groups)
FIRST_JOIN_AFTER_METADATA = {"group.initial.rebalance.delay.ms": 1000}


def produce(bootstrap, topic, values, partitions=len(PARTITIONS)):
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i, value in enumerate(values):
        producer.send(topic, value.encode(), partition=i % partitions)
    producer.flush()
    producer.close()


def committed_values(consumers):
    return {value for c in consumers for _, _, value in c.state()[1]}


@pytest.mark.parametrize("client", CLIENTS)
def test_group_splits_rebalances_and_resumes_after_restart(tmp_path, client):
    broker = start_broker(tmp_path, **FIRST_JOIN_AFTER_METADATA)
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

    broker = start_broker(tmp_path, port, **FIRST_JOIN_AFTER_METADATA)
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


def test_admin_clients_list_and_describe_the_group(tmp_path):
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    broker = start_broker(tmp_path, **FIRST_JOIN_AFTER_METADATA)
    consumers = []
    try:
        bootstrap = broker.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic("orders", 4, 1)])
        produce(bootstrap, "orders", [f"v{i}" for i in range(8)], partitions=4)
        consumers = [ConsumerProcess(client, bootstrap, "workers", "orders")
                     for client in ("kafka-python", "confluent-kafka")]
        wait_for(lambda: split_evenly(consumers, range(4)) and len(committed_values(consumers)) == 8,
                 "two consumers with two partitions each, every record committed", timeout=60)
        assignments = {frozenset(c.state()[0]) for c in consumers}
        committed = {("orders", p): 2 for p in range(4)}        # eight records over four partitions

        # kafka-python
        assert admin.list_groups() == [{"group_id": "workers", "protocol_type": "consumer", "group_state": "Stable",
                                        "group_type": "classic"}]
        described = admin.describe_groups(["workers"])["workers"]
        assert described["group_state"] == "Stable" and described["protocol_type"] == "consumer"
        assert {frozenset(p for a in m["member_assignment"]["assigned_partitions"] for p in a["partitions"])
                for m in described["members"]} == assignments
        assert {m["client_host"] for m in described["members"]} == {"/127.0.0.1"}
        assert {(tp.topic, tp.partition): o.offset
                for tp, o in admin.list_group_offsets("workers")["workers"].items()} == committed
        admin.close()

        # aiokafka
        async def aiokafka_view():
            client = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await client.start()
            try:
                return (await client.list_consumer_groups(), await client.describe_consumer_groups(["workers"]),
                        await client.list_consumer_group_offsets("workers"))
            finally:
                await client.close()
        listed, described, offsets = asyncio.run(aiokafka_view())
        assert listed == [("workers", "consumer")]
        group = described[0].groups[0]
        assert group[0] == 0 and group[1] == "workers" and group[2] == "Stable" and len(group[5]) == 2
        assert {(tp.topic, tp.partition): o.offset for tp, o in offsets.items()} == committed

        # confluent-kafka
        client = AdminClient({"bootstrap.servers": bootstrap})
        listed = client.list_consumer_groups().result(10)
        assert [(g.group_id, g.state.name) for g in listed.valid] == [("workers", "STABLE")] and not listed.errors
        described = client.describe_consumer_groups(["workers"])["workers"].result(10)
        assert described.state.name == "STABLE" and described.partition_assignor == "range"
        assert {frozenset(tp.partition for tp in m.assignment.topic_partitions)
                for m in described.members} == assignments
        offsets = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions("workers")])["workers"].result(10)
        assert {(tp.topic, tp.partition): tp.offset for tp in offsets.topic_partitions} == committed
    finally:
        for c in consumers:
            c.stop(signal.SIGKILL)
        broker.close()


def test_a_restarted_static_member_takes_its_partitions_back_without_a_rebalance(tmp_path):
    broker = start_broker(tmp_path)
    consumers = []
    try:
        bootstrap = broker.bootstrap_servers
        broker.logs.create_topic("orders", 4)
        consumers = [ConsumerProcess("confluent-kafka", bootstrap, "static", "orders", f"app-{i}") for i in range(2)]
        wait_for(lambda: split_evenly(consumers, range(4)), "two static members with two partitions each", timeout=60)
        group = broker.coordinator.groups["static"]
        generation = group.generation
        follower = next(i for i in range(2) if group.static_members[f"app-{i}"] != group.leader)
        before = consumers[follower].state()[0]
        old_member = group.static_members[f"app-{follower}"]
        consumers[follower].stop(signal.SIGKILL)               # gone without LeaveGroup (static: none sent)
        consumers[follower] = ConsumerProcess("confluent-kafka", bootstrap, "static", "orders", f"app-{follower}")
        wait_for(lambda: consumers[follower].state()[0] == before, "its partitions back", timeout=SESSION_TIMEOUT_S)
        assert group.generation == generation and group.state == "Stable"      # no rebalance happened
        assert group.static_members[f"app-{follower}"] != old_member          # a new member id took the place
    finally:
        for c in consumers:
            c.stop(signal.SIGKILL)
        broker.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_restarted_static_leader_takes_its_partitions_back_without_a_rebalance(tmp_path, client):
    """Kafka's ``updateStaticMemberAndRebalance``: the group stays Stable (same generation, so no member sees
    a revocation) and the returning leader, under a new member id, gets its assignment again."""
    broker = start_broker(tmp_path, **FIRST_JOIN_AFTER_METADATA)
    consumers = []
    try:
        bootstrap = broker.bootstrap_servers
        broker.logs.create_topic("orders", 4)
        consumers = [ConsumerProcess(client, bootstrap, "static", "orders", f"app-{i}") for i in range(2)]
        wait_for(lambda: split_evenly(consumers, range(4)), "two static members with two partitions each", timeout=60)
        group = broker.coordinator.groups["static"]
        generation, leader_id = group.generation, group.leader
        leader = next(i for i in range(2) if group.static_members[f"app-{i}"] == leader_id)
        before = [c.state()[0] for c in consumers]
        consumers[leader].stop(signal.SIGKILL)                 # gone without LeaveGroup (static: none sent)
        consumers[leader] = ConsumerProcess(client, bootstrap, "static", "orders", f"app-{leader}")
        wait_for(lambda: consumers[leader].state()[0] == before[leader], "its partitions back",
                 timeout=SESSION_TIMEOUT_S)
        assert group.generation == generation and group.state == "Stable"      # no rebalance happened
        assert group.leader == group.static_members[f"app-{leader}"] != leader_id
        assert consumers[1 - leader].state()[0] == before[1 - leader]
    finally:
        for c in consumers:
            c.stop(signal.SIGKILL)
        broker.close()


def test_a_frozen_member_holds_a_newcomers_rebalance_only_for_its_session_timeout(tmp_path):
    """Kafka removes a member that neither heartbeats nor rejoins during a rebalance at its session timeout
    (``hasSatisfiedHeartbeat``): kafka-python joins with a 300 s rebalance timeout (``max.poll.interval.ms``),
    which would otherwise keep a newcomer waiting for a frozen process."""
    broker = start_broker(tmp_path, **FIRST_JOIN_AFTER_METADATA)
    consumers = []
    try:
        bootstrap = broker.bootstrap_servers
        broker.logs.create_topic("orders", 2)
        consumers.append(ConsumerProcess("kafka-python", bootstrap, "workers", "orders"))
        wait_for(lambda: consumers[0].state()[0] == {0, 1}, "the first consumer with both partitions", timeout=60)
        assert broker.coordinator.groups["workers"].generation == 1
        consumers[0].process.send_signal(signal.SIGSTOP)     # alive to the kernel, silent to the broker
        frozen_at = time.monotonic()
        consumers.append(ConsumerProcess("kafka-python", bootstrap, "workers", "orders"))
        wait_for(lambda: consumers[1].state()[0] == {0, 1}, "the newcomer with both partitions",
                 timeout=SESSION_TIMEOUT_S * 4)
        assert time.monotonic() - frozen_at < SESSION_TIMEOUT_S * 3
        assert len(broker.coordinator.groups["workers"].members) == 1
    finally:
        for c in consumers:
            c.stop(signal.SIGKILL)
        broker.close()
