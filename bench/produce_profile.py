"""Where kmem broker's CPU time goes while a confluent-kafka producer sends 100 B records, sampled by ``perf``
(``.venv/bin/python bench/produce_profile.py``; needs Debian's ``linux-perf`` and root, or
``kernel.perf_event_paranoid`` at most 1).

The load is ``bench_produce_path.py``'s CPU-per-GB row (acks=all, idempotent, ``linger.ms`` 5, round-robin over
``--partitions``, default 8), ``--mb`` MB of record values (default 1024), against a ``kmem broker`` process whose
every thread ``perf record`` samples with DWARF call stacks. Each sample is put where its innermost frame's code is:

- ``kernel``: by the system call it serves (named by the C library's wrapper the stack enters the kernel from), or
  ``no system call`` (interrupts, page faults, the scheduler on the way out);
- ``core``: kmem's compiled core (``kmem._core``), by function;
- ``interpreter``: CPython's library and the object handling compiled into the core (CPython's inline functions,
  Cython's helpers), by the core function whose call reached it (the Cython code that touched a Python object),
  or ``Python code`` when the nearest caller is the bytecode loop (the network thread's Python);
- ``other``: the C library and the rest.

Printed: the broker's CPU seconds per GB over the sampled run (sampling costs the broker CPU time of its own:
``bench_produce_path.py`` gives the unsampled figure), each part's share of the samples, and each part's costliest
entries.
"""
import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CORE, INTERPRETER = "_core.", "libpython"
# CPython's inline functions and Cython's helpers compiled into the core: work on Python objects
OBJECT_GLUE = ("Py", "_Py", "__Pyx_")


def where(frame):
    """``(symbol, object)`` of a ``perf script`` stack line: ``address symbol+offset (object)``."""
    address, _, rest = frame.strip().partition(" ")
    symbol, _, obj = rest.rpartition(" (")
    return symbol.split("+0x")[0], obj.rstrip(")")


def part_of(frames):
    """``(part, entry)`` of one sample's stack, innermost frame first."""
    symbol, obj = frames[0]
    # an inlined function's object is the next frame's: the function it was inlined into
    obj = next((o for _, o in frames if o != "inlined"), obj)
    if obj.startswith("[kernel"):
        user = next((s for s, o in frames if not o.startswith("[kernel")), None)
        entered = any(s in ("do_syscall_64", "entry_SYSCALL_64_after_hwframe") for s, _ in frames)
        return "kernel", user.removeprefix("__GI_").removeprefix("__libc_") if entered and user else "no system call"
    if CORE in obj and not symbol.startswith(OBJECT_GLUE):
        return "core", symbol
    if INTERPRETER in obj or CORE in obj:
        for caller, _ in frames[1:]:
            if caller.startswith("_PyEval_EvalFrameDefault"):
                return "interpreter", "Python code"
            if caller.startswith("__pyx_"):       # a Cython function of the core (not one of its helpers)
                return "interpreter", caller
        return "interpreter", "no core caller (the garbage collector, a thread's start)"
    return "other", f"{symbol} ({os.path.basename(obj)})"


def samples(script):
    """The stacks of ``perf script``'s output, innermost frame first."""
    for block in script.split("\n\n"):
        lines = [line for line in block.splitlines() if line.startswith(("\t", " "))]
        if lines:
            yield [where(line) for line in lines]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="MB of record values to send (default 1024)")
    parser.add_argument("--partitions", type=int, default=8, help="partitions to send to (default 8)")
    parser.add_argument("--frequency", type=int, default=2000, help="samples a second (default 2000)")
    parser.add_argument("--entries", type=int, default=8, help="entries listed per part (default 8)")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf is not installed (Debian: apt-get install linux-perf)")
    os.environ["KMEM_BENCH_THROUGHPUT_MB"] = str(args.mb)    # read by bench_broker_throughput at import
    sys.path.insert(0, HERE)
    from bench_broker_throughput import GB, layout, produce, warm_producer
    from peers import BrokerProcess, create_topics

    size = 100
    with tempfile.TemporaryDirectory() as workdir:
        data = os.path.join(workdir, "perf.data")
        with BrokerProcess(os.path.join(workdir, "kmem"), {"message_max_bytes": 4 << 20}) as broker:
            topics, per_topic = layout("profile", args.partitions)
            create_topics(broker.bootstrap, topics, per_topic)
            targets = [(topic, p) for p in range(per_topic) for topic in topics]
            producer = warm_producer(broker.bootstrap, targets, size, "none")
            recorder = subprocess.Popen(
                ["perf", "record", "-F", str(args.frequency), "--call-graph", "dwarf,16384", "-p",
                 str(broker.process.pid), "-o", data], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 30
            while not os.path.exists(data) or not os.path.getsize(data):    # perf writes its header once attached
                if recorder.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"perf record did not start: {recorder.communicate()[1].strip()}")
                time.sleep(0.01)
            cpu = broker.cpu_seconds()
            count = produce(producer, targets, size)
            cpu = broker.cpu_seconds() - cpu
            recorder.send_signal(signal.SIGINT)
            _, errors = recorder.communicate()
            if recorder.returncode not in (0, -2):
                sys.exit(f"perf record failed: {errors.strip()}")
        script = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,dso"], capture_output=True,
                                text=True, check=True).stdout
    parts, entries, total = collections.Counter(), collections.defaultdict(collections.Counter), 0
    for stack in samples(script):
        part, entry = part_of(stack)
        parts[part] += 1
        entries[part][entry] += 1
        total += 1
    if not total:
        sys.exit("perf recorded no sample of the broker")
    print(f"kmem broker, {count * size / 1e6:.0f} MB of 100 B records over {args.partitions} partition(s): "
          f"{cpu / (count * size / GB):.2f} CPU s/GB while sampled, {total} samples")
    for part, n in parts.most_common():
        print(f"{n / total:6.1%} {part}")
        for entry, m in entries[part].most_common(args.entries):
            print(f"    {m / total:6.1%} {entry}")


if __name__ == "__main__":
    main()
