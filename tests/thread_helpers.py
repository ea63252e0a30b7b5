"""Threads for race tests: switch between them often, so a race in Python code shows up in a short test."""
import contextlib
import sys
import threading


@contextlib.contextmanager
def switching_often(interval=1e-6):
    """Inside the block the interpreter switches threads every ``interval`` seconds (5 ms by default)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def run_racing(*targets, interval=1e-6):
    """Run each of ``targets`` on its own thread, switching often, until all have returned."""
    threads = [threading.Thread(target=target) for target in targets]
    with switching_often(interval):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
