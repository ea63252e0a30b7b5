"""PidLedger: update and read speed, and memory at 1 M and 10 M ids, beside a plain dict of entries.

Run: .venv/bin/pytest bench/bench_ledger.py
The peer is what a Python service would write without kmem: a dict of ProducerEntry tuples in the heap
(Kafka's own design, with ~88 B per id before map overhead in the JVM). Single calls (``update``, ``read``)
and batches (``update_many``, ``read_many`` over numpy arrays, as the Spark ``ledger`` job and a
broker's produce path have them) are timed beside the dict doing the same, at 1 M ids (46 MB of rows, out of the
CPU cache; the update rows include the flush the millionth id triggers) and at 100k / 10k ids (in cache, no
flush); the table ends with issue 18's rows, their ratios and goals, and for a goal not met the limit
profiled (LIMITS). The 100 M run is long (a 4.7 GB snapshot): `python bench/ledger_memory.py --ids 100000000`.
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


SMALL = 100_000     # ids that fit one active file (4.6 MB of rows, its row table in the CPU cache): no flush


def test_update_kmem_ledger_no_flush(benchmark, timing, tmp_path_factory):
    batch = entries(SMALL)
    benchmark.group = "ledger update 100k ids"

    def run(ledger):
        update = ledger.update
        for e in batch:
            update(e)

    benchmark.pedantic(run, setup=lambda: ((PidLedger(tmp_path_factory.mktemp("ledger")),), {}), rounds=5,
                       iterations=1)
    RESULTS["update kmem PidLedger, 100k (no flush)"] = SMALL / timing()


def test_update_many_kmem_ledger_no_flush(benchmark, timing, tmp_path_factory):
    array = as_array(entries(SMALL))
    benchmark.group = "ledger update 100k ids"
    benchmark.pedantic(lambda ledger: ledger.update_many(array),
                       setup=lambda: ((PidLedger(tmp_path_factory.mktemp("ledger")),), {}), rounds=5, iterations=1)
    RESULTS["update_many kmem PidLedger, 100k (no flush)"] = SMALL / timing()


def test_update_dict_peer_small(benchmark, timing):
    batch = entries(SMALL)
    benchmark.group = "ledger update 100k ids"

    def run(store):
        for e in batch:
            store[e.producer_id] = e

    benchmark.pedantic(run, setup=lambda: (({},), {}), rounds=5, iterations=1)
    RESULTS["update dict peer, 100k"] = SMALL / timing()


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


@pytest.fixture(scope="module")
def small_ledger(tmp_path_factory):
    """10k ids in a snapshot (460 KB: in the CPU cache) and 1000 in the active file."""
    with PidLedger(tmp_path_factory.mktemp("small")) as ledger:
        ledger.update_many(as_array(entries(10_000)))
        ledger.flush()
        ledger.update_many(as_array(entries(1000, base=10_000)))
        yield ledger


def small_ids():
    return [e.producer_id for e in entries(10_000)] * 10


def test_read_kmem_ledger_in_cache(benchmark, timing, small_ledger):
    pids = small_ids()
    benchmark.group = "ledger read 100k present ids (10k in a snapshot)"
    read = small_ledger.read
    benchmark.pedantic(lambda: [read(p) for p in pids], rounds=3, iterations=1)
    RESULTS["read kmem PidLedger, 10k in cache"] = len(pids) / timing()


def test_read_many_kmem_ledger_in_cache(benchmark, timing, small_ledger):
    pids = np.array(small_ids(), np.int64)
    benchmark.group = "ledger read 100k present ids (10k in a snapshot)"
    found, _ = benchmark.pedantic(lambda: small_ledger.read_many(pids), rounds=5, iterations=1)
    assert found.all()
    RESULTS["read_many kmem PidLedger, 10k in cache"] = len(pids) / timing()


def test_read_dict_peer_in_cache(benchmark, timing):
    store = {e.producer_id: e for e in entries(10_000)}
    pids = small_ids()
    benchmark.group = "ledger read 100k present ids (10k in a snapshot)"
    get = store.get
    benchmark.pedantic(lambda: [get(p) for p in pids], rounds=3, iterations=1)
    RESULTS["read dict peer, 10k"] = len(pids) / timing()


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


ISSUE_18_ROWS = [
    # (kmem's row, the peer's, the goal in ids/s, the LIMITS entry explaining a shortfall)
    ("update kmem PidLedger (incl. flushes)", "update dict peer", 2e6, "update"),
    ("update kmem PidLedger, 100k (no flush)", "update dict peer, 100k", 2e6, "update"),
    ("update_many kmem PidLedger (incl. flushes)", "update dict peer", 10e6, "update_many"),
    ("update_many kmem PidLedger, 100k (no flush)", "update dict peer, 100k", 10e6, "update_many"),
    ("read kmem PidLedger", "read dict peer", 1e6, "read"),
    ("read kmem PidLedger, 10k in cache", "read dict peer, 10k", 1e6, "read"),
    ("read_many kmem PidLedger", "read dict peer", 5e6, "read_many"),
    ("read_many kmem PidLedger, 10k in cache", "read dict peer, 10k", 5e6, "read_many"),
]
# What stops a row short of its goal, as profiled (perf, cProfile) on the 2-core VM these figures come from.
LIMITS = {
    "update": "a call is ~300 ns in the core (entry check, hash probe out of the cache at 1 M ids, the row's "
              "page of the mapping faulted in); the flush the millionth id triggers adds ~45 ms (see update_many)",
    "update_many": "per 1 M ids: the active file's 44 MB of new page-cache pages ~40-55 ms (faulting them in or "
                   "MADV_POPULATE_WRITE cost the same), the snapshot's 44 MB pwrite ~30 ms, the Bloom filter's "
                   "adds ~30 ms, the row table's inserts ~40 ms: the flush is synchronous by design",
    "read_many": "not profiled (unchanged by issue 18's work; it runs at the goal's edge, 4.9-5.8 M/s here)",
    "read": "a snapshot probe is a pread through the descriptor the process keeps for its recently searched "
            "snapshots (at most set_open_snapshots_limit, so a broker's descriptors stay bounded), the rest the "
            "call, the lock, the 7 bit tests of the 1 MB sidecar and building the entry; probing a mapping "
            "instead would save the system call, but a snapshot truncated under the mapping would kill the "
            "process with SIGBUS where pread reports it",
}


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
    write("  issue 18's rows (goal: update >= 2 M/s, update_many >= 10 M/s, read >= 1 M/s, read_many >= 5 M/s):")
    for kmem_key, peer_key, goal, limit in ISSUE_18_ROWS:
        kmem, peer = RESULTS.get(kmem_key), RESULTS.get(peer_key)
        if kmem and peer:
            write(f"    {kmem_key.replace(' kmem PidLedger', ''):<40} kmem {kmem / 1e6:6.2f} M/s   "
                  f"dict {peer / 1e6:6.2f} M/s   kmem / dict = {kmem / peer:.2f}   "
                  f"goal {goal / 1e6:g} M/s {'met' if kmem >= goal else 'not met'}")
            if kmem < goal:
                write(f"      limit: {LIMITS.get(limit, 'not profiled')}")
    ledger, heap = RESULTS.get("memory 1,000,000"), RESULTS.get("memory dict peer 1,000,000")
    if ledger and heap:
        write(f"  heap growth at 1 M ids: dict / kmem = {heap / max(ledger['rss_anon_growth_mib'], 0.1):.0f}x")
