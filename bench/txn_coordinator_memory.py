"""Memory of the transaction coordinator per idle transactional id (issue 29's bound: 256 bytes of RSS).

    python bench/txn_coordinator_memory.py --ids 100000

Each id is made as a client makes it (InitProducerId: a producer id, epoch 0, the Empty state written to
``__transaction_state``), so it ends idle, in its packed form. Memory is RssAnon from /proc/self/status
(the heap; the log's pages are the page cache's), before and after, divided by the ids; the ids' names
(``transactional-id-000000`` style, 23 characters) are made as they are initialised, so they are counted.
Prints one JSON object.
"""
import argparse
import gc
import json
import tempfile
import time


def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class NoMarkers:
    def write(self, producer_id, producer_epoch, coordinator_epoch, commit, partitions):
        return {}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ids", type=int, default=100_000)
    args = parser.parse_args()

    from kmem.broker import LogManager
    from kmem.broker.timer import Timer
    from kmem.broker.txn.coordinator import TransactionCoordinator

    with tempfile.TemporaryDirectory() as directory:
        timer = Timer()
        logs = LogManager(directory)
        coordinator = TransactionCoordinator(logs, timer=timer, markers=NoMarkers())
        for i in range(1000):                                   # warm-up: the topic, the codecs, the caches
            coordinator.init_producer(f"warm-up-{i}", 60000)
        gc.collect()
        before = rss_anon()
        started = time.perf_counter()
        for i in range(args.ids):
            coordinator.init_producer(f"transactional-id-{i:06d}", 60000)
        seconds = time.perf_counter() - started
        gc.collect()
        grown = rss_anon() - before
        print(json.dumps({"ids": args.ids, "rss_anon_bytes_per_id": round(grown / args.ids, 1),
                          "init_producer_id_per_second": round(args.ids / seconds)}))
        coordinator.close()
        timer.close()
        logs.close()


if __name__ == "__main__":
    main()
