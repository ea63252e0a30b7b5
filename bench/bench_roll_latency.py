"""A producer's per-request latency across segment rolls: the kmem broker the run imports (the checkout) vs
kmem as it was before a roll's fsync left the appending thread (commit ``BEFORE``, its ``kmem`` package copied
out with ``git archive``, in the same run), ``.venv/bin/pytest bench/bench_roll_latency.py -s``.

Each round starts both brokers afresh, in turn, on new log directories with ``log.segment.bytes`` of
``KMEM_BENCH_ROLL_SEGMENT`` (default 4 MiB). One confluent-kafka producer (acks=1, ``linger.ms`` 0) sends
``MESSAGE`` bytes at a time and waits for each acknowledgement, for ``KMEM_BENCH_ROLL_SECONDS`` (default 5) s:
a roll every ~64 requests, so the requests that roll are 1.5% of them and the p99 shows what they wait for.
Printed per broker and round: requests, rolls, produce-to-ack latency p50 / p99 / p99.9 / max.
"""
import glob
import importlib.util
import io
import os
import shutil
import subprocess
import tarfile
import time

import numpy as np
import pytest

from peers import CHILD_ENV, HERE, BrokerProcess, create_topics

BEFORE = "8ce26357f7b2"         # the last commit whose roll fsyncs the old segment on the appending thread
ROOT = os.path.dirname(HERE)
SEGMENT = int(os.environ.get("KMEM_BENCH_ROLL_SEGMENT", str(4 << 20)))
SECONDS = float(os.environ.get("KMEM_BENCH_ROLL_SECONDS", "5"))
ROUNDS = int(os.environ.get("KMEM_BENCH_ROLL_ROUNDS", "2"))
MESSAGE = 64 << 10

rows = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print(f"\nProduce-to-ack latency across rolls (acks=1, {MESSAGE >> 10} KiB messages one at a time, "
          f"segment.bytes {SEGMENT >> 20} MiB):")
    print(f"{'round':>5} {'broker':>22} {'requests':>9} {'rolls':>6} {'p50 ms':>7} {'p99 ms':>7} {'p99.9 ms':>9} "
          f"{'max ms':>7}")
    for row in rows:
        print(f"{row[0]:>5} {row[1]:>22} {row[2]:>9} {row[3]:>6} {row[4]:>7.2f} {row[5]:>7.2f} {row[6]:>9.2f} "
              f"{row[7]:>7.2f}")


@pytest.fixture(scope="module")
def before_checkout(tmp_path_factory):
    """``BEFORE``'s kmem package with the compiled core kmem runs on here (its Cython sources are the same)."""
    changed = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", BEFORE, "--", "kmem/*.pyx", "kmem/*.pxi",
                              "kmem/*.pxd"])
    if changed.returncode != 0:
        pytest.skip(f"the Cython core changed since {BEFORE}: its build would be needed")
    directory = tmp_path_factory.mktemp("before")
    archive = subprocess.run(["git", "-C", ROOT, "archive", BEFORE, "kmem"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory)
    shutil.copy(importlib.util.find_spec("kmem._core").origin, os.path.join(directory, "kmem"))
    return str(directory)


def produce_one_at_a_time(bootstrap, seconds):
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0})
    value = os.urandom(MESSAGE)
    producer.produce("warm", value)
    producer.flush(30)
    latencies = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        producer.produce("rolls", value)
        assert producer.flush(30) == 0
        latencies.append(time.perf_counter() - started)
    return np.array(latencies) * 1000


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_produce_latency_across_rolls(tmp_path, before_checkout, round_):
    for name, env in [(f"before ({BEFORE[:7]})", dict(CHILD_ENV, PYTHONPATH=before_checkout)), ("now", CHILD_ENV)]:
        log_dir = tmp_path / name.split()[0]
        with BrokerProcess(log_dir, {"log_segment_bytes": SEGMENT}, env=env) as broker:
            create_topics(broker.bootstrap, ["warm", "rolls"])
            latencies = produce_one_at_a_time(broker.bootstrap, SECONDS)
        rolls = len(glob.glob(os.path.join(log_dir, "rolls-0", "*.log"))) - 1
        p50, p99, p999 = np.percentile(latencies, [50, 99, 99.9])
        rows.append((round_, name, len(latencies), rolls, p50, p99, p999, latencies.max()))
        assert rolls > 10
