"""Does the log cleaner keep up with a producer writing a compacted topic at full speed? (issue 28's figure)

    python bench/cleaner_keeps_up.py                           # 60 s, 10,000 keys, 16 MiB segments
    python bench/cleaner_keeps_up.py --seconds 30 --keys 1000 --segment-mib 4 --backoff-ms 1000

A kmem broker runs in this process (its cleaner thread with Kafka's defaults: ``min.cleanable.dirty.ratio``
0.5, ``log.cleaner.backoff.ms`` 15 s unless ``--backoff-ms``); a child process produces 1 KiB records whose
keys are drawn uniformly from ``--keys`` distinct keys to one partition of a compacted topic with
confluent-kafka (acks=all, ``linger.ms`` 5) as fast as the broker takes them, for ``--seconds``. Every
second the partition is sampled: its size, its dirty ratio (as the cleaner's ``LogToClean``: dirty bytes
before the active segment over all bytes before it) and its dirty bytes (from the first dirty offset to the
log end, the active segment included). Each pass's ``CleanerStats`` is recorded.

Prints one JSON object: the produce rate (MB/s of record values, records/s), the cleaning rate (MB/s of
dirty log mapped per second of cleaning; the cleaner thread's busy share), the passes, the maximum and final
dirty ratio, ``max-dirty-percent``, the maximum and final partition size and dirty bytes, the highest dirty
bytes and ratio of the last third of the run, and the dirty bytes of each sample. The cleaner keeps up when
the dirty bytes stop growing (the last third of the run no higher than the middle one) rather than growing
with the bytes written. With few keys the dirty ratio is close to 1 whenever a segment has rolled since
the last pass (the clean part is the live keys alone): the dirty bytes tell more.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

RECORD_BYTES = 1024
TOPIC = "compacted"


def produce(bootstrap, keys, seconds):
    """The child: produce at full speed for ``seconds``; prints records and bytes delivered and the time."""
    from confluent_kafka import Producer

    delivered = [0, 0]

    def on_delivery(error, message):
        if error is None:
            delivered[0] += 1
            delivered[1] += len(message.value())
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                         "queue.buffering.max.kbytes": 64 << 10})
    value = os.urandom(RECORD_BYTES - 16)
    rng = random.Random(1)
    started = time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        for _ in range(1000):
            try:
                producer.produce(TOPIC, value, b"key-%09d" % rng.randrange(keys), on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)
    print(json.dumps({"records": delivered[0], "bytes": delivered[1], "seconds": time.monotonic() - started}))


def sample(broker):
    """The partition's size, dirty ratio and dirty bytes, from the segments' sizes alone (reading their files
    would race with the cleaner swapping them)."""
    partition = broker.logs.get_partition(TOPIC, 0)
    first_dirty = broker.logs.cleaner.first_dirty_offset(TOPIC, 0)
    segments, _, _ = partition.cleanable_segments()
    clean = sum(s.size for s in segments if s.next_offset <= first_dirty)
    cleanable = sum(s.size for s in segments) - clean
    return {"size": partition.size_in_bytes, "dirty_ratio": cleanable / (clean + cleanable) if cleanable else 0.0,
            "dirty_bytes": partition.size_in_bytes - clean,
            "max_dirty_percent": broker.logs.cleaner.metrics["max-dirty-percent"]}


def record_passes(cleaner_class):
    """Every pass's ``CleanerStats``, appended as ``Cleaner.clean`` returns."""
    passes = []
    clean = cleaner_class.clean

    def recorded(self, *args, **kwargs):
        end, stats = clean(self, *args, **kwargs)
        passes.append(stats)
        return end, stats
    cleaner_class.clean = recorded
    return passes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--segment-mib", type=int, default=16)
    parser.add_argument("--backoff-ms", type=int, default=15_000, help="log.cleaner.backoff.ms")
    parser.add_argument("--dir", default=None, help="where the log goes (a temporary directory by default)")
    parser.add_argument("--produce", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        bootstrap, keys, seconds = args.produce
        produce(bootstrap, int(keys), float(seconds))
        return

    from kmem.broker import Broker
    from kmem.broker.log.cleaner import Cleaner

    passes = record_passes(Cleaner)
    root = tempfile.mkdtemp(prefix="kmem-cleaner-keeps-up-", dir=args.dir)
    settings = {"log.cleaner.backoff.ms": args.backoff_ms, "message.max.bytes": 4 << 20}
    try:
        with Broker(os.path.join(root, "logs"), properties=settings) as broker:
            broker.logs.create_topic(TOPIC, 1, {"cleanup.policy": "compact",
                                                "segment.bytes": str(args.segment_mib << 20)})
            child = subprocess.Popen([sys.executable, __file__, "--produce", broker.bootstrap_servers,
                                      str(args.keys), str(args.seconds)], stdout=subprocess.PIPE, text=True)
            samples, stop = [], threading.Event()
            try:
                while child.poll() is None:
                    samples.append(sample(broker))
                    stop.wait(1)
            finally:
                child.kill()            # when sampling failed (it has finished otherwise)
            produced = json.loads(child.stdout.read().splitlines()[-1])
            samples.append(sample(broker))
        print(json.dumps(summary(args, produced, samples, passes)))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def summary(args, produced, samples, passes):
    cleaning = sum(p.elapsed_secs for p in passes)
    third = max(len(samples) // 3, 1)
    middle, last = samples[third:2 * third], samples[2 * third:]
    mib = 2 ** 20
    return {
        "seconds": round(produced["seconds"], 1), "keys": args.keys, "record_bytes": RECORD_BYTES,
        "segment_mib": args.segment_mib, "backoff_ms": args.backoff_ms,
        "produce_mb_per_s": round(produced["bytes"] / 1e6 / produced["seconds"], 1),
        "produce_records_per_s": round(produced["records"] / produced["seconds"]),
        "passes": len(passes),
        "cleaning_mb_per_s": round(sum(p.map_bytes_read for p in passes) / 1e6 / cleaning, 1) if cleaning else None,
        "cleaner_busy_percent": round(100 * cleaning / produced["seconds"]),
        "max_dirty_ratio": round(max(s["dirty_ratio"] for s in samples), 3),
        "final_dirty_ratio": round(samples[-1]["dirty_ratio"], 3),
        "max_dirty_percent_metric": max(s["max_dirty_percent"] for s in samples),
        "max_size_mib": round(max(s["size"] for s in samples) / mib, 1),
        "final_size_mib": round(samples[-1]["size"] / mib, 1),
        "max_dirty_mib": round(max(s["dirty_bytes"] for s in samples) / mib, 1),
        "last_third_max_dirty_mib": round(max(s["dirty_bytes"] for s in last) / mib, 1),
        "last_third_max_dirty_ratio": round(max(s["dirty_ratio"] for s in last), 3),
        "final_dirty_mib": round(samples[-1]["dirty_bytes"] / mib, 1),
        "written_mib": round(produced["bytes"] / mib, 1),
        "dirty_mib_each_second": [round(s["dirty_bytes"] / mib) for s in samples],
        "keeps_up": bool(middle) and max(s["dirty_bytes"] for s in last) <= max(s["dirty_bytes"] for s in middle),
    }


if __name__ == "__main__":
    main()
