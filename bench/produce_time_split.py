"""Where a live Produce's CPU time goes in the broker (``.venv/bin/python bench/produce_time_split.py``).

A broker runs in this process with its network threads; a confluent-kafka producer in another process sends
``KMEM_BENCH_THROUGHPUT_MB`` (default 64) MB of ``RECORD_BYTES`` (default 100) B records over ``PARTITIONS``
(default 8) partitions, as ``bench_broker_throughput.py`` does. The dispatcher, the Produce handler, the log's
append and the parts of it below are wrapped to add up their thread CPU time. Printed: the requests, the broker
process's CPU per request, and each part's CPU per request (µs; a part includes the parts below it: the
dispatcher the handler, the handler the log's append, the log's append the validator, producer state and the
segment's append, the validator the core's check, the segment's append the core's write). The dispatcher's
time against the process's is the network loop's share. Each wrapper adds about half a microsecond.
"""
import functools
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PARTITIONS = int(os.environ.get("PARTITIONS", "8"))
RECORD_BYTES = int(os.environ.get("RECORD_BYTES", "100"))
TOTAL_MB = int(os.environ.get("KMEM_BENCH_THROUGHPUT_MB", "64"))

PRODUCER = """
import sys
sys.path.insert(0, sys.argv[1])
import bench_broker_throughput as throughput
from peers import create_topics
bootstrap, partitions, size = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
topics, per_topic = throughput.layout("split", partitions)
create_topics(bootstrap, topics, per_topic)
targets = [(topic, p) for p in range(per_topic) for topic in topics]
producer = throughput.warm_producer(bootstrap, targets, size, "none")
print("warm", flush=True)
sys.stdin.readline()
throughput.produce(producer, targets, size)
print("done", flush=True)
"""


def timed(owner, name, totals, key):
    """Replace ``owner.name`` by a wrapper adding its thread CPU time and its call to ``totals[key]``."""
    function = getattr(owner, name)
    totals[key] = [0, 0]

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        started = time.thread_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            totals[key][0] += time.thread_time_ns() - started
            totals[key][1] += 1

    setattr(owner, name, wrapper)


def main():
    import types

    from kmem import _core
    from kmem.broker import Broker
    from kmem.broker.apis import dispatch, handlers
    from kmem.broker.log import producer_state, segment, unified_log, validator

    totals = {}
    timed(dispatch.RequestDispatcher, "__call__", totals, "dispatcher")
    timed(handlers.Handlers, "produce", totals, "Produce handler")
    timed(unified_log.PartitionLog, "append", totals, "log append")
    timed(unified_log, "validate_and_assign", totals, "validator")
    for name in ("check", "reserve", "apply"):
        timed(producer_state.ProducerStateManager, name, totals, f"producer state {name}")
    timed(segment.LogSegment, "append", totals, "segment append")
    # the core calls, through a copy of the module seen by the validator and the segment only
    for module, name in ((validator, "assign_v2_batches"), (segment, "append_segment")):
        core = types.SimpleNamespace(**{n: getattr(_core, n) for n in dir(_core) if not n.startswith("__")})
        timed(core, name, totals, f"core {name}")
        module._core = core

    with tempfile.TemporaryDirectory() as directory:
        broker = Broker(directory, port=0, message_max_bytes=4 << 20).start()
        try:
            producer = subprocess.Popen(
                [sys.executable, "-c", PRODUCER, HERE, broker.bootstrap_servers, str(PARTITIONS), str(RECORD_BYTES)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                env=dict(os.environ, KMEM_BENCH_THROUGHPUT_MB=str(TOTAL_MB)))
            assert producer.stdout.readline().strip() == "warm"
            before, counted = resource.getrusage(resource.RUSAGE_SELF), {k: list(v) for k, v in totals.items()}
            producer.stdin.write("go\n")
            producer.stdin.flush()
            assert producer.stdout.readline().strip() == "done"
            after = resource.getrusage(resource.RUSAGE_SELF)
            producer.stdin.close()
            assert producer.wait(60) == 0
        finally:
            broker.close()
    requests = totals["dispatcher"][1] - counted["dispatcher"][1]
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"{requests} requests (all but a few Produce) of {TOTAL_MB} MB of {RECORD_BYTES} B records over "
          f"{PARTITIONS} partitions: broker process {cpu / requests * 1e6:.1f} µs of CPU a request "
          f"({cpu / (TOTAL_MB / 1000):.2f} s/GB)")
    for key, value in totals.items():
        print(f"  {key:<28} {(value[0] - counted[key][0]) / requests / 1000:7.1f} µs")


if __name__ == "__main__":
    main()
