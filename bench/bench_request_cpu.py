"""A tiny request's CPU in the server (``.venv/bin/pytest bench/bench_request_cpu.py -s``): one client process makes
``KMEM_BENCH_REQUESTS`` (default 20,000) round trips of an empty Fetch (v11, ``max_wait_ms`` 0), one at a time, to

- a minimal Python server: one ``selectors`` loop that reads a frame and writes a 60-byte answer (the floor of any
  network loop in Python: the system calls and the interpreter's own turn);
- kmem's ``SocketServer`` with a handler that returns that answer (the network layer alone);
- ``kmem broker`` in process (the network layer, the dispatcher, the Fetch handler and the codecs).

Printed: the server process's CPU per request (user and system) and the round trip, for each, over ``ROUNDS``
alternating rounds, and kmem's CPU per request over the minimal loop's in the same round.
"""
import os
import pathlib
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

REQUESTS = int(os.environ.get("KMEM_BENCH_REQUESTS", "20000"))
ROUNDS = 3
ANSWER = b"x" * 60

CLIENT = textwrap.dedent("""
    import socket, struct, sys
    from kmem.protocol import encode_request, messages
    from kmem.records import build_records
    F, P = messages.FetchRequest, messages.ProduceRequest
    if sys.argv[3] == "fetch":
        body = F(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, topics=[F.FetchTopic(
            topic="empty", partitions=[F.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
        payload = bytes(encode_request(body, 11, 1, "bench"))
    else:       # a Produce shaped as librdkafka sends 100 B records: one partition, 880 records (97 kB)
        records = build_records([{"value": bytes(100), "timestamp": 1700000000000}] * 880)
        body = P(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[P.TopicProduceData(
            name="empty", partition_data=[P.PartitionProduceData(index=0, records=records)])])
        sys.path.insert(0, sys.argv[4])
        from bench_produce_path import _payload_of
        payload = _payload_of(encode_request(body, 9, 1, "bench"))     # its records spliced in: written out
    frame = struct.pack(">i", len(payload)) + payload
    sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(int(sys.argv[2])):
        sock.sendall(frame)
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        sock.recv(size, socket.MSG_WAITALL)
""")

lines = []


def round_trips(port, count, kind="fetch"):
    """(server CPU seconds (user, system), wall seconds) of ``count`` round trips to ``port`` from a client
    process: each an empty Fetch (``kind`` "fetch") or a Produce of 880 records of 100 B ("produce")."""
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, "-c", CLIENT, str(port), "500", kind, here], check=True)      # warm
    before, started = os.times(), time.perf_counter()
    subprocess.run([sys.executable, "-c", CLIENT, str(port), str(count), kind, here], check=True)
    wall, after = time.perf_counter() - started, os.times()
    return (after.user - before.user, after.system - before.system), wall


class MinimalServer:
    """A selectors loop on a thread: a frame in, ``ANSWER`` framed out."""

    def __init__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._running = True
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        answer, pending = struct.pack(">i", len(ANSWER)) + ANSWER, {}
        while self._running:
            for key, _ in self._selector.select(0.2):
                sock = key.fileobj
                if sock is self._listener:
                    client, _ = sock.accept()
                    client.setblocking(False)
                    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._selector.register(client, selectors.EVENT_READ)
                    pending[client] = b""
                    continue
                data = sock.recv(65536)
                if not data:
                    self._selector.unregister(sock)
                    sock.close()
                    continue
                buffered = pending[sock] + data
                while len(buffered) >= 4 and len(buffered) >= 4 + struct.unpack_from(">i", buffered)[0]:
                    buffered = buffered[4 + struct.unpack_from(">i", buffered)[0]:]
                    sock.send(answer)
                pending[sock] = buffered

    def close(self):
        self._running = False
        self._thread.join()
        self._selector.close()
        self._listener.close()


def measure(start):
    server, port, stop = start()
    try:
        return round_trips(port, REQUESTS)
    finally:
        stop(server)


def minimal():
    server = MinimalServer()
    return server, server.port, MinimalServer.close


def network_layer():
    from kmem.network import SocketServer

    server = SocketServer(lambda request: ANSWER, num_network_threads=1, num_io_threads=1).start()
    return server, server.address[1], SocketServer.close


def broker():
    from kmem.broker import Broker

    directory = tempfile.mkdtemp()
    server = Broker(pathlib.Path(directory) / "broker", port=0).start()
    server.logs.create_topic("empty")

    def stop(server):
        server.close()
        shutil.rmtree(directory)        # a Produce's run leaves hundreds of MB
    return server, int(server.bootstrap_servers.rsplit(":", 1)[1]), stop


def test_tiny_request_cpu():
    servers = {"minimal Python loop": minimal, "kmem SocketServer": network_layer, "kmem broker": broker}
    figures = {name: [] for name in servers}
    for _ in range(ROUNDS):
        for name, start in servers.items():
            (user, system), wall = measure(start)
            figures[name].append(((user + system) / REQUESTS * 1e6, user / REQUESTS * 1e6, wall / REQUESTS * 1e6))
    for name, rows in figures.items():
        lines.append(f"{name}: server CPU per request " + "; ".join(
            f"{cpu:.1f} us (user {user:.1f}), round trip {wall:.1f} us" for cpu, user, wall in rows))
    floor = figures["minimal Python loop"]
    for name in ("kmem SocketServer", "kmem broker"):
        ratios = sorted(cpu / floor_cpu for (cpu, _, _), (floor_cpu, _, _) in zip(figures[name], floor))
        lines.append(f"{name} / minimal Python loop, CPU per request: median {ratios[len(ratios) // 2]:.2f} "
                     f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
    for line in lines:
        print(line)
