"""Consumer groups: how long a group of 10 confluent-kafka consumers takes to become stable, and to
rebalance after one of them leaves, on kmem broker and on librdkafka's mock cluster, in one run.

    .venv/bin/python -m pytest bench/bench_groups.py -q -s

Both sides get the same consumers (session.timeout.ms 6000, heartbeat.interval.ms 500) on a topic of
4 partitions (the partitions the mock cluster auto-creates). kmem broker runs with Kafka's defaults
(``group.initial.rebalance.delay.ms`` 3000) and, as a second contender, with no initial delay.

Also: a group of 10 kmem consumers (``kmem.consumer``) when an 11th joins, eager (range) against
cooperative-sticky (KIP-429): the time until every member consumes its share again, the partitions
revoked, and the partition-seconds without an owner, measured by their rebalance listeners.

    .venv/bin/python -m pytest bench/bench_groups.py -q -s -k 11th

And: the CPU an idle kmem broker uses with ``KMEM_BENCH_IDLE_GROUPS`` (default 50000) groups that hold
committed offsets (each with its offset-expiry deadline on the timer), over 10 s.
"""
import os
import tempfile
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer

from kmem.broker import Broker
from peers import BrokerProcess

MEMBERS = 10
PARTITIONS = 4
TOPIC = "bench-groups"
TIMEOUT = 60


class Member:
    """A confluent-kafka consumer polled on its own thread; counts the assignments it receives."""

    def __init__(self, bootstrap):
        self.assigned = None
        self.assignments = 0
        self.lock = threading.Lock()
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "session.timeout.ms": 6000,
                                  "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest"})
        self.consumer.subscribe([TOPIC], on_assign=self._on_assign, on_revoke=self._on_revoke)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on_assign(self, consumer, partitions):
        with self.lock:
            self.assigned = {p.partition for p in partitions}
            self.assignments += 1

    def _on_revoke(self, consumer, partitions):
        with self.lock:
            self.assigned = None

    def _run(self):
        while not self.stopping.is_set():
            self.consumer.poll(0.05)
        self.consumer.close()

    def close(self):
        self.stopping.set()
        self.thread.join(TIMEOUT)


def stable(members, since=None):
    """Every member holds an assignment (received after ``since`` counts, if given), together disjoint
    and covering the topic."""
    assigned = []
    for i, member in enumerate(members):
        with member.lock:
            if member.assigned is None or (since is not None and member.assignments <= since[i]):
                return False
            assigned.append(member.assigned)
    return sum(map(len, assigned)) == PARTITIONS and set().union(*assigned) == set(range(PARTITIONS))


def wait(condition):
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the group did not settle")
        time.sleep(0.01)


@pytest.fixture(scope="module", params=["kmem", "kmem, no initial delay", "librdkafka mock cluster"])
def cluster(request):
    if request.param == "librdkafka mock cluster":
        holder = Producer({"test.mock.num.brokers": 1})
        broker = holder.list_topics(timeout=10).brokers[next(iter(holder.list_topics().brokers))]
        bootstrap = f"{broker.host}:{broker.port}"
        Producer({"bootstrap.servers": bootstrap}).list_topics(TOPIC, timeout=10)     # auto-created
        yield request.param, bootstrap
        return
    delay = 0 if "no initial delay" in request.param else 3000
    with tempfile.TemporaryDirectory() as log_dir, Broker(log_dir, properties={
            "group.initial.rebalance.delay.ms": delay, "num.partitions": PARTITIONS}) as broker:
        broker.logs.create_topic(TOPIC, PARTITIONS)
        yield request.param, broker.bootstrap_servers


def test_group_of_10_becomes_stable(compare, cluster):
    name, bootstrap = cluster
    groups = []

    def close_previous():
        while groups:
            for member in groups.pop():
                member.close()
        return (), {}

    def form_group():
        members = [Member(bootstrap) for _ in range(MEMBERS)]
        groups.append(members)
        wait(lambda: stable(members))

    compare("group of 10 consumers: start to stable", name, form_group, rounds=3, setup=close_previous)
    close_previous()


def test_rebalance_after_one_leaves(compare, cluster):
    name, bootstrap = cluster
    state = {}

    def form_group():
        for member in state.get("members", [])[1:]:
            member.close()
        members = [Member(bootstrap) for _ in range(MEMBERS)]
        wait(lambda: stable(members))
        state["members"] = members
        return (), {}

    def one_leaves():
        members = state["members"]
        before = [m.assignments for m in members[1:]]
        members[0].close()
        wait(lambda: stable(members[1:], since=before))

    compare("group of 10 consumers: rebalance after one leaves", name, one_leaves, rounds=3, setup=form_group)
    for member in state["members"][1:]:
        member.close()


def test_idle_broker_cpu_with_many_groups(tmp_path):
    count = int(os.environ.get("KMEM_BENCH_IDLE_GROUPS", "50000"))
    with BrokerProcess(tmp_path / "logs", {}, "--groups", str(count)) as broker:
        cpu, started = broker.cpu_seconds(), time.perf_counter()
        time.sleep(10)              # the figure: what ten idle seconds cost
        share = (broker.cpu_seconds() - cpu) / (time.perf_counter() - started)
    print(f"\nidle kmem broker with {count:,} groups: {share * 100:.2f}% of a core (goal: under 2%)")



# -- kmem consumers: a group of 10 when an 11th joins, eager vs cooperative ------------------------------

REBALANCE_TOPIC = "bench-rebalance"
REBALANCE_PARTITIONS = 110          # 11 a member in a group of 10, 10 in a group of 11
REBALANCE_BACKLOG = 1000            # 100 B records a partition, so that the members have work
WORK_MS = [int(ms) for ms in os.environ.get("KMEM_BENCH_REBALANCE_WORK_MS", "0,200").split(",")]


class Stops:
    """When each partition lost its owner and got one again, across the members of one group."""

    def __init__(self):
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.unowned_since = {}
        self.stopped_seconds = 0.0      # partition-seconds without an owner
        self.revoked = 0


class KmemMember:
    """A kmem consumer polled on its own thread, its rebalance listener keeping what it holds."""

    def __init__(self, bootstrap, group, strategy, stops, work_ms):
        from kmem.consumer import Consumer

        self.held = set()
        self.stops = stops
        self.work = work_ms / 1000
        self.consumer = Consumer(bootstrap, group_id=group, partition_assignment_strategy=strategy,
                                 session_timeout_ms=6000, heartbeat_interval_ms=500, auto_offset_reset="earliest",
                                 buffer_memory=4 << 20, fetch_max_bytes=1 << 20)
        self.consumer.subscribe([REBALANCE_TOPIC], listener=self)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def on_partitions_revoked(self, partitions):
        with self.stops.lock:
            now = time.monotonic()
            self.held.difference_update(partitions)
            self.stops.revoked += len(partitions)
            self.stops.unowned_since.update((tp, now) for tp in partitions)

    on_partitions_lost = on_partitions_revoked

    def on_partitions_assigned(self, partitions):
        with self.stops.lock:
            now = time.monotonic()
            self.held.update(partitions)
            for tp in partitions:
                if tp in self.stops.unowned_since:
                    self.stops.stopped_seconds += now - self.stops.unowned_since.pop(tp)
            self.stops.changed.notify_all()

    def _run(self):
        while not self.stopping.is_set():
            if self.consumer.poll(100) and self.work:
                time.sleep(self.work)           # the application handles the batch

    def close(self):
        self.stopping.set()
        self.thread.join(TIMEOUT)
        self.consumer.close()


def balanced(members):
    """Every member holds its share (the listener told it so: it is consuming), each partition once."""
    held = [m.held for m in members]
    share = REBALANCE_PARTITIONS // len(members)
    return all(len(h) == share for h in held) and len(set().union(*held)) == REBALANCE_PARTITIONS


@pytest.mark.parametrize("work_ms", WORK_MS)
def test_kmem_group_of_10_rebalance_when_an_11th_joins(tmp_path, work_ms):
    """From the 11th member's subscribe() until all 11 are consuming their share again; with range the 10
    give up everything before rejoining (eager), with cooperative-sticky (KIP-429) only the 10 partitions
    that move stop, but it takes two rebalances. The application takes ``work_ms`` per batch (a member
    rejoins at its next poll). Three rounds each, a new group each round."""
    from peers import create_topics

    results = {}
    with BrokerProcess(tmp_path / "logs", {"properties": {"group.initial.rebalance.delay.ms": 0}}) as broker:
        create_topics(broker.bootstrap, [REBALANCE_TOPIC], REBALANCE_PARTITIONS)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
        for i in range(REBALANCE_BACKLOG * REBALANCE_PARTITIONS):
            producer.produce(REBALANCE_TOPIC, b"x" * 100, partition=i % REBALANCE_PARTITIONS)
            if i % 10000 == 0:
                producer.poll(0)
        producer.flush(60)
        del producer
        for strategy in ("range", "cooperative-sticky"):
            rounds = []
            for round_ in range(3):
                stops = Stops()
                group = f"rebalance-{strategy}-{round_}"
                members = [KmemMember(broker.bootstrap, group, strategy, stops, work_ms) for _ in range(MEMBERS)]
                try:
                    with stops.changed:
                        assert stops.changed.wait_for(lambda: balanced(members), TIMEOUT), "10 never settled"
                        stops.revoked, stops.stopped_seconds = 0, 0.0
                    started = time.monotonic()
                    members.append(KmemMember(broker.bootstrap, group, strategy, stops, work_ms))
                    with stops.changed:
                        assert stops.changed.wait_for(lambda: balanced(members), TIMEOUT), "11 never settled"
                        rounds.append((time.monotonic() - started, stops.revoked, stops.stopped_seconds))
                finally:
                    for member in members:
                        member.close()
            results[strategy] = sorted(rounds)[1]       # the median round by time
    print(f"\nkmem consumers, {REBALANCE_PARTITIONS} partitions, heartbeat.interval.ms 500, {work_ms} ms of work a "
          f"batch: a group of {MEMBERS} when an 11th joins (median of 3 rounds)")
    for strategy, (seconds, revoked, stopped) in results.items():
        print(f"    {strategy:<20} {seconds:6.2f} s until all consume again, {revoked:>3} partitions revoked, "
              f"{stopped:7.1f} partition-seconds without an owner")
    eager, cooperative = results["range"], results["cooperative-sticky"]
    print(f"    cooperative/eager: {cooperative[0] / eager[0]:.2f}x the time, "
          f"{cooperative[2] / eager[2]:.2f}x the partition-seconds stopped")
