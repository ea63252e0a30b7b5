"""Leader epochs on the wire (KIP-320): OffsetForLeaderEpoch answered from a partition's leader epoch cache as
Kafka's ``LeaderEpochFileCache.endOffsetFor``, and the ``current_leader_epoch`` of OffsetForLeaderEpoch,
ListOffsets and Fetch checked as Kafka's ``Partition.checkCurrentLeaderEpoch``. Requests are built and decoded
with kafka-python's codec (``kafka.protocol``)."""
import pytest
from kafka.protocol.consumer import (FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
                                     OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from broker_helpers import RawConnection
from kmem.broker import Broker
from kmem.records import build_records

NONE, UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 0, 3, 74, 75
OFFSET_FOR_LEADER_EPOCH = 23
# A partition of 10 records whose leaders were epochs 1 (offsets 0-3), 2 (4-6) and 5 (7-), as a Kafka cluster
# leaves it in leader-epoch-checkpoint
EPOCHS = [(1, 0), (2, 4), (5, 7)]
# requested epoch -> Kafka's (epoch, end offset): undefined for -1 and above every epoch; the requested epoch
# and the first start below the first; the largest epoch at or below it and the next start; the log end for
# the latest
END_OFFSETS = {-1: (-1, -1), 0: (0, 0), 1: (1, 4), 2: (2, 7), 3: (2, 7), 4: (2, 7), 5: (5, 10), 6: (-1, -1)}


@pytest.fixture
def broker(tmp_path):
    log_dir = tmp_path / "logs"
    with Broker(log_dir, num_partitions=1) as first:
        first.logs.create_topic("e", 1)
        assert first.logs.get_partition("e", 0).append(build_records([b"%d" % i for i in range(10)])).error_code == 0
    (log_dir / "e-0" / "leader-epoch-checkpoint").write_text(
        "0\n%d\n" % len(EPOCHS) + "".join(f"{epoch} {start}\n" for epoch, start in EPOCHS))
    with Broker(log_dir, num_partitions=1) as running:
        partition = running.logs.get_partition("e", 0)
        assert partition.leader_epochs == EPOCHS and partition.leader_epoch == 5      # carries on at the latest
        yield running


def end_offsets(connection, version, wanted, current_leader_epoch=-1, topic="e"):
    """``{(partition, requested epoch): answer}`` of one OffsetForLeaderEpoch request."""
    Topic = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    request = OffsetForLeaderEpochRequest(replica_id=-1, topics=[Topic(topic=topic, partitions=[
        Topic.OffsetForLeaderPartition(partition=partition, current_leader_epoch=current_leader_epoch,
                                       leader_epoch=epoch)
        for partition, epoch in wanted])])
    response = connection.request(request, OffsetForLeaderEpochResponse, version)
    assert [t.topic for t in response.topics] == [topic]
    answers = response.topics[0].partitions
    assert [a.partition for a in answers] == [partition for partition, _ in wanted]
    return {key: answer for key, answer in zip(wanted, answers)}


def list_latest(connection, version, current_leader_epoch):
    Topic = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[Topic(name="e", partitions=[
        Topic.ListOffsetsPartition(partition_index=0, current_leader_epoch=current_leader_epoch, timestamp=-1)])])
    return connection.request(request, ListOffsetsResponse, version).topics[0].partitions[0]


def fetch(connection, version, current_leader_epoch):
    partition = FetchRequest.FetchTopic.FetchPartition(partition=0, current_leader_epoch=current_leader_epoch,
                                                       fetch_offset=0, partition_max_bytes=1 << 20)
    request = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                           topics=[FetchRequest.FetchTopic(topic="e", partitions=[partition])])
    return connection.request(request, FetchResponse, version).responses[0].partitions[0]


def test_offset_for_leader_epoch_is_advertised_v0_to_v4(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        response = connection.request(ApiVersionsRequest(), ApiVersionsResponse, 0)
    assert {(k.min_version, k.max_version) for k in response.api_keys if k.api_key == OFFSET_FOR_LEADER_EPOCH} == \
        {(0, 4)}


@pytest.mark.parametrize("version", range(5))
def test_end_offsets_come_from_the_leader_epoch_cache_as_kafkas(broker, version):
    wanted = [(0, epoch) for epoch in END_OFFSETS] + [(1, 5)]          # partition 1 does not exist
    with RawConnection(broker.bootstrap_servers) as connection:
        answers = end_offsets(connection, version, wanted)
        unknown_topic = end_offsets(connection, version, [(0, 5)], topic="nothing")[(0, 5)]
    assert {epoch: answers[(0, epoch)].error_code for epoch in END_OFFSETS} == {epoch: NONE for epoch in END_OFFSETS}
    assert {epoch: answers[(0, epoch)].end_offset for epoch in END_OFFSETS} == \
        {epoch: end for epoch, (_, end) in END_OFFSETS.items()}
    if version >= 1:                                                   # v0 answers no epoch
        assert {epoch: answers[(0, epoch)].leader_epoch for epoch in END_OFFSETS} == \
            {epoch: found for epoch, (found, _) in END_OFFSETS.items()}
    for missing in (answers[(1, 5)], unknown_topic):
        assert (missing.error_code, missing.end_offset) == (UNKNOWN_TOPIC_OR_PARTITION, -1)


def test_a_new_partition_has_epoch_zero_up_to_its_log_end(tmp_path):
    with Broker(tmp_path, num_partitions=1) as broker:
        broker.logs.create_topic("fresh", 1)
        broker.logs.get_partition("fresh", 0).append(build_records([b"a", b"b", b"c"]))
        with RawConnection(broker.bootstrap_servers) as connection:
            answers = end_offsets(connection, 4, [(0, 0), (0, 1)], current_leader_epoch=0, topic="fresh")
    assert [(a.error_code, a.leader_epoch, a.end_offset) for a in answers.values()] == [(NONE, 0, 3), (NONE, -1, -1)]


# the partition's leader epoch (what Metadata reports) -> what a request carrying each current epoch gets
CURRENT_EPOCHS = {3: NONE, -1: NONE, 2: FENCED_LEADER_EPOCH, 0: FENCED_LEADER_EPOCH, 4: UNKNOWN_LEADER_EPOCH}


@pytest.fixture
def led_at_epoch_3(broker, monkeypatch):
    """The partition's leader epoch is 3 (kmem's own partitions stay at 0: only a newer one can be told apart)."""
    monkeypatch.setattr(broker.logs.get_partition("e", 0), "leader_epoch", 3)
    return broker


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch_checks_the_current_leader_epoch(led_at_epoch_3, version):
    with RawConnection(led_at_epoch_3.bootstrap_servers) as connection:
        answers = {current: end_offsets(connection, version, [(0, 5)], current)[(0, 5)] for current in CURRENT_EPOCHS}
    assert {current: a.error_code for current, a in answers.items()} == CURRENT_EPOCHS
    assert {current: (a.leader_epoch, a.end_offset) for current, a in answers.items()} == {
        current: (5, 10) if error == NONE else (-1, -1) for current, error in CURRENT_EPOCHS.items()}


@pytest.mark.parametrize("version", [4, 9])
def test_list_offsets_checks_the_current_leader_epoch(led_at_epoch_3, version):
    with RawConnection(led_at_epoch_3.bootstrap_servers) as connection:
        answers = {current: list_latest(connection, version, current) for current in CURRENT_EPOCHS}
        before_v4 = list_latest(connection, 3, 4)                         # v0-3 carry no current epoch
    assert {current: a.error_code for current, a in answers.items()} == CURRENT_EPOCHS
    assert {current: a.offset for current, a in answers.items()} == {
        current: 10 if error == NONE else -1 for current, error in CURRENT_EPOCHS.items()}
    assert (before_v4.error_code, before_v4.offset) == (NONE, 10)


@pytest.mark.parametrize("version", [9, 12])
def test_fetch_checks_the_current_leader_epoch(led_at_epoch_3, version):
    with RawConnection(led_at_epoch_3.bootstrap_servers) as connection:
        answers = {current: fetch(connection, version, current) for current in [*CURRENT_EPOCHS, -2]}
        before_v9 = fetch(connection, 8, 4)                               # v0-8 carry no current epoch
    # FetchRequest.PartitionData takes any negative epoch for none
    assert {current: a.error_code for current, a in answers.items()} == {**CURRENT_EPOCHS, -2: NONE}
    assert {current: (a.high_watermark, bool(a.records)) for current, a in answers.items()} == {
        current: (10, True) if error == NONE else (-1, False) for current, error in {**CURRENT_EPOCHS, -2: 0}.items()}
    assert (before_v9.error_code, before_v9.high_watermark) == (NONE, 10)


def test_offset_for_leader_epoch_and_list_offsets_take_minus_two_for_an_epoch(broker):
    """Only -1 means "no epoch" in OffsetForLeaderEpoch and ListOffsets (Kafka compares any other): -2 is older
    than the partition's epoch 5."""
    with RawConnection(broker.bootstrap_servers) as connection:
        assert end_offsets(connection, 4, [(0, 5)], current_leader_epoch=-2)[(0, 5)].error_code == FENCED_LEADER_EPOCH
        assert list_latest(connection, 9, -2).error_code == FENCED_LEADER_EPOCH
        assert end_offsets(connection, 4, [(0, 5)], current_leader_epoch=6)[(0, 5)].error_code == UNKNOWN_LEADER_EPOCH
