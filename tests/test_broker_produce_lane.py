"""A Produce's common case answered whole by the compiled core (``_core.ProduceLane``): the same answers, logs
and meters as ``Handlers.produce``'s Python path, for random requests mixing the common case with everything
it leaves to Python (acks out of range, internal, unknown and deleted topics, partitions listed twice,
transactional, corrupt, missing and two-batch records, old versions, duplicates and sequence gaps)."""
import os
import pathlib
import random
import time
from types import SimpleNamespace

import pytest

from kmem import _core
from kmem.broker import Broker
from kmem.broker.apis import handlers as handlers_module
from kmem.metrics import ALL_TOPICS
from kmem.protocol import encode_request, messages
from kmem.records import build_records

P = messages.ProduceRequest


def _request(payload):
    """What ``RequestDispatcher`` reads of a request (no quotas, no authorizer; no times tallied)."""
    return SimpleNamespace(payload=payload, principal=None, listener_name="PLAINTEXT", measure=lambda *args: None)


class _CountingLane:
    """The core's lane, what it took and left counted; ``python_only`` sends every request to the Python path."""

    def __init__(self, lane):
        self.lane, self.python_only, self.taken, self.left = lane, False, 0, 0

    def produce(self, handlers, version, request):
        if self.python_only:
            return False
        response = self.lane.produce(handlers, version, request)
        if response is False:
            self.left += 1
        else:
            self.taken += 1
        return response

    def answer_appended(self, *args):
        return self.lane.answer_appended(*args)


@pytest.fixture
def counting_lane(monkeypatch):
    lane = _CountingLane(handlers_module._PRODUCE_LANE)
    monkeypatch.setattr(handlers_module, "_PRODUCE_LANE", lane)
    return lane


def _encoded(response):
    if isinstance(response, (bytes, bytearray)):
        return bytes(response)
    chunks = []

    class Sink:
        @staticmethod
        def write(buffers):
            buffers = [buffers] if isinstance(buffers, memoryview) else buffers
            chunks.extend(bytes(b) for b in buffers)
            return sum(len(b) for b in chunks[-len(buffers):])

    while not response.completed:
        response.write_to(Sink)
    return b"".join(chunks)


class _Producers:
    """Batches of an idempotent producer (id 7), a non-idempotent one and a transactional one (id 9), and
    damaged ones; the idempotent one's sequences advance as its batches are made, with a retry or a gap now
    and then."""

    def __init__(self, rng):
        self.rng, self.sequences, self.last = rng, {}, {}

    def records(self, topic, partition):
        rng, now = self.rng, int(time.time() * 1000)
        values = [{"value": rng.randbytes(rng.randrange(0, 300)), "timestamp": now} for _ in range(rng.randrange(1, 6))]
        kind = rng.choices(["plain", "idempotent", "retry", "gap", "transactional", "corrupt", "two", "none"],
                           [6, 6, 2, 1, 1, 1, 1, 1])[0]
        if kind == "plain":
            return build_records(values)
        if kind in ("idempotent", "retry", "gap"):
            key = topic, partition
            if kind == "retry" and key in self.last:
                return self.last[key]
            sequence = self.sequences.get(key, 0) + (3 if kind == "gap" else 0)
            batch = build_records(values, producer_id=7, producer_epoch=0, base_sequence=sequence)
            if kind != "gap":
                self.sequences[key], self.last[key] = sequence + len(values), batch
            return batch
        if kind == "transactional":
            return build_records(values, producer_id=9, producer_epoch=0, base_sequence=0, transactional=True)
        if kind == "corrupt":
            damaged = bytearray(build_records(values))
            damaged[-1] ^= 0xFF
            return bytes(damaged)
        if kind == "two":
            return build_records(values) + build_records(values)
        return None


def _produce_payload(rng, producers, topics):
    partitions = []
    for _ in range(rng.randrange(1, 5)):
        name = rng.choices(topics, [8, 8, 1, 1])[0]
        index = rng.choices([0, 1, 2, 3], [4, 4, 4, 1])[0]
        partitions.append((name, index))
    if rng.random() < 0.1:
        partitions.append(partitions[0])            # listed again
    topic_data = [P.TopicProduceData(name=name, partition_data=[P.PartitionProduceData(
        index=index, records=producers.records(name, index))]) for name, index in partitions]
    acks = rng.choices([-1, 1, 0, 2], [8, 8, 2, 1])[0]
    version = rng.choices([3, 7, 9, 11], [1, 3, 6, 3])[0]
    return encode_request(P(transactional_id=None, acks=acks, timeout_ms=30000, topic_data=topic_data), version,
                          rng.randrange(1 << 31), "lane-test")


def _log_files(broker, topic, partition):
    """The bytes of the partition's segment files, by name."""
    directory = pathlib.Path(broker.logs.get_partition(topic, partition).directory)
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory)) if name.endswith(".log")}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_core_lane_answers_as_the_python_path(tmp_path, counting_lane, seed):
    rng = random.Random(seed)
    topics = ["t", "u", "__consumer_offsets", "missing"]
    brokers = [Broker(tmp_path / which, port=0).start() for which in ("lane", "python")]
    try:
        for broker in brokers:
            for name in ("t", "u"):
                broker.logs.create_topic(name, 3)
        producers = _Producers(rng)
        for step in range(300):
            if step == 200:             # a partition log closed under the handler: the topic deleted meanwhile
                for broker in brokers:
                    broker.logs.get_partition("u", 2).close()
            payload = bytes(_produce_payload(rng, producers, topics))
            answers = []
            for broker, python_only in zip(brokers, (False, True)):
                counting_lane.python_only = python_only
                answers.append(broker.server.handler(_request(payload)))
            assert (answers[0] is None) == (answers[1] is None)
            if answers[0] is not None:
                assert _encoded(answers[0]) == _encoded(answers[1]), step
        assert counting_lane.taken > 50 and counting_lane.left > 50     # the lane took some and left some
        lane, python = (broker.handlers.topic_stats for broker in brokers)
        for name in (ALL_TOPICS, "t", "u"):
            assert list(lane.row(name)) == list(python.row(name))
        for name in ("t", "u"):
            for index in range(3):
                ends = [broker.logs.get_partition(name, index).log_end_offset for broker in brokers]
                assert ends[0] == ends[1]
                assert name == "u" and index == 2 or ends[0] > 0
                assert _log_files(brokers[0], name, index) == _log_files(brokers[1], name, index)
    finally:
        for broker in brokers:
            broker.close()


def test_the_common_case_skips_the_python_checks(tmp_path, monkeypatch):
    """A Produce of plain batches never reaches ``check_produce_records``: the core's lane answered it."""
    def python_path(*args):
        raise AssertionError("the Python path was taken")

    monkeypatch.setattr(handlers_module, "check_produce_records", python_path)
    assert isinstance(handlers_module._PRODUCE_LANE, _core.ProduceLane)
    with Broker(tmp_path, port=0) as broker:
        broker.logs.create_topic("t", 2)
        records = build_records([{"value": b"v" * 100}] * 3, producer_id=7, producer_epoch=0, base_sequence=0)
        body = P(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[P.TopicProduceData(
            name="t", partition_data=[P.PartitionProduceData(index=i, records=records) for i in (0, 1)])])
        response = broker.handlers.produce(_Header(9), body)
        answered = response.responses[0].partition_responses
        assert [(p.index, p.error_code, p.base_offset) for p in answered] == [(0, 0, 0), (1, 0, 0)]
        response = broker.handlers.produce(_Header(9), body)           # the retry: its first append's offsets
        assert [(p.error_code, p.base_offset) for p in response.responses[0].partition_responses] == [(0, 0), (0, 0)]
        assert broker.logs.get_partition("t", 0).log_end_offset == 3
        assert broker.handlers.produce(_Header(9), P(transactional_id=None, acks=0, timeout_ms=1, topic_data=[
            P.TopicProduceData(name="t", partition_data=[P.PartitionProduceData(index=0, records=build_records(
                [b"x"]))])])) is None        # acks=0: no response
        assert broker.logs.get_partition("t", 0).log_end_offset == 4


class _Header:
    def __init__(self, api_version):
        self.api_version = api_version
