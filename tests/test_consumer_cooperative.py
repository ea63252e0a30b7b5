"""The sticky and cooperative-sticky assignors (KIP-54, KIP-429): the assignment they compute, the
ConsumerProtocol payloads that carry ownership, a cooperative group mixing kmem and librdkafka
(confluent-kafka) on kmem broker, where only the partitions that must move are revoked, and an eager
sticky group with kafka-python; the rebalance listener's callbacks, eager and cooperative."""
import asyncio
import threading
import time
import types

import aiokafka
import aiokafka.abc
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor as AiokafkaSticky
import confluent_kafka
import kafka
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
import pytest

from broker_helpers import kafka_python_knows_partitions
from consumer_helpers import Recorder
from kmem.broker import Broker
from kmem.consumer import Consumer, KafkaError, TopicPartition
from kmem.consumer.group import (Subscription, assign_sticky, encode_sticky_subscription, encode_subscription,
                                 read_subscription)

PARTITIONS = 6
TOPIC = "orders"
EVERY = {TopicPartition(TOPIC, p) for p in range(PARTITIONS)}


def tps(topic, *ids):
    return [TopicPartition(topic, p) for p in ids]


def test_sticky_assignment_keeps_owned_partitions_and_balances():
    partitions = {"t": list(range(6))}
    subscriptions = {"a": ["t"], "b": ["t"]}
    owned = {"a": Subscription(["t"], tps("t", 0, 1, 2, 3, 4, 5), 3), "b": Subscription(["t"], [], -1)}
    eager = assign_sticky(subscriptions, partitions, owned)
    assert eager == {"a": tps("t", 0, 1, 2), "b": tps("t", 3, 4, 5)}
    # Cooperative: the partitions changing owner wait for the next rebalance, once a has revoked them.
    assert assign_sticky(subscriptions, partitions, owned, cooperative=True) == {"a": tps("t", 0, 1, 2), "b": []}
    after = {"a": Subscription(["t"], tps("t", 0, 1, 2), 4), "b": Subscription(["t"], [], 4)}
    assert assign_sticky(subscriptions, partitions, after, cooperative=True) == eager
    # A partition claimed twice stays with the later generation; a third member takes from both.
    claims = {"a": Subscription(["t"], tps("t", 0, 1, 2, 3), 5), "b": Subscription(["t"], tps("t", 3, 4, 5), 4),
              "c": Subscription(["t"], [], -1)}
    three = assign_sticky({m: ["t"] for m in claims}, partitions, claims)
    assert three == {"a": tps("t", 0, 1), "b": tps("t", 4, 5), "c": tps("t", 2, 3)}
    # Topics with fewer subscribers are placed first, so a narrower member is not starved.
    uneven = assign_sticky({"a": ["t"], "b": ["t", "u"]}, {"t": [0, 1], "u": [0, 1, 2, 3]},
                           {"a": Subscription(["t"], [], -1), "b": Subscription(["t", "u"], [], -1)})
    assert uneven == {"a": tps("t", 0, 1), "b": tps("u", 0, 1, 2, 3)}


def test_subscriptions_carry_owned_partitions_and_sticky_user_data():
    data = encode_sticky_subscription(["t"], tps("t", 1, 0), tps("t", 0, 1, 2), 7)
    assert read_subscription(data) == Subscription(["t"], tps("t", 0, 1), 7)
    # An eager member owns nothing while joining; the sticky assignor reads its previous assignment.
    eager = encode_sticky_subscription(["t"], [], tps("t", 2), 7)
    assert read_subscription(eager) == Subscription(["t"], [], 7)
    assert read_subscription(eager, previous_as_owned=True) == Subscription(["t"], tps("t", 2), 7)
    assert read_subscription(encode_subscription(["t"])) == Subscription(["t"], [], -1)
    # kafka-python 3 writes its user data after a version; unreadable user data is ignored.
    python = StickyPartitionAssignor._metadata(["t"], tps("t", 3), 5).encode()
    assert read_subscription(python, previous_as_owned=True) == Subscription(["t"], tps("t", 3), 5)
    garbled = encode_subscription(["t"])[:-4] + b"\x00\x00\x00\x03abc"
    assert read_subscription(garbled, previous_as_owned=True) == Subscription(["t"], [], -1)


@pytest.fixture
def broker(tmp_path):
    with Broker(str(tmp_path), port=0, num_partitions=PARTITIONS, properties={
            "group.min.session.timeout.ms": "1000", "group.initial.rebalance.delay.ms": "0"}) as running:
        producer = kafka.KafkaProducer(bootstrap_servers=running.bootstrap_servers)
        for i in range(PARTITIONS * 10):
            producer.send(TOPIC, b"%d" % i, partition=i % PARTITIONS)
        producer.flush()
        producer.close()
        yield running.bootstrap_servers


def kmem_consumer(bootstrap):
    return Consumer(bootstrap, group_id="coop", partition_assignment_strategy="cooperative-sticky",
                    auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=200,
                    buffer_memory=1 << 20, fetch_max_bytes=256 << 10)


def librdkafka_consumer(bootstrap, revoked):
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "coop", "partition.assignment.strategy": "cooperative-sticky",
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 200})
    consumer.subscribe([TOPIC], on_revoke=lambda c, parts: revoked.extend(
        TopicPartition(p.topic, p.partition) for p in parts))
    return consumer


def poll_until(condition, *consumers, timeout=60.0):
    """Poll every consumer in turn until ``condition()`` holds (kmem's and kafka-python's take milliseconds,
    librdkafka's seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"the group never settled: {[c.assignment() for c in consumers]}"
        for consumer in consumers:
            consumer.poll(50) if isinstance(consumer, (Consumer, kafka.KafkaConsumer)) else consumer.poll(0.05)


def librdkafka_holds(consumer):
    return {TopicPartition(p.topic, p.partition) for p in consumer.assignment()}


def test_a_librdkafka_member_joining_a_kmem_led_group_takes_only_the_partitions_that_move(broker):
    with kmem_consumer(broker) as first:
        first.subscribe([TOPIC])
        poll_until(lambda: first.assignment() == EVERY, first)
        held = []                   # kmem's assignment after each of its polls
        second = librdkafka_consumer(broker, revoked := [])
        try:
            def settled():
                held.append(first.assignment())
                mine, theirs = first.assignment(), librdkafka_holds(second)
                return len(mine) == len(theirs) == PARTITIONS // 2 and mine | theirs == EVERY
            poll_until(settled, first, second)
            kept = first.assignment()
            # The partitions kmem kept were never taken away meanwhile: no stop-the-world revocation.
            assert all(kept <= snapshot for snapshot in held)
            assert revoked == []
        finally:
            second.close()


def test_a_kmem_member_joining_a_librdkafka_led_group_takes_only_the_partitions_that_move(broker):
    first = librdkafka_consumer(broker, revoked := [])
    try:
        poll_until(lambda: librdkafka_holds(first) == EVERY, first)
        with kmem_consumer(broker) as second:
            second.subscribe([TOPIC])

            def settled():
                mine, theirs = second.assignment(), librdkafka_holds(first)
                return len(mine) == len(theirs) == PARTITIONS // 2 and mine | theirs == EVERY
            poll_until(settled, first, second)
            # librdkafka gave up exactly the partitions kmem now holds, in one incremental revocation.
            assert sorted(revoked) == sorted(second.assignment())
    finally:
        first.close()


def sticky_kmem_consumer(bootstrap):
    consumer = Consumer(bootstrap, group_id="sticky", partition_assignment_strategy="sticky",
                        auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=200,
                        buffer_memory=1 << 20, fetch_max_bytes=256 << 10)
    consumer.subscribe([TOPIC])
    return consumer


def kafka_python_holds(consumer):
    return {TopicPartition(p.topic, p.partition) for p in consumer.assignment()}


def test_eager_sticky_members_of_kafka_python_and_kmem_keep_their_partitions(broker):
    # kmem leads (it joins first) and reads kafka-python's previous assignment from its user data.
    # (kafka-python 3 as the leader cannot read Java's user data layout, which kmem and librdkafka write.)
    kmem_members = [sticky_kmem_consumer(broker)]
    python = kafka.KafkaConsumer(bootstrap_servers=broker, group_id="sticky", auto_offset_reset="earliest",
                                 partition_assignment_strategy=[StickyPartitionAssignor],
                                 session_timeout_ms=6000, heartbeat_interval_ms=200)
    try:
        poll_until(lambda: kmem_members[0].assignment() == EVERY, *kmem_members)
        python.subscribe([TOPIC])
        kafka_python_knows_partitions(python, [TOPIC])

        def holds():
            return [m.assignment() for m in kmem_members] + [kafka_python_holds(python)]

        def settled(count):
            return len(holds()) == count and all(len(h) == PARTITIONS // count for h in holds()) \
                and set().union(*holds()) == EVERY
        poll_until(lambda: settled(2), python, *kmem_members)
        before = holds()
        kmem_members.insert(1, sticky_kmem_consumer(broker))
        poll_until(lambda: settled(3), python, *kmem_members)
        after = holds()
        # The two members keep two of their three partitions each: only the new member's share moves.
        assert len(before[0] & after[0]) == len(before[1] & after[2]) == 2, (before, after)
    finally:
        for member in kmem_members:
            member.close()
        python.close()


def test_rolling_upgrade_from_eager_to_cooperative(broker):
    # Step one: a member still on range and one on ["cooperative-sticky", "range"] agree on range (two
    # members without a common protocol could not form a group). Step two: with cooperative-sticky chosen,
    # the member that still lists range rebalances eagerly, giving up everything while it rejoins.
    def member(strategy):
        consumer = Consumer(broker, group_id="upgrade", partition_assignment_strategy=strategy,
                            auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=200,
                            buffer_memory=1 << 20, fetch_max_bytes=256 << 10)
        consumer.subscribe([TOPIC])
        return consumer

    with member("range") as old, member(["cooperative-sticky", "range"]) as upgraded:
        poll_until(lambda: len(old.assignment()) == len(upgraded.assignment()) == 3, old, upgraded)
    with member(["cooperative-sticky", "range"]) as upgraded:
        poll_until(lambda: upgraded.assignment() == EVERY, upgraded)
        held = []                   # every assignment the member's fetcher is given (a poll may span several)
        fetcher_assign = upgraded._fetcher.assign
        upgraded._fetcher.assign = lambda partitions: (held.append(set(partitions)), fetcher_assign(partitions))
        with member("cooperative-sticky") as cooperative:
            poll_until(lambda: len(upgraded.assignment()) == len(cooperative.assignment()) == 3, upgraded, cooperative)
        assert set() in held        # eager: it gave up everything while it rejoined


# -- the rebalance listener (Kafka's ConsumerRebalanceListener) --------------------------------------------

def listening_member(bootstrap, group, strategy, listener, session_timeout_ms=6000):
    consumer = Consumer(bootstrap, group_id=group, partition_assignment_strategy=strategy,
                        auto_offset_reset="earliest", session_timeout_ms=session_timeout_ms,
                        heartbeat_interval_ms=200, buffer_memory=1 << 20, fetch_max_bytes=256 << 10)
    consumer.subscribe([TOPIC], listener=listener)
    return consumer


def shared(*consumers):
    """Whether the members hold equal shares that together cover the topic, each partition once."""
    held = [c.assignment() for c in consumers]
    return all(len(h) == PARTITIONS // len(held) for h in held) and set().union(*held) == EVERY


def test_eager_listener_revokes_everything_before_each_rejoin(broker):
    first_heard, second_heard = Recorder(), Recorder()
    with listening_member(broker, "eager-listener", "range", first_heard) as first:
        poll_until(lambda: first.assignment() == EVERY, first)
        assert first_heard.events == [("assigned", EVERY)]       # nothing to revoke before the first join
        with listening_member(broker, "eager-listener", "range", second_heard) as second:
            poll_until(lambda: shared(first, second), first, second)
            mine, theirs = first.assignment(), second.assignment()
            assert first_heard.events == [("assigned", EVERY), ("revoked", EVERY), ("assigned", mine)]
            assert second_heard.events == [("assigned", theirs)]
        assert second_heard.events[-1] == ("revoked", theirs)    # close gives its partitions up
        poll_until(lambda: first.assignment() == EVERY, first)
        assert first_heard.events[3:] == [("revoked", mine), ("assigned", EVERY)]
        first.unsubscribe()
        assert first_heard.events[-1] == ("revoked", EVERY)
    assert not any(name == "lost" for name, _ in first_heard.events + second_heard.events)


def test_cooperative_listener_hears_only_the_partitions_that_move(broker):
    first_heard, second_heard = Recorder(), Recorder()
    with listening_member(broker, "coop-listener", "cooperative-sticky", first_heard) as first:
        poll_until(lambda: first.assignment() == EVERY, first)
        with listening_member(broker, "coop-listener", "cooperative-sticky", second_heard) as second:
            poll_until(lambda: shared(first, second), first, second)
            moved = second.assignment()
            # The first member gave up only what the second took, after the rebalance that decided it;
            # the rebalances after that assigned it nothing new.
            assert first_heard.changes() == [("assigned", EVERY), ("revoked", moved)]
            assert first_heard.events[:3] == [("assigned", EVERY), ("revoked", moved), ("assigned", set())]
            assert second_heard.changes() == [("assigned", moved)]
            assert {name for name, _ in second_heard.events} == {"assigned"}
        assert second_heard.events[-1] == ("revoked", moved)
        poll_until(lambda: first.assignment() == EVERY, first)
        assert first_heard.changes() == [("assigned", EVERY), ("revoked", moved), ("assigned", moved)]


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_a_member_whose_session_expired_hears_its_partitions_lost(broker, strategy):
    first_heard = Recorder()
    group = f"lost-{strategy}"
    with listening_member(broker, group, strategy, first_heard, session_timeout_ms=1000) as first, \
            listening_member(broker, group, strategy, Recorder(), session_timeout_ms=1000) as second:
        poll_until(lambda: shared(first, second), first, second)
        held = first.assignment()
        heard = len(first_heard.events)
        # The application's thread holds the consumer (as a C extension holding the GIL would): no
        # heartbeat goes out, the coordinator expires the member and the other takes everything.
        with first._lock:
            poll_until(lambda: second.assignment() == EVERY, second)
        poll_until(lambda: shared(first, second), first, second)
        after = first_heard.events[heard:]
        assert after[0] == ("lost", held), first_heard.events
        assert ("revoked", held) not in after
        assert after[-1][0] == "assigned"


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_a_member_that_learns_it_expired_from_its_rejoin_commit_hears_its_partitions_lost(broker, strategy):
    # As above, but the member learns it is out of the group from the commit before its rejoin (auto-commit,
    # for a new subscription): Kafka's ConsumerCoordinator then calls onPartitionsLost, not revoked.
    first_heard = Recorder()
    group = f"lost-in-commit-{strategy}"
    with listening_member(broker, group, strategy, first_heard, session_timeout_ms=1000) as first, \
            listening_member(broker, group, strategy, Recorder(), session_timeout_ms=1000) as second:
        # Its positions known, so that the commit before its rejoin has offsets to send (with none, it sends
        # nothing and, as Kafka's ConsumerCoordinator, revokes: it has not learned it is out).
        poll_until(lambda: shared(first, second) and set(first._positions()) == first.assignment(), first, second)
        held = first.assignment()
        heard = len(first_heard.events)
        with first._lock:       # no heartbeat: the coordinator expires it; it rejoins before it hears so
            poll_until(lambda: second.assignment() == EVERY, second)
            first.subscribe([TOPIC, "more-orders"], listener=first_heard)
        poll_until(lambda: ("assigned" in {name for name, _ in first_heard.events[heard:]}), first, second)
        after = first_heard.events[heard:]
        assert after[0] == ("lost", held), first_heard.events
        assert ("revoked", held) not in after


class Failing(Recorder):
    """Raises from every revoked and assigned callback, after recording it."""

    def on_partitions_revoked(self, revoked):
        super().on_partitions_revoked(revoked)
        raise RuntimeError("revoked failed")

    def on_partitions_assigned(self, assigned):
        super().on_partitions_assigned(assigned)
        raise RuntimeError("assigned failed")


def test_a_listener_that_raises_does_not_stop_the_rebalance_and_poll_raises_it(broker, caplog):
    raised = []

    def polling(consumer):
        def poll(_timeout):
            try:
                return consumer.poll(50)
            except KafkaError as exc:
                raised.append(exc)
                return []
        return types.SimpleNamespace(poll=poll, assignment=consumer.assignment)

    first_heard = Failing()
    with listening_member(broker, "failing-listener", "range", first_heard) as first:
        poll_until(lambda: first.assignment() == EVERY, polling(first))
        with listening_member(broker, "failing-listener", "range", Recorder()) as second:
            poll_until(lambda: shared(first, second), polling(first), second)
            mine = first.assignment()
            assert first_heard.events == [("assigned", EVERY), ("revoked", EVERY), ("assigned", mine)]
            assert [str(e).split(":")[0] for e in raised] == [
                "the rebalance listener raised in on_partitions_assigned",
                "the rebalance listener raised in on_partitions_revoked",
                "the rebalance listener raised in on_partitions_assigned"]
            assert [str(e.__cause__) for e in raised] == ["assigned failed", "revoked failed", "assigned failed"]
            assert "rebalance listener Failing failed in on_partitions_revoked" in caplog.text
        with pytest.raises(KafkaError, match="on_partitions_revoked"):
            first.close()


# -- mixed groups with other clients' listeners ----------------------------------------------------------

class PeerHeard:
    """Another client's rebalance listener callbacks, as (name, set of partitions)."""

    def __init__(self):
        self.events = []

    def _record(self, name, partitions):
        self.events.append((name, {TopicPartition(p.topic, p.partition) for p in partitions}))

    def on_partitions_revoked(self, revoked):
        self._record("revoked", revoked)

    def on_partitions_assigned(self, assigned):
        self._record("assigned", assigned)

    def changes(self):
        return [event for event in self.events if event[1]]


class KafkaPythonHeard(PeerHeard, kafka.ConsumerRebalanceListener):
    pass


class AiokafkaHeard(PeerHeard, aiokafka.abc.ConsumerRebalanceListener):
    pass


def kafka_python_member(bootstrap, group, assignor, heard):
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                   partition_assignment_strategy=[assignor], session_timeout_ms=6000,
                                   heartbeat_interval_ms=200)
    consumer.subscribe([TOPIC], listener=heard)
    kafka_python_knows_partitions(consumer, [TOPIC])
    return consumer


@pytest.mark.parametrize("first", ["kafka-python", "kmem"])
def test_cooperative_sticky_with_kafka_python_moves_only_what_it_must(broker, first):
    group = f"coop-python-{first}"
    kmem_heard, python_heard = Recorder(), KafkaPythonHeard()
    members = []
    try:
        if first == "kafka-python":
            members.append(kafka_python_member(broker, group, CooperativeStickyAssignor, python_heard))
            poll_until(lambda: kafka_python_holds(members[0]) == EVERY, *members)
            members.append(listening_member(broker, group, "cooperative-sticky", kmem_heard))
        else:
            members.append(listening_member(broker, group, "cooperative-sticky", kmem_heard))
            poll_until(lambda: members[0].assignment() == EVERY, *members)
            members.append(kafka_python_member(broker, group, CooperativeStickyAssignor, python_heard))
        python, kmem = sorted(members, key=lambda m: isinstance(m, Consumer))
        poll_until(lambda: len(kmem.assignment()) == len(kafka_python_holds(python)) == PARTITIONS // 2
                   and kmem.assignment() | kafka_python_holds(python) == EVERY, *members)
        mine, theirs = kmem.assignment(), kafka_python_holds(python)
        if first == "kafka-python":
            assert python_heard.changes() == [("assigned", EVERY), ("revoked", mine)]
            assert kmem_heard.changes() == [("assigned", mine)]
        else:
            assert kmem_heard.changes() == [("assigned", EVERY), ("revoked", theirs)]
            assert python_heard.changes() == [("assigned", theirs)]
    finally:
        for member in members:
            member.close()


class AiokafkaMember:
    """An aiokafka consumer in a group, run by its own event loop on its own thread; ``poll`` waits for its
    assignment to change. (aiokafka's sticky assignor keeps its state in the class: one member a process.)"""

    def __init__(self, bootstrap, group, heard):
        self._args = dict(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                          partition_assignment_strategy=(AiokafkaSticky,), session_timeout_ms=6000,
                          heartbeat_interval_ms=200)
        self._heard = heard
        self._held = set()
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)
        self._thread.start()

    async def _run(self):
        consumer = aiokafka.AIOKafkaConsumer(**self._args)
        consumer.subscribe([TOPIC], listener=self._heard)
        await consumer.start()
        try:
            while not self._stopping.is_set():
                await consumer.getmany(timeout_ms=50)
                held = {TopicPartition(p.topic, p.partition) for p in consumer.assignment()}
                if held != self._held:
                    with self._changed:
                        self._held = held
                        self._changed.notify_all()
        finally:
            await consumer.stop()

    def assignment(self):
        return set(self._held)

    def poll(self, timeout):
        with self._changed:
            self._changed.wait(timeout)

    def close(self):
        self._stopping.set()
        self._thread.join(30)


def test_eager_sticky_members_of_aiokafka_and_kmem_keep_their_partitions(broker):
    # aiokafka leads (it joins first), reading kmem's StickyAssignor user data; then a kmem member leads a
    # group where aiokafka's member keeps what it held.
    for leader in ("aiokafka", "kmem"):
        group = f"sticky-aiokafka-{leader}"
        members = []
        try:
            for client in (leader, {"aiokafka": "kmem", "kmem": "aiokafka"}[leader], "kmem"):
                members.append(AiokafkaMember(broker, group, AiokafkaHeard()) if client == "aiokafka"
                               else listening_member(broker, group, "sticky", Recorder()))
                count = len(members)
                poll_until(lambda: all(len(m.assignment()) == PARTITIONS // count for m in members)
                           and set().union(*(m.assignment() for m in members)) == EVERY, *members)
                if count == 2:
                    before = [m.assignment() for m in members]
            after = [m.assignment() for m in members]
            # The two members keep two of their three partitions each: only the new member's share moves.
            assert len(before[0] & after[0]) == len(before[1] & after[1]) == 2, (leader, before, after)
        finally:
            for member in members:
                member.close()
