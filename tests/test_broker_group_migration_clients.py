"""KIP-848's online migration with real clients: a group of classic confluent-kafka consumers (``range``, eager, or
``cooperative-sticky``) is moved to ``group.protocol=consumer`` one member at a time, as a rolling restart does,
while a producer keeps writing, then back to the classic protocol; every record is consumed and the group's
committed offsets reach the end of every partition (Apache's Java consumer as a classic member of an upgraded group:
``tests/test_broker_consumer_groups_clients.py``, whose Java probe it shares)."""
import signal
import threading

import pytest
from confluent_kafka import Producer

from broker_helpers import wait_for
from group_helpers import ConsumerProcess, split_evenly, start_broker
from test_broker_groups import PARTITIONS

SETTINGS = {"group.consumer.heartbeat.interval.ms": 200, "group.consumer.session.timeout.ms": 3000}
CLASSIC, CONSUMER = "confluent-kafka-classic", "confluent-kafka-consumer-protocol"


class KeepProducing(threading.Thread):
    """Writes ``v0``, ``v1``... to every partition in turn until ``stop()``; ``values`` were acknowledged."""

    def __init__(self, bootstrap, topic):
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic = topic
        self.values = []
        self.stopping = threading.Event()
        self.start()

    def run(self):
        i = 0
        while not self.stopping.is_set():
            value = f"v{i}"
            self.producer.produce(self.topic, value.encode(), partition=i % len(PARTITIONS),
                                  on_delivery=lambda err, _, value=value: err or self.values.append(value))
            i += 1
            self.producer.poll(0.01)          # its delivery reports, and a pace of about a hundred a second
        self.producer.flush(30)
        self.producer = None                  # closed: it stops reconnecting to a broker that closes

    def stop(self):
        self.stopping.set()
        self.join(60)
        return set(self.values)


def committed_values(consumers):
    return {value for c in consumers for _, _, value in c.state()[1]}


# range (eager) is the slow run's: the coordinator tests cover its path, and the default run's time is kept
@pytest.mark.parametrize("strategy", [pytest.param("range", marks=pytest.mark.slow), "cooperative-sticky"])
def test_a_rolling_restart_moves_a_classic_group_to_the_consumer_protocol_and_back(tmp_path, strategy):
    broker = start_broker(tmp_path, **SETTINGS)
    coordinator = broker.coordinator
    everyone = []

    def start(client, argument):
        consumer = ConsumerProcess(client, broker.bootstrap_servers, "workers", "orders", argument)
        everyone.append(consumer)
        return consumer

    def replace(members, index, client, argument, what):
        """A rolling restart's step: the new member joins, then the one it replaces leaves (LeaveGroup or a
        heartbeat with epoch -1)."""
        new = start(client, argument)
        wait_for(lambda: split_evenly([*members, new], PARTITIONS), f"{what}: the new member taking its share")
        members[index].stop(signal.SIGTERM)
        members[index] = new
        wait_for(lambda: split_evenly(members, PARTITIONS), f"{what}: the others taking the leaver's partitions")

    producer = None
    try:
        broker.logs.create_topic("orders", len(PARTITIONS))
        producer = KeepProducing(broker.bootstrap_servers, "orders")
        members = [start(CLASSIC, strategy) for _ in range(3)]
        wait_for(lambda: split_evenly(members, PARTITIONS), "three classic members sharing the partitions")
        for i in range(3):
            replace(members, i, CONSUMER, "uniform", f"upgrade {i}")
            consumer_group = coordinator.consumer_groups.groups["workers"]
            assert sum(m.classic is not None for m in consumer_group.members.values()) == 2 - i
        for i in range(3):
            replace(members, i, CLASSIC, strategy, f"downgrade {i}")
            assert ("workers" in coordinator.consumer_groups.groups) == (i < 2)
        classic = coordinator.groups["workers"]
        assert (classic.state, len(classic.members), classic.protocol) == ("Stable", 3, strategy)
        produced = producer.stop()
        producer = None
        wait_for(lambda: produced <= committed_values(everyone), "every record consumed and committed")
        ends = {p: broker.logs.get_partition("orders", p).high_watermark for p in PARTITIONS}
        wait_for(lambda: {p: classic.offsets[("orders", p)].offset for p in PARTITIONS} == ends,
                 "the group's offsets at the end of every partition")
    finally:
        if producer is not None:
            producer.stop()
        for consumer in everyone:
            consumer.stop(signal.SIGKILL)
        broker.close()
