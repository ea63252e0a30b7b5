"""Where a live Produce's CPU time goes in the broker (``.venv/bin/python bench/produce_time_split.py``).

A broker runs in this process with its network threads; a confluent-kafka producer in another process sends
``KMEM_BENCH_THROUGHPUT_MB`` (default 64) MB of ``RECORD_BYTES`` (default 100) B records over ``PARTITIONS``
(default 8) partitions, as ``bench_broker_throughput.py`` does. The dispatcher, the Produce handler, the log's
append and the parts of it below are wrapped to add up their thread CPU time. Printed: the requests, the broker
process's CPU per request, and each part's CPU per request (µs; a part includes the parts below it: the
dispatcher the handler (for its common case the core's ``ProduceLane``), the handler the log's append, the log's
append (one core call, ``LogAppender.append_to``) the validator's common case (``_core.assign_common_case``: the
core's check and offsets), producer state and the segment's append (the core's write)). The dispatcher's time against the process's is the network loop's share.
Each wrapper adds about half a microsecond.

``--core-only``: the Produce handler is replaced by one that only has each partition's records checked and given
offsets by the core and written by it (``_core.assign_v2_batches``, ``_core.append_segment``), answering with
the offsets: no producer state, index entries, roll decision, metrics or error handling (never use it otherwise).
Its figures against the real handler's are what the handler's and the log's Python cost a live request.
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


def core_only_produce(handlers, header, request):
    """The Produce handler of ``--core-only`` (see the module docstring)."""
    from kmem import _core
    from kmem.broker.log.validator import BatchInfo
    from kmem.protocol import messages

    response = messages.ProduceResponse(throttle_time_ms=0, responses=[])
    for topic in request.topic_data:
        answers = messages.ProduceResponse.TopicProduceResponse(name=topic.name, partition_responses=[])
        response.responses.append(answers)
        for data in topic.partition_data:
            partition_log = handlers.logs.get_partition(topic.name, data.index)
            with partition_log._lock:
                segment = partition_log.active
                found = _core.assign_v2_batches(
                    data.records, next_offset=partition_log.log_end_offset, leader_epoch=0, log_append_time=-1,
                    from_client=True, max_message_bytes=1 << 30, segment_bytes=1 << 30, codec=-1, keyless=False,
                    low=-(1 << 63), high=(1 << 63) - 1, info_class=BatchInfo)
                validated = found[0]
                segment.size += _core.append_segment(segment._fd, validated.pieces, segment.size)
                base = partition_log.log_end_offset
                partition_log.log_end_offset = segment.next_offset = validated.last_offset + 1
            answers.partition_responses.append(messages.ProduceResponse.PartitionProduceResponse(
                index=data.index, error_code=0, base_offset=base, log_append_time_ms=-1, log_start_offset=0))
    return response


def main():
    from kmem import _core
    from kmem.broker import Broker
    from kmem.broker.apis import dispatch, handlers
    from kmem.broker.log import producer_state, segment, unified_log

    if "--core-only" in sys.argv[1:]:
        handlers.Handlers.produce = core_only_produce
    totals = {}
    timed(dispatch.RequestDispatcher, "__call__", totals, "dispatcher")
    timed(handlers.Handlers, "produce", totals, "Produce handler")
    timed(unified_log.PartitionLog, "append", totals, "log append")
    timed(_core, "assign_common_case", totals, "validator (core)")     # the log's core call finds it there
    for name in ("check", "reserve", "apply"):
        timed(producer_state.ProducerStateManager, name, totals, f"producer state {name}")
    timed(segment.LogSegment, "append", totals, "segment append (core)")

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
