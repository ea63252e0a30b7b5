"""Memory and read latency of a PidLedger holding many producer ids (KIP-1044's point).

    python bench/ledger_memory.py --ids 10000000            # a snapshot of 10 M producers
    python bench/ledger_memory.py --ids 100000000           # the long run: ~4.7 GB of disk

The snapshot (sorted, with its sidecar, holding every producer as Kafka's do) is written by a separate
process, as a batch job would, a million entries at a time, so this process starts clean. It then opens the ledger (verifying every CRC), warms up, and times
``read`` for present and for absent ids. Memory comes from /proc/self/status: RssAnon is the heap
(what grows with ids in Kafka's design), RssFile the mapped file pages, VmRSS their sum.
Prints one JSON object.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

PER_RUN = 1_000_000


def producer_ids(numbers):
    """Distinct ids spread over the id space, increasing with ``numbers``; ``+ 1`` gives ids between them."""
    return numbers * 2_654_435_761 + 0x5DEECE66D


def status():
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def build(directory, ids, seed):
    import numpy as np

    from kmem.bloom import Shape
    from kmem.ledger import ENTRY_DTYPE, snapshot_name
    from kmem.ledger.snapshot import merge_snapshot

    rng = np.random.default_rng(seed)
    now = int(time.time() * 1000)

    def runs():
        for first in range(0, ids, PER_RUN):
            n = min(PER_RUN, ids - first)
            array = np.zeros(n, ENTRY_DTYPE)
            array["producer_id"] = producer_ids(np.arange(first, first + n, dtype=np.int64))
            array["epoch"] = rng.integers(0, 100, n)
            array["last_offset"] = np.arange(first, first + n)
            array["timestamp"] = now
            array["current_txn_first_offset"] = -1
            yield array.view(np.uint8), None
    merge_snapshot(os.path.join(directory, snapshot_name(ids)), [runs()], Shape.from_np(max(ids, 1), 0.01))


def measure(directory, ids, samples, seed):
    import numpy as np

    from kmem.ledger import PidLedger

    before = status()
    started = time.perf_counter()
    ledger = PidLedger(directory)
    open_seconds = time.perf_counter() - started
    rng = np.random.default_rng(seed)
    present = producer_ids(rng.integers(0, ids, 2 * samples, dtype=np.int64))
    absent = producer_ids(rng.integers(0, ids, 2 * samples, dtype=np.int64)) + 1
    for pid in present[:samples].tolist() + absent[:samples].tolist():      # warm-up
        ledger.read(pid)
    result = {"ids": ids, "snapshots": len(ledger.snapshot_paths), "open_seconds": round(open_seconds, 2)}
    for name, pids in (("present", present[samples:]), ("absent", absent[samples:])):
        times = np.empty(len(pids), np.int64)
        found = 0
        clock = time.perf_counter_ns
        read = ledger.read
        for i, pid in enumerate(pids.tolist()):
            t = clock()
            found += read(pid) is not None
            times[i] = clock() - t
        assert found == (len(pids) if name == "present" else 0), (name, found)
        result[f"read_{name}_p50_us"] = round(float(np.percentile(times, 50)) / 1000, 2)
        result[f"read_{name}_p99_us"] = round(float(np.percentile(times, 99)) / 1000, 2)
    after = status()
    result["rss_anon_growth_mib"] = round((after["RssAnon"] - before["RssAnon"]) / 2**20, 1)
    result["rss_file_mib"] = round(after["RssFile"] / 2**20, 1)
    result["rss_total_mib"] = round(after["VmRSS"] / 2**20, 1)
    ledger.close()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=20_000, help="reads timed per kind (after as many warm-up)")
    parser.add_argument("--dir", help="ledger directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--reuse", action="store_true", help="measure a --dir built by an earlier run")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.build_only:
        build(args.dir, args.ids, args.seed)
        return
    directory = args.dir or tempfile.mkdtemp(prefix="kmem-ledger-bench-")
    try:
        started = time.perf_counter()
        if not args.reuse:
            subprocess.run([sys.executable, __file__, "--build-only", "--dir", directory, "--ids", str(args.ids)],
                           check=True)
        build_seconds = time.perf_counter() - started
        result = measure(directory, args.ids, args.samples, args.seed)
        result["build_seconds"] = round(build_seconds, 1)
        print(json.dumps(result))
    finally:
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
