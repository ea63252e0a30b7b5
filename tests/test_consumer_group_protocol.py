"""kmem's consumer with ``group.protocol=consumer`` (KIP-848) on kmem broker: incremental reconciliation and the
rebalance listener's calls as Kafka's Java consumer makes them (revoked first, exactly the partitions moved away;
assigned, exactly those added; lost when fenced, then a rejoin at epoch 0), commits at the member epoch, a
subscription by regular expression, leaving with epoch -1 (-2 for a static member), max.poll.interval.ms, and the
coordinator's refusals as clear errors; on librdkafka's mock cluster too. Members of other clients in the same
group: test_consumer_group_protocol_clients.py, test_broker_consumer_groups_clients.py (Java)."""
import time

import kafka
import pytest

from broker_helpers import wait_for
from consumer_helpers import Recorder, consume
from group_helpers import start_broker
from kmem.consumer import Consumer, KafkaError, TopicPartition
from kmem.consumer import config as consumer_config
from kmem.consumer import errors as codes
from kmem.consumer.membership import ConsumerGroupMember
from kmem.errors import ConfigError, InvalidArgumentError
from kmem.protocol import messages
from mock_cluster import MockCluster

PARTITIONS = 4
SETTINGS = {"group.consumer.heartbeat.interval.ms": 100, "group.consumer.session.timeout.ms": 1000}


def tps(topic, *ids):
    return {TopicPartition(topic, p) for p in ids}


@pytest.fixture
def broker(tmp_path):
    running = start_broker(tmp_path, **SETTINGS)
    for topic in ("orders", "orders-eu", "stock"):
        running.logs.create_topic(topic, PARTITIONS)
    producer = kafka.KafkaProducer(bootstrap_servers=running.bootstrap_servers)
    for i in range(40):
        producer.send("orders", b"%d" % i, partition=i % PARTITIONS)
    producer.flush()
    producer.close()
    yield running
    running.close()


def member(broker, **settings):
    return Consumer(broker.bootstrap_servers, group_id="g", group_protocol="consumer", auto_offset_reset="earliest",
                    **settings)


def poll_until(consumers, condition, what, timeout=15.0):
    """Poll every consumer in turn until ``condition()``; the records each was handed, by consumer."""
    records = {c: [] for c in consumers}
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for c in consumers:
            records[c] += c.poll(20)
    return records


def group_members(broker):
    group = broker.coordinator.consumer_groups.groups.get("g")
    return {} if group is None else dict(group.members)


def test_settings_of_the_other_protocol_are_refused():
    with Consumer.from_properties({"bootstrap.servers": "localhost:1", "group.protocol": "CONSUMER"}) as named:
        assert named.config["group.protocol"] == "consumer"
    with pytest.raises(ConfigError, match="group.remote.assignor cannot be set when group.protocol=classic"):
        Consumer("localhost:1", group_id="g", group_remote_assignor="range")
    for name in ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms"):
        with pytest.raises(ConfigError, match=f"{name} cannot be set when group.protocol=consumer"):
            Consumer.from_properties({"bootstrap.servers": "localhost:1", "group.protocol": "consumer",
                                      name: "range" if name.startswith("partition") else "1000"})
    with pytest.raises(ConfigError, match="group.protocol must be one of"):
        Consumer("localhost:1", group_id="g", group_protocol="eager")
    classic = Consumer("localhost:1", group_id="g")
    with pytest.raises(InvalidArgumentError, match="needs group.protocol=consumer"):
        classic.subscribe(pattern="orders.*")
    classic.close()


def test_members_reconcile_incrementally_and_the_listener_hears_exactly_what_moves(broker):
    first, second = Recorder(), Recorder()
    a = member(broker, enable_auto_commit=False)
    a.subscribe(["orders"], listener=first)
    assert len(consume(a, 40)) == 40
    assert first.events == [("assigned", tps("orders", 0, 1, 2, 3))]
    a.commit()
    assert a.committed(TopicPartition("orders", 0)) == 10       # OffsetCommit and OffsetFetch v9, at a's epoch

    b = member(broker, enable_auto_commit=False)
    b.subscribe(["orders"], listener=second)
    poll_until([a, b], lambda: len(a.assignment()) == len(b.assignment()) == 2, "b taking half")
    moved = tps("orders", 0, 1, 2, 3) - a.assignment()
    assert b.assignment() == moved
    # a gave up exactly what moved, then took nothing; b was answered nothing until a had acknowledged
    assert first.events[1:] == [("revoked", moved), ("assigned", set())]
    assert second.events == [("assigned", set()), ("assigned", moved)]
    assert a.generation == b.generation > 1
    assert {m.epoch for m in group_members(broker).values()} == {a.generation}

    b.close()                                   # revoked, then a heartbeat with epoch -1
    assert second.events[-1] == ("revoked", moved)
    poll_until([a], lambda: len(a.assignment()) == PARTITIONS, "a taking b's partitions back")
    assert first.events[3:] == [("assigned", moved)]
    assert len(group_members(broker)) == 1
    a.close()
    assert first.events[-1] == ("revoked", tps("orders", 0, 1, 2, 3))
    assert group_members(broker) == {}


def test_auto_commit_commits_what_is_revoked_before_it_moves(broker):
    a = member(broker, auto_commit_interval_ms=60000)
    a.subscribe(["orders"])
    assert len(consume(a, 40)) == 40
    b = member(broker)
    b.subscribe(["orders"])
    read = poll_until([a, b], lambda: len(b.assignment()) == 2, "b taking half")
    # b starts where a was: a committed the revoked partitions' positions before giving them up
    assert read[b] == []
    assert all(b.position(tp) == 10 for tp in b.assignment())
    a.close()
    b.close()


class PollingInLost(Recorder):
    """A listener whose ``on_partitions_lost`` polls the consumer (the rejoin must not start over inside it)."""

    def __init__(self, consumer):
        super().__init__()
        self.consumer = consumer

    def on_partitions_lost(self, lost):
        super().on_partitions_lost(lost)
        self.consumer.poll(0)


def test_a_fenced_member_loses_its_partitions_and_rejoins_at_epoch_zero(broker):
    a = member(broker)
    events = PollingInLost(a)
    a.subscribe(["orders"], listener=events)
    poll_until([a], lambda: len(a.assignment()) == PARTITIONS, "a holding every partition")
    with a._lock:                               # the heartbeat thread waits: the session expires
        wait_for(lambda: group_members(broker) == {}, "the coordinator fencing a")
    poll_until([a], lambda: len(events.events) == 3, "a rejoining")
    assert events.events == [("assigned", tps("orders", 0, 1, 2, 3)), ("lost", tps("orders", 0, 1, 2, 3)),
                             ("assigned", tps("orders", 0, 1, 2, 3))]
    (joined,) = group_members(broker).values()
    assert joined.member_id == a._coordinator.member_id         # the same member id, from epoch 0
    assert a.generation == joined.epoch > 0
    a.close()


def test_a_member_beyond_max_poll_interval_leaves_and_rejoins(broker):
    events = Recorder()
    a = member(broker, max_poll_interval_ms=300)
    a.subscribe(["orders"], listener=events)
    poll_until([a], lambda: len(a.assignment()) == PARTITIONS, "a holding every partition")
    wait_for(lambda: group_members(broker) == {}, "a leaving from its heartbeat thread")
    poll_until([a], lambda: len(events.events) == 3, "a rejoining")
    assert [name for name, _ in events.events] == ["assigned", "lost", "assigned"]
    a.close()


def test_a_subscription_by_regular_expression_follows_new_topics(broker):
    a = member(broker)
    a.subscribe(pattern="orders.*")
    poll_until([a], lambda: a.assignment() == tps("orders", 0, 1, 2, 3) | tps("orders-eu", 0, 1, 2, 3),
               "a holding the topics the expression matches")
    broker.logs.create_topic("orders-us", 2)
    poll_until([a], lambda: tps("orders-us", 0, 1) <= a.assignment(), "a topic created later joining in")
    assert [m.topic_regex for m in group_members(broker).values()] == ["orders.*"]
    a.close()


def test_a_static_member_leaves_with_epoch_minus_two_and_its_return_takes_its_partitions_back(broker):
    a = member(broker, group_instance_id="a")
    b = member(broker, group_instance_id="b")
    a.subscribe(["orders"])
    b.subscribe(["orders"])
    poll_until([a, b], lambda: len(a.assignment()) == len(b.assignment()) == 2, "a and b sharing")
    held = a.assignment()
    a.close()
    (left,) = [m for m in group_members(broker).values() if m.instance_id == "a"]
    assert left.epoch == -2                     # kept for its return within the session timeout
    back = member(broker, group_instance_id="a")
    back.subscribe(["orders"])
    poll_until([back, b], lambda: back.assignment() == held, "the instance taking its partitions back")
    assert len(b.assignment()) == 2
    back.close()
    b.close()


def test_refusals_are_clear_errors(broker):
    unknown = member(broker, group_remote_assignor="sticky")
    unknown.subscribe(["orders"])
    for _ in range(2):                          # every poll says so, until subscribe() again
        with pytest.raises(KafkaError, match="ServerAssignor sticky is not supported") as refused:
            poll_until([unknown], lambda: False, "the refusal")
        assert refused.value.code == codes.UNSUPPORTED_ASSIGNOR
    unknown.close()
    bad = member(broker)
    bad.subscribe(pattern="orders[")
    with pytest.raises(KafkaError, match="INVALID_REGULAR_EXPRESSION") as refused:
        poll_until([bad], lambda: False, "the refusal")
    assert refused.value.code == codes.INVALID_REGULAR_EXPRESSION
    bad.subscribe(pattern="stock")              # a new subscription joins again
    poll_until([bad], lambda: bad.assignment() == tps("stock", 0, 1, 2, 3), "the corrected subscription")
    bad.close()


def test_on_librdkafkas_mock_cluster_which_fetches_offsets_without_member_epochs():
    """librdkafka's mock cluster serves ConsumerGroupHeartbeat, but OffsetFetch only up to v6 (the member reads its
    committed offsets in that form), and answers a join with epoch 0 until it has an assignment for the member
    (whose next heartbeat is a join again)."""
    mock = MockCluster()
    try:
        mock.create_topic("orders", PARTITIONS)
        mock.produce("orders", [b"%d" % i for i in range(40)], partitions=PARTITIONS)
        with member_of(mock) as a, member_of(mock) as b:
            a.subscribe(["orders"])
            assert len(consume(a, 40)) == 40
            a.commit()
            assert a.committed(TopicPartition("orders", 1)) == 10
            b.subscribe(["orders"])
            poll_until([a, b], lambda: len(a.assignment()) == len(b.assignment()) == 2, "b taking half")
            assert all(b.position(tp) == 10 for tp in b.assignment())
    finally:
        mock.close()


def member_of(mock):
    return Consumer(mock.bootstrap, group_id="g", group_protocol="consumer", auto_offset_reset="earliest")


class _Wire:
    """A connected coordinator that keeps each request for the test to answer."""

    def __init__(self):
        self.sent = []

    def is_connected(self, node):
        return True

    def send(self, node, request, callback):
        self.sent.append((request, callback))


def test_a_commit_refused_as_stale_while_the_epoch_moved_on_is_sent_again_at_the_new_epoch():
    wire = _Wire()
    config = consumer_config.parse({"bootstrap.servers": "localhost:1", "group.id": "g", "group.protocol": "consumer"})
    coordinator = ConsumerGroupMember(wire, None, config)
    coordinator.node, coordinator.generation = "c", 5
    Response = messages.OffsetCommitResponse

    def answer(code):
        request, callback = wire.sent[-1]
        callback(None, Response(throttle_time_ms=0, topics=[Response.OffsetCommitResponseTopic(
            name="t", partitions=[Response.OffsetCommitResponsePartition(partition_index=0, error_code=code)])]), None)
        return request.generation_id_or_member_epoch, request.member_id

    results = []
    coordinator.commit({TopicPartition("t", 0): 7}, results.append)
    coordinator.generation = 6                  # a heartbeat's answer moved the member on meanwhile
    assert answer(codes.STALE_MEMBER_EPOCH) == (5, coordinator.member_id)
    assert results == [] and answer(codes.NONE) == (6, coordinator.member_id)
    assert results == [None]
    coordinator.commit({TopicPartition("t", 0): 8}, results.append)
    answer(codes.STALE_MEMBER_EPOCH)            # stale at the member's own epoch: refused, not sent again
    assert len(wire.sent) == 3 and results[1].code == codes.STALE_MEMBER_EPOCH
