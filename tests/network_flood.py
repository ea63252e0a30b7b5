"""The flood scenario, shared by the flood test and the bench: a SocketServer in a child process (so its
RSS is its own) and many client threads sending 1 MiB requests.

Run as a script it is the server: ``python network_flood.py <queued_max_request_bytes> <max_request>
<handler_delay_s> <crc|echo>``; it prints ``READY <port>`` and, on the ``stats`` line from stdin, one JSON line with
the pool's peak use seen by the handlers and the process's RSS before and at its peak (VmHWM).
"""
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

from network_helpers import recv_frame

HEADER = struct.Struct(">iii")      # client id, sequence number, padding; the response echoes id, seq + crc
RESPONSE = struct.Struct(">iiI")


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def serve(queued_max_request_bytes, max_request, handler_delay, mode):
    from kmem.network import SocketServer

    peak_used = [0]

    def handler(req):
        pool = server.pool
        if server.bounded:
            peak_used[0] = max(peak_used[0], pool.size - pool.available_memory)
        if handler_delay:
            time.sleep(handler_delay)
        if mode == "echo":
            return bytes(req.payload)
        client, seq, _ = HEADER.unpack_from(req.payload)
        return RESPONSE.pack(client, seq, zlib.crc32(req.payload))

    server = SocketServer(handler, queued_max_request_bytes=queued_max_request_bytes,
                          socket_request_max_bytes=max_request, socket_listen_backlog_size=1024)
    with server:
        baseline_kib = _status_kib("VmRSS")
        print("READY", server.address[1], flush=True)
        for line in sys.stdin:
            if line.strip() == "stats":
                print(json.dumps({"peak_used": peak_used[0], "baseline_rss": baseline_kib * 1024,
                                  "peak_rss": _status_kib("VmHWM") * 1024,
                                  "available": server.pool.available_memory}), flush=True)
            elif line.strip() == "quit":
                break


class FloodServer:
    """The server child process."""

    def __init__(self, queued_max_request_bytes, max_request, handler_delay=0.002, mode="crc"):
        # the child imports the same kmem as the tests (PYTHONSAFEPATH keeps the checkout off its path),
        # and the helpers beside this file
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(queued_max_request_bytes), str(max_request), str(handler_delay), mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        words = self.process.stdout.readline().split()
        if not words or words[0] != "READY":
            self.close()
            raise RuntimeError("flood server did not start")
        self.address = ("127.0.0.1", int(words[1]))

    def stats(self):
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def flood(address, clients, requests_per_client, request_size):
    """Every client sends its requests one at a time and checks each answer; returns the failures."""
    body = os.urandom(request_size - HEADER.size)
    failures = []

    def client(client_id):
        try:
            with socket.create_connection(address, timeout=120) as sock:
                for seq in range(requests_per_client):
                    header = HEADER.pack(client_id, seq, 0)
                    sock.sendall(struct.pack(">i", request_size) + header)
                    sock.sendall(body)
                    answer = recv_frame(sock)
                    expected = RESPONSE.pack(client_id, seq, zlib.crc32(body, zlib.crc32(header)))
                    if answer != expected:
                        failures.append((client_id, seq, answer))
        except Exception as exc:
            failures.append((client_id, None, repr(exc)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
