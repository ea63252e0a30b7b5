"""Broker produce throughput with ``num.network.threads=2`` against 1 (issue 39's figure for two network
threads on two cores): ``PRODUCERS`` confluent-kafka producer processes (acks=all, idempotent, ``linger.ms``
5, as ``bench_broker_throughput.py``) each send ``KMEM_BENCH_THREADS_MB`` (default 32) MB of 1 KiB records
round-robin over 8 partitions (two topics of 4) at once; printed: MB/s, the broker's CPU seconds per GB, and
how busy the machine's cores were (all processes) and the broker's share of them, for each setting,
alternating ``ROUNDS`` times, and the median ratio of 2 threads' MB/s to 1's
(``.venv/bin/pytest bench/bench_network_threads.py -s``). A second network thread can only add throughput
while a core is left idle: with the producers on the same cores, the busy figure says whether one is.

With ``KMEM_BENCH_PYSPY`` naming a py-spy binary, the broker is sampled (``--gil``: only the thread holding
the GIL) during each 2-thread run, into ``network-threads-gil-<round>.txt`` (collapsed stacks) in the
current directory.
"""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from bench_broker_throughput import GB, layout
from peers import BrokerProcess, busy_and_total, create_topics

PRODUCERS = 4
RECORD_BYTES = 1024
MB_EACH = int(os.environ.get("KMEM_BENCH_THREADS_MB", "32"))
ROUNDS = 3
PY_SPY = os.environ.get("KMEM_BENCH_PYSPY")

PRODUCER = textwrap.dedent("""
    import os, sys, confluent_kafka
    bootstrap, targets, size, count = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
    targets = [(t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1])) for t in targets]
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                         "linger.ms": 5, "queue.buffering.max.kbytes": 1 << 20})
    for topic, partition in targets:                 # warm: connected, producer id and metadata known
        producer.produce(topic, b"w", partition=partition)
    assert producer.flush(60) == 0
    print("READY", flush=True)
    sys.stdin.readline()
    payload = os.urandom(size)
    for i in range(count):
        topic, partition = targets[i % len(targets)]
        while True:
            try:
                producer.produce(topic, payload, partition=partition)
                break
            except BufferError:
                producer.poll(0.005)
    assert producer.flush(300) == 0
    print("DONE", flush=True)
""")

lines = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    for line in lines:
        print(line)


def run(tmp_path, threads, profile=None):
    """(MB/s of record values, broker CPU seconds per GB, cores busy, cores the broker used) with ``threads``
    network threads."""
    with BrokerProcess(tmp_path, {"num_network_threads": threads, "message_max_bytes": 4 << 20}) as broker:
        topics, per_topic = layout("threads", 8)
        create_topics(broker.bootstrap, topics, per_topic)
        targets = ",".join(f"{topic}:{p}" for p in range(per_topic) for topic in topics)
        count = MB_EACH * 1_000_000 // RECORD_BYTES
        producers = [subprocess.Popen([sys.executable, "-c", PRODUCER, broker.bootstrap, targets, str(RECORD_BYTES),
                                       str(count)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                     for _ in range(PRODUCERS)]
        try:
            for producer in producers:
                assert producer.stdout.readline().strip() == "READY"
            spy = None
            if profile:
                spy = subprocess.Popen([PY_SPY, "record", "--gil", "--nonblocking", "-r", "200", "-f", "raw", "-o",
                                        profile, "--pid", str(broker.process.pid)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cpu, started, machine = broker.cpu_seconds(), time.perf_counter(), busy_and_total()
            for producer in producers:
                producer.stdin.write("go\n")
                producer.stdin.flush()
            for producer in producers:
                assert producer.stdout.readline().strip() == "DONE"
            seconds, cpu = time.perf_counter() - started, broker.cpu_seconds() - cpu
            busy, total = (after - before for after, before in zip(busy_and_total(), machine))
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
        finally:
            for producer in producers:
                producer.stdin.close()
                producer.wait(60)
    produced = PRODUCERS * count * RECORD_BYTES
    cores = os.cpu_count()
    return produced / 1e6 / seconds, cpu / (produced / GB), busy / total * cores, cpu / seconds


def test_two_network_threads_against_one(tmp_path):
    figures = {1: [], 2: []}
    for round_ in range(ROUNDS):
        for threads in (1, 2):
            profile = f"network-threads-gil-{round_}.txt" if PY_SPY and threads == 2 else None
            figures[threads].append(run(tmp_path / f"{threads}-{round_}", threads, profile))
    for threads, rows in figures.items():
        lines.append(f"num.network.threads={threads}, {PRODUCERS} producers x {MB_EACH} MB of {RECORD_BYTES} B records "
                     f"on 8 partitions: " + "; ".join(f"{rate:.1f} MB/s {cpu:.2f} CPU s/GB, {busy:.2f} of "
                                                       f"{os.cpu_count()} cores busy ({broker:.2f} the broker's)"
                                                       for rate, cpu, busy, broker in rows))
    ratios = sorted(two[0] / one[0] for one, two in zip(figures[1], figures[2]))
    lines.append(f"MB/s with 2 network threads / with 1: median {ratios[len(ratios) // 2]:.2f} "
                 f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
