"""kmem.consumer groups against librdkafka's mock cluster: assignors, commits, a rebalance with every
record processed exactly once, and KIP-81 liveness (heartbeats read outside a full pool); commits during a
rebalance, answered by the test."""
import threading
import time

import pytest

from kmem.consumer import CommitFailedError, Consumer, RebalanceInProgressError, TopicPartition
from kmem.consumer import config as consumer_config
from kmem.consumer import errors as codes
from kmem.consumer.group import (Coordinator, assign_range, assign_round_robin, decode_assignment,
                                 decode_subscription, encode_assignment, encode_subscription)
from kmem.errors import CorruptRecordError
from kmem.protocol import messages
from mock_cluster import MockCluster


@pytest.fixture(scope="module")
def cluster():
    mock = MockCluster()
    yield mock
    mock.close()


def tps(*pairs):
    return [TopicPartition(t, p) for t, p in pairs]


def test_range_and_round_robin_assignors():
    # The examples of Kafka's RangeAssignor and RoundRobinAssignor javadoc: two consumers, two topics of
    # three partitions each.
    subscriptions = {"C0": ["t0", "t1"], "C1": ["t0", "t1"]}
    partitions = {"t0": [0, 1, 2], "t1": [0, 1, 2]}
    assert assign_range(subscriptions, partitions) == {
        "C0": tps(("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)), "C1": tps(("t0", 2), ("t1", 2))}
    assert assign_round_robin(subscriptions, partitions) == {
        "C0": tps(("t0", 0), ("t0", 2), ("t1", 1)), "C1": tps(("t0", 1), ("t1", 0), ("t1", 2))}
    # Members subscribed to different topics only get those.
    uneven = assign_round_robin({"a": ["t0"], "b": ["t0", "t1"]}, partitions)
    assert uneven == {"a": tps(("t0", 0), ("t0", 2)), "b": tps(("t0", 1), ("t1", 0), ("t1", 1), ("t1", 2))}


def test_consumer_protocol_payloads():
    assert decode_subscription(encode_subscription(["b", "a"])) == ["a", "b"]
    parts = tps(("t", 2), ("t", 0), ("u", 1))
    assert decode_assignment(encode_assignment(parts)) == sorted(parts)
    with pytest.raises(CorruptRecordError, match="consumer assignment"):
        decode_assignment(encode_assignment(parts)[:-7])


def consume_in_group(cluster, group, topic, stop, results, **settings):
    """An application that commits after each batch and counts a batch only once its commit succeeded."""
    with Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                  session_timeout_ms=6000, heartbeat_interval_ms=500, buffer_memory=1 << 20,
                  fetch_max_bytes=256 << 10, max_poll_records=50, **settings) as consumer:
        consumer.subscribe([topic])
        while not stop.is_set():
            batch = consumer.poll(50)
            if not batch:
                continue
            time.sleep(0.01)            # processing
            try:
                consumer.commit()
            except CommitFailedError:
                continue                # not committed: these records come again, to whoever owns them
            results.extend((r.partition, r.offset) for r in batch)


@pytest.mark.parametrize("strategy", ["range", "roundrobin"])
def test_every_record_processed_once_across_a_rebalance(cluster, strategy):
    topic, group, total = f"rebalance-{strategy}", f"group-{strategy}", 4000
    cluster.produce(topic, [b"r%d" % i for i in range(total)], partitions=4)
    stop = threading.Event()
    first, second = [], []
    threads = [threading.Thread(target=consume_in_group, args=(cluster, group, topic, stop, out),
                                kwargs={"partition_assignment_strategy": strategy}) for out in (first, second)]
    threads[0].start()
    deadline = time.monotonic() + 60
    while len(first) < total // 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    threads[1].start()                  # joins mid-stream: the group rebalances
    while len(first) + len(second) < total and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(30)
    processed = first + second
    assert len(processed) == len(set(processed)), "a record counted twice"
    if len(processed) < total:      # skipped (later offsets of the partition processed) or never reached?
        done = set(processed)
        last = {p: max(o for q, o in done if q == p) for p, _ in done}
        missing = sorted({(p, o) for p in range(4) for o in range(total // 4)} - done)     # round-robin
        skipped = [(p, o) for p, o in missing if o < last.get(p, -1)]
        pytest.fail(f"{len(missing)} records not processed by the deadline, {len(skipped)} of them skipped "
                    f"(e.g. {skipped[:5]}); first member {len(first)}, second {len(second)}")
    assert second, "the second member never got partitions"


def test_subscribe_commit_and_committed(cluster):
    cluster.produce("sub", [b"s%d" % i for i in range(400)], partitions=4)
    with Consumer(cluster.bootstrap, group_id="sub-group", auto_offset_reset="earliest",
                  session_timeout_ms=6000, heartbeat_interval_ms=500) as consumer:
        consumer.subscribe("sub")
        records = []
        deadline = time.monotonic() + 30
        while len(records) < 400 and time.monotonic() < deadline:
            records += consumer.poll(100)
        assert consumer.assignment() == set(tps(*(("sub", p) for p in range(4))))
        assert consumer.generation > 0
        consumer.commit({("sub", 0): 42})
        assert consumer.committed(("sub", 0)) == 42
        consumer.unsubscribe()              # commits the positions (enable.auto.commit), leaves the group
        assert consumer.assignment() == set() and consumer.committed(("sub", 0)) == 100
        consumer.subscribe(["sub"])
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            assert consumer.poll(100) == []          # rejoined: nothing left after the commits
        consumer.commit({("sub", 1): 7})
    # close() committed the positions (enable.auto.commit): a new member starts after them.
    with Consumer(cluster.bootstrap, group_id="sub-group", session_timeout_ms=6000) as again:
        assert again.committed(("sub", 1)) == 100
    assert sorted(r.value for r in records) == sorted(b"s%d" % i for i in range(400))


def run_with_full_pool(cluster, group, priority, seconds):
    """Keep the pool full for ``seconds`` while polling every 50 ms; returns (generation before and
    after, heartbeats answered while the pool was full, when the full period began or None)."""
    consumer = Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                        buffer_memory=256 << 10, fetch_max_bytes=256 << 10, max_poll_records=1,
                        session_timeout_ms=4000, heartbeat_interval_ms=300, _priority_coordinator=priority)
    consumer.subscribe(["liveness"])
    while not consumer.poll(100):
        pass
    generation = consumer.generation
    full_since = answered_before = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        records = consumer.poll(50)
        time.sleep(0.2 * len(records))      # a slow application: 5 records a second
        if not consumer.pool.is_out_of_memory:
            full_since = None
        elif full_since is None:
            full_since, answered_before = time.monotonic(), consumer.metrics()["heartbeat-total"]
        elif time.monotonic() - full_since >= seconds:
            break
    answered_while_full = consumer.metrics()["heartbeat-total"] - (answered_before or 0)
    # The application catches up: memory returns, the coordinator's answers can be read again.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and consumer.generation == generation and priority is False:
        consumer.poll(10)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        consumer.poll(10)
    generations = [generation, consumer.generation]
    consumer.close()
    return generations, answered_while_full, full_since


def test_heartbeats_are_read_outside_a_full_pool(cluster):
    cluster.create_topic("liveness", 16)
    cluster.produce("liveness", [b"x" * 1024] * 8000, partitions=16)
    # Priority coordinator channel (KIP-81): the pool stays full longer than session.timeout.ms and
    # the member keeps its generation, because heartbeat answers do not need pool memory.
    generations, answered, full_since = run_with_full_pool(cluster, "live-priority", True, seconds=6)
    assert full_since is not None, "the pool was never full for the whole period"
    assert generations[0] == generations[1]
    assert answered >= 10               # heartbeats every 300 ms kept being answered while full
    # The same with the coordinator's answers read into the pool: they wait for memory, no heartbeat
    # follows, the session expires and the group rebalances (a new generation).
    generations, answered, full_since = run_with_full_pool(cluster, "live-plain", False, seconds=6)
    assert full_since is not None
    assert generations[1] != generations[0]
    assert answered <= 1


class ScriptedClient:
    """The coordinator's network client, connected, answered by the test: ``sent`` holds each request
    with its callback until ``answer`` runs it (in any order)."""

    def __init__(self):
        self.sent = []
        self.connected = True

    def is_connected(self, node):
        return self.connected

    def close(self, node):
        self.connected = False

    def send(self, node, request, callback):
        self.sent.append((request, callback))

    def requests(self, kind):
        return [request for request, _ in self.sent if isinstance(request, kind)]

    def answer(self, kind, response):
        entry = next(entry for entry in self.sent if isinstance(entry[0], kind))
        self.sent.remove(entry)
        entry[1](None, response, None)


def commit_answer(code):
    r = messages.OffsetCommitResponse
    return r(topics=[r.OffsetCommitResponseTopic(name="t", partitions=[
        r.OffsetCommitResponsePartition(partition_index=0, error_code=code)])])


def joined_follower(client, generation, partitions):
    """The answers that make a member a follower of ``generation`` holding ``partitions``."""
    client.answer(messages.JoinGroupRequest, messages.JoinGroupResponse(
        error_code=0, generation_id=generation, protocol_name="range", leader="leader", member_id="me", members=[]))
    client.answer(messages.SyncGroupRequest, messages.SyncGroupResponse(
        error_code=0, assignment=encode_assignment(partitions)))


def scripted_coordinator(client, on_join_prepare=lambda: None):
    coordinator = Coordinator(client, None, consumer_config.parse({"bootstrap.servers": "127.0.0.1:1",
                                                                   "group.id": "g"}),
                              on_join_prepare=on_join_prepare)
    coordinator.node = "coordinator-0"
    return coordinator


def test_no_commit_goes_out_during_a_rebalance_and_a_late_refusal_leaves_the_rebalance_alone():
    # Kafka's ConsumerCoordinator: a commit while the member rejoins fails locally (nothing on the wire,
    # which would be refused with the ending generation); a refusal of a commit of the previous
    # generation, answered once the member rejoins, does not undo its JoinGroup or SyncGroup.
    client = ScriptedClient()
    coordinator = scripted_coordinator(client)
    coordinator.subscribe(["t"])
    coordinator.poll(time.monotonic())
    owned = tps(("t", 0), ("t", 1))
    joined_follower(client, 1, owned)
    assert coordinator.stable and coordinator.assigned == owned
    results = []
    coordinator.commit({TopicPartition("t", 0): 5}, results.append)       # stable: sent with generation 1
    coordinator.request_rejoin()                                           # as a heartbeat's answer would
    coordinator.poll(time.monotonic())
    assert coordinator.rebalancing and len(client.requests(messages.JoinGroupRequest)) == 1
    coordinator.commit({TopicPartition("t", 0): 6}, results.append)
    assert isinstance(results[0], RebalanceInProgressError) and "rejoining" in str(results[0])
    assert len(client.requests(messages.OffsetCommitRequest)) == 1         # nothing more went out
    client.answer(messages.JoinGroupRequest, messages.JoinGroupResponse(
        error_code=0, generation_id=2, protocol_name="range", leader="leader", member_id="me", members=[]))
    # The commit of generation 1 refused while generation 2 syncs: the sync goes on.
    client.answer(messages.OffsetCommitRequest, commit_answer(codes.ILLEGAL_GENERATION))
    assert isinstance(results[1], RebalanceInProgressError) and results[1].code == codes.ILLEGAL_GENERATION
    assert coordinator.generation == 2 and coordinator.member_id == "me"
    client.answer(messages.SyncGroupRequest, messages.SyncGroupResponse(
        error_code=0, assignment=encode_assignment(owned[:1])))
    assert coordinator.stable and coordinator.assigned == owned[:1] and coordinator.generations == [1, 2]
    assert not client.requests(messages.JoinGroupRequest)
    # A refusal of the current generation, with no rebalance under way, is the coordinator's word: fenced.
    coordinator.commit({TopicPartition("t", 0): 7}, results.append)
    client.answer(messages.OffsetCommitRequest, commit_answer(codes.ILLEGAL_GENERATION))
    assert type(results[2]) is CommitFailedError and results[2].code == codes.ILLEGAL_GENERATION
    assert coordinator.generation == -1 and coordinator.member_id == "me" and not coordinator.stable
    # REBALANCE_IN_PROGRESS for the current generation: rejoin, keeping the generation.
    coordinator.poll(time.monotonic())
    joined_follower(client, 3, owned)
    coordinator.commit({TopicPartition("t", 0): 8}, results.append)
    client.answer(messages.OffsetCommitRequest, commit_answer(codes.REBALANCE_IN_PROGRESS))
    assert isinstance(results[3], RebalanceInProgressError) and coordinator.generation == 3
    assert not coordinator.stable and not coordinator.rebalancing      # its JoinGroup goes at the next poll


def test_the_rebalance_preparation_runs_once_and_may_poll_or_lose_the_coordinator():
    # The preparation (the consumer's commit and revocation, and the listener) runs before the first
    # JoinGroup with the generation being left; a listener's poll() there does not join (nor prepare)
    # again, and a commit there that loses the coordinator leaves the JoinGroup to the next poll.
    client = ScriptedClient()
    prepared = []

    def prepare():
        prepared.append((coordinator.rebalancing, coordinator.generation))
        coordinator.poll(time.monotonic())
        client.close(coordinator.node)
    coordinator = scripted_coordinator(client, prepare)
    coordinator.subscribe(["t"])
    coordinator.poll(time.monotonic())
    assert prepared == [(False, -1)] and not client.sent
    client.connected = True
    coordinator.node = "coordinator-0"
    coordinator.poll(time.monotonic())
    assert prepared == [(False, -1)] and len(client.requests(messages.JoinGroupRequest)) == 1
    assert coordinator.rebalancing


def test_a_rejoin_asked_for_during_a_rebalance_waits_for_its_sync():
    # Kafka's rejoinNeeded: a subscription changed while the JoinGroup or SyncGroup is out leaves them be
    # (the other members wait on this one's sync); the member rejoins with the new subscription once the
    # consumer has taken the assignment, not before.
    client = ScriptedClient()
    coordinator = scripted_coordinator(client)
    coordinator.subscribe(["t"])
    coordinator.poll(time.monotonic())
    for answered in (messages.JoinGroupRequest, messages.SyncGroupRequest):
        coordinator.subscribe(["t", f"after-{answered.__name__}"])
        if answered is messages.JoinGroupRequest:
            client.answer(answered, messages.JoinGroupResponse(error_code=0, generation_id=1, protocol_name="range",
                                                               leader="leader", member_id="me", members=[]))
        assert client.requests(messages.SyncGroupRequest) and not client.requests(messages.JoinGroupRequest)
    client.answer(messages.SyncGroupRequest, messages.SyncGroupResponse(
        error_code=0, assignment=encode_assignment(tps(("t", 0)))))
    assert coordinator.stable and coordinator.assigned == tps(("t", 0))
    coordinator.poll(time.monotonic())
    assert coordinator.stable and not client.requests(messages.JoinGroupRequest)    # assignment not yet taken
    assert coordinator.assignment_changed == tps(("t", 0))
    coordinator.assignment_changed = None
    coordinator.poll(time.monotonic())
    [join] = client.requests(messages.JoinGroupRequest)
    assert sorted(decode_subscription(join.protocols[0].metadata)) == ["after-SyncGroupRequest", "t"]
    joined_follower(client, 2, tps(("t", 0)))
    coordinator.assignment_changed = None
    coordinator.poll(time.monotonic())
    assert coordinator.stable and coordinator.generations == [1, 2] and not client.sent
