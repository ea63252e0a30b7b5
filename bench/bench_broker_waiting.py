"""A producer's latency while N consumers long-poll an empty topic, kmem broker vs Tansu vs librdkafka's
mock cluster in the same run (``.venv/bin/pytest bench/bench_broker_waiting.py -s``).

For each N of ``KMEM_BENCH_WAITING`` (default ``0,50,200,1000``) and each broker, fresh: N idle
consumers (``idle_fetchers.py``, at most 250 connections per process) each send Fetch v11 with
``max_wait_ms`` 500 again as each answer arrives, as caught-up consumers with ``fetch.wait.max.ms=500``
do; then one confluent-kafka producer (acks=1, ``linger.ms`` 0) sends 200 messages/s of 100 B for
``KMEM_BENCH_WAITING_SECONDS`` (default 5) s to another topic. Printed per broker: the produce-to-ack
latency p50 / p99, the slowest ApiVersions of a new connection (a new client's first request, five
tries), the broker's CPU over the window, and the idle fetches it answered per second.

Also a burst of ``KMEM_BENCH_BURST`` (default 5000) new clients connecting at once (1,000 per process),
each sending ApiVersions: seconds until all are answered, kmem with its default accept backlog (1,024)
and with Kafka's ``socket.listen.backlog.size`` of 50, and Tansu.

Tansu and the mock cluster keep their data in memory; kmem writes its log directory to disk.
"""
import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from peers import CHILD_ENV, HERE, BrokerProcess, MockCluster, Tansu, create_topics

COUNTS = [int(n) for n in os.environ.get("KMEM_BENCH_WAITING", "0,50,200,1000").split(",")]
SECONDS = float(os.environ.get("KMEM_BENCH_WAITING_SECONDS", "5"))
PER_PROCESS = 250
RATE = 200
WAIT_MS = 500

rows = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print("\nProduce-to-ack latency (acks=1, 200 msg/s) with N consumers long-polling an empty topic "
          "(max_wait_ms 500):")
    print(f"{'N':>5} {'broker':>6} {'p50 ms':>8} {'p99 ms':>8} {'ApiVersions ms':>15} {'CPU %':>6} {'fetches/s':>10}")
    for row in rows:
        print(f"{row[0]:>5} {row[1]:>6} {row[2]:>8.2f} {row[3]:>8.2f} {row[4]:>15.1f} {row[5]:>6.0f} {row[6]:>10.0f}")


def idle_consumers(bootstrap, count):
    processes = []
    for start in range(0, count, PER_PROCESS):
        processes.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "idle_fetchers.py"), bootstrap, "idle",
             str(min(PER_PROCESS, count - start)), str(WAIT_MS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=CHILD_ENV))
    for process in processes:
        assert process.stdout.readline().strip() == "READY", "idle consumers did not start"
    return processes


def stop(processes):
    answers = 0
    for process in processes:
        process.stdin.close()
        line = process.stdout.readline()
        answers += int(line.split(":")[1].strip(" }\n")) if line else 0
        process.wait(30)
    return answers


def api_versions_ms(bootstrap):
    """The slowest of five new connections' first ApiVersions (v3), in ms."""
    from kafka.protocol.metadata import ApiVersionsRequest

    request = ApiVersionsRequest[3](client_software_name="bench", client_software_version="1")
    request.with_header(correlation_id=1, client_id="new")
    payload = request.encode(version=3, header=True)
    host, port = bootstrap.rsplit(":", 1)
    worst = 0.0
    for _ in range(5):
        started = time.perf_counter()
        with socket.create_connection((host, int(port)), timeout=120) as sock:
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            sock.recv(size, socket.MSG_WAITALL)
        worst = max(worst, time.perf_counter() - started)
    return worst * 1000


def produce_latencies(bootstrap):
    import confluent_kafka

    latencies = []
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0})

    def delivered(error, _message, sent):
        assert error is None, error
        latencies.append(time.perf_counter() - sent)
    producer.produce("latency", b"warm-up", partition=0)
    assert producer.flush(60) == 0
    payload = os.urandom(100)
    started = time.perf_counter()
    for i in range(int(RATE * SECONDS)):
        due = started + i / RATE
        while (now := time.perf_counter()) < due:
            producer.poll(min(due - now, 0.001))
        sent = time.perf_counter()
        producer.produce("latency", payload, partition=0, on_delivery=lambda e, m, s=sent: delivered(e, m, s))
        producer.poll(0)
    assert producer.flush(300) == 0
    latencies.sort()
    return latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.99)] * 1000


def peers():
    yield "kmem", lambda tmp: BrokerProcess(tmp / "kmem", {"num_partitions": 1})
    if Tansu.available():
        yield "tansu", lambda tmp: Tansu()
    yield "mock", lambda tmp: MockCluster()


@pytest.mark.parametrize("count", COUNTS)
def test_produce_latency_with_idle_consumers(tmp_path, count):
    for name, start in peers():
        with start(tmp_path / str(count)) as broker:
            create_topics(broker.bootstrap, ["idle", "latency"])
            idle_since = time.perf_counter()
            idle = idle_consumers(broker.bootstrap, count)
            try:
                cpu_before, clock_before = broker.cpu_seconds(), time.perf_counter()
                p50, p99 = produce_latencies(broker.bootstrap)
                new_client = api_versions_ms(broker.bootstrap)
                elapsed = time.perf_counter() - clock_before
                cpu = (broker.cpu_seconds() - cpu_before) / elapsed * 100
            finally:
                answers = stop(idle)
            rows.append((count, name, p50, p99, new_client, cpu, answers / (time.perf_counter() - idle_since)))


def test_connection_burst(tmp_path):
    total = int(os.environ.get("KMEM_BENCH_BURST", "5000"))
    contenders = [("kmem", lambda: BrokerProcess(tmp_path / "default", {})),
                  ("kmem, backlog 50", lambda: BrokerProcess(tmp_path / "fifty", {"socket_listen_backlog_size": 50}))]
    if Tansu.available():
        contenders.append(("tansu", Tansu))
    figures = []
    for name, start in contenders:
        with start() as broker:
            clients = [subprocess.Popen([sys.executable, os.path.join(HERE, "connection_burst.py"), broker.bootstrap,
                                         str(min(1000, total - first))], stdout=subprocess.PIPE, text=True,
                                        env=CHILD_ENV) for first in range(0, total, 1000)]
            seconds = [json.loads(client.communicate(timeout=300)[0]) for client in clients]
            figures.append(f"{name} {max(seconds):.1f} s" if None not in seconds else f"{name}: not all answered")
    print(f"\n{total:,} clients connecting at once, all answered after: " + "; ".join(figures))

