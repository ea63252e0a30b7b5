"""The least CPU a broker that writes its log pays per GB produced: what the kernel does to receive the bytes over
loopback TCP and append them to a file, with nothing else done (no protocol, no checks, no index).

    python io_floor.py DIRECTORY TOTAL_BYTES FRAME_BYTES
        receives TOTAL_BYTES from a sender process in frames of FRAME_BYTES (a Produce's worth), appends each to a
        file in DIRECTORY with one pwritev, and prints JSON: the receiving process's user and system CPU seconds
        per GB.
"""
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile

GB = 1e9


def send(port, total, frame):
    data = os.urandom(frame)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(total // frame):
            sock.sendall(data)


def receive(directory, total, frame):
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)           # a sender that never connects fails the bench instead of hanging it
        sender = subprocess.Popen([sys.executable, __file__, "--send", str(server.getsockname()[1]), str(total),
                                   str(frame)])
        connection, _ = server.accept()
        connection.settimeout(None)
    buffer = memoryview(bytearray(frame))
    fd, path = tempfile.mkstemp(dir=directory, suffix=".log")
    before = resource.getrusage(resource.RUSAGE_SELF)
    written = 0
    with connection:
        while True:
            got = 0
            while got < frame:
                n = connection.recv_into(buffer[got:])
                if not n:
                    break
                got += n
            if got:
                written += os.pwritev(fd, [buffer[:got]], written)
            if got < frame:
                break
    after = resource.getrusage(resource.RUSAGE_SELF)
    os.close(fd)
    os.unlink(path)
    assert sender.wait() == 0 and written == total // frame * frame, (written, total)
    gb = written / GB
    return {"user": (after.ru_utime - before.ru_utime) / gb, "system": (after.ru_stime - before.ru_stime) / gb}


if __name__ == "__main__":
    if sys.argv[1] == "--send":
        send(*map(int, sys.argv[2:5]))
    else:
        print(json.dumps(receive(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
