"""Benchmark support: each benchmark records its per-operation time under a comparison group, and the
run ends with one table per group giving every contender's time and its ratio to kmem's."""
import collections
import math

import pytest

_results = collections.defaultdict(dict)     # group -> contender -> seconds per operation


def seconds_per_call(benchmark, statistic="median"):
    """A statistic of the benchmark's timings, in seconds per call; NaN under ``--benchmark-disable``,
    where pytest-benchmark runs each function once, untimed (the quick check that every bench runs)."""
    return math.nan if benchmark.stats is None else getattr(benchmark.stats.stats, statistic)


@pytest.fixture
def timing(benchmark):
    """``timing()`` / ``timing("min")``: ``seconds_per_call`` of this test's benchmark."""
    return lambda statistic="median": seconds_per_call(benchmark, statistic)


class Comparison:
    """Run a pytest-benchmark and file its per-op time for the side-by-side table."""

    def __init__(self, benchmark):
        self._benchmark = benchmark

    def __call__(self, group, contender, func, ops_per_call=1, unit_bytes=None, rounds=None, setup=None):
        """``rounds``: run ``func`` exactly that many times (``setup`` before each), for operations that
        take seconds."""
        if rounds is None:
            result = self._benchmark(func)
        else:
            result = self._benchmark.pedantic(func, setup=setup, rounds=rounds, iterations=1)
        seconds = seconds_per_call(self._benchmark) / ops_per_call
        _results[group][contender] = (seconds, unit_bytes)
        self._benchmark.extra_info.update(group=group, contender=contender, seconds_per_op=seconds)
        return result


@pytest.fixture
def compare(benchmark):
    return Comparison(benchmark)


def pytest_terminal_summary(terminalreporter):
    if not _results:
        return
    write = terminalreporter.write_line
    terminalreporter.section("kmem vs peers (median per operation; ratio = peer time / kmem time)")
    for group, contenders in _results.items():
        write(f"{group}:")
        kmem = contenders.get("kmem", (None, None))[0]
        for name, (seconds, unit_bytes) in contenders.items():
            line = f"    {name:<28} {seconds * 1e9:>14,.1f} ns/op"
            if unit_bytes:
                line += f"  {unit_bytes / seconds / 1e6:>10,.1f} MB/s"
            if kmem and name != "kmem":
                line += f"   kmem is {seconds / kmem:,.1f}x faster"
            write(line)
