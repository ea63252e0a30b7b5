"""The purgatory: requests that wait, parked without a thread (Kafka's ``DelayedOperationPurgatory``).

A ``DelayedOperation`` is completed exactly once: by ``try_complete`` when an event on one of the keys it
watches makes it satisfiable (``check_and_complete(key)``, called by whoever caused the event), or at its
deadline (``kmem.broker.timer.Timer``), or by ``complete_all`` at shutdown. ``on_complete`` then builds and
sends its response. ``cancel()`` drops an operation whose client has gone, running nothing.

``try_complete_else_watch`` follows Kafka's order: try, watch the keys, try again, so an event between the
first try and the watch is not missed. Completed and cancelled operations leave their watch lists at once;
nothing is swept per tick.
"""
import logging
import threading

log = logging.getLogger(__name__)


class DelayedOperation:
    """One parked request. Subclasses define ``try_complete`` (call ``force_complete`` when satisfied and
    return its result) and ``on_complete`` (build and send the response)."""

    def __init__(self, deadline):
        self.deadline = deadline            # time.monotonic() seconds
        self._done = threading.Lock()       # taken once: by the completion or by cancel
        self._purgatory = None
        self._keys = ()
        self._timer_task = None

    @property
    def is_completed(self):
        return self._done.locked()

    def try_complete(self):
        raise NotImplementedError

    def on_complete(self):
        raise NotImplementedError

    def force_complete(self):
        """Complete now, unless something else already did: True for the caller that completed it."""
        if not self._finish():
            return False
        self.on_complete()
        return True

    def cancel(self):
        """Drop the operation without completing it (its client is gone)."""
        self._finish()

    def _finish(self):
        if not self._done.acquire(blocking=False):
            return False
        if self._timer_task is not None:
            self._timer_task.cancel()
            self._timer_task = None         # the task refers back to this operation: no cycle left
        if self._purgatory is not None:
            self._purgatory._unwatch(self)
        return True

    def _expire(self):
        if self.force_complete():
            log.debug("%r completed at its deadline", self)


class DelayedOperationPurgatory:
    """Operations parked by key, with deadlines on a shared ``Timer`` (see the module docstring)."""

    def __init__(self, name, timer):
        self.name = name
        self._timer = timer
        self._lock = threading.Lock()
        self._watchers = {}                 # key -> {operation: None}, in parking order
        self._parked = {}                   # operation -> None: those watching or timed

    def __len__(self):
        """Operations parked now."""
        return len(self._parked)

    def watched(self, key):
        """How many operations watch ``key``."""
        with self._lock:
            return len(self._watchers.get(key, ()))

    def try_complete_else_watch(self, operation, keys):
        """Complete ``operation`` now if it can be (True), else park it under ``keys`` until one of their
        events completes it or its deadline passes (False)."""
        if operation.try_complete():
            return True
        operation._purgatory = self
        operation._keys = tuple(keys)
        with self._lock:
            if operation.is_completed:
                return True
            for key in operation._keys:
                self._watchers.setdefault(key, {})[operation] = None
            self._parked[operation] = None
        task = self._timer.schedule(operation.deadline, operation._expire)
        operation._timer_task = task
        if operation.is_completed:          # completed before its task was recorded: stop the task
            task.cancel()
        if operation.try_complete():
            return True
        return operation.is_completed

    def check_and_complete(self, key):
        """An event on ``key``: try every operation watching it; returns how many completed."""
        if key not in self._watchers:       # looked up without the lock, as Kafka's checkAndComplete does: an
            return 0                        # operation that starts watching tries to complete itself after
        with self._lock:
            watchers = self._watchers.get(key)
            if not watchers:
                return 0
            operations = list(watchers)
        completed = 0
        for operation in operations:
            if not operation.is_completed and operation.try_complete():
                completed += 1
        return completed

    def complete_all(self):
        """Force every parked operation to complete now (at shutdown)."""
        with self._lock:
            operations = list(self._parked)
        for operation in operations:
            operation.force_complete()

    def _unwatch(self, operation):
        with self._lock:
            if self._parked.pop(operation, False) is False:
                return
            for key in operation._keys:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.pop(operation, None)
                    if not watchers:
                        del self._watchers[key]

    def __repr__(self):
        return f"<DelayedOperationPurgatory {self.name}: {len(self)} parked>"
