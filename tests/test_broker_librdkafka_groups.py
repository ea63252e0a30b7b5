"""librdkafka's own consumer-group tests, their paths under ``group.protocol=consumer`` (KIP-848): the scenarios
of its test suite's 0018-cgrp_term, 0022-consume_batch, 0045-subscribe_update, 0102-static_group_rebalance,
0113-cooperative_rebalance, 0118-commit_rebalance and 0153-memberid run with confluent-kafka against kmem broker.
(The tests themselves, built from librdkafka's sources and run with ``TEST_CONSUMER_GROUP_PROTOCOL=consumer``
against a kmem broker, pass too; 0106-cgrp_sess_timeout, 0120-asymmetric_subscription and the ``*_mock`` ones
run on librdkafka's mock cluster, not on a broker.)"""
import threading
import time

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient
import pytest

from broker_helpers import TIMEOUT
from group_helpers import start_broker
from test_broker_groups import produce

# a short heartbeat interval: a partition moves within a few heartbeats of its old and new owners
SETTINGS = {"group.consumer.heartbeat.interval.ms": 200, "group.consumer.session.timeout.ms": 6000}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    broker = start_broker(str(tmp_path_factory.mktemp("broker")), **SETTINGS)
    yield broker
    broker.close()


@pytest.fixture
def new_member(broker):
    """Makes a group's ``Member``; those still open when the test ends are closed."""
    made = []

    def make(group, **config):
        made.append(Member(broker, group, **config))
        return made[-1]
    yield make
    for one in made:
        one.close()


def partitions(topic, count):
    return {(topic, p) for p in range(count)}


class Member:
    """A confluent-kafka consumer with ``group.protocol=consumer``: the incremental assignments (``+``) and
    revocations (``-``) its callbacks saw (librdkafka also calls them with none, left out), the partitions it
    holds, and the records it read (topic, partition, offset)."""

    def __init__(self, broker, group, **config):
        self.consumer = KafkaConsumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
                                       "group.protocol": "consumer", "auto.offset.reset": "earliest", **config})
        self.events, self.held, self.records, self.errors = [], set(), [], []
        self.closed = False

    def subscribe(self, *topics):
        self.consumer.subscribe(list(topics), on_assign=self._assigned, on_revoke=self._revoked,
                                on_lost=self._revoked)

    def _assigned(self, consumer, assigned):
        self._event("+", assigned)
        self.held |= {(tp.topic, tp.partition) for tp in assigned}

    def _revoked(self, consumer, revoked):
        self._event("-", revoked)
        self.held -= {(tp.topic, tp.partition) for tp in revoked}

    def _event(self, sign, changed):
        if changed:
            self.events.append((sign, {(tp.topic, tp.partition) for tp in changed}))

    def close(self):
        """Serves the callbacks queued meanwhile (a member not polled while others came and went has assignments
        waiting), then closes. librdkafka can hang in ``close()`` when ``close()`` serves such a callback: the
        callback asks the closing group for its rebalance protocol and no one answers (librdkafka issue #4041,
        seen once in this file's 20-member test). So ``close()`` gets ``TIMEOUT`` seconds in a thread of its
        own: a client that hangs fails the test, and the run goes on."""
        if not self.closed:
            self.closed = True
            self.poll()
            closing = threading.Thread(target=self.consumer.close, daemon=True)
            closing.start()
            closing.join(TIMEOUT)
            assert not closing.is_alive(), f"librdkafka's close() did not return in {TIMEOUT} s"

    def poll(self):
        message = self.consumer.poll(0.05)
        if message is None:
            return
        if message.error():
            self.errors.append(message.error())
        else:
            self.records.append((message.topic(), message.partition(), message.offset()))


def poll_until(members, condition, what, timeout=TIMEOUT):
    """Poll ``members`` in turn (their callbacks run in poll) until ``condition()``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        for member in members:
            member.poll()


def records(topic, count, partition_count):
    """The (topic, partition, offset) of ``count`` records produced round-robin over the partitions."""
    return {(topic, i % partition_count, i // partition_count) for i in range(count)}


def test_0018_cgrp_term(broker, new_member):
    """Three members share a topic; one closes: the two others take its partitions over and read every record,
    produced before and after; each then unsubscribes and closes, revoking what it held."""
    topic = "0018-cgrp_term"
    broker.logs.create_topic(topic, 4)
    produce(broker.bootstrap_servers, topic, [str(i) for i in range(100)], partitions=4)
    members = [new_member(topic) for _ in range(3)]
    for member in members:
        member.subscribe(topic)
    poll_until(members, lambda: all(m.held for m in members), "the partitions shared by the three")
    members[0].close()
    produce(broker.bootstrap_servers, topic, [str(i) for i in range(100, 200)], partitions=4)
    read = lambda: {r for m in members for r in m.records}          # noqa: E731
    poll_until(members[1:], lambda: read() == records(topic, 200, 4), "every record read")
    assert members[1].held | members[2].held == partitions(topic, 4)
    for member in members[1:]:
        member.consumer.unsubscribe()
        poll_until([member], lambda: not member.held, "the unsubscribed member's partitions revoked")
        member.close()
    assert not any(m.errors for m in members)


def test_0022_consume_batch(broker, new_member):
    """consume() hands the records of every partition over in batches."""
    topic = "0022-consume_batch"
    broker.logs.create_topic(topic, 4)
    produce(broker.bootstrap_servers, topic, [str(i) for i in range(400)], partitions=4)
    member = new_member(topic)
    member.subscribe(topic)
    batches = []
    deadline = time.monotonic() + TIMEOUT
    while sum(map(len, batches)) < 400 and time.monotonic() < deadline:
        batches.append(member.consumer.consume(num_messages=100, timeout=1))
    read = [(m.topic(), m.partition(), m.offset()) for batch in batches for m in batch if not m.error()]
    assert sorted(read) == sorted(records(topic, 400, 4))
    assert max(map(len, batches)) > 1
    member.close()


def test_0045_subscribe_update(broker, new_member):
    """A regular expression subscription takes in a matching topic created later, and a subscribed topic's new
    partitions; a topic that is not matched whole stays out."""
    member = new_member("0045-subscribe_update")
    broker.logs.create_topic("0045-update-a", 2)
    member.subscribe("^0045-update-[a-z]")
    poll_until([member], lambda: member.held == partitions("0045-update-a", 2), "the matched topic assigned")
    broker.logs.create_topic("0045-update-b", 1)
    broker.logs.create_topic("0045-update-c-not-matched", 1)
    poll_until([member], lambda: member.held == partitions("0045-update-a", 2) | partitions("0045-update-b", 1),
               "the topic created later assigned")
    broker.logs.add_partitions("0045-update-a", 3)
    poll_until([member], lambda: ("0045-update-a", 2) in member.held, "the new partition assigned")
    assert all(sign == "+" for sign, _ in member.events)
    member.close()


def test_0045_resubscribe_with_regex(broker, new_member):
    """Subscribe to one topic, to another, to a regular expression, then to the expression and a topic by name,
    unsubscribing in between: each subscription gets its partitions, each unsubscription revokes them. The
    topic named comes at once and the ones the new expression matches with a later heartbeat, as Kafka's
    coordinator resolves a regular expression new to the group after the heartbeat that brings it."""
    topic1, topic2, topic_a = "0045-topic_regex1", "0045-topic_regex2", "0045-topic_a"
    for topic, count in ((topic1, 4), (topic2, 4), (topic_a, 2)):
        broker.logs.create_topic(topic, count)
    member = new_member("0045-resubscribe_with_regex")
    regex, both = "^0045-topic_regex.*", partitions(topic1, 4) | partitions(topic2, 4)
    for subscription, expected in (([topic1], partitions(topic1, 4)), ([topic2], partitions(topic2, 4)),
                                   ([regex], both)):
        member.subscribe(*subscription)
        poll_until([member], lambda: member.held == expected, f"the assignment of {subscription}")
        member.consumer.unsubscribe()
        poll_until([member], lambda: not member.held, f"the revocation of {subscription}")
    member.events.clear()
    member.subscribe(regex, topic_a)
    poll_until([member], lambda: member.held == both | partitions(topic_a, 2), "the assignment of both")
    assert member.events == [("+", partitions(topic_a, 2)), ("+", both)]
    member.close()


def test_0102_static_group_rebalance_fenced_member(broker, new_member):
    """A second consumer with the group.instance.id of a static member that holds partitions is fenced with a
    fatal UNRELEASED_INSTANCE_ID; the two static members keep their partitions."""
    topic = "0102-static_group_rebalance"
    broker.logs.create_topic(topic, 3)
    first = new_member(topic, **{"group.instance.id": "consumer1", "client.id": "consumer1"})
    second = new_member(topic, **{"group.instance.id": "consumer2", "client.id": "consumer2a"})
    first.subscribe(topic)
    second.subscribe(topic)
    poll_until([first, second], lambda: first.held and second.held and first.held | second.held ==
               partitions(topic, 3), "the initial assignments")
    held = (set(first.held), set(second.held))
    conflicting = new_member(topic, **{"group.instance.id": "consumer2", "client.id": "consumer2b"})
    conflicting.subscribe(topic)
    poll_until([conflicting, first, second], lambda: conflicting.errors, "the conflicting member fenced")
    fatal = conflicting.errors[0]
    assert fatal.code() == KafkaError._FATAL and "instance ID is still used by another member" in fatal.str()
    conflicting.close()
    deadline = time.monotonic() + 2         # a while of heartbeats in which nothing moves
    while time.monotonic() < deadline:
        first.poll()
        second.poll()
    assert (first.held, second.held) == held and not first.errors and not second.errors
    first.close()
    second.close()


def test_0113_cooperative_rebalance(broker, new_member):
    """Rebalances are incremental: a topic added to the subscription assigns only its partitions, a topic removed
    revokes only its own, a second member takes its share while the first revokes only that share, and
    unsubscribing revokes what the member held, which the other one then gets."""
    topic1, topic2 = "0113-cooperative_rebalance-1", "0113-cooperative_rebalance-2"
    broker.logs.create_topic(topic1, 4)
    broker.logs.create_topic(topic2, 2)
    first = new_member("0113-cooperative_rebalance")
    first.subscribe(topic1)
    poll_until([first], lambda: first.held == partitions(topic1, 4), "the first assignment")
    first.subscribe(topic1, topic2)
    poll_until([first], lambda: first.held == partitions(topic1, 4) | partitions(topic2, 2), "the topic added")
    first.subscribe(topic1)
    poll_until([first], lambda: first.held == partitions(topic1, 4), "the topic removed")
    assert first.events == [("+", partitions(topic1, 4)), ("+", partitions(topic2, 2)), ("-", partitions(topic2, 2))]

    second = new_member("0113-cooperative_rebalance")
    second.subscribe(topic1)
    poll_until([first, second], lambda: len(first.held) == len(second.held) == 2, "the partitions shared")
    assert first.events[3:] == [("-", second.held)] and second.events == [("+", second.held)]
    given = set(first.held)
    first.consumer.unsubscribe()
    poll_until([first, second], lambda: second.held == partitions(topic1, 4), "the partitions handed over")
    assert first.events[4:] == [("-", given)] and second.events[1:] == [("+", given)]
    first.close()
    second.close()


def test_0118_commit_rebalance(broker, new_member):
    """Two members read without committing; when one closes, the other takes its partitions over and reads them
    from the start (nothing was committed), and its own from where it was: every record, none lost."""
    topic = "0118-commit_rebalance"
    broker.logs.create_topic(topic, 4)
    produce(broker.bootstrap_servers, topic, [str(i) for i in range(1000)], partitions=4)
    first, second = (new_member(topic, **{"enable.auto.commit": False}) for _ in range(2))
    first.subscribe(topic)
    second.subscribe(topic)
    poll_until([first, second], lambda: len(first.records) >= 10 and len(second.records) >= 10 and
               first.held and second.held, "both reading")
    given = set(second.held)
    second.close()
    poll_until([first], lambda: set(first.records) >= records(topic, 1000, 4), "every record read")
    # what the closed member had read is read again from the start: it committed nothing
    assert {(t, p, o) for t, p, o in second.records} <= set(first.records)
    assert {(t, p) for t, p, o in first.records if o == 0} >= given
    first.close()


def test_0153_memberid(broker, new_member):
    """Each consumer makes its member id itself (KIP-848): twenty consumers of a group have twenty ids, the ones
    the group's description lists."""
    topic = "0153-memberid"
    broker.logs.create_topic(topic, 2)
    members = [new_member(topic) for _ in range(20)]
    for member in members:
        member.subscribe(topic)
    ids = {member.consumer.memberid() for member in members}
    assert len(ids) == 20 and all(ids)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})

    def described():
        group = admin.describe_consumer_groups([topic])[topic].result(TIMEOUT)
        return {m.member_id for m in group.members}
    poll_until(members, lambda: described() == ids, "every member in the group's description")
    for member in members:
        member.close()
