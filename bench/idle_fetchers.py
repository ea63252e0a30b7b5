"""Idle consumers for bench_broker_waiting.py, in a process of their own:

    python idle_fetchers.py BOOTSTRAP TOPIC COUNT WAIT_MS

opens COUNT connections and on each sends Fetch v11 for TOPIC partition 0 at its end offset with
``max_wait_ms`` WAIT_MS and ``min_bytes`` 1, again as soon as each answer arrives: what COUNT
consumers caught up on an empty topic send (librdkafka's ``fetch.wait.max.ms``). Prints ``READY`` once
every connection has had one answer, then on stdin EOF prints the number of answers as JSON and exits.
One selector loop, so a thousand consumers cost a few processes, not a thousand.
"""
import json
import os
import selectors
import socket
import struct
import sys
import threading

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
    for _ in range(count):
        sock = socket.create_connection(address)
        sock.setblocking(False)
        sock.sendall(fetch)         # a few hundred bytes: the socket buffer takes them at once
        selector.register(sock, selectors.EVENT_READ)
        pending[sock] = bytearray()
    answers = 0
    answered = set()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    ready = False
    while not stop.is_set():
        for key, _ in selector.select(0.2):
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
