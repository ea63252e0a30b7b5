"""Instructions a tiny request costs the server's network thread, counted by valgrind's callgrind: deterministic where
CPU times on a shared machine move by tens of percent (``.venv/bin/python bench/request_instructions.py``; needs
``valgrind``).

The servers of ``bench_request_cpu.py`` (a minimal Python ``selectors`` loop, kmem's ``SocketServer`` answering 60
bytes, ``kmem broker`` answering an empty Fetch, and ``kmem broker`` answering a Produce of 880 records of 100 B, as
librdkafka sends them) each run under callgrind twice, serving ``--requests`` and twice as many round trips of one
client process (run natively); the thread whose count grows most is the one that serves, and the growth over the
extra requests is its cost per request, start-up cancelled out. ``--only`` names one of them (``minimal``,
``network_layer``, ``broker``, ``produce``).
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
    bench.round_trips(port, int({count!r}), {kind!r})
finally:
    stop(server)
"""


# (name for --only, the server's function in bench_request_cpu, the request, what is printed)
SERVERS = (("minimal", "minimal", "fetch", "minimal Python loop"),
           ("network_layer", "network_layer", "fetch", "kmem SocketServer"),
           ("broker", "broker", "fetch", "kmem broker"),
           ("produce", "broker", "produce", "kmem broker, a Produce of 880 records of 100 B"))


def thread_totals(which, count, workdir, kind):
    """The instructions callgrind counted on each thread of a server of ``which`` serving ``count`` round trips of
    ``kind`` ("fetch" or "produce")."""
    for old in glob.glob(os.path.join(workdir, "callgrind.*")):
        os.unlink(old)
    out = os.path.join(workdir, "callgrind.%p")
    subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                    sys.executable, "-c", SERVE.format(here=HERE, which=which, count=count, kind=kind)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    totals = []
    for path in sorted(glob.glob(os.path.join(workdir, "callgrind.*-*"))):
        with open(path) as f:
            totals += [int(line.split()[1]) for line in f if line.startswith("totals:")]
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="round trips of the shorter run (default 1000)")
    parser.add_argument("--only", choices=[key for key, _, _, _ in SERVERS], help="measure this server alone")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as workdir:
        for key, which, kind, name in SERVERS:
            if args.only not in (None, key):
                continue
            shorter = thread_totals(which, args.requests, workdir, kind)
            longer = thread_totals(which, 2 * args.requests, workdir, kind)
            grown = max(after - before for before, after in zip(shorter, longer))
            print(f"{name}: {grown // args.requests} instructions a request on its serving thread")


if __name__ == "__main__":
    main()
