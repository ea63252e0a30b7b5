"""Consumer groups: how long a group of 10 confluent-kafka consumers takes to become stable, and to
rebalance after one of them leaves, on kmem broker and on librdkafka's mock cluster, in one run.

    .venv/bin/python -m pytest bench/bench_groups.py -q -s

Both sides get the same consumers (session.timeout.ms 6000, heartbeat.interval.ms 500) on a topic of
4 partitions (the partitions the mock cluster auto-creates). kmem broker runs with Kafka's defaults
(``group.initial.rebalance.delay.ms`` 3000) and, as a second contender, with no initial delay.

Also: the CPU an idle kmem broker uses with ``KMEM_BENCH_IDLE_GROUPS`` (default 50000) groups that hold
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

