"""Helpers for the broker tests: waiting for records, reading the broker's log directory back, and raw
requests built with kafka-python's own codec (``kafka.protocol``), which nobody here wrote."""
import errno
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time

from kmem.broker.codes import ErrorCode
from kmem.broker.log import AppendResult
from kmem.protocol import decode_response, encode_request
from kmem.records import FileRecords, log_segments

TIMEOUT = 30


def wait_for(condition, what, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return result


def kafka_python_knows_partitions(consumer, topics):
    """Have a subscribed kafka-python consumer learn ``topics``' partitions before its first join. kafka-python 3.0,
    leading a join without them, assigns nothing and rejoins at once; when its ``poll`` times out during that
    rejoin, it never applies the assignment it then gets (its join loop finds nothing left to rejoin). Kafka's
    3 s ``group.initial.rebalance.delay.ms`` hides this; tests that set it to 0 meet it."""
    for topic in topics:
        consumer.partitions_for_topic(topic)


def consume_to_end(bootstrap, topic, partitions=1, isolation="read_committed", **config):
    """``[(partition, offset, key, value)]`` of ``topic``'s first ``partitions`` partitions, in the order a
    confluent-kafka consumer at ``isolation`` (librdkafka's default, read_committed) reads them from their
    beginning to the end it sees (the last stable offset for read_committed)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "isolation.level": isolation,
                         "enable.partition.eof": True, "enable.auto.commit": False, **config})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    found, ended = [], set()

    def at_end():
        for message in consumer.consume(1000, 0.2):
            if message.error():
                if message.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(message.error())
                ended.add(message.partition())
            else:
                found.append((message.partition(), message.offset(), message.key(), message.value()))
                ended.discard(message.partition())
        return len(ended) == partitions
    try:
        wait_for(at_end, f"the end of {topic} at {isolation}")
    finally:
        consumer.close()
    return found


def stored_batches(log_dir, topic, partition):
    """Every batch the broker wrote for a partition, read back from its segment files."""
    directory = os.path.join(log_dir, f"{topic}-{partition}")
    batches = []
    for _, path in log_segments(directory):
        with FileRecords(path) as records:
            batches.extend((b.magic, b.producer_id, b.compression, [r.value for r in b]) for b in records.batches())
    return batches


def entry_magics(data):
    """The magic byte of every complete entry of a records field (offset i64 | size i32 | ... magic at 16)."""
    magics, pos = [], 0
    while pos + 17 <= len(data):
        size, = struct.unpack_from(">i", data, pos + 8)
        if size < 0 or pos + 12 + size > len(data):
            break
        magics.append(data[pos + 16])
        pos += 12 + size
    return magics


class RawConnection:
    """A blocking connection speaking size-prefixed frames."""

    def __init__(self, bootstrap):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)

    def send_frame(self, payload):
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def receive_frame(self):
        """The next response payload, or None when the broker closed the connection."""
        prefix = self._exactly(4)
        if prefix is None:
            return None
        size, = struct.unpack(">i", prefix)
        return self._exactly(size)

    def _exactly(self, size):
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return bytes(data)

    def request(self, peer_request, response_class, version, correlation_id=1):
        """Send a kafka-python request object at ``version``; returns its decoded response."""
        peer_request.with_header(correlation_id=correlation_id, client_id="raw")
        self.send_frame(peer_request.encode(version=version, header=True))
        payload = self.receive_frame()
        assert payload is not None, "the broker closed the connection"
        return response_class.decode(payload, version=version, header=True)

    def call(self, api_key, version, request, correlation_id=1, client_id="raw"):
        """Send a ``kmem.protocol.messages`` request at ``version``; returns its decoded response body."""
        self.send_frame(bytes(encode_request(request, version, correlation_id, client_id=client_id)))
        payload = self.receive_frame()
        assert payload is not None, "the broker closed the connection"
        return decode_response(payload, api_key, version)[1]

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def produce_raw(connection, topic, records, version=9):
    """One partition's answer to a Produce (acks=-1) of ``records`` to partition 0 of ``topic``."""
    from kafka.protocol.producer import ProduceRequest, ProduceResponse

    data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    request = ProduceRequest(acks=-1, timeout_ms=1000,
                             topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[data])])
    response = connection.request(request, ProduceResponse, version)
    connection.last_throttle_time_ms = response.throttle_time_ms if version >= 1 else 0
    return response.responses[0].partition_responses[0]


def fetch_raw(connection, topic, version, offset=0):
    """One partition's answer to a Fetch (no wait, up to 1 MiB) of partition 0 of ``topic`` from ``offset``."""
    from kafka.protocol.consumer import FetchRequest, FetchResponse

    partition = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset,
                                                       partition_max_bytes=1 << 20)
    request = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                           topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])])
    return connection.request(request, FetchResponse, version).responses[0].partitions[0]


def start_broker_process(log_dir, *args, port=0, open_files=None, before=None):
    """``kmem broker`` in a child interpreter; returns (process, bootstrap) once it logs where it listens;
    ``process.log_lines`` collects its log.
    ``open_files``: the child's RLIMIT_NOFILE (soft and hard). ``log_dir`` or ``port`` None: not given.
    ``before``: Python code the child runs first (a test hook, e.g. patching a class)."""
    env = dict(os.environ, PYTHONSAFEPATH="1")

    def limit_open_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    command = ["-m", "kmem.cli"] if before is None else \
        ["-c", f"{before}\nimport runpy\nrunpy.run_module('kmem.cli', run_name='__main__')"]
    process = subprocess.Popen(
        [sys.executable, *command, "broker", *([] if log_dir is None else ["--log-dir", str(log_dir)]),
         *([] if port is None else ["--port", str(port)]), *args],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True,
        preexec_fn=None if open_files is None else limit_open_files)
    deadline = time.monotonic() + TIMEOUT
    lines = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "listening on " in line:
            address = line.rsplit("listening on ", 1)[1].strip()
            # keep reading its log (a full pipe would block the broker's next log line) into ``log_lines``
            process.log_lines = lines
            threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
            return process, address
    process.kill()
    raise AssertionError("kmem broker did not start:\n" + "".join(lines))


def fail_appends(monkeypatch, logs, topic, how):
    """Every append to ``topic``'s partitions fails as on a full disk: ``how`` is "result" (the
    ``AppendResult`` with KAFKA_STORAGE_ERROR that ``PartitionLog.append`` gives) or "raise" (OSError
    ENOSPC escaping it). ``monkeypatch.undo()`` gives the disk back."""
    def full(*args, **kwargs):
        if how == "raise":
            raise OSError(errno.ENOSPC, "No space left on device")
        return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, -1, -1, -1, 0, "No space left on device")

    for partition in range(logs.topics()[topic].partitions):
        monkeypatch.setattr(logs.get_partition(topic, partition), "append", full)
