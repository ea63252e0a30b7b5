"""What blocks reserved ahead save an append (``.venv/bin/python bench/reserve_ahead.py [DIRECTORY]``).

Appends 200 MB to a new file in DIRECTORY (default: the current one) in writes of 100 kB (a Produce of small
records over 8 partitions), first with no reservation, then reserving 256 KiB, 1 MiB and 4 MiB at a time ahead of
the writes as kmem's active segment does (``_core.reserve_blocks``: ``fallocate`` keeping the file's size), and
prints the process's CPU seconds per GB for each, the reservations included. Each run first writes and deletes a
scratch file, so the page cache takes memory touched before (see ``peers.reuse_freed_memory``); runs alternate,
twice each.
"""
import os
import sys
import time

from kmem import _core
from peers import reuse_freed_memory

TOTAL_BYTES = 200_000_000
WRITE_BYTES = 100_000
STEPS = [0, 256 << 10, 1 << 20, 4 << 20]


def append(directory, step):
    """CPU seconds per GB of appending ``TOTAL_BYTES`` with blocks reserved ``step`` bytes at a time (0: none)."""
    reuse_freed_memory(directory)
    chunk = os.urandom(WRITE_BYTES)
    path = os.path.join(directory, "reserve-ahead.log")
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    try:
        written = reserved = 0
        started = time.process_time()
        while written < TOTAL_BYTES:
            if step and written + WRITE_BYTES > reserved:
                error = _core.reserve_blocks(fd, reserved, step)
                if error:
                    raise OSError(error, os.strerror(error), path)
                reserved += step
            written += os.pwritev(fd, [chunk], written)
        return (time.process_time() - started) / (written / 1e9)
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    results = {step: [] for step in STEPS}
    for _ in range(2):
        for step in STEPS:
            results[step].append(append(directory, step))
    for step, seconds in results.items():
        label = "no reservation" if not step else f"{step >> 10} KiB reserved at a time"
        print(f"{label:>28}: {', '.join(f'{s:.3f}' for s in seconds)} CPU s/GB")


if __name__ == "__main__":
    main()
