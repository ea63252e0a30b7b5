"""Reading loops shared by the consumer tests (mock cluster and kmem broker alike)."""
import time


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
