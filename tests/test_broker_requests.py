"""The broker's request path: requests answered on the network thread that read them, long polls and
rebalances parked without a thread. Real clients long-poll while another produces; hundreds of parked
requests neither hold threads nor stop anyone else; a parked request whose client leaves leaks nothing;
a parked fetch completes on a roll, when enough bytes arrive over several partitions, or when its topic
goes; shutdown answers what is parked and never hangs. Raw requests use kafka-python's own codec."""
import os
import socket
import struct
import threading
import time

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse, JoinGroupRequest, JoinGroupResponse
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, \
    MetadataResponse

from broker_helpers import RawConnection, wait_for
from kmem.broker import Broker
from kmem.broker.apis import handlers
from kmem.broker.apis.handlers import FETCH_COPY_BYTES, protocol_uuid
from kmem.protocol.codegen import INLINE_RECORDS_MAX
from kmem.records import build_records

NONE, UNKNOWN_TOPIC_OR_PARTITION, COORDINATOR_NOT_AVAILABLE = 0, 3, 15


@pytest.fixture
def broker(tmp_path):
    # a bounded request pool, so that what a parked request holds of it shows
    settings = {"num.io.threads": "1", "queued.max.request.bytes": str(200 << 20)}
    with Broker(tmp_path / "logs", num_partitions=1, properties=settings) as running:
        yield running


def append(broker, topic, values, partition=0):
    if broker.logs.get_partition(topic, partition) is None:
        broker.logs.create_topic(topic, partition + 1)
    assert broker.logs.get_partition(topic, partition).append(build_records(values, magic=2)).error_code == 0


def fetch_request(topics, max_wait_ms=60_000, min_bytes=1):
    """``topics``: {name: [(partition, offset)]}."""
    return FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20, topics=[
        FetchRequest.FetchTopic(topic=name, partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=p, fetch_offset=offset, partition_max_bytes=1 << 20)
            for p, offset in partitions]) for name, partitions in topics.items()])


class ParkedFetch:
    """A raw Fetch v11 sent on its own connection; ``answer()`` waits for the response."""

    def __init__(self, broker, topics, **kwargs):
        self.connection = RawConnection(broker.bootstrap_servers)
        request = fetch_request(topics, **kwargs)
        request.with_header(correlation_id=7, client_id="parked")
        self.connection.send_frame(request.encode(version=11, header=True))

    def answer(self):
        payload = self.connection.receive_frame()
        assert payload is not None, "the broker closed the connection"
        return FetchResponse.decode(payload, version=11, header=True)

    def close(self):
        self.connection.close()


def parked(broker):
    return len(broker.handlers.fetch_purgatory)


def records_of(response):
    return [p.records for topic in response.responses for p in topic.partitions]


def test_hundreds_of_parked_fetches_hold_no_thread_and_a_produce_wakes_them(broker):
    append(broker, "idle", [b"first"])
    threads = threading.active_count()
    fetches = [ParkedFetch(broker, {"idle": [(0, 1)]}) for _ in range(200)]
    try:
        wait_for(lambda: parked(broker) == 200, "200 fetches to be parked")
        assert threading.active_count() <= threads          # with num.io.threads=1 too
        with RawConnection(broker.bootstrap_servers) as other:   # everyone else is answered meanwhile
            metadata = other.request(MetadataRequest[1](topics=["idle"]), MetadataResponse, 1)
            assert metadata.topics[0][0] == NONE
        append(broker, "idle", [b"wake"])
        answers = [fetch.answer() for fetch in fetches]
        assert all(records_of(answer)[0] for answer in answers)
        assert parked(broker) == 0 and len(broker.timer) == broker_timer_baseline(broker)
    finally:
        for fetch in fetches:
            fetch.close()


def broker_timer_baseline(broker):
    """Timer tasks of an idle broker: one per group, and the transaction coordinator's two periodic checks."""
    return sum(group.timer_task is not None for group in broker.coordinator.groups.values()) + 2


def test_a_parked_fetch_whose_client_leaves_leaks_nothing(broker):
    append(broker, "idle", [b"first"])
    fds = len(os.listdir("/proc/self/fd"))
    threads = threading.active_count()
    pool = broker.server.pool.available_memory
    fetches = [ParkedFetch(broker, {"idle": [(0, 1)]}) for _ in range(50)]
    wait_for(lambda: parked(broker) == 50, "50 fetches to be parked")
    assert broker.server.bounded and broker.server.pool.available_memory == pool     # parked: none held
    for fetch in fetches:
        fetch.close()
    wait_for(lambda: parked(broker) == 0, "the purgatory to drop the fetches of clients that left")
    wait_for(lambda: len(os.listdir("/proc/self/fd")) == fds, "the connections' descriptors to close")
    assert threading.active_count() <= threads
    assert broker.server.pool.available_memory == pool
    assert all(not processor._deferred for processor in broker.server.processors)
    assert broker.handlers.fetch_purgatory.watched(broker.logs.get_partition("idle", 0)) == 0
    assert len(broker.timer) == broker_timer_baseline(broker)


def test_min_bytes_counts_the_bytes_of_every_fetched_partition(broker):
    broker.logs.create_topic("two", 2)
    batch_size = len(build_records([b"x" * 100], magic=2))
    fetch = ParkedFetch(broker, {"two": [(0, 0), (1, 0)]}, min_bytes=batch_size + 1)
    try:
        wait_for(lambda: parked(broker) == 1, "the fetch to be parked")
        append(broker, "two", [b"x" * 100], partition=0)
        assert parked(broker) == 1                      # one batch is not min_bytes
        append(broker, "two", [b"x" * 100], partition=1)
        assert all(records_of(fetch.answer()))
    finally:
        fetch.close()


def test_a_roll_completes_a_parked_fetch(broker):
    """Kafka's case: the fetch offset is now on an older segment than the high watermark."""
    append(broker, "rolled", [b"x"])
    fetch = ParkedFetch(broker, {"rolled": [(0, 1)]}, min_bytes=1 << 20)
    try:
        wait_for(lambda: parked(broker) == 1, "the fetch to be parked")
        partition_log = broker.logs.get_partition("rolled", 0)
        partition_log.roll()
        append(broker, "rolled", [b"y"])                # a small append to the new segment
        assert records_of(fetch.answer())[0]
    finally:
        fetch.close()


def test_deleting_a_fetched_topic_completes_the_parked_fetch(broker):
    append(broker, "doomed", [b"x"])
    fetch = ParkedFetch(broker, {"doomed": [(0, 1)]})
    try:
        wait_for(lambda: parked(broker) == 1, "the fetch to be parked")
        broker.logs.delete_topic("doomed")
        partitions = fetch.answer().responses[0].partitions
        assert partitions[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
    finally:
        fetch.close()


def test_close_answers_parked_fetches_and_joins_and_never_hangs(tmp_path):
    broker = Broker(tmp_path / "logs", num_partitions=1, properties={"group.initial.rebalance.delay.ms": "60000"})
    broker.start()
    try:
        append(broker, "t", [b"there"])
        fetch = ParkedFetch(broker, {"t": [(0, 0)]}, min_bytes=1 << 20)
        joiner = RawConnection(broker.bootstrap_servers)
        joiner.request(FindCoordinatorRequest[0](key="g"), FindCoordinatorResponse, 0)
        join = JoinGroupRequest[3](group_id="g", session_timeout_ms=10_000, rebalance_timeout_ms=60_000,
                                   member_id="", protocol_type="consumer", protocols=[("range", b"")])
        join.with_header(correlation_id=3, client_id="joiner")
        joiner.send_frame(join.encode(version=3, header=True))
        wait_for(lambda: parked(broker) == 1 and "g" in broker.coordinator.groups, "the fetch and the join to park")
        closer = threading.Thread(target=broker.close)
        closer.start()
        answer = fetch.answer()                       # what is there
        assert records_of(answer)[0]
        joined = JoinGroupResponse[3].decode(joiner.receive_frame(), version=3, header=True)
        assert joined.error_code == COORDINATOR_NOT_AVAILABLE
        closer.join(30)
        assert not closer.is_alive()
        fetch.close()
        joiner.close()
    finally:
        broker.close()


def open_descriptors():
    return len(os.listdir("/proc/self/fd"))


def test_a_fetch_listing_a_partition_thousands_of_times_holds_one_descriptor_and_frees_it_when_the_client_leaves(
        broker):
    """One Fetch lists a partition 3,000 times (Kafka reads and answers it once), parks, is answered at its
    deadline, and its client leaves without reading: no descriptor per listing, and the one of the
    response's file region is closed as soon as the connection is, with no other request served."""
    for _ in range(32):
        append(broker, "big", [b"x" * (512 << 10)])                    # 16 MiB: more than the sockets take
    baseline = open_descriptors()
    connection = RawConnection(broker.bootstrap_servers)
    connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request = fetch_request({"big": [(0, 0)] * 3000}, max_wait_ms=100, min_bytes=1 << 30)
    for partition in request.topics[0].partitions:
        partition.partition_max_bytes = 16 << 20
    request.max_bytes = 1 << 30
    request.with_header(correlation_id=1, client_id="repeats")
    connection.send_frame(request.encode(version=11, header=True))
    assert connection.sock.recv(4, socket.MSG_PEEK)                 # its response is under way
    assert open_descriptors() - baseline <= 10                      # the two ends of the connection, the region
    connection.close()
    wait_for(lambda: open_descriptors() <= baseline, "the response's descriptors to close")


@pytest.mark.parametrize("copy_bytes", [FETCH_COPY_BYTES, 1000])
def test_small_slices_are_read_into_the_fetch_response_and_large_ones_go_from_their_file(broker, monkeypatch,
                                                                                       copy_bytes):
    """A consumer at the tail of many partitions reads a little of each: a slice of at most INLINE_RECORDS_MAX
    bytes is read into the response while its copies stay within FETCH_COPY_BYTES; a larger one, and those past
    the budget, are sent from their file. Each partition's records are its log's bytes, either way."""
    monkeypatch.setattr(handlers, "FETCH_COPY_BYTES", copy_bytes)
    broker.logs.create_topic("small", 20)
    for p in range(20):
        append(broker, "small", [b"s%02d" % p * 50], partition=p)
    append(broker, "large", [os.urandom(INLINE_RECORDS_MAX)])
    stored = {}
    for topic, partitions in (("small", 20), ("large", 1)):
        for p in range(partitions):
            with broker.logs.get_partition(topic, p).read(0, 1 << 20).records as records:
                stored[topic, p] = records.read(0, records.size_in_bytes)
    sent = []
    real_sendfile = os.sendfile
    monkeypatch.setattr(os, "sendfile", lambda out, fd, offset, count: sent.append(count) or real_sendfile(
        out, fd, offset, count))
    request = fetch_request({"small": [(p, 0) for p in range(20)], "large": [(0, 0)]}, max_wait_ms=0)
    with RawConnection(broker.bootstrap_servers) as connection:
        response = connection.request(request, FetchResponse, 11)
    answered = {(topic.topic, p.partition_index): p.records for topic in response.responses for p in topic.partitions}
    assert answered == stored
    small = len(stored["small", 0])
    copied = min(20, copy_bytes // small)
    assert 0 < copied < 20 if copy_bytes < FETCH_COPY_BYTES else copied == 20
    # the small slices past the budget and the large one, each from its file
    assert sorted(set(sent)) == sorted({small} if copied < 20 else set()) + [len(stored["large", 0])]
    assert sum(sent) == (20 - copied) * small + len(stored["large", 0])


@pytest.mark.parametrize("version", [11, 13])
def test_a_partition_listed_again_is_answered_once_in_its_first_place_with_its_last_fields(broker, version):
    """Kafka's ``FetchRequest.fetchData``: one entry per partition, first place, last fields; the response
    has one topic per run of partitions of a topic."""
    append(broker, "t", [b"zero"])
    append(broker, "t", [b"one"])
    append(broker, "u", [b"u"])
    topic_ids = {name: protocol_uuid(info.topic_id) for name, info in broker.logs.topics().items()}
    listed = [("t", 0, 0, 1 << 20), ("u", 0, 0, 1 << 20), ("t", 0, 1, 1 << 20), ("u", 0, 0, 0)]
    request = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, topics=[
        FetchRequest.FetchTopic(topic=name, topic_id=topic_ids[name], partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=p, fetch_offset=offset, partition_max_bytes=limit)])
        for name, p, offset, limit in listed])
    with RawConnection(broker.bootstrap_servers) as connection:
        response = connection.request(request, FetchResponse, version)
    answered = [(topic.topic if version < 13 else topic.topic_id, [p.partition_index for p in topic.partitions])
                for topic in response.responses]
    assert answered == [("t", [0]), ("u", [0])] if version < 13 else [(topic_ids["t"], [0]), (topic_ids["u"], [0])]
    t_records, u_records = records_of(response)
    assert struct.unpack_from(">q", t_records)[0] == 1              # from the last listing's offset
    assert not u_records                                            # the last listing's max bytes: 0


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python", "aiokafka"])
def test_real_clients_long_polling_get_records_as_soon_as_they_arrive(broker, client):
    """A consumer waits with a long fetch.wait.max.ms on an empty topic; the record produced meanwhile
    reaches it long before that deadline (woken by the append, not answered at max_wait_ms)."""
    append(broker, "poll", [b"before"])
    consumer = LongPollingConsumer.start(client, broker.bootstrap_servers, "poll", wait_ms=20_000)
    try:
        assert consumer.next() == b"before"
        received = []
        reader = threading.Thread(target=lambda: received.append((consumer.next(), time.monotonic())))
        reader.start()                                       # kafka-python fetches only inside poll()
        wait_for(lambda: parked(broker) == 1, "the consumer's fetch to be parked")
        produced_at = time.monotonic()
        append(broker, "poll", [b"after"])
        reader.join(30)
        value, received_at = received[0]
        assert value == b"after"
        assert received_at - produced_at < 10                # the deadline was 20 s away
    finally:
        consumer.close()


class LongPollingConsumer:
    """One of the Python clients reading a topic from offset 0 with a long fetch wait."""

    @staticmethod
    def start(client, bootstrap, topic, wait_ms):
        return {"confluent-kafka": _Confluent, "kafka-python": _KafkaPython, "aiokafka": _AioKafka}[client](
            bootstrap, topic, wait_ms)


class _Confluent:
    def __init__(self, bootstrap, topic, wait_ms):
        from confluent_kafka import Consumer, TopicPartition
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "fetch.wait.max.ms": wait_ms,
                                  "enable.auto.commit": False})
        self.consumer.assign([TopicPartition(topic, 0, 0)])

    def next(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = self.consumer.poll(0.5)
            if message is not None and not message.error():
                return message.value()
        raise AssertionError("no record")

    def close(self):
        self.consumer.close()


class _KafkaPython:
    def __init__(self, bootstrap, topic, wait_ms):
        from kafka import KafkaConsumer, TopicPartition
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=wait_ms,
                                      request_timeout_ms=wait_ms + 10_000, enable_auto_commit=False)
        self.consumer.assign([TopicPartition(topic, 0)])
        self.consumer.seek(TopicPartition(topic, 0), 0)
        self.pending = []

    def next(self):
        deadline = time.monotonic() + 30
        while not self.pending and time.monotonic() < deadline:
            for records in self.consumer.poll(500).values():
                self.pending += [record.value for record in records]
        assert self.pending, "no record"
        return self.pending.pop(0)

    def close(self):
        self.consumer.close()


class _AioKafka:
    def __init__(self, bootstrap, topic, wait_ms):
        import asyncio

        from aiokafka import AIOKafkaConsumer, TopicPartition
        async def started():
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=wait_ms,
                                        request_timeout_ms=wait_ms + 10_000, enable_auto_commit=False)
            await consumer.start()
            consumer.assign([TopicPartition(topic, 0)])
            consumer.seek(TopicPartition(topic, 0), 0)
            return consumer

        self.loop = asyncio.new_event_loop()
        self.consumer = self.loop.run_until_complete(started())

    def next(self):
        import asyncio
        record = self.loop.run_until_complete(asyncio.wait_for(self.consumer.getone(), 30))
        return record.value

    def close(self):
        self.loop.run_until_complete(self.consumer.stop())
        self.loop.close()
