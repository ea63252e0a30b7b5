"""Produce and consume throughput with the broker's CPU per GB, and produce-to-consume latency: kmem
broker vs Tansu vs librdkafka's mock cluster in the same run
(``.venv/bin/pytest bench/bench_broker_throughput.py -s``).

Throughput: for 100 B, 1 KiB and 100 KiB records, 1 and 8 partitions, no compression and lz4, a
confluent-kafka producer (acks=all, idempotent, ``linger.ms`` 5), warmed up by one record to each
partition, sends ``KMEM_BENCH_THROUGHPUT_MB`` (default 64) MB of random bytes, at least 2,500 records,
round-robin over the partitions, created beforehand (8 partitions are two topics of 4: librdkafka's mock
cluster makes topics of 4 partitions and serves no CreateTopics); then a
client reads back all the broker holds (all of it, but the mock cluster keeps only the last few MB of
a partition) with raw Fetch v11 requests of 16 MiB, not decoding the records (confluent-kafka's
consumer in Python tops out far below any of the brokers). Printed per row and broker: produce MB/s of
record values and consume MB/s of batches, the broker process's CPU seconds per GB over each phase, the
share of the produce phase the producer's busiest thread ran (its Python loop at small records, librdkafka's
broker thread at large ones: near 1.00 the client is the limit), the machine's cores busy meanwhile (every
process), the shares of the phase the broker's busiest thread ran and waited for a core (a thread that is running
or waiting nearly all the time is the limit), and kmem's ratios to the mock cluster, marked where the mock's
client was its limit.

Latency: a producer sends 2,000 messages/s (100 B, ``linger.ms`` 0) for ``KMEM_BENCH_LATENCY_SECONDS``
(default 5) s while a consumer with librdkafka's defaults (``fetch.wait.max.ms`` 500) reads them; p50 and
p99 of the time from send to receipt.

Tansu and the mock cluster keep their data in memory; kmem writes its log directory to disk. Each row starts by
freeing memory that was touched (``peers.reuse_freed_memory``), and kmem's log is deleted after its row, so no
broker pays for its host's first touch of guest memory (see ``peers``).
"""
import os
import socket
import struct
import time

import pytest

from peers import (BrokerProcess, MockCluster, Tansu, busy_and_total, create_topics, remove_log, reuse_freed_memory,
                   thread_cpu_seconds)

TOTAL_MB = int(os.environ.get("KMEM_BENCH_THROUGHPUT_MB", "64"))
#: 64 MB of 100 KiB records are 640, sent in tens of milliseconds: about the client's own ramp, so its ratio to
#: the mock swung 0.4-1.0 between runs. A row sends at least this many (256 MB of 100 KiB records).
MIN_RECORDS = 2_500
CLIENT_BOUND = 0.95     # the share of the time the producer's busiest thread ran at which it is the limit
LATENCY_SECONDS = float(os.environ.get("KMEM_BENCH_LATENCY_SECONDS", "5"))
SIZES = [100, 1024, 100 * 1024]
GB = 1e9

rows = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print(f"\nThroughput, {TOTAL_MB} MB of record values, at least {MIN_RECORDS:,} records (MB/s; broker CPU s per "
          f"GB):")
    print(f"{'record':>7} {'parts':>5} {'codec':>5} {'broker':>6} {'produce':>8} {'cpu/GB':>7} {'client':>6} "
          f"{'cores':>5} {'server':>9} {'consume':>8} {'cpu/GB':>7} {'vs mock':>8} {'vs tansu':>9}")
    peer = {(row[3], row[:3]): row for row in rows}
    for row in rows:
        mock, tansu = peer.get(("mock", row[:3])), peer.get(("tansu", row[:3]))
        versus = ""
        if row[3] == "kmem" and mock and tansu:
            bound = "*" if mock[6] >= CLIENT_BOUND else " "
            versus = f"{row[4] / mock[4]:>7.2f}{bound} {row[7] / tansu[7]:>9.2f}"
        print(f"{row[0]:>7} {row[1]:>5} {row[2]:>5} {row[3]:>6} {row[4]:>8.1f} {row[5]:>7.2f} {row[6]:>6.2f} "
              f"{row[9]:>5.2f} {row[10]:>4.2f}/{row[11]:<4.2f} {row[7]:>8.1f} {row[8]:>7.2f} {versus}")
    print(f"(client: the share of the produce phase the producer's busiest thread ran; cores: the machine's cores busy "
          f"meanwhile, of {os.cpu_count()}; server: the shares the broker's busiest thread ran and waited for a core "
          f"(its scheduler counts); vs mock: kmem's produce MB/s "
          f"over the mock cluster's, * where the mock's client ran {CLIENT_BOUND:.0%} or more, its own limit; vs "
          f"tansu: kmem's consume MB/s over Tansu's)")
    for line in latency_rows:
        print(line)


def peers():
    yield lambda tmp: BrokerProcess(tmp / "kmem", {"message_max_bytes": 4 << 20})
    if Tansu.available():
        yield lambda tmp: Tansu()
    yield lambda tmp: MockCluster()


def layout(name, partitions):
    """``(topics, partitions per topic)``: 8 partitions as two topics of 4 (see the module docstring)."""
    if partitions <= 4:
        return [name], partitions
    return [f"{name}-{i}" for i in range(partitions // 4)], 4


def warm_producer(bootstrap, targets, size, codec):
    """A producer that has delivered one record to each target: connected, its producer id acquired
    (librdkafka's idempotence timer takes up to 0.5 s for that against a real broker) and the metadata
    known, so the timed part is the steady state."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                         "linger.ms": 5, "compression.type": codec,
                                         "message.max.bytes": 4 << 20, "queue.buffering.max.kbytes": 1 << 20})
    for topic, partition in targets:
        producer.produce(topic, os.urandom(size), partition=partition)
    assert producer.flush(60) == 0
    return producer


def produce(producer, targets, size):
    """Send TOTAL_MB, at least MIN_RECORDS records, round-robin over ``targets``, [(topic, partition)]; returns the
    record count."""
    payload = os.urandom(size)
    count = max(TOTAL_MB * 1_000_000 // size, MIN_RECORDS)
    for i in range(count):
        topic, partition = targets[i % len(targets)]
        while True:
            try:
                producer.produce(topic, payload, partition=partition)
                break
            except BufferError:
                producer.poll(0.005)
    assert producer.flush(300) == 0
    return count


FETCH_BYTES = 16 << 20
OFFSET_OUT_OF_RANGE = 1


def fetch_frame(topic, partition, offset):
    from kafka.protocol.consumer import FetchRequest

    # max_wait_ms 500, min_bytes 1: Tansu answers a Fetch with max_wait_ms 0 with no partitions at all;
    # the data is there, so every broker answers at once
    request = FetchRequest(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=FETCH_BYTES, isolation_level=0,
                           topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                               FetchRequest.FetchTopic.FetchPartition(partition=partition, fetch_offset=offset,
                                                                      partition_max_bytes=FETCH_BYTES)])])
    request.with_header(correlation_id=1, client_id="bench")
    payload = request.encode(version=11, header=True)
    return struct.pack(">i", len(payload)) + payload


def read_exactly(sock, view):
    while view:
        n = sock.recv_into(view)
        assert n, "connection closed"
        view = view[n:]


def consume(bootstrap, targets):
    """Read every record the broker holds (the mock cluster keeps only the last few MB of a partition)
    with raw Fetch v11 requests of 16 MiB, one partition at a time, records not decoded (a client's
    parsing would be the limit, not the broker); returns the record bytes read."""
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    buffer = bytearray(FETCH_BYTES + (1 << 20))
    total = 0
    for topic, partition in targets:
        offset = 0
        while True:
            sock.sendall(fetch_frame(topic, partition, offset))
            read_exactly(sock, memoryview(buffer)[:4])
            size, = struct.unpack_from(">i", buffer)
            read_exactly(sock, memoryview(buffer)[:size])
            # v11: correlation id, throttle, error, session id, [topic name, [partition, error, high
            # watermark, last stable offset, log start, aborted transactions, preferred replica, records]]
            name_length, = struct.unpack_from(">h", buffer, 18)
            position = 20 + name_length + 4
            _, error, high_watermark, _, log_start, aborted = struct.unpack_from(">ihqqqi", buffer, position)
            position += 34 + max(aborted, 0) * 16 + 4        # and the preferred read replica
            if error == OFFSET_OUT_OF_RANGE:
                offset = log_start
                continue
            assert error == 0, error
            records_size, = struct.unpack_from(">i", buffer, position)
            position += 4
            end = position + max(records_size, 0)
            start = offset
            while position + 61 <= end:                  # each whole v2 batch: base offset, length...
                base, length = struct.unpack_from(">qi", buffer, position)
                if position + 12 + length > end:
                    break
                offset = base + struct.unpack_from(">i", buffer, position + 23)[0] + 1
                total += length + 12
                position += 12 + length
            if offset >= high_watermark:
                break
            assert offset > start, f"no progress at offset {offset} of {topic}-{partition}"
    sock.close()
    return total


def timed(broker, action):
    """``(action's result, seconds, the broker's CPU seconds, the share of the seconds this process's busiest
    thread ran, the machine's cores busy meanwhile, the shares of the seconds the broker's busiest thread ran and
    waited for a core)``."""
    client, cpu, started = thread_cpu_seconds(os.getpid()), broker.cpu_seconds(), time.perf_counter()
    machine, server = busy_and_total(), broker.thread_schedstat()
    result = action()
    seconds, cpu = time.perf_counter() - started, broker.cpu_seconds() - cpu
    busy, total = (after - before for after, before in zip(busy_and_total(), machine))
    ran = thread_cpu_seconds(os.getpid())
    served = [(after[0] - server.get(thread, (0, 0))[0], after[1] - server.get(thread, (0, 0))[1])
              for thread, after in broker.thread_schedstat().items()]
    server_ran, server_waited = max(served, default=(0, 0))
    return (result, seconds, cpu, max(ran[thread] - client.get(thread, 0) for thread in ran) / seconds,
            busy / max(total, 1) * os.cpu_count(), server_ran / seconds, server_waited / seconds)


@pytest.mark.parametrize("codec", ["none", "lz4"])
@pytest.mark.parametrize("partitions", [1, 8])
@pytest.mark.parametrize("size", SIZES, ids=["100B", "1KiB", "100KiB"])
def test_throughput(tmp_path, size, partitions, codec):
    reuse_freed_memory(tmp_path)
    for start in peers():
        with start(tmp_path) as broker:
            topics, per_topic = layout(f"t-{size}-{partitions}-{codec}", partitions)
            create_topics(broker.bootstrap, topics, per_topic)
            targets = [(topic, p) for p in range(per_topic) for topic in topics]
            producer = warm_producer(broker.bootstrap, targets, size, codec)
            count, produce_seconds, produce_cpu, client, cores, ran, waited = timed(
                broker, lambda: produce(producer, targets, size))
            read, consume_seconds, consume_cpu, *_ = timed(broker, lambda: consume(broker.bootstrap, targets))
            produced, consumed = count * size / GB, read / GB
            rows.append((size, partitions, codec, broker.name, produced * 1000 / produce_seconds,
                         produce_cpu / produced, client, consumed * 1000 / consume_seconds, consume_cpu / consumed,
                         cores, ran, waited))
        remove_log(tmp_path / "kmem")


latency_rows = []


def produce_to_consume(bootstrap):
    import confluent_kafka

    create_topics(bootstrap, ["latency"])
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "latency",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition("latency", 0, confluent_kafka.OFFSET_END)])
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})
    producer.produce("latency", b"warm-up", partition=0)
    producer.flush(30)
    consumer.consume(10, timeout=2)                 # connected and positioned before the clock
    latencies, rate, total = [], 2000, int(2000 * LATENCY_SECONDS)
    padding = b"\0" * 92
    started = time.perf_counter()
    sent = 0
    while len(latencies) < total:
        now = time.perf_counter()
        while sent < total and started + sent / rate <= now:
            producer.produce("latency", struct.pack(">d", time.perf_counter()) + padding, partition=0)
            sent += 1
        producer.poll(0)
        for message in consumer.consume(1000, timeout=0.0005):
            if message.error() is None and len(message.value()) == 100:
                latencies.append(time.perf_counter() - struct.unpack_from(">d", message.value())[0])
        assert now - started < LATENCY_SECONDS + 60, f"received {len(latencies)} of {total}"
    producer.flush(30)
    consumer.close()
    latencies.sort()
    return latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.99)] * 1000


def test_produce_to_consume_latency(tmp_path):
    for start in peers():
        with start(tmp_path) as broker:
            p50, p99 = produce_to_consume(broker.bootstrap)
            latency_rows.append(f"produce-to-consume latency at 2,000 msg/s, {broker.name}: "
                                f"p50 {p50:.2f} ms, p99 {p99:.2f} ms")
