"""kmem's consumer with ``group.protocol=consumer`` (KIP-848) in one group with librdkafka's (confluent-kafka) on the
same protocol, on kmem broker, each member in its own process: members of both clients join, leave cleanly, crash
(SIGKILL) and restart, and every record is committed exactly once (a crashed member's uncommitted records are
read again by the next owner, and were never reported committed). With Apache's Java consumer:
test_broker_consumer_groups_clients.py."""
import signal

import pytest

from broker_helpers import wait_for
from group_helpers import ConsumerProcess, split_evenly, start_broker
from test_broker_consumer_groups_clients import SETTINGS, committed
from test_broker_groups import PARTITIONS, produce

KMEM, LIBRDKAFKA = "kmem-consumer-protocol", "confluent-kafka-consumer-protocol"


@pytest.mark.parametrize("assignor", ["uniform", pytest.param("range", marks=pytest.mark.slow)])
def test_kmem_and_librdkafka_members_join_leave_crash_and_restart_and_every_record_is_committed_once(tmp_path,
                                                                                                     assignor):
    broker = start_broker(tmp_path, **SETTINGS)
    consumers = []

    def start(client):
        consumers.append(ConsumerProcess(client, broker.bootstrap_servers, "workers", "orders", assignor))
        return consumers[-1]

    def live():
        return [c for c in consumers if c.process.poll() is None]

    try:
        broker.logs.create_topic("orders", len(PARTITIONS))
        produce(broker.bootstrap_servers, "orders", [f"a{i}" for i in range(60)])
        kmem, librdkafka = start(KMEM), start(LIBRDKAFKA)
        wait_for(lambda: split_evenly(live(), PARTITIONS), "a kmem and a librdkafka member sharing")
        start(KMEM)
        wait_for(lambda: split_evenly(live(), PARTITIONS), "a second kmem member taking its share")
        produce(broker.bootstrap_servers, "orders", [f"b{i}" for i in range(60)])
        librdkafka.stop(signal.SIGTERM)                 # leaves with epoch -1
        wait_for(lambda: split_evenly(live(), PARTITIONS), "the kmem members taking its partitions")
        kmem.stop(signal.SIGKILL)                       # a crash: the session timeout fences it
        wait_for(lambda: split_evenly(live(), PARTITIONS), "the survivor taking every partition")
        start(KMEM), start(LIBRDKAFKA)                  # restarts
        wait_for(lambda: split_evenly(live(), PARTITIONS), "three members sharing again")
        produce(broker.bootstrap_servers, "orders", [f"c{i}" for i in range(60)])
        wait_for(lambda: len(set(committed(consumers))) == 180, "every record committed")
        for c in live():
            c.stop(signal.SIGTERM)
        seen = committed(consumers)
        assert len(seen) == len(set(seen)), "a committed record was read twice"
    finally:
        for c in consumers:
            c.stop(signal.SIGKILL)
        broker.close()

