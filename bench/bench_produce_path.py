"""The Produce path's cost in the broker (``.venv/bin/pytest bench/bench_produce_path.py -s``), issue 39's figures:

- the broker time of one Produce request (acks=1, one batch of one 1 KiB record from an idempotent producer),
  from its payload to its encoded response: ``RequestDispatcher`` called in the broker's own process, on a
  started ``Broker`` writing its log to disk, ``REQUESTS`` times; the median and p99 are printed;
- produce CPU seconds per GB of 100 B records with a confluent-kafka producer (as
  ``bench_broker_throughput.py`` sends them: acks=all, idempotent, ``linger.ms`` 5), 1 and 8 partitions,
  kmem broker side by side with librdkafka's mock cluster in the same run, ``KMEM_BENCH_THROUGHPUT_MB``
  (default 64) MB of values each, and kmem's CPU per GB as a ratio to the mock's.
"""
import gc
import time

import pytest

from bench_broker_throughput import GB, TOTAL_MB, layout, produce, timed, warm_producer
from peers import BrokerProcess, MockCluster, create_topics

REQUESTS = 5000
RECORD_BYTES = 1024

lines = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    for line in lines:
        print(line)


class _Request:
    """What ``RequestDispatcher`` reads of a request on the network thread (no quotas, no authorizer)."""

    principal = None
    listener_name = "PLAINTEXT"

    def __init__(self, payload):
        self.payload = payload


def produce_payloads(count):
    """``count`` Produce v9 payloads to "hot"-0, each one batch of one record, sequences in order."""
    from kmem.protocol import encode_request, messages
    from kmem.records import build_records

    P = messages.ProduceRequest
    value = bytes(RECORD_BYTES)
    payloads = []
    for sequence in range(count):
        records = build_records([{"value": value, "timestamp": int(time.time() * 1000)}], producer_id=1000,
                                producer_epoch=0, base_sequence=sequence)
        body = P(transactional_id=None, acks=1, timeout_ms=30000, topic_data=[P.TopicProduceData(
            name="hot", partition_data=[P.PartitionProduceData(index=0, records=records)])])
        payloads.append(bytes(encode_request(body, 9, sequence, "bench")))
    return payloads


def test_produce_request_broker_time(tmp_path):
    from kmem.broker import Broker
    from kmem.protocol import ApiKey, decode_response

    payloads = produce_payloads(REQUESTS)
    broker = Broker(tmp_path / "kmem", port=0).start()
    try:
        broker.logs.create_topic("hot")
        gc.freeze()             # as `kmem broker` does once started
        handle = broker.server.handler
        times, cpu_times = [], []
        for payload in payloads:
            request = _Request(payload)
            started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
            response = handle(request)
            times.append(time.perf_counter_ns() - started)
            cpu_times.append(time.thread_time_ns() - cpu_started)
        _, last = decode_response(response, ApiKey.PRODUCE, 9)
        assert last.responses[0].partition_responses[0].error_code == 0
        assert broker.logs.get_partition("hot", 0).log_end_offset == REQUESTS
    finally:
        broker.close()
        gc.unfreeze()
    times.sort()
    cpu_times.sort()
    median, p99, cpu = times[len(times) // 2], times[len(times) * 99 // 100], cpu_times[len(cpu_times) // 2]
    lines.append(f"one-batch Produce of {RECORD_BYTES} B (v9, acks=1, idempotent), broker time over {REQUESTS} "
                 f"requests: median {median / 1000:.1f} us, p99 {p99 / 1000:.1f} us; the thread's CPU time: median "
                 f"{cpu / 1000:.1f} us")


@pytest.mark.parametrize("partitions", [1, 8])
def test_small_records_cpu_per_gb(tmp_path, partitions):
    size, figures = 100, {}
    for start in (lambda: BrokerProcess(tmp_path / "kmem", {"message_max_bytes": 4 << 20}), MockCluster):
        with start() as broker:
            topics, per_topic = layout(f"small-{partitions}", partitions)
            create_topics(broker.bootstrap, topics, per_topic)
            targets = [(topic, p) for p in range(per_topic) for topic in topics]
            producer = warm_producer(broker.bootstrap, targets, size, "none")
            count, seconds, cpu = timed(broker, lambda: produce(producer, targets, size))
            produced = count * size / GB
            figures[broker.name] = (produced * 1000 / seconds, cpu / produced)
    (kmem_rate, kmem_cpu), (mock_rate, mock_cpu) = figures["kmem"], figures["mock"]
    lines.append(f"{TOTAL_MB} MB of 100 B records, {partitions} partition(s), confluent-kafka: kmem {kmem_rate:.1f} "
                 f"MB/s {kmem_cpu:.2f} CPU s/GB; mock {mock_rate:.1f} MB/s {mock_cpu:.2f} CPU s/GB; kmem/mock CPU per GB "
                 f"{kmem_cpu / mock_cpu:.2f}, throughput {kmem_rate / mock_rate:.2f}")
