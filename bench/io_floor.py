"""The least CPU a broker that writes its log pays per GB produced: what the kernel does to receive the bytes over
loopback TCP and append them to a file, with nothing else done (no protocol, no checks, no index).

    python io_floor.py DIRECTORY TOTAL_BYTES FRAME_BYTES [--checked RECORD_BYTES]
        receives TOTAL_BYTES from a sender process in frames of FRAME_BYTES (a Produce's worth), appends each to a
        file in DIRECTORY with one pwritev (into blocks reserved ahead, as kmem's active segment reserves them
        once it holds 1 MiB), and prints JSON: the receiving process's user and system CPU seconds
        per GB. ``--checked``: each frame is a v2 batch of RECORD_BYTES records, checked and given offsets by the
        compiled core as kmem broker's append does (``_core.assign_v2_batches``: the CRC, every record), written as
        kmem writes it (the new header, then the records) and answered with a 60-byte frame (the sender reads the
        answers as it sends, as a client with requests in flight does): the floor of a broker whose per-request
        decisions cost nothing.
"""
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import threading

GB = 1e9
ANSWER = struct.pack(">i", 60) + bytes(60)


def batch_of(frame, record_bytes):
    """A v2 batch of ``record_bytes`` records, about ``frame`` bytes long."""
    import time

    from kmem.records import build_records

    count = max(1, frame // (record_bytes + 10))
    now = int(time.time() * 1000)
    return bytes(build_records([{"value": os.urandom(record_bytes), "timestamp": now} for _ in range(count)],
                               producer_id=1, producer_epoch=0, base_sequence=0))


def send(port, total, frame, record_bytes):
    data = os.urandom(frame) if not record_bytes else batch_of(frame, record_bytes)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        reader = None
        if record_bytes:
            frames = total // len(data)
            reader = threading.Thread(target=lambda: _read_answers(sock, frames))
            reader.start()
        for _ in range(total // len(data)):
            sock.sendall(data)
        if reader is not None:
            reader.join()


def _read_answers(sock, frames):
    expected = frames * len(ANSWER)
    while expected:
        got = sock.recv(min(expected, 1 << 16))
        if not got:
            raise EOFError("the receiver closed before answering every frame")
        expected -= len(got)


def receive(directory, total, frame, record_bytes=0):
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)           # a sender that never connects fails the bench instead of hanging it
        sender = subprocess.Popen([sys.executable, __file__, "--send", str(server.getsockname()[1]), str(total),
                                   str(frame), str(record_bytes)])
        connection, _ = server.accept()
        connection.settimeout(None)
    from kmem import _core
    from kmem.broker.log.segment import RESERVE_AHEAD_BYTES, RESERVE_FROM_BYTES
    from kmem.broker.log.validator import BatchInfo

    if record_bytes:
        frame = len(batch_of(frame, record_bytes))      # the sender's frames: whole batches
    buffer = memoryview(bytearray(frame))
    fd, path = tempfile.mkstemp(dir=directory, suffix=".log")
    before = resource.getrusage(resource.RUSAGE_SELF)
    written = next_offset = reserved = 0
    with connection:
        while True:
            got = 0
            while got < frame:
                n = connection.recv_into(buffer[got:])
                if not n:
                    break
                got += n
            if got < frame:
                break
            end = written + frame
            if end > max(reserved, RESERVE_FROM_BYTES):
                start, reserved = max(written, reserved), end + min(end, RESERVE_AHEAD_BYTES)
                _core.reserve_blocks(fd, start, reserved - start)
            if not record_bytes:
                written += os.pwritev(fd, [buffer], written)
                continue
            found = _core.assign_v2_batches(buffer, next_offset=next_offset, leader_epoch=0, log_append_time=-1,
                                            from_client=True, max_message_bytes=1 << 30, segment_bytes=1 << 30,
                                            codec=-1, keyless=False, low=-(1 << 63), high=(1 << 63) - 1,
                                            info_class=BatchInfo)
            validated = found[0]
            next_offset = validated.last_offset + 1
            written += _core.append_segment(fd, validated.pieces, written)
            connection.sendall(ANSWER)
    after = resource.getrusage(resource.RUSAGE_SELF)
    os.close(fd)
    os.unlink(path)
    assert sender.wait() == 0 and written == total // frame * frame, (written, total)
    gb = written / GB
    return {"user": (after.ru_utime - before.ru_utime) / gb, "system": (after.ru_stime - before.ru_stime) / gb}


if __name__ == "__main__":
    if sys.argv[1] == "--send":
        send(*map(int, sys.argv[2:6]))
    else:
        record_bytes = int(sys.argv[5]) if sys.argv[4:5] == ["--checked"] else 0
        print(json.dumps(receive(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), record_bytes)))
