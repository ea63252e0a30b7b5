"""kmem.broker under faults: damaged files, a full disk, descriptor limits, names that would break a restart.
Nothing acknowledged may be lost or stored twice, and the broker must start again."""
import errno
import os
import struct

import pytest

from kmem.broker import Broker, ErrorCode, LogError
from kmem.broker.log import index as index_module
from kmem.broker.log import segment as segment_module
from kmem.errors import ConfigError, CorruptRecordError, IllegalStateError
from kmem.protocol import ApiKey, messages
from kmem.records import FileRecords

from broker_helpers import TIMEOUT, RawConnection, consume_to_end, produce_raw, start_broker_process, wait_for
from test_broker_log import blocks_past_end
from test_broker_log_recovery import batch, crash, open_manager, populate, values


def test_zeroed_tail_keeps_every_batch_before_it(tmp_path):
    # What a crash leaves when pages past the data were allocated but never written: zeros.
    bases, directory = populate(tmp_path, log_segment_bytes=1 << 20)
    last = os.path.join(directory, f"{bases[-1]:020d}.log")
    valid = os.path.getsize(last)
    with open(last, "ab") as f:
        f.write(bytes(4096))
    with FileRecords(last) as records:
        seen = []
        with pytest.raises(CorruptRecordError):
            for read in records:
                seen.append(read.last_offset)
    with FileRecords(last, 0, valid) as records:
        assert seen == [read.last_offset for read in records]
    crash(tmp_path)
    with open_manager(tmp_path, log_segment_bytes=1 << 20) as manager:
        partition_log = manager.get_partition("t", 0)
        assert [v for _, v in values(partition_log)] == [b"value-%03d" % i * 10 for i in range(40)]
        assert os.path.getsize(last) == valid
        assert partition_log.log_end_offset == 40



# --- an append is all or nothing ------------------------------------------------------------------------

def test_a_failed_index_write_leaves_no_batch_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(index_module, "PENDING_BYTES", 16)      # two offset entries held, the third due
    with open_manager(tmp_path, log_index_interval_bytes=0) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for i in range(3):
            assert partition_log.append(batch(b"kept-%d" % i, sequence=i, producer_id=7)).error_code == ErrorCode.NONE
        segment = partition_log.active
        size, entries = segment.size, segment.offset_index.entries
        assert entries == 2 and open(segment.offset_index.path, "rb").read(16) == bytes(16)      # held

        # the data write succeeds, the index entries after it fail: their file cannot be opened
        os.rename(segment.offset_index.path, segment.offset_index.path + ".away")
        result = partition_log.append(batch(b"refused", sequence=3, producer_id=7))
        os.rename(segment.offset_index.path + ".away", segment.offset_index.path)
        assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        assert "No such file" in result.error_message
        assert (segment.size, segment.offset_index.entries, partition_log.log_end_offset) == (size, entries, 3)
        assert os.path.getsize(segment.log_path) == size
        assert [v for _, v in values(partition_log)] == [b"kept-0", b"kept-1", b"kept-2"]
        retried = partition_log.append(batch(b"refused", sequence=3, producer_id=7))
        assert (retried.error_code, retried.base_offset, retried.duplicate) == (ErrorCode.NONE, 3, False)
        assert [segment.offset_index.lookup(offset)[0] for offset in range(4)] == [0, 1, 2, 3]
        with open(segment.offset_index.path, "rb") as index:             # the entries held and the new one
            assert [struct.unpack(">ii", index.read(8))[0] for _ in range(3)] == [1, 2, 3]
    crash(tmp_path)
    with open_manager(tmp_path) as manager:
        assert [v for _, v in values(manager.get_partition("t", 0))] == [b"kept-0", b"kept-1", b"kept-2", b"refused"]


@pytest.mark.parametrize("then", ["flush", "delete_topic"])
def test_index_entries_held_on_a_full_disk_reach_the_file_or_go_with_it(small_filesystem, then):
    """The blocks of the index entries an append holds are reserved by that append: on a disk filled since, the
    flush that writes them, or the deletion that drops them, needs no new block. (A roll on a full disk fails
    for its producer snapshot, entries held or not.)"""
    filesystem = small_filesystem("8m")
    with open_manager(os.path.join(filesystem.path, "logs"), log_index_interval_bytes=0,
                      log_segment_bytes=1 << 20) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for i in range(40):
            assert partition_log.append(batch(b"v%d" % i)).error_code == ErrorCode.NONE
        segment = partition_log.active
        assert segment.offset_index.entries == 39
        with open(segment.offset_index.path, "rb") as index:
            assert index.read(39 * 8) == bytes(39 * 8)                 # held: nothing written yet
        filesystem.fill()
        assert partition_log.append(batch(b"x" * 65536)).error_code == ErrorCode.KAFKA_STORAGE_ERROR
        if then == "flush":
            partition_log.flush()
            with open(segment.offset_index.path, "rb") as index:
                assert [struct.unpack(">ii", index.read(8))[0] for _ in range(39)] == list(range(1, 40))
        else:
            manager.delete_topic("t")
            assert manager.get_partition("t", 0) is None and not os.path.exists(partition_log.directory)
        filesystem.free()
    if then == "flush":
        with open_manager(os.path.join(filesystem.path, "logs")) as manager:
            assert [v for _, v in values(manager.get_partition("t", 0))] == [b"v%d" % i for i in range(40)]


def test_an_append_whose_held_index_entry_finds_no_block_is_refused_whole(tmp_path, monkeypatch):
    with open_manager(tmp_path, log_index_interval_bytes=0, log_segment_bytes=1 << 20) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for i in range(513):                       # 512 offset entries: the first 4 KiB of the index reserved
            assert partition_log.append(batch(b"v%d" % i)).error_code == ErrorCode.NONE
        segment = partition_log.active
        size, entries = segment.size, segment.offset_index.entries
        reserved = []

        def full_disk(fd, offset, length):
            reserved.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length))
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(os, "posix_fallocate", full_disk)
        refused = partition_log.append(batch(b"v513"))
        assert refused.error_code == ErrorCode.KAFKA_STORAGE_ERROR and "No space left" in refused.error_message
        assert reserved == [(segment.offset_index.path, 4096, 4096)]
        assert (segment.size, segment.offset_index.entries, partition_log.log_end_offset) == (size, entries, 513)
        assert os.path.getsize(segment.log_path) == size
        monkeypatch.undo()
        assert partition_log.append(batch(b"v513")).base_offset == 513
        assert [v for _, v in values(partition_log)] == [b"v%d" % i for i in range(514)]


def free_bytes(path):
    disk = os.statvfs(path)
    return disk.f_bavail * disk.f_frsize


def test_a_disk_short_of_room_gets_no_block_reserved_ahead(small_filesystem):
    """Below ``RESERVE_HEADROOM_BYTES`` free, the active segment reserves nothing: the records fill the disk."""
    filesystem = small_filesystem("8m")
    logs = os.path.join(filesystem.path, "logs")
    acknowledged = []
    with open_manager(logs, log_segment_bytes=1 << 30) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        while (result := partition_log.append(batch(b"%099999d" % len(acknowledged)))).error_code == ErrorCode.NONE:
            acknowledged.append(b"%099999d" % len(acknowledged))
            assert blocks_past_end(partition_log.active.log_path) < 64 << 10
        assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR, result.error_message
        assert len(acknowledged) * 100_000 > 7 << 20 and free_bytes(filesystem.path) < 200_000
    with open_manager(logs) as manager:
        assert [v for _, v in values(manager.get_partition("t", 0))] == acknowledged


def test_the_first_append_to_find_the_disk_full_frees_every_partitions_reservation(small_filesystem, monkeypatch):
    """A partition that reserved blocks ahead and went quiet holds them until it rolls; once an append of any
    partition finds no room, every partition's are freed, the retry is appended, and records fill the disk."""
    monkeypatch.setattr(segment_module, "RESERVE_HEADROOM_BYTES", 0)
    filesystem = small_filesystem("16m")
    logs = os.path.join(filesystem.path, "logs")
    with open_manager(logs, log_segment_bytes=1 << 30) as manager:
        manager.create_topic("quiet")
        manager.create_topic("busy")
        quiet, busy = manager.get_partition("quiet", 0), manager.get_partition("busy", 0)
        for i in range(11):
            assert quiet.append(batch(b"%099999d" % i)).error_code == ErrorCode.NONE
        assert blocks_past_end(quiet.active.log_path) >= 1 << 20
        acknowledged, refused = [], 0
        while refused < 2:
            value = b"%099999d" % len(acknowledged)
            result = busy.append(batch(value))
            if result.error_code:
                assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR, result.error_message
                refused += 1
                if refused == 1:
                    assert blocks_past_end(quiet.active.log_path) < 64 << 10
                    assert blocks_past_end(busy.active.log_path) < 64 << 10
                    assert busy.append(batch(value)).error_code == ErrorCode.NONE       # the retry finds room
                    acknowledged.append(value)
            else:
                acknowledged.append(value)
        assert free_bytes(filesystem.path) < 200_000
    with open_manager(logs) as manager:
        assert [v for _, v in values(manager.get_partition("busy", 0))] == acknowledged
        assert len(values(manager.get_partition("quiet", 0))) == 11


def test_a_disk_that_stays_full_has_the_partitions_visited_at_most_once_a_second(tmp_path, monkeypatch):
    """Every refused retry on a full disk asks for the reservations back; the partitions are visited once a
    second at most (none reserves anew there)."""
    from kmem.broker.log import manager as manager_module, unified_log
    visited = []
    monkeypatch.setattr(unified_log.PartitionLog, "release_reserved_blocks", lambda log: visited.append(log.topic))
    with open_manager(tmp_path) as manager:
        manager.create_topic("a", partitions=3)
        for _ in range(5):
            manager.release_reserved_blocks()
        assert visited == ["a"] * 3
        manager._released_at -= manager_module.RELEASE_INTERVAL_SECONDS       # a second later
        manager.release_reserved_blocks()
        assert visited == ["a"] * 6


def test_a_failed_roll_keeps_the_active_segment(tmp_path, monkeypatch):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        assert partition_log.append(batch(b"first")).error_code == ErrorCode.NONE
        real_open = segment_module.os.open

        def no_descriptors(path, *args):
            if str(path).endswith(".log"):
                raise OSError(errno.EMFILE, "Too many open files")
            return real_open(path, *args)
        with monkeypatch.context() as m:
            m.setattr(segment_module.os, "open", no_descriptors)
            with pytest.raises(OSError):
                partition_log.roll()
            result = partition_log.append(batch(b"refused"))
        assert result.error_code == ErrorCode.NONE       # no roll was due: the active segment took it
        partition_log.roll()
        assert partition_log.append(batch(b"after")).error_code == ErrorCode.NONE
        assert [v for _, v in values(partition_log)] == [b"first", b"refused", b"after"]
        assert [s.base_offset for s in partition_log.segments] == [0, 2]


# --- names and files that must not keep the broker from starting ----------------------------------------

@pytest.mark.parametrize("name", ["t\n", "t\n-0", "\nt", "t\r", "t ", "..", ".", "", "ü", "a" * 250, "t\x00"])
def test_topic_names_are_validated_over_the_whole_string(tmp_path, name):
    with open_manager(tmp_path) as manager:
        with pytest.raises(LogError) as refused:
            manager.create_topic(name)
        assert refused.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert [n for n in os.listdir(tmp_path) if os.path.isdir(tmp_path / n)] == []


def test_an_unreadable_recovery_point_checkpoint_recovers_every_partition(tmp_path, caplog):
    populate(tmp_path, log_segment_bytes=1 << 20)
    with open(tmp_path / "recovery-point-offset-checkpoint", "w") as f:
        f.write("0\n2\nt 0 40\nbroken\n")
    with open_manager(tmp_path, log_segment_bytes=1 << 20) as manager:
        assert [v for _, v in values(manager.get_partition("t", 0))] == [b"value-%03d" % i * 10 for i in range(40)]
    assert "recovering every partition" in caplog.text
    with open(tmp_path / "recovery-point-offset-checkpoint") as f:
        assert f.read() == "0\n1\nt 0 40\n"            # rewritten whole


def test_an_unreadable_log_start_checkpoint_starts_at_the_first_segment(tmp_path, caplog):
    populate(tmp_path)
    with open_manager(tmp_path) as manager:
        partition_log = manager.get_partition("t", 0)
        first_kept = partition_log.segments[1].base_offset
        manager.get_partition("t", 0).delete_records_before(first_kept + 1)
    with open(tmp_path / "log-start-offset-checkpoint", "w") as f:
        f.write("0\n1\nt 0\n")
    with open_manager(tmp_path) as manager:
        assert manager.get_partition("t", 0).log_start_offset == first_kept
    assert "DeleteRecords" in caplog.text


def test_a_directory_with_partitions_but_no_meta_properties_is_refused(tmp_path):
    populate(tmp_path, count=3)
    os.unlink(tmp_path / "meta.properties")
    with pytest.raises(IllegalStateError, match="holds 1 partitions .* but no meta.properties"):
        open_manager(tmp_path)
    assert not os.path.exists(tmp_path / "meta.properties")
    empty = tmp_path / "empty"
    with open_manager(empty) as manager:                   # an empty directory is formatted, as before
        assert manager.cluster_id


# --- file descriptors -------------------------------------------------------------------------------------

def open_descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def partition_directories(log_dir, topic):
    return sorted(n for n in os.listdir(log_dir) if n.startswith(f"{topic}-") and os.path.isdir(log_dir / n))


def test_a_partition_holds_one_descriptor(tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    process, bootstrap = start_broker_process(tmp_path, "--override", "log.segment.bytes=2000")
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("warm", 1, 1)])["warm"].result(30)     # the broker's own files are open
        before = open_descriptors(process.pid)
        admin.create_topics([NewTopic("many", 100, 1)])["many"].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        for _ in range(4):                   # every partition rolls segments and writes producer snapshots
            for partition in range(100):
                producer.produce("many", b"x" * 1000, partition=partition)
            assert producer.flush(30) == 0
        assert len(os.listdir(tmp_path / "many-0")) > 6
        assert open_descriptors(process.pid) - before <= 100 + 8      # one per partition; connections
    finally:
        process.kill()
        process.wait()


def test_running_out_of_descriptors_creates_nothing_and_the_broker_starts_again(tmp_path):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    process, bootstrap = start_broker_process(tmp_path, open_files=160)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        with pytest.raises(KafkaException) as refused:
            admin.create_topics([NewTopic("wide", 250, 1)])["wide"].result(30)
        error = refused.value.args[0]
        assert error.code() == ErrorCode.KAFKA_STORAGE_ERROR
        assert "RLIMIT_NOFILE: 160" in error.str()
        assert partition_directories(tmp_path, "wide") == []
        admin.create_topics([NewTopic("narrow", 4, 1)])["narrow"].result(30)      # the broker goes on
    finally:
        process.kill()
        process.wait()
    process, bootstrap = start_broker_process(tmp_path, open_files=160)
    try:
        topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics
        assert "narrow" in topics and "wide" not in topics
    finally:
        process.terminate()
        process.wait()


# --- a full disk ------------------------------------------------------------------------------------------

def read_partition(bootstrap, topic):
    """Every value of partition 0 of ``topic``, read from its start to its end (read_committed)."""
    return [value for *_, value in consume_to_end(bootstrap, topic)]


def test_a_full_disk_under_an_idempotent_producer_loses_and_repeats_nothing(small_filesystem):
    from confluent_kafka import Producer

    filesystem = small_filesystem("24m")
    log_dir = os.path.join(filesystem.path, "kafka-logs")
    settings = ("--override", "log.segment.bytes=1048576", "--override", "auto.create.topics.enable=true")
    process, bootstrap = start_broker_process(log_dir, *settings)
    try:
        acknowledged, refused = [], []

        def delivered(error, message):
            (refused if error else acknowledged).append(message.value())
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2,
                             "batch.num.messages": 50, "delivery.timeout.ms": 120000})
        sent = [b"record-%06d-" % i + b"x" * 300 for i in range(16000)]
        for value in sent[:4000]:
            producer.produce("t", value, partition=0, on_delivery=delivered)
            producer.poll(0)
        assert producer.flush(TIMEOUT) == 0 and len(acknowledged) == 4000
        filesystem.fill()
        for value in sent[4000:]:
            producer.produce("t", value, partition=0, on_delivery=delivered)
            producer.poll(0)
        wait_for(lambda: producer.poll(0.05) >= 0 and sum("No space left" in line for line in process.log_lines) > 3,
                 "produce requests refused by the full disk")
        assert read_partition(bootstrap, "t")[:4000] == sent[:4000]          # reads go on
        filesystem.free()
        assert producer.flush(60) == 0
        assert refused == [] and sorted(acknowledged) == sent
        assert read_partition(bootstrap, "t") == sent                        # each once, in order
    finally:
        process.kill()
        process.wait()
    process, bootstrap = start_broker_process(log_dir, *settings)       # recovery after SIGKILL
    try:
        assert read_partition(bootstrap, "t") == sent
    finally:
        process.kill()
        process.wait()


def test_a_full_disk_while_the_producer_ledger_grows_stores_no_batch_twice(small_filesystem):
    # The ledger's active file grows (its blocks reserved) when its first 1,024 rows are taken: that
    # reservation fails on the full disk, and no batch may be kept or acknowledged without its producer.
    filesystem = small_filesystem("8m")
    with Broker(os.path.join(filesystem.path, "logs")) as broker, RawConnection(broker.bootstrap_servers) as client:
        broker.logs.create_topic("t", 1)
        first = [batch(b"producer-%d" % pid, sequence=0, producer_id=pid) for pid in range(1, 1101)]
        for records in first[:1000]:
            assert produce_raw(client, "t", records).error_code == ErrorCode.NONE
        filesystem.fill()
        answers = [produce_raw(client, "t", records).error_code for records in first[1000:]]
        assert set(answers) <= {ErrorCode.NONE, ErrorCode.KAFKA_STORAGE_ERROR}
        assert ErrorCode.KAFKA_STORAGE_ERROR in answers
        filesystem.free()
        retried = [produce_raw(client, "t", records) for records in first[1000:]]      # every retry
        assert all(r.error_code == ErrorCode.NONE for r in retried)
        kept = [value for _, value in values(broker.logs.get_partition("t", 0))]
        assert kept == [b"producer-%d" % pid for pid in range(1, 1101)]


def test_closing_on_a_full_disk_keeps_everything_for_the_next_start(small_filesystem):
    filesystem = small_filesystem("4m")
    log_dir = os.path.join(filesystem.path, "logs")
    manager = open_manager(log_dir, log_segment_bytes=1 << 20)
    manager.create_topic("t")
    for i in range(50):
        assert manager.get_partition("t", 0).append(batch(b"kept-%d" % i)).error_code == ErrorCode.NONE
    filesystem.fill()
    manager.close()                     # trimming, checkpoints or the marker fail: no exception, no marker
    filesystem.free()
    with open_manager(log_dir, log_segment_bytes=1 << 20) as manager:
        assert [v for _, v in values(manager.get_partition("t", 0))] == [b"kept-%d" % i for i in range(50)]


@pytest.mark.parametrize("how", ["delete_records", "retention"])
def test_deleting_every_segment_of_a_full_disk_frees_it(small_filesystem, how):
    """DeleteRecords to the log end, or retention of every segment, rolls before the active segment goes; its
    producer snapshot needs room a full disk has only once the older segments are deleted, which they are first."""
    filesystem = small_filesystem("8m")
    logs = os.path.join(filesystem.path, "logs")
    with open_manager(logs, log_segment_bytes=64 << 10, log_retention_ms=60_000) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for i in range(COUNT := 600):           # a producer each: the roll's snapshot takes a few pages
            assert partition_log.append(batch(b"v%d" % i * 100, sequence=0, producer_id=1000 + i)).error_code == 0
        assert len(partition_log.segments) > 3
        filesystem.fill()
        refused = partition_log.append(batch(b"refused" * 5_000))
        assert refused.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        if how == "delete_records":
            assert partition_log.delete_records_before(-1) == COUNT
        else:
            manager.maintain(now_ms=partition_log.active.largest_timestamp + 120_000)
        assert (len(partition_log.segments), partition_log.active.size) == (1, 0)
        assert partition_log.log_start_offset == COUNT
        appended = partition_log.append(batch(b"room again"))
        assert (appended.error_code, appended.base_offset) == (ErrorCode.NONE, COUNT)
    with open_manager(logs) as manager:
        reopened = manager.get_partition("t", 0)
        assert (reopened.log_start_offset, reopened.log_end_offset) == (COUNT, COUNT + 1)
        with reopened.read(COUNT, 1 << 20).records as records:
            assert [(r.offset, r.value) for r in records.records()] == [(COUNT, b"room again")]


def test_delete_records_whose_roll_finds_the_disk_full_moves_the_log_start_and_leaves_the_segment(
        small_filesystem):
    """One segment holding every record: deleting them all needs a roll first, with nothing older to free. The log
    start offset moves (the answer says so, the connection stays); the segment goes at a later retention pass."""
    filesystem = small_filesystem("4m")
    with Broker(os.path.join(filesystem.path, "logs")) as broker, RawConnection(broker.bootstrap_servers) as client:
        broker.logs.create_topic("t")
        partition_log = broker.logs.get_partition("t", 0)
        for i in range(5):
            assert partition_log.append(batch(b"v%d" % i, sequence=i, producer_id=7)).error_code == 0
        filesystem.fill()
        R = messages.DeleteRecordsRequest
        request = R(topics=[R.DeleteRecordsTopic(name="t", partitions=[
            R.DeleteRecordsPartition(partition_index=0, offset=-1)])], timeout_ms=1000)
        answered = client.call(ApiKey.DELETE_RECORDS, 2, request).topics[0].partitions[0]
        assert (answered.error_code, answered.low_watermark) == (ErrorCode.NONE, 5)
        assert [s.base_offset for s in partition_log.segments] == [0] and partition_log.read(0, 1 << 20).error_code
        filesystem.free()
        answered = client.call(ApiKey.DELETE_RECORDS, 2, request, correlation_id=2).topics[0].partitions[0]
        assert (answered.error_code, answered.low_watermark) == (ErrorCode.NONE, 5)
        assert [s.base_offset for s in partition_log.segments] == [5]


def test_init_producer_id_on_a_full_disk_is_retriable(small_filesystem):
    from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

    filesystem = small_filesystem("4m")
    with Broker(os.path.join(filesystem.path, "logs")) as broker, RawConnection(broker.bootstrap_servers) as client:
        def init_producer_id():
            return client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1),
                                  InitProducerIdResponse, 1)
        filesystem.fill()           # the first id needs a block of ids reserved on disk
        refused = init_producer_id()
        assert (refused.error_code, refused.producer_id) == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, -1)
        filesystem.free()
        granted = init_producer_id()
        assert granted.error_code == ErrorCode.NONE and granted.producer_id >= 0


def test_a_partition_listed_twice_in_one_produce_is_appended_once(tmp_path):
    from kafka.protocol.producer import ProduceRequest, ProduceResponse

    with Broker(tmp_path) as broker, RawConnection(broker.bootstrap_servers) as client:
        broker.logs.create_topic("t", 2)
        Data = ProduceRequest.TopicProduceData.PartitionProduceData
        listed = [Data(index=0, records=batch(b"first")), Data(index=1, records=batch(b"other")),
                  Data(index=0, records=batch(b"last"))]
        request = ProduceRequest(acks=-1, timeout_ms=1000,
                                 topic_data=[ProduceRequest.TopicProduceData(name="t", partition_data=listed)])
        response = client.request(request, ProduceResponse, 9)
        answered = [(p.index, p.error_code) for t in response.responses for p in t.partition_responses]
        assert answered == [(0, 0), (1, 0)]
        assert [v for _, v in values(broker.logs.get_partition("t", 0))] == [b"last"]
        assert [v for _, v in values(broker.logs.get_partition("t", 1))] == [b"other"]


# --- starting -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("existed", [False, True])
def test_a_start_that_fails_leaves_no_formatted_directory(tmp_path, existed):
    import socket

    log_dir = tmp_path / "logs"
    if existed:
        log_dir.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(OSError):
            Broker(log_dir, port=busy.getsockname()[1]).start()
    assert os.path.isdir(log_dir) == existed and (not existed or os.listdir(log_dir) == [])
    with Broker(log_dir) as broker:         # and a start that works formats it
        assert broker.logs.cluster_id


def test_a_second_broker_on_a_directory_is_told_who_holds_it(tmp_path):
    with Broker(tmp_path):
        with pytest.raises(IllegalStateError, match="in use by another kmem broker"):
            Broker(tmp_path).start()


def test_the_log_says_what_happened_to_topics_and_recovery(tmp_path, caplog):
    caplog.set_level("INFO", logger="kmem.broker.log.manager")
    with open_manager(tmp_path) as manager:
        manager.create_topic("t", 2, {"retention.ms": 1000})
        manager.add_partitions("t", 3)
        manager.create_topic("u")
        manager.delete_topic("u")
    crash(tmp_path)
    open_manager(tmp_path).close()
    assert "created topic t (2 partitions, retention.ms=1000)" in caplog.text
    assert "topic t grown from 2 to 3 partitions" in caplog.text
    assert "deleted topic u (1 partition)" in caplog.text
    assert "recovered 3 partitions" in caplog.text


def test_a_log_directory_that_is_a_file_is_named_so(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        open_manager(tmp_path / "file")
