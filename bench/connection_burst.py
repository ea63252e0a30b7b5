"""A burst of new clients for bench_broker_waiting.py, in a process of its own:

    python connection_burst.py BOOTSTRAP COUNT

starts COUNT non-blocking connects at once, sends ApiVersions v0 on each as it connects and prints, as
JSON, the seconds until every one was answered (``null`` if some never was within 120 s, or was
refused or reset).
"""
import errno
import json
import resource
import selectors
import socket
import struct
import sys
import time

from kafka.protocol.metadata import ApiVersionsRequest

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(bootstrap, count):
    host, port = bootstrap.rsplit(":", 1)
    request = ApiVersionsRequest[0]()
    request.with_header(correlation_id=1, client_id="burst")
    payload = request.encode(version=0, header=True)
    frame = struct.pack(">i", len(payload)) + payload
    selector = selectors.DefaultSelector()
    started = time.monotonic()
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        error = sock.connect_ex((host, int(port)))
        assert error in (0, errno.EINPROGRESS), errno.errorcode.get(error)
        selector.register(sock, selectors.EVENT_WRITE, bytearray())
    answered = 0
    while answered < count and time.monotonic() - started < 120:
        for key, events in selector.select(1.0):
            sock = key.fileobj
            try:
                if events & selectors.EVENT_WRITE:
                    sock.send(frame)
                    selector.modify(sock, selectors.EVENT_READ, key.data)
                    continue
                data = sock.recv(65536)
            except ConnectionError:         # refused or reset (an overflowing accept queue): never answered
                data = b""
            key.data.extend(data)
            if not data or (len(key.data) >= 4 and len(key.data) >= 4 + struct.unpack_from(">i", key.data)[0]):
                answered += bool(data)
                selector.unregister(sock)
                sock.close()
    print(json.dumps(time.monotonic() - started if answered == count else None), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
