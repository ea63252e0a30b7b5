"""Bloom filter speed: kmem beside rbloom and pybloomfiltermmap3, 1 M 64-bit ids into a 1 M / 1% filter.

Run: .venv/bin/pytest bench/bench_bloom.py
At the end a table gives ids/s per case and kmem's ratio to each peer. Peers:
- rbloom with Python's own hash (fast, but salted per process: its filters cannot be persisted and
  shared) and with a stable hash (mmh3 over the same 8 bytes, what persisting requires);
- pybloomfiltermmap3 (persistable, its own hashing).
kmem always uses the persistable commons-collections hashing.
"""
import struct

import mmh3
import numpy as np
import pybloomfilter
import pytest
import rbloom

from kmem.bloom import BloomFilter, Shape

N = 1_000_000
P = 0.01
ROUNDS = 5
IDS = np.random.default_rng(2024).integers(-(2**63), 2**63 - 1, N, dtype=np.int64)
ID_LIST = IDS.tolist()
RESULTS = {}        # (case, implementation) -> ids per second (median round)


def stable_hash(pid):
    """A process-independent 128-bit hash for rbloom (signed, as rbloom requires)."""
    return mmh3.hash128(struct.pack(">q", pid), 0, True, True)


def kmem_filter():
    return BloomFilter(Shape.from_np(N, P))


def filled(make, add):
    bf = make()
    add(bf)
    return bf


def loop_add(bf):
    add = bf.add
    for pid in ID_LIST:
        add(pid)


def loop_contains(bf):
    hits = 0
    for pid in ID_LIST:
        hits += pid in bf
    assert hits == N


CASES = {
    "batch add": {
        "kmem add_many": (kmem_filter, lambda bf: bf.add_many(IDS)),
        "rbloom update (python hash)": (lambda: rbloom.Bloom(N, P), lambda bf: bf.update(ID_LIST)),
        "pybloomfiltermmap3 update": (lambda: pybloomfilter.BloomFilter(N, P), lambda bf: bf.update(ID_LIST)),
    },
    "batch query": {
        "kmem contains_many": (lambda: filled(kmem_filter, lambda bf: bf.add_many(IDS)),
                               lambda bf: bf.contains_many(IDS).all()),
    },
    "per-item add": {
        "kmem add": (kmem_filter, loop_add),
        "rbloom add (python hash)": (lambda: rbloom.Bloom(N, P), loop_add),
        "rbloom add (stable hash)": (lambda: rbloom.Bloom(N, P, stable_hash), loop_add),
        "pybloomfiltermmap3 add": (lambda: pybloomfilter.BloomFilter(N, P), loop_add),
    },
    "per-item in": {
        "kmem in": (lambda: filled(kmem_filter, loop_add), loop_contains),
        "rbloom in (python hash)": (lambda: filled(lambda: rbloom.Bloom(N, P), loop_add), loop_contains),
        "rbloom in (stable hash)": (lambda: filled(lambda: rbloom.Bloom(N, P, stable_hash), loop_add),
                                    loop_contains),
        "pybloomfiltermmap3 in": (lambda: filled(lambda: pybloomfilter.BloomFilter(N, P), loop_add),
                                  loop_contains),
    },
}

# The batch-query peers are their per-item loops (neither offers a batch query).
CASES["batch query"].update({k: v for k, v in CASES["per-item in"].items() if not k.startswith("kmem")})


def print_table(write):
    write("")
    write(f"Bloom filters, {N:,} ids, 1% filter: millions of ids/s (median of {ROUNDS}), kmem / peer")
    for case, impls in CASES.items():
        kmem = [v for (c, name), v in RESULTS.items() if c == case and name.startswith("kmem")]
        for name in impls:
            if (case, name) in RESULTS:
                speed = RESULTS[case, name]
                ratio = "" if name.startswith("kmem") or not kmem else f"  kmem x{kmem[0] / speed:.1f}"
                write(f"  {case:13} {name:30} {speed / 1e6:7.1f} M/s{ratio}")
    # The yardstick: kmem's batch calls against rbloom's per-item loop with Python's hash.
    yardsticks = [("batch add", "kmem add_many", "per-item add", "rbloom add (python hash)"),
                  ("batch query", "kmem contains_many", "per-item in", "rbloom in (python hash)")]
    for batch, kmem_name, loop, peer in yardsticks:
        if (batch, kmem_name) in RESULTS and (loop, peer) in RESULTS:
            write(f"  {kmem_name} / {peer} loop: x{RESULTS[batch, kmem_name] / RESULTS[loop, peer]:.1f}")


@pytest.fixture(scope="module", autouse=True)
def report(request):
    # Printed when pytest closes, after output capture has ended, so the table is always shown.
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    request.config.add_cleanup(lambda: print_table(tr.write_line if tr else print))


@pytest.mark.parametrize("case,name", [(c, n) for c, impls in CASES.items() for n in impls])
def test_bloom(benchmark, timing, case, name):
    make, run = CASES[case][name]
    bf = make()
    benchmark.group = f"bloom {case}"
    benchmark.pedantic(run, args=(bf,), rounds=ROUNDS, iterations=1, warmup_rounds=1)
    RESULTS[case, name] = N / timing()
    benchmark.extra_info["ids_per_second"] = RESULTS[case, name]
