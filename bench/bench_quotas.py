"""KIP-219 throttling at issue 37's scale (``.venv/bin/pytest bench/bench_quotas.py -s``): a confluent-kafka producer
with ``producer_byte_rate`` = 1 MB/s by its client id, Kafka's default windows (11 of 1 s), sends as fast as it can
for 48 s. Kafka's sampled rate lets a fresh client send the 10 windows' worth at once, and that clump comes back
each time its sample expires (every 11 s); so the rate is measured over whole periods, 33 s from the end of the
first one (3 periods), and printed as a ratio to the quota (within 10%). Side by side in the same run: the median latency of an unthrottled producer on the same broker, alone and then while the
throttled one runs (as a ratio)."""
import statistics
import tempfile
import threading
import time

import pytest

from kmem.admin.client import AdminClient
from kmem.broker import Broker
from kmem.protocol import messages

QUOTA = 1_000_000
PERIOD = 11                     # quota.window.num x quota.window.size.seconds
RUN_SECONDS, STEADY_SECONDS = 48, 3 * PERIOD


def set_quota(bootstrap):
    Alter = messages.AlterClientQuotasRequest
    with AdminClient(bootstrap) as admin:
        response = admin.request(Alter(validate_only=False, entries=[Alter.EntryData(
            entity=[Alter.EntityData(entity_type="client-id", entity_name="bulk")],
            ops=[Alter.OpData(key="producer_byte_rate", value=QUOTA, remove=False)])]))
    assert response.entries[0].error_code == 0


def latencies(confluent_kafka, bootstrap, seconds):
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "client.id": "free", "linger.ms": 0})
    measured = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        producer.produce("free", b"x" * 100)
        producer.flush(10)
        measured.append(time.monotonic() - started)
        time.sleep(0.02)
    return statistics.median(measured)


def test_producer_held_to_1_mb_per_s_over_30_s():
    confluent_kafka = pytest.importorskip("confluent_kafka")
    with tempfile.TemporaryDirectory() as log_dir, Broker(log_dir) as broker:
        set_quota(broker.bootstrap_servers)
        alone = latencies(confluent_kafka, broker.bootstrap_servers, 3)
        acked = []
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers, "client.id": "bulk",
                                             "linger.ms": 5, "queue.buffering.max.messages": 200})
        during = []
        checker = threading.Thread(target=lambda: during.append(
            latencies(confluent_kafka, broker.bootstrap_servers, RUN_SECONDS - 5)))
        started = time.monotonic()
        checker.start()
        value = b"v" * 1000
        while time.monotonic() - started < RUN_SECONDS:
            try:
                producer.produce("bulk", value, on_delivery=lambda err, msg: acked.append(time.monotonic()))
            except BufferError:
                producer.poll(0.02)
            producer.poll(0)
        checker.join()
        producer.flush(60)
        begin = acked[0] + PERIOD
        steady = [t for t in acked if begin <= t < begin + STEADY_SECONDS]
        rate = len(steady) * len(value) / STEADY_SECONDS
        print(f"\nthrottled producer: {rate / 1e6:.3f} MB/s over {STEADY_SECONDS} s (3 periods), "
              f"{rate / QUOTA:.3f} x its producer_byte_rate")
        print(f"unthrottled producer's median latency: {alone * 1000:.1f} ms alone, {during[0] * 1000:.1f} ms "
              f"beside it ({during[0] / alone:.2f} x)")
        assert 0.9 <= rate / QUOTA <= 1.1
