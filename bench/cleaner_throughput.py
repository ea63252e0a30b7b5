"""Log cleaner throughput and the memory of a cleaning pass (issue 28's figures).

    python bench/cleaner_throughput.py                               # 1 GiB of 1 KiB records, 10 and 1 M keys
    python bench/cleaner_throughput.py --records 200000 --keys 10 --buffers 16

A compacted partition (``segment.bytes`` 128 MiB) is filled with 1 KiB records whose keys are drawn
uniformly from ``--keys`` distinct keys, then the active segment is rolled so the whole log is dirty. For
each ``log.cleaner.dedupe.buffer.size`` of ``--buffers`` (MiB), a fresh process opens a copy of that log and
runs ``LogCleaner.clean`` until the whole log is clean (a map smaller than the keys takes several passes):
MB/s is the dirty log's size over that time. Peak RSS is the process's VmHWM during the passes, and its
growth over the VmHWM after opening the log (the pass's own memory: the key map, the I/O buffers, one
batch). Prints one JSON object per run.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

RECORD_BYTES = 1024
BATCH_RECORDS = 64
TOPIC = "compacted"


def high_water_mark():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def config(buffer_bytes):
    from kmem.broker.log.config import BrokerConfig
    return BrokerConfig.from_properties(log_cleaner_dedupe_buffer_size=buffer_bytes, log_cleaner_enable=False)


def write(directory, records, keys, seed):
    from kmem.broker.log import LogManager
    from kmem.records import RecordsBuilder

    rng = random.Random(seed)
    value = b"v" * (RECORD_BYTES - 16)
    now = int(time.time() * 1000)
    with LogManager(directory, config(1 << 20)) as logs:
        logs.create_topic(TOPIC, 1, {"cleanup.policy": "compact", "segment.bytes": 128 << 20})
        partition = logs.get_partition(TOPIC, 0)
        for first in range(0, records, BATCH_RECORDS):
            builder = RecordsBuilder(2, "none")
            for _ in range(min(BATCH_RECORDS, records - first)):
                builder.append(value, key=b"key-%07d" % rng.randrange(keys), timestamp=now)
            result = partition.append(builder.build(), now_ms=now)
            assert result.error_code == 0, result
        partition.roll()
        return partition.size_in_bytes


def clean(directory, buffer_bytes):
    from kmem.broker.log import LogManager

    with LogManager(directory, config(buffer_bytes)) as logs:
        partition = logs.get_partition(TOPIC, 0)
        dirty, end = partition.size_in_bytes, partition.active.base_offset
        opened_hwm = high_water_mark()
        passes, started = 0, time.monotonic()
        while logs.cleaner.first_dirty_offset(TOPIC, 0) < end:
            logs.cleaner.clean(TOPIC, 0)
            passes += 1
        elapsed = time.monotonic() - started
        return {"dirty_mb": round(dirty / 1e6, 1), "cleaned_mb": round(partition.size_in_bytes / 1e6, 1),
                "passes": passes, "seconds": round(elapsed, 2), "mb_per_s": round(dirty / 1e6 / elapsed, 1),
                "peak_rss_mib": round(high_water_mark() / 2**20, 1),
                "pass_rss_growth_mib": round((high_water_mark() - opened_hwm) / 2**20, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1 << 20)
    parser.add_argument("--keys", type=int, nargs="+", default=[10, 1_000_000])
    parser.add_argument("--buffers", type=int, nargs="+", default=[16, 128], help="dedupe buffer sizes, MiB")
    parser.add_argument("--dir", default=None, help="where the logs go (a temporary directory by default)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:                      # a fresh process per measure, so VmHWM is the pass's own
        mode, directory, number = args.child
        result = write(directory, args.records, int(number), 1) if mode == "write" \
            else clean(directory, int(number))
        print(json.dumps(result))
        return
    root = tempfile.mkdtemp(prefix="kmem-cleaner-bench-", dir=args.dir)
    try:
        for keys in args.keys:
            pristine = os.path.join(root, f"keys-{keys}")
            started = time.monotonic()
            child(["write", pristine, str(keys)], args.records)
            written_secs = time.monotonic() - started
            for buffer_mib in args.buffers:
                copy = os.path.join(root, "copy")
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(pristine, copy)
                result = child(["clean", copy, str(buffer_mib << 20)], args.records)
                print(json.dumps({"records": args.records, "record_bytes": RECORD_BYTES, "keys": keys,
                                  "dedupe_buffer_mib": buffer_mib, "write_seconds": round(written_secs, 1),
                                  **result}), flush=True)
            shutil.rmtree(pristine)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def child(arguments, records):
    output = subprocess.run([sys.executable, __file__, "--records", str(records), "--child", *arguments],
                            check=True, capture_output=True, text=True).stdout
    return json.loads(output.splitlines()[-1])


if __name__ == "__main__":
    main()
