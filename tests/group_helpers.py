"""Helpers for the consumer-group tests: a broker tuned for short rebalances, and consumer processes
(``tests/group_consumer.py``) whose assignments and committed records are read from their output."""
import json
import os
import signal
import subprocess
import sys
import threading

from kmem.broker import Broker

GROUP_SETTINGS = {"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 5}
CONSUMER_SCRIPT = os.path.join(os.path.dirname(__file__), "group_consumer.py")


def start_broker(log_dir, port=0, **settings):
    return Broker(log_dir, port, properties={**GROUP_SETTINGS, **settings}).start()


class ConsumerProcess:
    """One consumer of a group in its own process; ``assigned`` is its latest assignment, ``records``
    the (partition, offset, value) it committed."""

    def __init__(self, client, bootstrap, group, topic, instance_id=None):
        extra = [instance_id] if instance_id else []
        self.process = subprocess.Popen([sys.executable, CONSUMER_SCRIPT, client, bootstrap, group, topic, *extra],
                                        stdout=subprocess.PIPE, text=True)
        self.assigned = None
        self.records = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            message = json.loads(line)
            with self._lock:
                if "assigned" in message:
                    self.assigned = set(message["assigned"])
                else:
                    self.records.extend(tuple(r) for r in message["records"])

    def state(self):
        with self._lock:
            return self.assigned, list(self.records)

    def stop(self, sig=signal.SIGTERM):
        if self.process.poll() is None:
            self.process.send_signal(sig)
        self.process.wait(30)
        self._reader.join(10)


def split_evenly(consumers, partitions):
    """True when the consumers' assignments are disjoint, cover ``partitions`` and differ by at most one."""
    assigned = [c.state()[0] for c in consumers]
    if any(a is None for a in assigned):
        return False
    sizes = [len(a) for a in assigned]
    return sum(sizes) == len(partitions) and set().union(*assigned) == set(partitions) and max(sizes) - min(sizes) <= 1
