"""A small thread pool shared by the conversions of one process, for batches that need a codec.

libdeflate, zlib-ng and cramjam release the GIL while they compress and decompress, so independent
batches convert on separate cores. ``OrderedJobs`` keeps the output deterministic (results are taken in
the order the jobs were given) and memory bounded (at most ``THREADS + 1`` jobs given and not yet taken).
With one thread (one CPU) jobs run inline, in the caller's thread.
"""
import collections
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait


def _available_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # macOS
        return os.cpu_count() or 1


#: Threads converting batches: the CPUs this process may use, at most 4 (a broker has other work).
THREADS = min(4, _available_cpus())

_pool = None
_pool_lock = threading.Lock()


def _forget_pool():
    # A forked child has none of its parent's threads: it starts its own pool when it needs one.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def shared_pool():
    """The process's pool of ``THREADS`` threads, started on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="kmem-codec")
        return _pool


class OrderedJobs:
    """Run ``job(*args)`` calls on the shared pool and hand each result to ``take`` in the order given.

    ``take`` runs in the caller's thread. A job's exception is raised, in order, from the ``give`` or
    ``finish`` call that reaches it, once the jobs still running have ended (none outlives the call).
    """

    def __init__(self, take):
        self._take = take
        self._threads = THREADS
        self._pending = collections.deque()

    @property
    def pending(self):
        """Whether any job given has not been taken yet."""
        return bool(self._pending)

    def give(self, job, *args):
        if self._threads <= 1:
            self._take(job(*args))
            return
        while len(self._pending) > self._threads:
            self._take_oldest()
        self._pending.append(shared_pool().submit(job, *args))

    def finish(self):
        """Take every result still pending."""
        while self._pending:
            self._take_oldest()

    def settle(self):
        """After the caller's own error: wait for the pending jobs, then raise the first one's error, if
        any (it is about earlier input, so a serial conversion would have met it first)."""
        pending, self._pending = self._pending, collections.deque()
        wait(pending)
        error = next((f.exception() for f in pending if f.exception() is not None), None)
        del pending
        if error is not None:
            try:
                raise error
            finally:
                del error       # the error's traceback holds this frame: no cycle keeping its data alive

    def _take_oldest(self):
        future = self._pending.popleft()
        try:
            result = future.result()
        except BaseException:
            for later in self._pending:
                later.cancel()
            wait(self._pending)
            self._pending.clear()
            raise
        finally:
            del future          # as in settle: the job's error would hold it and it the error
        self._take(result)
