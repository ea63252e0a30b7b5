"""PidLedger: update and read speed, and memory at 1 M and 10 M ids, beside a plain dict of entries.

Run: .venv/bin/pytest bench/bench_ledger.py
The peer is what a Python service would write without kmem: a dict of ProducerEntry tuples in the heap
(Kafka's own design, with ~88 B per id before map overhead in the JVM). Single calls (``update``, ``read``)
and batches (``update_many``, ``read_many`` over numpy arrays, as the Spark ``ledger`` job and a
broker's produce path have them) are timed beside the dict doing the same; the table ends with ratios. The 100 M run is long (about
4.7 GB of snapshots): `python bench/ledger_memory.py --ids 100000000`.
"""
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from kmem.ledger import ENTRY_DTYPE, PidLedger, ProducerEntry

HERE = os.path.dirname(os.path.abspath(__file__))
# Children started with -c would put the working directory first on sys.path: from a checkout, that is
# the uncompiled source tree instead of the installed kmem under test.
CHILD_ENV = {**os.environ, "PYTHONSAFEPATH": "1"}
UPDATES = 1_000_000
RESULTS = {}

# RssAnon growth of a dict holding N entries, measured in a fresh process.
DICT_PEER = textwrap.dedent("""
    import sys, time
    from kmem.ledger import ProducerEntry
    def anon():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    n = int(sys.argv[1])
    before = anon()
    now = int(time.time() * 1000)
    ledger = {}
    for pid in range(n):
        ledger[pid * 2654435761] = ProducerEntry(pid * 2654435761, 1, pid, pid, 0, now, 0, -1)
    print((anon() - before) / 2**20)
""")


def entries(n, base=0):
    now = int(time.time() * 1000)
    return [ProducerEntry(pid * 2_654_435_761, 1, pid, pid, 0, now, 0, -1) for pid in range(base, base + n)]


def test_update_kmem_ledger(benchmark, timing, tmp_path_factory):
    batch = entries(UPDATES)
    benchmark.group = "ledger update 1M ids"

    def run(ledger):
        update = ledger.update
        for e in batch:
            update(e)

    def fresh():
        return (PidLedger(tmp_path_factory.mktemp("ledger")),), {}

    benchmark.pedantic(run, setup=fresh, rounds=3, iterations=1)
    RESULTS["update kmem PidLedger (incl. flushes)"] = UPDATES / timing()


def as_array(batch):
    return np.array([tuple(e) for e in batch], ENTRY_DTYPE)


def test_update_many_kmem_ledger(benchmark, timing, tmp_path_factory):
    array = as_array(entries(UPDATES))
    benchmark.group = "ledger update 1M ids"

    def fresh():
        return (PidLedger(tmp_path_factory.mktemp("ledger")),), {}

    benchmark.pedantic(lambda ledger: ledger.update_many(array), setup=fresh, rounds=3, iterations=1)
    RESULTS["update_many kmem PidLedger (incl. flushes)"] = UPDATES / timing()


def test_update_dict_peer(benchmark, timing):
    batch = entries(UPDATES)
    benchmark.group = "ledger update 1M ids"

    def run(store):
        for e in batch:
            store[e.producer_id] = e

    benchmark.pedantic(run, setup=lambda: (({},), {}), rounds=3, iterations=1)
    RESULTS["update dict peer"] = UPDATES / timing()


READ_GROUP = "ledger read 100k present ids (1M in a snapshot + active file)"


@pytest.fixture(scope="module")
def filled_ledger(tmp_path_factory):
    with PidLedger(tmp_path_factory.mktemp("filled")) as ledger:
        ledger.update_many(as_array(entries(UPDATES)))
        ledger.flush()
        ledger.update_many(as_array(entries(1000, base=UPDATES)))     # and some in the active file
        yield ledger


def present_ids():
    return [e.producer_id for e in entries(100_000, base=UPDATES // 2)]


def test_read_kmem_ledger(benchmark, timing, filled_ledger):
    pids = present_ids()
    benchmark.group = READ_GROUP
    read = filled_ledger.read
    benchmark.pedantic(lambda: [read(p) for p in pids], rounds=3, iterations=1)
    RESULTS["read kmem PidLedger"] = len(pids) / timing()


def test_read_many_kmem_ledger(benchmark, timing, filled_ledger):
    pids = np.array(present_ids(), np.int64)
    benchmark.group = READ_GROUP
    found, _ = benchmark.pedantic(lambda: filled_ledger.read_many(pids), rounds=5, iterations=1)
    assert found.all()
    RESULTS["read_many kmem PidLedger"] = len(pids) / timing()


def test_read_dict_peer(benchmark, timing):
    store = {e.producer_id: e for e in entries(UPDATES)}
    pids = present_ids()
    benchmark.group = READ_GROUP
    get = store.get
    benchmark.pedantic(lambda: [get(p) for p in pids], rounds=3, iterations=1)
    RESULTS["read dict peer"] = len(pids) / timing()


@pytest.mark.parametrize("ids", [1_000_000, 10_000_000])
def test_memory_and_read_latency(ids):
    out = subprocess.run([sys.executable, os.path.join(HERE, "ledger_memory.py"), "--ids", str(ids)],
                         check=True, capture_output=True, text=True, env=CHILD_ENV).stdout
    RESULTS[f"memory {ids:,}"] = json.loads(out)


def test_memory_dict_peer():
    out = subprocess.run([sys.executable, "-c", DICT_PEER, str(UPDATES)], check=True, capture_output=True,
                         text=True, env=CHILD_ENV).stdout
    RESULTS["memory dict peer 1,000,000"] = float(out)


@pytest.fixture(scope="module", autouse=True)
def report(request):
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    request.config.add_cleanup(lambda: print_table(tr.write_line if tr else print))


def print_table(write):
    write("")
    write("PidLedger (KIP-1044)")
    for key, value in RESULTS.items():
        if isinstance(value, dict):
            write(f"  {key} ids: RssAnon growth {value['rss_anon_growth_mib']} MiB, RSS {value['rss_total_mib']} MiB "
                  f"(mapped files {value['rss_file_mib']} MiB), read p99 present {value['read_present_p99_us']} us / "
                  f"absent {value['read_absent_p99_us']} us, open {value['open_seconds']} s")
        elif key.startswith("memory"):
            write(f"  {key} ids: RssAnon growth {value:.1f} MiB (the heap design)")
        else:
            write(f"  {key}: {value / 1e6:.2f} M/s")
    for kmem_key, peer_key in [("update kmem PidLedger (incl. flushes)", "update dict peer"),
                               ("update_many kmem PidLedger (incl. flushes)", "update dict peer"),
                               ("read kmem PidLedger", "read dict peer"),
                               ("read_many kmem PidLedger", "read dict peer")]:
        kmem, peer = RESULTS.get(kmem_key), RESULTS.get(peer_key)
        if kmem and peer:
            write(f"  {kmem_key.split(' kmem')[0]}: kmem / dict = {kmem / peer:.2f}")
    ledger, heap = RESULTS.get("memory 1,000,000"), RESULTS.get("memory dict peer 1,000,000")
    if ledger and heap:
        write(f"  heap growth at 1 M ids: dict / kmem = {heap / max(ledger['rss_anon_growth_mib'], 0.1):.0f}x")
