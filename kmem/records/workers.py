"""Threads for the gzip batches of one conversion, with results in input order.

libdeflate and zlib-ng release the GIL while they deflate and inflate, so independent gzip batches
convert on separate cores. ``OrderedJobs`` keeps the output deterministic (results are taken in the order
the jobs were given) and memory bounded (at most ``THREADS + 1`` jobs given and not yet taken). Its
threads are its own and end with it, so none outlives a conversion or survives into a forked child.
Other codecs run in the caller's thread: lz4 and snappy convert 64 KiB in a few hundred microseconds,
about what starting two threads costs, and on threads snappy took 45% more CPU (its per-block Python
loop contends for the GIL; measured on batches of 1 KiB values).
"""
import collections
import os
from concurrent.futures import ThreadPoolExecutor, wait


def _available_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # macOS
        return os.cpu_count() or 1


#: Threads of one conversion: the CPUs this process may use, at most 4. With one, everything runs inline.
THREADS = min(4, _available_cpus())


class OrderedJobs:
    """Run ``job(*args)`` calls and hand each result to ``take``, in the order given, in the caller's thread.

    A context manager: its threads (``THREADS``, started on the first threaded job) end with the block.
    A job's exception is raised, in order, from the ``give`` or ``finish`` call that reaches it, once
    the jobs still running have ended.
    """

    def __init__(self, take):
        self._take = take
        self._threads = THREADS
        self._pending = collections.deque()
        self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    @property
    def pending(self):
        """Whether any job given has not been taken yet."""
        return bool(self._pending)

    def give(self, job, *args, threaded=True):
        """Run ``job(*args)`` on a thread, or, with ``threaded=False`` (or one thread), here once the jobs
        before it are taken."""
        if not threaded or self._threads <= 1:
            self.finish()
            self._take(job(*args))
            return
        while len(self._pending) > self._threads:
            self._take_oldest()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="kmem-codec")
        self._pending.append(self._pool.submit(job, *args))

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
            self._take(future.result())
        except BaseException:
            # This job comes before every pending one: nothing after it is wanted.
            for later in self._pending:
                later.cancel()
            wait(self._pending)
            self._pending.clear()
            raise
        finally:
            del future          # as in settle: the job's error would hold it and it the error
