"""What scraping the broker's Prometheus endpoint (``metrics.port``) costs the produce path, in the same run
(``.venv/bin/pytest bench/bench_metrics.py -s``).

One kmem broker (``broker_child.py``, a process of its own) with the endpoint on, holding besides the loaded
topic an idle topic of 100 partitions and 100 groups with committed offsets, so that a scrape has partitions,
offsets and lag to report. A confluent-kafka producer (acks=all, idempotent, ``linger.ms`` 5) sends 1 KiB
records round-robin over 8 partitions for ``KMEM_BENCH_METRICS_SECONDS`` (default 5) s a phase, in
``KMEM_BENCH_METRICS_ROUNDS`` (default 3) rounds of two phases taken in turn: no scrape, then a scraper process
(started and ready before the phase) reading ``/metrics`` every second, as Prometheus would. Printed: each phase's
MB/s of record values acknowledged and their medians, the ratio scraped / not scraped of each round (its two
phases back to back, so the machine's drift cancels out) and their median, the scrapes' size and time.
"""
import os
import statistics
import subprocess
import sys
import time

from peers import CHILD_ENV, BrokerProcess, _free_port, create_topics
from bench_broker_throughput import warm_producer

PHASE_SECONDS = float(os.environ.get("KMEM_BENCH_METRICS_SECONDS", "5"))
ROUNDS = int(os.environ.get("KMEM_BENCH_METRICS_ROUNDS", "3"))
SIZE, PARTITIONS, IDLE_PARTITIONS, GROUPS = 1024, 8, 100, 100

# prints "ready", then every second GETs /metrics; on stdin's end, prints the scrapes, their mean bytes and mean ms
SCRAPER = """
import sys, threading, time, urllib.request
url, stop, times, sizes = sys.argv[1], threading.Event(), [], []
print("ready", flush=True)
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as answer:
        sizes.append(len(answer.read()))
    times.append(time.perf_counter() - started)
    stop.wait(max(1 - times[-1], 0))
print(len(times), sum(sizes) / len(sizes), sum(times) / len(times) * 1000, flush=True)
"""


def commit_offsets(bootstrap):
    """GROUPS groups, each with an offset committed on the idle topic (Empty groups with lag to report)."""
    import confluent_kafka

    for i in range(GROUPS):
        consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"group-{i}"})
        consumer.commit(offsets=[confluent_kafka.TopicPartition("idle", i % IDLE_PARTITIONS, 0)],
                        asynchronous=False)
        consumer.close()


def produce_for(producer, targets, seconds):
    """Records sent round-robin over ``targets`` for ``seconds``; returns MB/s of values acknowledged."""
    payload = os.urandom(SIZE)
    started = time.perf_counter()
    count = 0
    while time.perf_counter() - started < seconds:
        topic, partition = targets[count % len(targets)]
        try:
            producer.produce(topic, payload, partition=partition)
            count += 1
        except BufferError:
            producer.poll(0.005)
    assert producer.flush(300) == 0
    return count * SIZE / 1e6 / (time.perf_counter() - started)


def test_produce_throughput_scraped_every_second_vs_not(tmp_path):
    metrics_port = _free_port()
    with BrokerProcess(tmp_path / "kmem", {"metrics_port": metrics_port}) as broker:
        create_topics(broker.bootstrap, ["load"], PARTITIONS)
        create_topics(broker.bootstrap, ["idle"], IDLE_PARTITIONS)
        commit_offsets(broker.bootstrap)
        targets = [("load", p) for p in range(PARTITIONS)]
        producer = warm_producer(broker.bootstrap, targets, SIZE, "none")
        rates = {"not scraped": [], "scraped every 1 s": []}
        scrapes = []
        for _ in range(ROUNDS):
            for phase in rates:
                scraper = None
                if phase != "not scraped":
                    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER,
                                                f"http://127.0.0.1:{metrics_port}/metrics"],
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=CHILD_ENV)
                    assert scraper.stdout.readline().strip() == "ready"
                rates[phase].append(produce_for(producer, targets, PHASE_SECONDS))
                if scraper is not None:
                    output, _ = scraper.communicate(timeout=60)
                    assert scraper.returncode == 0, output
                    scrapes.append([float(x) for x in output.split()])
    medians = {phase: statistics.median(values) for phase, values in rates.items()}
    ratios = [scraped / plain for plain, scraped in zip(*rates.values())]
    print(f"\nProduce throughput, 1 KiB records, {ROUNDS} rounds of {PHASE_SECONDS:g} s phases (median MB/s):")
    for phase, median in medians.items():
        print(f"  {phase:<18} {median:8.1f}   ({', '.join(f'{v:.1f}' for v in rates[phase])})")
    print(f"  ratio scraped / not scraped, each round: {', '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f}")
    count = sum(s[0] for s in scrapes)
    print(f"  {count:.0f} scrapes of {sum(s[0] * s[1] for s in scrapes) / count / 1000:.1f} kB, "
          f"{sum(s[0] * s[2] for s in scrapes) / count:.1f} ms each on average")
