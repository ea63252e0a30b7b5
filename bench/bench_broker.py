"""``kmem broker`` figures, side by side in one run (``.venv/bin/pytest bench/bench_broker.py -s``):

1. Produce and consume MB/s, and produce p99 latency (send to delivery report), with confluent-kafka
   clients and 1 KiB / 100 KiB messages: kmem broker vs librdkafka's built-in mock cluster
   (``test.mock.num.brokers``: in memory, in C, in the client's process) on the same machine.
   ``KMEM_BENCH_BROKER_MB`` (default 16) megabytes per run, in a new topic every 2 MB. Twice: with the
   topics auto-created by the first produce (the figure includes creating them: kmem fsyncs each new
   partition's files and directory, the mock keeps them in memory), and warm: the topics created (by
   the producer's Metadata requests) and one message produced before the clock starts, so the figure
   excludes a fresh broker's first use of each request type (kmem generates each API's codec then).
2. Old clients (KIP-283): 20 clients each reading the whole of a ``KMEM_BENCH_BROKER_LOG_MIB`` (default
   256) MiB log with Fetch v3 (magic 1) and 16 MiB per fetch: lazy chunked down-conversion vs eager
   (the whole response converted in memory); MB/s and the broker's peak RSS.
3. A Produce flood (32 connections x 4 requests of 16 MiB): the broker's peak RSS with
   ``queued.max.request.bytes`` = 64 MiB vs unbounded (Kafka's default), and the slowest answer a small
   client got meanwhile.
4. The heap growth for ``KMEM_BENCH_BROKER_PIDS`` (default 100000; the issue's 1000000 takes ~4 min)
   distinct idempotent producer ids appended through the broker's storage layer vs a dict of
   Kafka-style producer entries.

Brokers run in a child process (``bench/peers.py``) so their RSS is their own.
"""
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from peers import HERE, BrokerProcess, MockCluster, create_topics

KIB, MIB = 1 << 10, 1 << 20
TOTAL_MB = int(os.environ.get("KMEM_BENCH_BROKER_MB", "16"))
ROUND_MB = 2           # per topic: the mock cluster drops a partition's older data beyond a few MB
LOG_MIB = int(os.environ.get("KMEM_BENCH_BROKER_LOG_MIB", "256"))
PID_COUNTS = [int(n) for n in os.environ.get("KMEM_BENCH_BROKER_PIDS", "100000").split(",")]
OLD_CLIENTS = 20
OLD_FETCH_BYTES = 16 * MIB

results = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print("\n" + "\n".join(results))


def produce_consume(bootstrap, size, precreate):
    """(produce MB/s, consume MB/s, produce p99 ms): TOTAL_MB in ROUND_MB topics (one partition each),
    auto-created by the first produce or, with ``precreate``, created (and one message produced to a
    warm-up topic) before the clock starts.
    Consumption is timed from an ``assign`` of every topic but the first, which warmed the consumer up
    (connections, metadata), to the last message."""
    import confluent_kafka

    rounds = max(TOTAL_MB // ROUND_MB, 2)
    per_topic = max(ROUND_MB * MIB // size, 10)
    topics = [f"bench-{size}-{i}" for i in range(rounds)]
    payload = os.urandom(size)
    latencies = []
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    if precreate:       # and a first produce, so neither broker meets a request type for the first time
        create_topics(bootstrap, topics + [f"bench-{size}-warm-up"])
        producer.produce(f"bench-{size}-warm-up", payload, partition=0)
        assert producer.flush(30) == 0

    def delivered(error, _message, sent):
        assert error is None, error
        latencies.append(time.perf_counter() - sent)
    started = time.perf_counter()
    for topic in topics:
        for _ in range(per_topic):
            sent = time.perf_counter()
            while True:
                try:
                    producer.produce(topic, payload, partition=0, on_delivery=lambda e, m, s=sent: delivered(e, m, s))
                    break
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
    assert producer.flush(120) == 0
    produce_seconds = time.perf_counter() - started

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                                         "enable.auto.commit": False})

    def consume(assigned):
        consumer.assign([confluent_kafka.TopicPartition(t, 0, confluent_kafka.OFFSET_BEGINNING) for t in assigned])
        received, deadline = 0, time.perf_counter() + 120
        while received < per_topic * len(assigned):
            assert time.perf_counter() < deadline, f"consumed {received} from {bootstrap}"
            for message in consumer.consume(1000, timeout=0.05):
                assert message.error() is None, message.error()
                received += 1
    consume(topics[:1])
    started = time.perf_counter()
    consume(topics[1:])
    consume_seconds = time.perf_counter() - started
    consumer.close()
    latencies.sort()
    megabytes = per_topic * size / 1e6
    return (megabytes * rounds / produce_seconds, megabytes * (rounds - 1) / consume_seconds,
            latencies[int(len(latencies) * 0.99)] * 1000)


@pytest.mark.parametrize("precreate", [False, True], ids=["auto-created", "warm"])
@pytest.mark.parametrize("size", [KIB, 100 * KIB], ids=["1KiB", "100KiB"])
def test_produce_consume_vs_mock_cluster(tmp_path, size, precreate):
    with MockCluster() as peer:
        mock = produce_consume(peer.bootstrap, size, precreate)
    with BrokerProcess(tmp_path / "logs", {"message_max_bytes": 4 * MIB}) as broker:
        kmem = produce_consume(broker.bootstrap, size, precreate)
    topics = "topics created and broker warmed first" if precreate else "topics auto-created"
    results.append(f"confluent-kafka, {size // KIB} KiB messages, {TOTAL_MB} MB, {topics}: "
                   f"produce kmem {kmem[0]:.1f} MB/s (p99 {kmem[2]:.1f} ms) vs mock {mock[0]:.1f} MB/s "
                   f"(p99 {mock[2]:.1f} ms), ratio {kmem[0] / mock[0]:.2f}; "
                   f"consume kmem {kmem[1]:.1f} MB/s vs mock {mock[1]:.1f} MB/s, ratio {kmem[1] / mock[1]:.2f}")


# --- old clients: lazy vs eager down-conversion -----------------------------------------------------

def fetch_v3_request(offset, correlation_id):
    """A Fetch v3 request for topic "old" partition 0 (kafka-python's codec)."""
    from kafka.protocol.consumer import FetchRequest

    partition = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset,
                                                       partition_max_bytes=OLD_FETCH_BYTES)
    request = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=OLD_FETCH_BYTES,
                           topics=[FetchRequest.FetchTopic(topic="old", partitions=[partition])])
    request.with_header(correlation_id=correlation_id, client_id="old")
    payload = request.encode(version=3, header=True)
    return struct.pack(">i", len(payload)) + payload


def read_exactly(sock, buffer, size):
    view = memoryview(buffer)[:size]
    while view:
        n = sock.recv_into(view)
        assert n, "connection closed"
        view = view[n:]


def old_client(bootstrap, end_offset, totals, index):
    host, port = bootstrap.split(":")
    sock = socket.create_connection((host, int(port)))
    buffer = bytearray(OLD_FETCH_BYTES + 4 * MIB)
    offset, received = 0, 0
    while offset < end_offset:
        sock.sendall(fetch_v3_request(offset, offset))
        read_exactly(sock, buffer, 4)
        size, = struct.unpack_from(">i", buffer)
        read_exactly(sock, buffer, size)
        # v3: correlation id, throttle, [topic: name, [partition, error, high watermark, records]]
        name_length, = struct.unpack_from(">h", buffer, 12)
        position = 14 + name_length + 4
        _, error, _, records_size = struct.unpack_from(">ihqi", buffer, position)
        assert error == 0, error
        position += 18
        end = position + records_size
        last = None
        while position + 12 <= end:                       # the last complete magic-1 entry
            entry_offset, entry_size = struct.unpack_from(">qi", buffer, position)
            if position + 12 + entry_size > end or entry_offset < 0:
                break
            assert buffer[position + 16] == 1
            last = entry_offset
            position += 12 + entry_size
        offset = last + 1
        received += records_size
    sock.close()
    totals[index] = received


def run_old_clients(broker, end_offset):
    totals = [0] * OLD_CLIENTS
    threads = [threading.Thread(target=old_client, args=(broker.bootstrap, end_offset, totals, i))
               for i in range(OLD_CLIENTS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(totals), f"an old client failed: bytes read per client {totals}"
    return sum(totals) / 1e6 / (time.perf_counter() - started)


def test_old_clients_lazy_vs_eager(tmp_path):
    figures = {}
    for mode in ("lazy", "eager"):
        extra = ("--fill-mib", str(LOG_MIB)) + (("--eager",) if mode == "eager" else ())
        with BrokerProcess(tmp_path / mode, {"log_segment_bytes": 64 * MIB}, *extra) as broker:
            baseline = broker.status()["VmRSS"]
            throughput = run_old_clients(broker, broker.filled_end_offset)
            figures[mode] = (throughput, broker.status()["VmHWM"] - baseline)
    results.append(f"{OLD_CLIENTS} Fetch v3 clients reading {LOG_MIB} MiB (16 MiB fetches): "
                   f"lazy {figures['lazy'][0]:.0f} MB/s, peak RSS +{figures['lazy'][1] / MIB:.0f} MiB; "
                   f"eager {figures['eager'][0]:.0f} MB/s, peak RSS +{figures['eager'][1] / MIB:.0f} MiB")


# --- a Produce flood --------------------------------------------------------------------------------

def produce_request(size, correlation_id):
    from kafka.protocol.producer import ProduceRequest

    from kmem.records import build_records

    records = build_records([b"\0" * (size - 100)], magic=2)
    data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    request = ProduceRequest(acks=1, timeout_ms=30000,
                             topic_data=[ProduceRequest.TopicProduceData(name="flood", partition_data=[data])])
    request.with_header(correlation_id=correlation_id, client_id="flood")
    payload = request.encode(version=7, header=True)
    return struct.pack(">i", len(payload)) + payload


def flood(bootstrap, connections=32, requests=4, size=16 * MIB):
    frame = produce_request(size, 1)
    host, port = bootstrap.split(":")

    def client():
        sock = socket.create_connection((host, int(port)))
        buffer = bytearray(1 << 16)
        for _ in range(requests):
            sock.sendall(frame)
            read_exactly(sock, buffer, 4)
            read_exactly(sock, buffer, struct.unpack_from(">i", buffer)[0])
        sock.close()
    threads = [threading.Thread(target=client) for _ in range(connections)]
    for thread in threads:
        thread.start()
    return threads


def small_client_worst_latency(bootstrap, threads):
    from kafka.protocol.metadata import ApiVersionsRequest

    host, port = bootstrap.split(":")
    sock = socket.create_connection((host, int(port)))
    buffer = bytearray(1 << 16)
    worst = 0.0
    request = ApiVersionsRequest()
    request.with_header(correlation_id=1, client_id="small")
    payload = request.encode(version=3, header=True)
    while any(thread.is_alive() for thread in threads):
        started = time.perf_counter()
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        read_exactly(sock, buffer, 4)
        read_exactly(sock, buffer, struct.unpack_from(">i", buffer)[0])
        worst = max(worst, time.perf_counter() - started)
        time.sleep(0.01)
    sock.close()
    return worst


def test_produce_flood_rss_bounded_vs_unbounded(tmp_path):
    figures = {}
    common = {"message_max_bytes": 20 * MIB, "socket_request_max_bytes": 20 * MIB, "log_segment_bytes": 1 << 30,
              "auto_create_topics_enable": True}
    for mode, bound in (("bounded", 64 * MIB), ("unbounded", -1)):
        with BrokerProcess(tmp_path / mode, dict(common, queued_max_request_bytes=bound)) as broker:
            from kafka import KafkaAdminClient
            from kafka.admin import NewTopic
            admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
            admin.create_topics([NewTopic("flood", 1, 1)])
            admin.close()
            baseline = broker.status()["VmRSS"]
            threads = flood(broker.bootstrap)
            worst = small_client_worst_latency(broker.bootstrap, threads)
            figures[mode] = (broker.status()["VmHWM"] - baseline, worst)
    results.append(f"Produce flood, 32 connections x 4 x 16 MiB: peak RSS over baseline "
                   f"bounded (64 MiB) +{figures['bounded'][0] / MIB:.0f} MiB, "
                   f"unbounded +{figures['unbounded'][0] / MIB:.0f} MiB; small client's slowest ApiVersions "
                   f"{figures['bounded'][1] * 1000:.0f} ms bounded, {figures['unbounded'][1] * 1000:.0f} ms unbounded")


# --- producer ids -----------------------------------------------------------------------------------

@pytest.mark.parametrize("count", PID_COUNTS)
def test_producer_id_memory(count):
    runs = {}
    for mode in ("ledger", "dict"):
        out = subprocess.run([sys.executable, os.path.join(HERE, "broker_child.py"), "pids", str(count)]
                             + (["--dict"] if mode == "dict" else []), capture_output=True, text=True, check=True,
                             env=dict(os.environ, PYTHONSAFEPATH="1"))
        runs[mode] = json.loads(out.stdout)
    results.append(f"{count:,} idempotent producer ids: heap growth broker storage (PidLedger) "
                   f"{runs['ledger']['rss_anon_growth'] / MIB:.1f} MiB vs dict of entries "
                   f"{runs['dict']['rss_anon_growth'] / MIB:.1f} MiB")
