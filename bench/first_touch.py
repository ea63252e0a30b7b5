"""What writing into the page cache costs when its memory was never touched before, against memory freed by a
deleted file (``python bench/first_touch.py [directory] [MB]``, default the system's temporary directory and 512).

Writes ``MB`` MB to a new file three times, keeping each file (the page cache grows), then deletes them and writes
twice more into a new file, deleting it each time (the page cache takes the pages just freed); prints the process's
CPU seconds per GB of each write. On a virtual machine whose host backs guest memory at its first touch, the writes
that grow the page cache past what was ever touched cost several times the others; the benches therefore write
into freed memory (``peers.reuse_freed_memory``, ``peers.remove_log``).
"""
import os
import resource
import sys
import tempfile


def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def write(path, mb, chunk):
    started = cpu()
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(chunk)
    return (cpu() - started) / (mb / 1000)


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
    mb = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    chunk = os.urandom(1 << 20)
    kept = [os.path.join(directory, f"first-touch-{i}") for i in range(3)]
    try:
        for i, path in enumerate(kept):
            print(f"write {i + 1}, files kept ({(i + 1) * mb} MB in the page cache): "
                  f"{write(path, mb, chunk):.2f} CPU s/GB")
    finally:
        for path in kept:
            if os.path.exists(path):
                os.unlink(path)
    for i in range(2):
        path = os.path.join(directory, "first-touch-reused")
        try:
            print(f"write {i + 1} after deleting the files (freed pages reused): {write(path, mb, chunk):.2f} CPU s/GB")
        finally:
            os.unlink(path)


if __name__ == "__main__":
    main()
