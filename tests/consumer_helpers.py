"""Reading loops shared by the consumer tests (mock cluster and kmem broker alike), and a rebalance
listener that records its callbacks."""
import threading
import time

from kmem.consumer import ConsumerRebalanceListener


def consume(consumer, count, timeout=30.0):
    """Poll until ``count`` records were handed out or ``timeout`` seconds passed; the records."""
    records, deadline = [], time.monotonic() + timeout
    while len(records) < count and time.monotonic() < deadline:
        records += consumer.poll(100)
    return records


def read_slowly(consumer, total, timeout=60.0):
    """An application slower than the network: poll until ``total`` records, pausing after each non-empty
    poll; the records and the most pool memory the consumer held meanwhile."""
    records, peak = [], 0
    deadline = time.monotonic() + timeout
    while len(records) < total and time.monotonic() < deadline:
        batch = consumer.poll(100)
        records += batch
        peak = max(peak, consumer.pool.outstanding_bytes)
        if batch:
            time.sleep(0.002)
    return records, peak


class Recorder(ConsumerRebalanceListener):
    """Every callback as (name, set of partitions); each must come on the test's own thread (the
    application's), never on the heartbeat thread, with a sorted list."""

    def __init__(self):
        self.events = []
        self.thread = threading.get_ident()

    def _record(self, name, partitions):
        assert threading.get_ident() == self.thread, f"{name} called on another thread"
        assert partitions == sorted(partitions)
        self.events.append((name, set(partitions)))

    def on_partitions_revoked(self, revoked):
        self._record("revoked", revoked)

    def on_partitions_assigned(self, assigned):
        self._record("assigned", assigned)

    def on_partitions_lost(self, lost):
        self._record("lost", lost)

    def changes(self):
        """The callbacks with partitions (cooperative rebalances also call assigned with none)."""
        return [event for event in self.events if event[1]]
