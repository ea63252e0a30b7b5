"""Instructions a tiny request costs the server's network thread, counted by valgrind's callgrind: deterministic where
CPU times on a shared machine move by tens of percent (``.venv/bin/python bench/request_instructions.py``; needs
``valgrind``).

The servers of ``bench_request_cpu.py`` (a minimal Python ``selectors`` loop, kmem's ``SocketServer`` answering 60
bytes, ``kmem broker`` answering an empty Fetch, and ``kmem broker`` answering a Produce of 880 records of 100 B, as
librdkafka sends them) each run under callgrind twice, serving ``--requests`` and twice as many round trips of one
client process (run natively); the thread whose count grows most is the one that serves, and the growth over the
extra requests is its cost per request, start-up cancelled out. ``--only`` names one of them (``minimal``,
``network_layer``, ``broker``, ``produce``); ``--functions N`` also lists the serving thread's N costliest
functions a request, by their own instructions (callgrind_annotate's), and its share of each object (the core,
the interpreter's library, libc).
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

SERVE = """
import os, sys
sys.path.insert(0, {here!r})
import bench_request_cpu as bench
server, port, stop = getattr(bench, {which!r})()
try:
    bench.round_trips(port, int({count!r}), {kind!r})
finally:
    stop(server)
"""


# (name for --only, the server's function in bench_request_cpu, the request, what is printed)
SERVERS = (("minimal", "minimal", "fetch", "minimal Python loop"),
           ("network_layer", "network_layer", "fetch", "kmem SocketServer"),
           ("broker", "broker", "fetch", "kmem broker"),
           ("produce", "broker", "produce", "kmem broker, a Produce of 880 records of 100 B"))


# a line of callgrind_annotate's per-function listing: instructions, share, file:function [object]
ANNOTATED = re.compile(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+?):(\S+)(?: \[(\S+)\])?")


def thread_counts(which, count, workdir, kind, by_function):
    """``[(instructions, {(object, function): its own instructions} or None)]``: what callgrind counted on each
    thread of a server of ``which`` serving ``count`` round trips of ``kind`` ("fetch" or "produce"), by function
    when ``by_function``."""
    for old in glob.glob(os.path.join(workdir, "callgrind.*")):
        os.unlink(old)
    out = os.path.join(workdir, "callgrind.%p")
    subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                    sys.executable, "-c", SERVE.format(here=HERE, which=which, count=count, kind=kind)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=dict(os.environ, PYTHONSAFEPATH="1"))      # kmem from PYTHONPATH, not the current directory
    counts = []
    for path in sorted(glob.glob(os.path.join(workdir, "callgrind.*-*"))):
        with open(path) as f:
            total = sum(int(line.split()[1]) for line in f if line.startswith("totals:"))
        functions = None
        if by_function:
            listing = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", path],
                                     capture_output=True, text=True, check=True).stdout
            functions = collections.Counter()
            for line in listing.splitlines():
                found = ANNOTATED.match(line)
                if found and "PROGRAM TOTALS" not in line:
                    # an object's name, or for code inlined from a header (CRC-32C's intrinsics, CPython's
                    # inline functions) the header's
                    where = (os.path.basename(found.group(4)).split(".")[0] if found.group(4)
                             else os.path.basename(found.group(2)) + " (inlined)")
                    functions[where, found.group(3)] += int(found.group(1).replace(",", ""))
        counts.append((total, functions))
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="round trips of the shorter run (default 1000)")
    parser.add_argument("--only", choices=[key for key, _, _, _ in SERVERS], help="measure this server alone")
    parser.add_argument("--functions", type=int, default=0, metavar="N",
                        help="also list the N functions that cost the most instructions a request, by their own")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as workdir:
        for key, which, kind, name in SERVERS:
            if args.only not in (None, key):
                continue
            shorter = thread_counts(which, args.requests, workdir, kind, args.functions)
            longer = thread_counts(which, 2 * args.requests, workdir, kind, args.functions)
            grown, before, after = max(((after[0] - before[0], before, after) for before, after in zip(shorter, longer)),
                                       key=lambda growth: growth[0])
            print(f"{name}: {grown // args.requests} instructions a request on its serving thread")
            if args.functions:
                own = {where: (after[1][where] - before[1][where]) / args.requests for where in after[1]}
                by_object = collections.Counter()
                for (obj, _), instructions in own.items():
                    by_object[obj] += instructions
                for obj, instructions in by_object.most_common(4):
                    print(f"  {instructions:9,.0f} {instructions * args.requests / grown:6.1%} in {obj}")
                for (obj, function), instructions in sorted(own.items(), key=lambda item: -item[1])[:args.functions]:
                    print(f"  {instructions:9,.0f} {instructions * args.requests / grown:6.1%} {function} ({obj})")


if __name__ == "__main__":
    main()
