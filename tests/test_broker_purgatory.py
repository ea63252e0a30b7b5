"""The timer and the purgatory on their own: deadlines fire in order and only once, cancelled tasks are
dropped and their memory bounded, and a parked operation completes exactly once when an event on its
key, its deadline, a shutdown or a cancel race each other."""
import threading
import time

import pytest

from broker_helpers import wait_for
from kmem.broker.apis.purgatory import DelayedOperation, DelayedOperationPurgatory
from kmem.broker.timer import PURGE_MIN_ENTRIES, Timer
from thread_helpers import run_racing


@pytest.fixture
def timer():
    running = Timer("test-timer")
    yield running
    running.close()


def test_tasks_run_in_deadline_order_whatever_the_order_scheduled(timer):
    ran = []
    now = time.monotonic()
    for delay in (0.15, 0.05, 0.10, 0.0):
        timer.schedule(now + delay, lambda delay=delay: ran.append(delay))
    wait_for(lambda: len(ran) == 4, "the tasks to run")
    assert ran == [0.0, 0.05, 0.10, 0.15]
    assert len(timer) == 0


def test_an_earlier_deadline_wakes_the_sleeping_timer(timer):
    ran = threading.Event()
    timer.schedule(time.monotonic() + 3600, lambda: None)        # the thread sleeps towards this one
    scheduled_at = time.monotonic()
    timer.schedule(scheduled_at, ran.set)
    assert ran.wait(5)
    assert len(timer) == 1


def test_a_deadline_centuries_away_does_not_stop_the_timer(timer):
    """An offset committed to be kept for ever is due in 2**63 ms: too far for one wait on the clock."""
    timer.schedule(time.monotonic() + (2**63 - 1) / 1000, lambda: None)
    first, second = threading.Event(), threading.Event()
    timer.schedule(time.monotonic(), first.set)
    assert first.wait(5)                                         # then the thread sleeps towards the far one
    timer.schedule(time.monotonic(), second.set)
    assert second.wait(5)
    assert len(timer) == 1


def test_a_cancelled_task_never_runs_and_cancelling_twice_or_late_is_harmless(timer):
    ran = []
    task = timer.schedule(time.monotonic() + 0.05, lambda: ran.append("cancelled"))
    task.cancel()
    task.cancel()
    done = threading.Event()
    timer.schedule(time.monotonic() + 0.1, done.set)
    assert done.wait(5)
    assert ran == [] and len(timer) == 0
    late = timer.schedule(time.monotonic(), lambda: ran.append("ran"))
    wait_for(lambda: ran == ["ran"], "the task to run")
    late.cancel()                   # after it ran: nothing to stop, and the count stays right
    assert len(timer) == 0


def test_cancelled_tasks_do_not_accumulate(timer):
    """Operations that complete early cancel their deadline: the heap stays within twice the live tasks."""
    far = time.monotonic() + 3600
    live = [timer.schedule(far, lambda: None) for _ in range(10)]
    for _ in range(20_000):
        timer.schedule(far, lambda: None).cancel()
    assert len(timer) == len(live)
    assert len(timer._heap) <= max(2 * len(live) + 1, PURGE_MIN_ENTRIES)


def test_a_failing_task_is_logged_and_the_timer_carries_on(timer, caplog):
    done = threading.Event()
    timer.schedule(time.monotonic(), lambda: 1 / 0)
    timer.schedule(time.monotonic() + 0.01, done.set)
    assert done.wait(5)
    assert "ZeroDivisionError" in caplog.text


def test_close_stops_the_thread_and_drops_what_is_not_due():
    ran = []
    timer = Timer("test-timer")
    timer.schedule(time.monotonic() + 0.2, lambda: ran.append(1))
    timer.close()
    assert not timer._thread.is_alive() and ran == []


class Countdown(DelayedOperation):
    """Completes once ``needed`` events arrived (an event bumps ``self.seen``)."""

    def __init__(self, deadline, needed):
        super().__init__(deadline)
        self.needed = needed
        self.seen = 0
        self.completions = []
        self._seen_lock = threading.Lock()

    def event(self):
        with self._seen_lock:
            self.seen += 1

    def try_complete(self):
        return self.seen >= self.needed and self.force_complete()

    def on_complete(self):
        self.completions.append((threading.current_thread().name, self.seen))


def test_an_operation_that_can_complete_at_once_is_never_parked(timer):
    purgatory = DelayedOperationPurgatory("test", timer)
    operation = Countdown(time.monotonic() + 60, needed=0)
    assert purgatory.try_complete_else_watch(operation, ["k"])
    assert len(operation.completions) == 1 and len(purgatory) == 0 and purgatory.watched("k") == 0
    assert len(timer) == 0


def test_an_event_on_a_watched_key_completes_it_and_unwatches_every_key(timer):
    purgatory = DelayedOperationPurgatory("test", timer)
    operation = Countdown(time.monotonic() + 60, needed=1)
    assert not purgatory.try_complete_else_watch(operation, ["a", "b"])
    assert len(purgatory) == 1 and purgatory.watched("a") == purgatory.watched("b") == 1 and len(timer) == 1
    assert purgatory.check_and_complete("other") == 0
    operation.event()
    assert purgatory.check_and_complete("b") == 1
    assert operation.completions == [(threading.current_thread().name, 1)]
    assert len(purgatory) == 0 and purgatory.watched("a") == purgatory.watched("b") == 0
    assert len(timer) == 0          # its deadline was cancelled


def test_the_deadline_completes_it_on_the_timer_thread(timer):
    purgatory = DelayedOperationPurgatory("test", timer)
    operation = Countdown(time.monotonic() + 0.05, needed=1)
    assert not purgatory.try_complete_else_watch(operation, ["a"])
    wait_for(lambda: operation.completions, "the deadline")
    assert operation.completions == [("test-timer", 0)]
    assert len(purgatory) == 0 and purgatory.watched("a") == 0


def test_cancel_drops_it_without_completing(timer):
    purgatory = DelayedOperationPurgatory("test", timer)
    operation = Countdown(time.monotonic() + 0.05, needed=1)
    purgatory.try_complete_else_watch(operation, ["a"])
    operation.cancel()
    assert len(purgatory) == 0 and purgatory.watched("a") == 0 and len(timer) == 0
    operation.event()
    assert purgatory.check_and_complete("a") == 0 and not operation.force_complete()
    assert operation.completions == []


def test_complete_all_answers_every_parked_operation(timer):
    purgatory = DelayedOperationPurgatory("test", timer)
    operations = [Countdown(time.monotonic() + 60, needed=1) for _ in range(100)]
    for i, operation in enumerate(operations):
        purgatory.try_complete_else_watch(operation, [i % 7])
    purgatory.complete_all()
    assert all(len(operation.completions) == 1 for operation in operations)
    assert len(purgatory) == 0 and len(timer) == 0


def test_an_event_racing_the_deadline_completes_exactly_once(timer):
    """An append and the deadline at once, many times over, with threads switching every microsecond."""
    purgatory = DelayedOperationPurgatory("test", timer)
    operations = []
    for _ in range(300):
        operation = Countdown(time.monotonic() + 0.002, needed=1)
        operations.append(operation)
        purgatory.try_complete_else_watch(operation, ["key"])

    def events():
        for operation in operations:
            operation.event()
            purgatory.check_and_complete("key")

    run_racing(events, events, lambda: purgatory.complete_all())
    wait_for(lambda: all(operation.completions for operation in operations), "every operation to complete")
    assert [len(operation.completions) for operation in operations] == [1] * len(operations)
    assert len(purgatory) == 0 and purgatory.watched("key") == 0 and len(timer) == 0


def test_an_event_between_the_first_try_and_the_watch_is_not_missed(timer):
    """Kafka's order: try, watch, try again. The event lands after the first try, before any watcher."""
    purgatory = DelayedOperationPurgatory("test", timer)

    class Racing(Countdown):
        tries = 0

        def try_complete(self):
            self.tries += 1
            if self.tries == 1:
                result = super().try_complete()
                self.event()                                    # arrives now: nobody watches yet
                assert purgatory.check_and_complete("a") == 0
                return result
            return super().try_complete()

    operation = Racing(time.monotonic() + 60, needed=1)
    assert purgatory.try_complete_else_watch(operation, ["a"])
    assert len(operation.completions) == 1 and len(purgatory) == 0 and len(timer) == 0
