"""The consumer group protocol of KIP-848 against the classic eager one: how long a member that keeps consuming
through a rebalance (the "unaffected" member) stops, while another member joins the group and then leaves it.

    .venv/bin/python -m pytest bench/bench_consumer_group_protocol.py -q -s

Two kmem consumers (``kmem.consumer``) on a topic of 4 partitions with a backlog: X reads alone, Y joins, the
two share, Y leaves (``close``), X holds every partition again. X's longest pause is the longest time it waited
inside ``poll`` for records (from the end of its work on a batch until a ``poll`` returned the next), from Y's
``subscribe`` until X holds all four again and has read from them. Both handle each batch (at most 100 records)
in ``KMEM_BENCH_PAUSE_WORK_MS`` (default 10 and 200 ms: an eager rebalance waits for every member to finish its
batch and rejoin), so neither catches up with the backlog. Both protocols on kmem broker (in its own process),
and the consumer protocol on librdkafka's mock cluster (which serves ConsumerGroupHeartbeat), in the same run;
median of 3 rounds, a new group each round.

- classic: ``partition.assignment.strategy=range`` (eager: every member gives up all its partitions before each
  rejoin), ``session.timeout.ms`` 6000, ``heartbeat.interval.ms`` 500, kmem broker without initial rebalance delay;
- consumer: ``group.protocol=consumer``, the coordinator's default assignor (``uniform``), kmem broker's
  ``group.consumer.heartbeat.interval.ms`` 500 (the mock cluster's own interval otherwise).
"""
import os
import tempfile
import threading
import time

import pytest
from confluent_kafka import Producer

from peers import BrokerProcess, MockCluster, create_topics

TOPIC = "bench-pause"
PARTITIONS = 4                  # what the mock cluster auto-creates
BACKLOG = 25_000                # 100 B records a partition
WORK_MS = [int(ms) for ms in os.environ.get("KMEM_BENCH_PAUSE_WORK_MS", "10,200").split(",")]
TIMEOUT = 60
# (name, 0: kmem broker or 1: the mock cluster, protocol); the mock cluster's classic rebalances of these eager
# members took 10-60 s in trials (X paused 4.7 s in each), so it runs the consumer protocol only
CONTENDERS = [("kmem", 0, "classic"), ("kmem", 0, "consumer"), ("librdkafka mock", 1, "consumer")]
PROTOCOLS = {"classic": {"partition_assignment_strategy": "range", "session_timeout_ms": 6000,
                         "heartbeat_interval_ms": 500},
             "consumer": {"group_protocol": "consumer"}}


class Reader:
    """A kmem consumer polled on its own thread: the partitions its listener says it holds, and (when, how long it
    had waited) for each of its polls that returned records."""

    def __init__(self, bootstrap, group, protocol, work):
        from kmem.consumer import Consumer

        self.lock = threading.Lock()
        self.held = set()
        self.waits = []
        self.work = work
        self.consumer = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest", max_poll_records=100,
                                 buffer_memory=4 << 20, fetch_max_bytes=1 << 20, **PROTOCOLS[protocol])
        self.consumer.subscribe([TOPIC], listener=self)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def on_partitions_revoked(self, partitions):
        with self.lock:
            self.held.difference_update(partitions)

    on_partitions_lost = on_partitions_revoked

    def on_partitions_assigned(self, partitions):
        with self.lock:
            self.held.update(partitions)

    def holds(self, count):
        with self.lock:
            return len(self.held) == count

    def _run(self):
        waiting_since = time.monotonic()
        while not self.stopping.is_set():
            if self.consumer.poll(100):
                now = time.monotonic()
                with self.lock:
                    self.waits.append((now, now - waiting_since))
                time.sleep(self.work)           # the application handles the batch
                waiting_since = time.monotonic()

    def close(self):
        self.stopping.set()
        self.thread.join(TIMEOUT)
        self.consumer.close()


def wait(condition, what):
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def longest_pause(bootstrap, group, protocol, work):
    """One round: X's longest pause (seconds) while Y joins and leaves, and how long that took."""
    x = Reader(bootstrap, group, protocol, work)
    try:
        wait(lambda: x.holds(PARTITIONS) and len(x.waits) > 5, "X reading alone")
        started = time.monotonic()
        y = Reader(bootstrap, group, protocol, work)
        try:
            wait(lambda: x.holds(PARTITIONS // 2) and y.holds(PARTITIONS // 2), "X and Y sharing")
        finally:
            y.close()
        wait(lambda: x.holds(PARTITIONS), "X holding every partition again")
        settled = time.monotonic()
        wait(lambda: x.waits[-1][0] > settled, "X reading again")
        with x.lock:
            waits = [(at, waited) for at, waited in x.waits if at > started]
        return max(waited for _, waited in waits), waits[-1][0] - started
    finally:
        x.close()


def fill(bootstrap):
    create_topics(bootstrap, [TOPIC], PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(BACKLOG * PARTITIONS):
        producer.produce(TOPIC, b"x" * 100, partition=i % PARTITIONS)
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(60)


@pytest.mark.parametrize("work_ms", WORK_MS)
def test_unaffected_member_pause_while_another_joins_and_leaves(work_ms):
    results = {}
    with tempfile.TemporaryDirectory() as log_dir, \
            BrokerProcess(log_dir, {"properties": {"group.initial.rebalance.delay.ms": 0,
                                                   "group.consumer.heartbeat.interval.ms": 500}}) as kmem, \
            MockCluster() as mock:
        for broker in (kmem, mock):
            fill(broker.bootstrap)
        for name, broker, protocol in CONTENDERS:
            rounds = []
            for i in range(3):
                rounds.append(longest_pause((kmem, mock)[broker].bootstrap, f"pause-{work_ms}-{protocol}-{i}",
                                            protocol, work_ms / 1000))
            results[name, protocol] = sorted(rounds)[1]
    print(f"\nan unaffected kmem consumer's longest pause while another joins and leaves ({PARTITIONS} partitions, "
          f"{work_ms} ms of work a batch; median of 3 rounds)")
    print(f"    {'broker, protocol':<40} {'longest pause':>14} {'join and leave took':>20} {'eager/this':>11}")
    eager = results["kmem", "classic"][0]
    for (name, protocol), (pause, span) in results.items():
        label = f"{name}, {protocol} ({'eager range' if protocol == 'classic' else 'KIP-848'})"
        print(f"    {label:<40} {pause * 1000:>11.1f} ms {span:>18.2f} s {eager / pause:>10.1f}x")
