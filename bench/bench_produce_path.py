"""The Produce path's cost in the broker (``.venv/bin/pytest bench/bench_produce_path.py -s``), issue 39's figures:

- the broker time of one Produce request (acks=1, one batch of one 1 KiB record from an idempotent producer)
  and of one Fetch answered with one such batch, from its payload to its encoded response: ``RequestDispatcher``
  called in the broker's own process, on a started ``Broker`` writing its log to disk, ``REQUESTS`` times; the
  median and p99 are printed (and the lowest median CPU time of ``BLOCK`` requests in a row), with the Python
  codecs alone and with the compiled ones in front (kmem.protocol's hot APIs), on two brokers that take each
  request in turn, and their ratio;
- the broker time of one Fetch of ``MANY_PARTITIONS`` partitions each answered with one batch of one 100 B record
  (``MANY_FETCHES`` times, median), as above, with the compiled codecs, and the CPU time of writing its response
  to a loopback socket as the network thread writes it;
- the broker time of one Fetch of one partition at a random offset of a log of ``BEHIND_BATCHES`` one-record batches
  of 100 B (a reader behind the tail: an index search, then a scan of batch heads), ``BEHIND_FETCHES`` times;
- the thread CPU time of a live-sized 100 B Produce (one partition, ``RECORDS_A_REQUEST`` records, about 100 kB)
  handled in the broker's process, back to back, its core appends alone, and the whole with 0.5 ms and 1 ms
  pauses between requests (``PAUSED_REQUESTS`` each; median of the last four fifths);
- produce CPU seconds per GB of 100 B records with a confluent-kafka producer (as
  ``bench_broker_throughput.py`` sends them: acks=all, idempotent, ``linger.ms`` 5), 1 and 8 partitions,
  kmem broker side by side with librdkafka's mock cluster in the same run, ``KMEM_BENCH_THROUGHPUT_MB``
  (default 64) MB of values each, in ``KMEM_BENCH_SMALL_ROUNDS`` (default 3) rounds taking turns, the median
  round printed with each round's figure, and kmem's CPU per GB as a ratio to the mock's; kmem's split into user and
  system time, beside the floor of any broker that writes its log: the same bytes received over loopback TCP and
  appended to a file in the same directory, in frames the size of kmem's Produce requests, with nothing else done
  (``io_floor.py``); and the core's floor: the same frames as v2 batches of 100 B records, each also checked and
  given offsets by the compiled core, written as kmem writes it and answered (``io_floor.py --checked``): about
  what kmem would cost if its per-request decisions cost nothing (a few Python lines a frame remain; no index
  entry is written). Every one of them writes into memory freed before it (``peers.reuse_freed_memory``).
"""
import functools
import gc
import importlib
import json
import os
import struct
import subprocess
import sys
import time

import pytest

from bench_broker_throughput import GB, TOTAL_MB, layout, produce, timed, warm_producer
from peers import HERE, BrokerProcess, MockCluster, create_topics, remove_log, reuse_freed_memory

REQUESTS = 5000
BLOCK = 250
RECORD_BYTES = 1024
MANY_PARTITIONS, MANY_FETCHES = 1000, 30
SMALL_ROUNDS = int(os.environ.get("KMEM_BENCH_SMALL_ROUNDS", "3"))
BEHIND_BATCHES, BEHIND_FETCHES = 3000, 2000
PAUSED_REQUESTS, RECORDS_A_REQUEST = 1000, 880

lines = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    for line in lines:
        print(line)


class _Request:
    """What ``RequestDispatcher`` reads of a request on the network thread (no quotas, no authorizer)."""

    principal = None
    listener_name = "PLAINTEXT"

    def __init__(self, payload):
        self.payload = payload

    def measure(self, tallies, key):
        """The network layer tallies a request's times once its response is sent; none is sent here."""


def produce_payloads(count):
    """``count`` Produce v9 payloads to "hot"-0, each one batch of one record, sequences in order."""
    from kmem.protocol import encode_request, messages
    from kmem.records import build_records

    P = messages.ProduceRequest
    value = bytes(RECORD_BYTES)
    payloads = []
    for sequence in range(count):
        records = build_records([{"value": value, "timestamp": int(time.time() * 1000)}], producer_id=1000,
                                producer_epoch=0, base_sequence=sequence)
        body = P(transactional_id=None, acks=1, timeout_ms=30000, topic_data=[P.TopicProduceData(
            name="hot", partition_data=[P.PartitionProduceData(index=0, records=records)])])
        payloads.append(bytes(encode_request(body, 9, sequence, "bench")))
    return payloads


def fetch_payloads(count):
    """``count`` Fetch v12 payloads of "hot"-0, the i-th from offset i, each answered with one 1 KiB batch."""
    from kmem.protocol import encode_request, messages

    F = messages.FetchRequest
    return [bytes(encode_request(F(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                                   topics=[F.FetchTopic(topic="hot", partitions=[F.FetchPartition(
                                       partition=0, fetch_offset=offset, partition_max_bytes=RECORD_BYTES * 2)])]),
                                 12, offset, "bench")) for offset in range(count)]


def python_codecs():
    """kmem.protocol's codec lookup as it was before the compiled codecs: the Python ones alone."""
    from kmem.protocol import api, codegen

    @functools.lru_cache(maxsize=None)
    def python_codec(api_key, version, kind, direction):
        spec = api.message(api_key, kind)
        return codegen.decoder(spec, version) if direction == "decode" else codegen.encoder(spec, version)
    return python_codec


# where kmem.protocol finds its codecs: api's lookups, the compiled wire codecs' tables (which decode_request and
# encode_response try first) and compiled.codec_index (which fills those tables as each plan is made)
CODEC_TABLES = (("api", "_codec"), ("api", "_REQUEST_PLANS"), ("api", "_RESPONSE_PLANS"), ("api", "_COMPILED_REQUESTS"),
                ("api", "_COMPILED_RESPONSES"), ("compiled", "codec_index"))


def codecs_in_use():
    return tuple(getattr(importlib.import_module(f"kmem.protocol.{module}"), name) for module, name in CODEC_TABLES)


def use_codecs(tables):
    """Make kmem.protocol use ``tables`` (one for each of ``CODEC_TABLES``)."""
    for (module, name), table in zip(CODEC_TABLES, tables):
        setattr(importlib.import_module(f"kmem.protocol.{module}"), name, table)


def broker_times(path, prefill, payloads, check):
    """Broker times (ns) and thread CPU times of ``payloads`` on two new brokers holding "hot" (once the
    Produce payloads ``prefill`` are in), one with the Python codecs, one with the compiled ones: each
    request is handled by both, in turn, so both see the same load from whatever else runs."""
    from kmem.broker import Broker

    # each with its own cache of the lookups made once per API and version (the Python codecs': no compiled one)
    lookups = {"python": (python_codecs(), {}, {}, {}, {}, lambda message, version: None),
               "compiled": codecs_in_use()}
    brokers = {which: Broker(path / which, port=0).start() for which in lookups}
    times = {which: ([], []) for which in lookups}
    try:
        for which, broker in brokers.items():
            use_codecs(lookups[which])
            broker.logs.create_topic("hot")
            for payload in prefill:
                broker.server.handler(_Request(payload))
        gc.freeze()             # as `kmem broker` does once started
        for i, payload in enumerate(payloads):
            for which in sorted(lookups, reverse=i % 2 == 1):
                use_codecs(lookups[which])
                request, handle = _Request(payload), brokers[which].server.handler
                started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
                response = handle(request)
                times[which][0].append(time.perf_counter_ns() - started)
                times[which][1].append(time.thread_time_ns() - cpu_started)
                check(brokers[which], response, i == len(payloads) - 1)
    finally:
        use_codecs(lookups["compiled"])
        for broker in brokers.values():
            broker.close()
        gc.unfreeze()
    return {which: (sorted(wall), sorted(cpu), _steadiest(cpu)) for which, (wall, cpu) in times.items()}


def _steadiest(cpu_times):
    """The lowest median CPU time of ``BLOCK`` consecutive requests: on a shared machine, the load of other work
    moves the plain median by tens of percent, and only adds time."""
    return min(sorted(cpu_times[i:i + BLOCK])[BLOCK // 2] for i in range(0, len(cpu_times) - BLOCK + 1, BLOCK))


class _Sink:
    def __init__(self):
        self.data = bytearray()

    def write(self, buffers):
        if isinstance(buffers, memoryview):             # a file's records come as one view
            buffers = [buffers]
        for buffer in buffers:
            self.data += buffer
        return sum(memoryview(b).nbytes for b in buffers)


def _payload_of(response):
    """A handler's encoded response as bytes: itself, or what its Send writes."""
    if isinstance(response, bytes):
        return response
    sink = _Sink()
    while not response.completed:
        response.write_to(sink)
    return bytes(sink.data)


class _Socket:
    """A loopback socket pair whose far end a thread drains: ``send(response)`` writes a response framed as the
    network thread writes it (``NetworkSend`` over a ``PlaintextTransport``, so file regions go by ``sendfile``)
    and returns the thread's CPU time it took (ns)."""

    def __init__(self):
        import socket
        import threading

        from kmem.network.transport import PlaintextTransport

        self._near, self._far = socket.socketpair()
        self._near.setblocking(False)
        self._transport = PlaintextTransport(self._near)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        while self._far.recv(1 << 20):
            pass

    def send(self, response):
        import select

        from kmem.network.receive import NetworkSend

        started = time.thread_time_ns()
        frame = NetworkSend("bench", response)
        while not frame.completed:
            frame.write_to(self._transport)
            if not frame.completed:
                select.select([], [self._near], [])
        return time.thread_time_ns() - started

    def close(self):
        self._near.close()
        self._far.close()


def _produced(broker, response, last_one):
    if not last_one:
        return
    from kmem.protocol import ApiKey, decode_response

    _, last = decode_response(response, ApiKey.PRODUCE, 9)
    assert last.responses[0].partition_responses[0].error_code == 0
    assert broker.logs.get_partition("hot", 0).log_end_offset == REQUESTS


def _fetched(broker, response, last_one):
    from kmem.send import close_send

    if not last_one:
        close_send(response)
        return
    from kmem.protocol import ApiKey, decode_response

    _, last = decode_response(_payload_of(response), ApiKey.FETCH, 12)
    partition = last.responses[0].partitions[0]
    assert partition.error_code == 0 and RECORD_BYTES < len(partition.records) < 2 * RECORD_BYTES


@pytest.mark.parametrize("api", ["produce", "fetch"])
def test_request_broker_time(tmp_path, api):
    """Broker time with the Python codecs alone and with the compiled ones, request by request in turn."""
    if api == "produce":
        prefill, payloads, check = [], produce_payloads(REQUESTS), _produced
        what = f"one-batch Produce of {RECORD_BYTES} B (v9, acks=1, idempotent)"
    else:
        prefill, payloads, check = produce_payloads(REQUESTS), fetch_payloads(REQUESTS), _fetched
        what = f"Fetch v12 answered with one {RECORD_BYTES} B batch"
    figures = broker_times(tmp_path, prefill, payloads, check)
    for which, (times, cpu_times, steadiest) in figures.items():
        median, p99, cpu = times[len(times) // 2], times[len(times) * 99 // 100], cpu_times[len(cpu_times) // 2]
        lines.append(f"{what}, {which} codecs, broker time over {REQUESTS} requests: median {median / 1000:.1f} us, "
                     f"p99 {p99 / 1000:.1f} us; the thread's CPU time: median {cpu / 1000:.1f} us, lowest median of "
                     f"{BLOCK} requests in a row {steadiest / 1000:.1f} us")
    medians = {which: times[len(times) // 2] for which, (times, _, _) in figures.items()}
    lines.append(f"{what}: compiled/python median broker time {medians['compiled'] / medians['python']:.2f}")


def test_fetch_of_many_partitions_broker_time(tmp_path):
    from kmem.broker import Broker
    from kmem.protocol import ApiKey, decode_response, encode_request, messages
    from kmem.records import build_records

    P, F = messages.ProduceRequest, messages.FetchRequest
    records = build_records([{"value": bytes(100), "timestamp": int(time.time() * 1000)}])
    produce_payload = bytes(encode_request(P(transactional_id=None, acks=1, timeout_ms=30000, topic_data=[
        P.TopicProduceData(name="many", partition_data=[P.PartitionProduceData(index=i, records=records)
                                                        for i in range(MANY_PARTITIONS)])]), 9, 0, "bench"))
    fetch_payload = bytes(encode_request(F(
        replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=64 << 20, isolation_level=0, topics=[F.FetchTopic(
            topic="many", partitions=[F.FetchPartition(partition=i, fetch_offset=1, partition_max_bytes=1 << 20)
                                      for i in range(MANY_PARTITIONS)])]), 12, 1, "bench"))
    broker = Broker(tmp_path / "many", port=0).start()
    sender = _Socket()
    times, send_times = [], []
    try:
        broker.logs.create_topic("many", partitions=MANY_PARTITIONS)
        for _ in range(3):
            broker.server.handler(_Request(produce_payload))
        gc.freeze()
        for i in range(MANY_FETCHES):
            started = time.perf_counter_ns()
            response = broker.server.handler(_Request(fetch_payload))
            times.append(time.perf_counter_ns() - started)
            if i < MANY_FETCHES - 1:
                send_times.append(sender.send(response))
        _, last = decode_response(_payload_of(response), ApiKey.FETCH, 12)
        assert [len(p.records) > 100 for p in last.responses[0].partitions] == [True] * MANY_PARTITIONS
    finally:
        sender.close()
        broker.close()
        gc.unfreeze()
    times.sort()
    send_times.sort()
    lines.append(f"Fetch v12 of {MANY_PARTITIONS} partitions, one 100 B record each, broker time over {MANY_FETCHES} "
                 f"requests: median {times[len(times) // 2] / 1e6:.1f} ms; the network thread's CPU time to send "
                 f"its response: median {send_times[len(send_times) // 2] / 1e6:.1f} ms")


def test_large_produce_cpu_with_pauses(tmp_path):
    """A live 100 B Produce as confluent-kafka sends it (one partition a request, about 100 kB of records) handled
    in the broker's process, ``PAUSED_REQUESTS`` times back to back, then with a pause between requests as live
    traffic has them (a request every millisecond at 100 MB/s): the thread's CPU time of the same work rises once
    the thread sleeps between requests (its caches, and a virtual CPU's, go cold). Also the same requests' core
    appends alone (decoded, then ``LogAppender.append`` for each partition): the Python left in the path."""
    from kmem.broker import Broker
    from kmem.broker.log.unified_log import _APPENDER
    from kmem.protocol import decode_request, encode_request, messages
    from kmem.records import build_records

    P, records = messages.ProduceRequest, RECORDS_A_REQUEST
    targets = [(topic, partition) for partition in range(4) for topic in ("a", "b")]
    value, now = os.urandom(100), int(time.time() * 1000)
    payloads = []
    for i in range(PAUSED_REQUESTS * 4):
        topic, partition = targets[i % len(targets)]
        batch = build_records([{"value": value, "timestamp": now}] * records, producer_id=1000, producer_epoch=0,
                              base_sequence=i // len(targets) * records)
        payloads.append(_payload_of(encode_request(P(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[
            P.TopicProduceData(name=topic, partition_data=[P.PartitionProduceData(index=partition, records=batch)])]),
            9, i, "bench")))

    def core_appends(broker, payload):
        _, body = decode_request(payload)
        for topic in body.topic_data:
            for data in topic.partition_data:
                partition_log = broker.logs.get_partition(topic.name, data.index)
                _APPENDER.append(partition_log, data.records, partition_log._clock(), "client", False)

    figures = []
    broker = Broker(tmp_path / "paused", port=0).start()
    try:
        for topic in ("a", "b"):
            broker.logs.create_topic(topic, 4)
        gc.freeze()
        runs = [("whole, back to back", 0, None), ("core appends alone, back to back", 0, core_appends),
                ("whole, 0.5 ms pauses", 0.0005, None), ("whole, 1 ms pauses", 0.001, None)]
        for run, (name, pause, handle) in enumerate(runs):
            cpu_times = []
            for payload in payloads[run * PAUSED_REQUESTS:(run + 1) * PAUSED_REQUESTS]:
                if pause:
                    time.sleep(pause)
                started = time.thread_time_ns()
                if handle is None:
                    broker.server.handler(_Request(payload))
                else:
                    handle(broker, payload)
                cpu_times.append(time.thread_time_ns() - started)
            cpu_times = sorted(cpu_times[len(cpu_times) // 5:])
            figures.append(f"{name} {cpu_times[len(cpu_times) // 2] / 1000:.1f}")
        ends = [broker.logs.get_partition(topic, partition).log_end_offset for topic, partition in targets]
        assert ends == [len(payloads) // len(targets) * records] * len(targets)
    finally:
        broker.close()
        gc.unfreeze()
    lines.append(f"Produce v9 of one partition, {records} records of 100 B ({len(payloads[0]) // 1000} kB), handled in "
                 f"the broker's process, the thread's median CPU time (µs) over {PAUSED_REQUESTS} requests each: "
                 + "; ".join(figures))


def batches_per_log(log_dir):
    """``(batches, bytes)`` of the ``.log`` files under ``log_dir``: one batch per partition per Produce."""
    from kmem.records import FileRecords

    batches = size = 0
    for directory, _, files in os.walk(log_dir):
        for name in files:
            if name.endswith(".log"):
                with FileRecords(os.path.join(directory, name)) as records:
                    batches += sum(1 for _ in records)
                    size += records.size_in_bytes
    return batches, size


@pytest.mark.parametrize("partitions", [1, 8])
def test_small_records_cpu_per_gb(tmp_path, partitions):
    size, runs = 100, {"kmem": [], "mock": []}      # per round: (MB/s, CPU s/GB, user and system s/GB)
    for round_ in range(SMALL_ROUNDS):
        reuse_freed_memory(tmp_path)
        remove_log(tmp_path / "kmem")                   # the last round's is measured below
        for start in (lambda: BrokerProcess(tmp_path / "kmem", {"message_max_bytes": 4 << 20}), MockCluster):
            with start() as broker:
                topics, per_topic = layout(f"small-{partitions}", partitions)
                create_topics(broker.bootstrap, topics, per_topic)
                targets = [(topic, p) for p in range(per_topic) for topic in topics]
                producer = warm_producer(broker.bootstrap, targets, size, "none")
                user, system = broker.cpu_times()
                count, seconds, cpu, *_ = timed(broker, lambda: produce(producer, targets, size))
                produced = count * size / GB
                split = [(after - before) / produced for after, before in zip(broker.cpu_times(), (user, system))]
                runs[broker.name].append((produced * 1000 / seconds, cpu / produced, split))
    (kmem_rate, kmem_cpu, split), (mock_rate, mock_cpu, _) = (sorted(runs[name], key=lambda run: run[1])[
        SMALL_ROUNDS // 2] for name in ("kmem", "mock"))
    batches, log_bytes = batches_per_log(tmp_path / "kmem")
    remove_log(tmp_path / "kmem")
    frame = log_bytes // batches
    floor, checked = (json.loads(subprocess.run(
        [sys.executable, os.path.join(HERE, "io_floor.py"), str(tmp_path), str(log_bytes), str(frame), *extra],
        capture_output=True, text=True, check=True).stdout) for extra in ((), ("--checked", str(size))))
    each = "; ".join(f"{name} " + ", ".join(f"{run[1]:.2f}" for run in runs[name]) for name in runs)
    lines.append(f"{TOTAL_MB} MB of 100 B records, {partitions} partition(s), confluent-kafka, the median of "
                 f"{SMALL_ROUNDS} alternating rounds: kmem {kmem_rate:.1f} MB/s {kmem_cpu:.2f} CPU s/GB (user "
                 f"{split[0]:.2f}, system {split[1]:.2f}); mock {mock_rate:.1f} MB/s {mock_cpu:.2f} CPU s/GB; "
                 f"kmem/mock CPU per GB {kmem_cpu / mock_cpu:.2f}, throughput {kmem_rate / mock_rate:.2f} (CPU s/GB "
                 f"of each round: {each}); the I/O floor (receive and append, {frame // 1000} kB frames as kmem's "
                 f"{batches} batches) user {floor['user']:.2f}, system {floor['system']:.2f} CPU s/GB; the core's "
                 f"floor (also checked by the core, written as kmem writes it and answered) user "
                 f"{checked['user']:.2f}, system {checked['system']:.2f} CPU s/GB")


def test_fetch_behind_the_tail_broker_time(tmp_path):
    import random

    from kmem.broker import Broker
    from kmem.protocol import ApiKey, decode_response, encode_request, messages
    from kmem.records import build_records
    from kmem.send import close_send

    F = messages.FetchRequest
    rng = random.Random(1)
    offsets = [rng.randrange(BEHIND_BATCHES) for _ in range(BEHIND_FETCHES)]
    payloads = [bytes(encode_request(F(
        replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1, isolation_level=0, topics=[F.FetchTopic(
            topic="behind", partitions=[F.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1)])]),
        12, 1, "bench")) for offset in offsets]
    broker = Broker(tmp_path / "behind", port=0).start()
    times, cpu_times = [], []
    try:
        broker.logs.create_topic("behind")
        partition_log = broker.logs.get_partition("behind", 0)
        for _ in range(BEHIND_BATCHES):
            partition_log.append(build_records([{"value": bytes(100), "timestamp": int(time.time() * 1000)}]))
        gc.freeze()
        for i, payload in enumerate(payloads):
            started, cpu = time.perf_counter_ns(), time.thread_time_ns()
            response = broker.server.handler(_Request(payload))
            times.append(time.perf_counter_ns() - started)
            cpu_times.append(time.thread_time_ns() - cpu)
            if i < len(payloads) - 1:
                close_send(response)
        _, last = decode_response(_payload_of(response), ApiKey.FETCH, 12)
        records = last.responses[0].partitions[0].records
        assert struct.unpack_from(">q", records)[0] == offsets[-1]      # the one-record batch asked for
    finally:
        broker.close()
        gc.unfreeze()
    times.sort()
    cpu_times.sort()
    lines.append(f"Fetch v12 of one partition at a random offset of {BEHIND_BATCHES} one-record batches, broker time "
                 f"over {BEHIND_FETCHES} requests: median {times[len(times) // 2] / 1000:.1f} us, the thread's CPU "
                 f"time {cpu_times[len(cpu_times) // 2] / 1000:.1f} us")
