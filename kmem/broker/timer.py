"""``Timer``: deadlines run on one thread (the role of Kafka's ``SystemTimer``).

``schedule(deadline, action)`` runs ``action()`` on the timer's thread once ``time.monotonic()`` reaches
``deadline`` and returns a ``TimerTask`` whose ``cancel()`` stops it. Deadlines wait in a heap, so the
thread sleeps until the earliest one (an hour at most at a time) and the cost of a deadline is O(log n)
when it is scheduled and when it fires: nothing is scanned per tick, however many wait. Cancelled tasks
stay in the heap until they come up, unless more than half the heap is cancelled: then it is rebuilt
without them, which keeps its size within twice the live tasks.

Actions run one at a time, outside the timer's lock (they may schedule and cancel); an action that raises
is logged and the timer carries on.
"""
import heapq
import itertools
import logging
import threading
import time

log = logging.getLogger(__name__)

# Below this many entries a heap full of cancelled tasks is left alone (rebuilding costs more).
PURGE_MIN_ENTRIES = 64
# The longest the thread sleeps at once: a deadline centuries away (an offset committed to be kept for
# ever) is waited for in such steps, as a wait that long overflows the platform's clock.
MAX_SLEEP_SECONDS = 3600.0


class TimerTask:
    __slots__ = ("deadline", "action", "cancelled", "_timer")

    def __init__(self, timer, deadline, action):
        self._timer = timer
        self.deadline = deadline
        self.action = action
        self.cancelled = False

    @property
    def pending(self):
        """Neither run (nor running) nor cancelled."""
        return not self.cancelled and self.action is not None

    def cancel(self):
        """Stop the task from running (nothing happens if it already ran or was cancelled)."""
        self._timer._cancel(self)

    def __repr__(self):
        return f"<TimerTask at {self.deadline:.3f}{' cancelled' if self.cancelled else ''}>"


class Timer:
    """See the module docstring. ``close()`` stops the thread; tasks not yet due never run."""

    def __init__(self, name="kmem-timer"):
        self._heap = []                 # (deadline, sequence, task)
        self._sequence = itertools.count()
        self._cancelled = 0             # cancelled tasks still in the heap
        self._condition = threading.Condition(threading.Lock())
        self._running = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def schedule(self, deadline, action):
        """Run ``action()`` at ``deadline`` (``time.monotonic()`` seconds); returns the ``TimerTask``."""
        task = TimerTask(self, deadline, action)
        with self._condition:
            heapq.heappush(self._heap, (deadline, next(self._sequence), task))
            if self._heap[0][2] is task:
                self._condition.notify()        # earlier than what the thread sleeps towards
        return task

    def __len__(self):
        """Tasks waiting to run (cancelled ones excluded)."""
        with self._condition:
            return len(self._heap) - self._cancelled

    def _cancel(self, task):
        with self._condition:
            if not task.pending:
                return
            task.cancelled = True
            task.action = None              # drop the reference (often a cycle back to its owner)
            self._cancelled += 1
            if self._cancelled > len(self._heap) // 2 and len(self._heap) >= PURGE_MIN_ENTRIES:
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _due(self):
        """Wait for, then pop, the tasks due now; [] once closed."""
        with self._condition:
            while self._running:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                    self._cancelled -= 1
                if not self._heap:
                    self._condition.wait()
                    continue
                now = time.monotonic()
                delay = self._heap[0][0] - now
                if delay > 0:
                    self._condition.wait(min(delay, MAX_SLEEP_SECONDS))
                    continue
                due = []
                while self._heap and self._heap[0][0] <= now:
                    _, _, task = heapq.heappop(self._heap)
                    if task.cancelled:
                        self._cancelled -= 1
                        continue
                    due.append((task.action, task))
                    task.action = None          # ran (or running): cancel() has nothing to stop
                return due
            return []

    def _run(self):
        while self._running:
            self._run_all(self._due())

    @staticmethod
    def _run_all(due):
        # A method of its own: nothing of the last action (and what it refers to, such as a parked request's
        # response) stays referenced while the thread waits for the next deadline.
        for action, task in due:
            try:
                action()
            except Exception:
                log.exception("timer task %r failed", task)

    def close(self):
        with self._condition:
            self._running = False
            self._condition.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __repr__(self):
        return f"<Timer {len(self)} tasks>"
