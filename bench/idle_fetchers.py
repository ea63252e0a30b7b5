"""Idle consumers for bench_broker_waiting.py, in a process of their own:

    python idle_fetchers.py BOOTSTRAP TOPIC COUNT WAIT_MS

opens COUNT connections and on each sends Fetch v11 for TOPIC partition 0 at its end offset with
``max_wait_ms`` WAIT_MS and ``min_bytes`` 1, again as soon as each answer arrives: what COUNT
consumers caught up on an empty topic send (librdkafka's ``fetch.wait.max.ms``). Their first fetches
are spread at random over the first WAIT_MS, as consumers started independently are (all at once, every
deadline would fall in the same millisecond forever after). Prints ``READY`` once every connection has
had one answer, then on stdin EOF prints the number of answers as JSON and exits.
One selector loop, so a thousand consumers cost a few processes, not a thousand.
"""
import json
import os
import random
import selectors
import socket
import struct
import sys
import threading
import time

from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, ListOffsetsResponse

try:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
except (ImportError, ValueError, OSError):
    pass


def frame(request, version, correlation_id=1):
    request.with_header(correlation_id=correlation_id, client_id=f"idle-{os.getpid()}")
    payload = request.encode(version=version, header=True)
    return struct.pack(">i", len(payload)) + payload


def receive(sock):
    def exactly(size):
        data = bytearray()
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return bytes(data)
    return exactly(struct.unpack(">i", exactly(4))[0])


def end_offset(address, topic):
    with socket.create_connection(address) as sock:
        request = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1)])])
        sock.sendall(frame(request, 1))
        response = ListOffsetsResponse.decode(receive(sock), version=1, header=True)
        return response.topics[0].partitions[0].offset


def main(bootstrap, topic, count, wait_ms):
    host, port = bootstrap.rsplit(":", 1)
    address = (host, int(port))
    offset = end_offset(address, topic)
    fetch = frame(FetchRequest(replica_id=-1, max_wait_ms=wait_ms, min_bytes=1, max_bytes=1 << 20, topics=[
        FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)])]),
        11)
    selector = selectors.DefaultSelector()
    pending = {}
    started = time.monotonic()
    first_fetches = []                  # (when, socket), sorted
    for _ in range(count):
        sock = socket.create_connection(address)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        pending[sock] = bytearray()
        first_fetches.append((started + random.uniform(0, wait_ms / 1000), sock))
    first_fetches.sort(key=lambda entry: entry[0])
    answers = 0
    answered = set()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    ready = False
    while not stop.is_set():
        while first_fetches and first_fetches[0][0] <= time.monotonic():
            first_fetches.pop(0)[1].sendall(fetch)     # a few hundred bytes: the socket buffer takes them
        timeout = max(first_fetches[0][0] - time.monotonic(), 0) if first_fetches else 0.2
        for key, _ in selector.select(timeout):
            sock = key.fileobj
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the broker closed an idle consumer's connection")
            buffer = pending[sock]
            buffer += data
            while len(buffer) >= 4 and len(buffer) >= 4 + struct.unpack_from(">i", buffer)[0]:
                del buffer[:4 + struct.unpack_from(">i", buffer)[0]]
                answers += 1
                answered.add(sock)
                sock.sendall(fetch)
        if not ready and len(answered) == count:
            ready = True
            print("READY", flush=True)
    print(json.dumps({"answers": answers}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
