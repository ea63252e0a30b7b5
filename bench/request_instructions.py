"""Instructions a tiny request costs the server's network thread, counted by valgrind's callgrind: deterministic where
CPU times on a shared machine move by tens of percent (``.venv/bin/python bench/request_instructions.py``; needs
``valgrind``).

The servers of ``bench_request_cpu.py`` (a minimal Python ``selectors`` loop, kmem's ``SocketServer`` answering 60
bytes, ``kmem broker`` answering an empty Fetch) each run under callgrind twice, serving ``--requests`` and twice as
many round trips of one client process (run natively); the thread whose count grows most is the one that serves, and
the growth over the extra requests is its cost per request, start-up cancelled out.
"""
import argparse
import glob
import os
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
    bench.round_trips(port, int({count!r}))
finally:
    stop(server)
"""


def thread_totals(which, count, workdir):
    """The instructions callgrind counted on each thread of a server of ``which`` serving ``count`` round trips."""
    for old in glob.glob(os.path.join(workdir, "callgrind.*")):
        os.unlink(old)
    out = os.path.join(workdir, "callgrind.%p")
    subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                    sys.executable, "-c", SERVE.format(here=HERE, which=which, count=count)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    totals = []
    for path in sorted(glob.glob(os.path.join(workdir, "callgrind.*-*"))):
        with open(path) as f:
            totals += [int(line.split()[1]) for line in f if line.startswith("totals:")]
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="round trips of the shorter run (default 1000)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as workdir:
        for which, name in (("minimal", "minimal Python loop"), ("network_layer", "kmem SocketServer"),
                            ("broker", "kmem broker")):
            shorter = thread_totals(which, args.requests, workdir)
            longer = thread_totals(which, 2 * args.requests, workdir)
            grown = max(after - before for before, after in zip(shorter, longer))
            print(f"{name}: {grown // args.requests} instructions a request on its serving thread")


if __name__ == "__main__":
    main()
