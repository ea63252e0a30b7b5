"""The records API checks its arguments at the boundary: a kmem error naming the argument, never a
TypeError, OverflowError or a misleading message from deeper down."""
import pytest
from records_samples import scenario_batches

from kmem.errors import ConfigError, InvalidArgumentError
from kmem.records import (CompressionType, FileRecords, LazyDownConvertRecords, MemoryRecords, RecordsBuilder,
                          build_control_batch, build_records, codecs, down_convert, fetch_magic, plan_fetch,
                          segment_file_name)

DATA = scenario_batches("none")
INT64_PAST = 1 << 63


def file_records(tmp_path):
    path = tmp_path / segment_file_name(0)
    path.write_bytes(DATA)
    return FileRecords(path)


BAD_CALLS = {   # id: (call, error, the argument its message names)
    "plan_fetch str version": (lambda: plan_fetch("3"), InvalidArgumentError, "fetch_version"),
    "plan_fetch float version": (lambda: plan_fetch(3.0), InvalidArgumentError, "fetch_version"),
    "plan_fetch version past int16": (lambda: plan_fetch(1 << 15), InvalidArgumentError, "fetch_version"),
    "fetch_magic negative": (lambda: fetch_magic(-1), InvalidArgumentError, "fetch_version"),
    "plan_fetch log magic": (lambda: plan_fetch(3, log_magic="2"), InvalidArgumentError, "log_magic"),
    "plan_fetch compression": (lambda: plan_fetch(3, topic_compression=None), ConfigError, "topic_compression"),
    "plan_fetch unknown codec": (lambda: plan_fetch(3, topic_compression="brotli"), ConfigError,
                                 "topic_compression"),
    "plan_fetch follower": (lambda: plan_fetch(3, is_follower="no"), InvalidArgumentError, "is_follower"),
    "plan_fetch topic config": (lambda: plan_fetch(3, topic_config=[("a", 1)]), InvalidArgumentError,
                                "topic_config"),
    "down_convert str magic": (lambda: down_convert(DATA, to_magic="1"), InvalidArgumentError, "to_magic"),
    "down_convert magic 3": (lambda: down_convert(DATA, 3), InvalidArgumentError, "to_magic"),
    "down_convert offset": (lambda: down_convert(DATA, 1, INT64_PAST), InvalidArgumentError, "first_offset"),
    "down_convert limit": (lambda: down_convert(DATA, 1, max_decompressed_bytes=0), InvalidArgumentError,
                           "max_decompressed_bytes"),
    "down_convert crc flag": (lambda: down_convert(DATA, 1, verify_crc="yes"), InvalidArgumentError, "verify_crc"),
    "down_convert records": (lambda: down_convert(42, 1), InvalidArgumentError, "records"),
    "lazy magic": (lambda: LazyDownConvertRecords(DATA, 2), InvalidArgumentError, "to_magic"),
    "lazy chunk": (lambda: LazyDownConvertRecords(DATA, 1, chunk_size="big"), InvalidArgumentError, "chunk_size"),
    "lazy offset": (lambda: LazyDownConvertRecords(DATA, 1, first_offset=None), InvalidArgumentError,
                    "first_offset"),
    "lazy records": (lambda: LazyDownConvertRecords("text", 1), InvalidArgumentError, "records"),
    "memory records data": (lambda: MemoryRecords(3), InvalidArgumentError, "data"),
    "memory records start": (lambda: MemoryRecords(DATA).batches(-1), InvalidArgumentError, "start"),
    "memory records read": (lambda: MemoryRecords(DATA).read(-1, 5), InvalidArgumentError, "position"),
    "batch records limit": (lambda: next(iter(MemoryRecords(DATA))).records(max_decompressed_bytes=-1),
                            InvalidArgumentError, "max_decompressed_bytes"),
    "builder magic": (lambda: RecordsBuilder("2"), InvalidArgumentError, "magic"),
    "builder base offset": (lambda: RecordsBuilder(2, base_offset=INT64_PAST), InvalidArgumentError,
                            "base_offset"),
    "builder epoch": (lambda: RecordsBuilder(2, producer_epoch=1 << 15), InvalidArgumentError, "producer_epoch"),
    "builder sequence": (lambda: RecordsBuilder(2, base_sequence=1 << 31), InvalidArgumentError, "base_sequence"),
    "builder leader epoch": (lambda: RecordsBuilder(2, partition_leader_epoch="0"), InvalidArgumentError,
                             "partition_leader_epoch"),
    "builder transactional": (lambda: RecordsBuilder(2, transactional=1), InvalidArgumentError, "transactional"),
    "builder timestamp type": (lambda: RecordsBuilder(2, timestamp_type=5), InvalidArgumentError, "timestamp_type"),
    "append str value": (lambda: RecordsBuilder(2).append("text"), InvalidArgumentError, "value"),
    "append key": (lambda: RecordsBuilder(2).append(b"v", key=5), InvalidArgumentError, "key"),
    "append timestamp": (lambda: RecordsBuilder(2).append(b"v", timestamp=INT64_PAST), InvalidArgumentError,
                         "timestamp"),
    "append offset": (lambda: RecordsBuilder(2).append(b"v", offset="7"), InvalidArgumentError, "offset"),
    "append header key": (lambda: RecordsBuilder(2).append(b"v", headers=[(None, b"x")]), InvalidArgumentError,
                          "header key"),
    "append header value": (lambda: RecordsBuilder(2).append(b"v", headers=[("h", 5)]), InvalidArgumentError,
                            "header value"),
    "append headers shape": (lambda: RecordsBuilder(2).append(b"v", headers=[b"xyz"]), InvalidArgumentError,
                             "headers"),
    "build_records field": (lambda: build_records([{"valeu": b"x"}]), InvalidArgumentError, "valeu"),
    "control type": (lambda: build_control_batch(7, 0, 1, 0, 0), InvalidArgumentError, "control_type"),
    "control epoch": (lambda: build_control_batch(1, 0, 1, 0, 0, coordinator_epoch=1 << 31),
                      InvalidArgumentError, "coordinator_epoch"),
    "control producer epoch": (lambda: build_control_batch(1, 0, 1, 1 << 15, 0), InvalidArgumentError,
                               "producer_epoch"),
    "control timestamp": (lambda: build_control_batch(1, 0, 1, 0, -2), InvalidArgumentError, "timestamp"),
    "control offset": (lambda: build_control_batch(1, "0", 1, 0, 0), InvalidArgumentError, "offset"),
    "segment name": (lambda: segment_file_name(-1), InvalidArgumentError, "base_offset"),
    "file path": (lambda: FileRecords(None), InvalidArgumentError, "path"),
    "file start": (lambda: FileRecords(__file__, start="0"), InvalidArgumentError, "start"),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_arguments_raise_kmem_errors_naming_them(case):
    call, error, argument = BAD_CALLS[case]
    with pytest.raises(error, match=argument):
        call()


@pytest.mark.parametrize("call, argument", [
    (lambda f: f.read("0", 5), "position"), (lambda f: f.read(0, None), "size"),
    (lambda f: f.slice(0, -1), "size"), (lambda f: f.batches("0"), "position"),
    (lambda f: f.search_for_offset("3"), "target_offset"),
])
def test_file_records_arguments(tmp_path, call, argument):
    with file_records(tmp_path) as records, pytest.raises(InvalidArgumentError, match=argument):
        call(records)


def test_compression_is_a_named_int():
    batches = [next(iter(MemoryRecords(build_records([b"x"], compression=codec)))) for codec in codecs.CODEC_NAMES]
    assert [b.compression for b in batches] == [0, 1, 2, 3, 4]      # still equal to Kafka's ids
    assert [b.compression for b in batches] == list(CompressionType)
    assert batches[1].compression is CompressionType.GZIP and batches[1].compression.name == "GZIP"
    assert codecs.codec_id("LZ4") is CompressionType.LZ4
    bad = bytearray(DATA)
    bad[22] |= 0x07     # codec bits 7: names no codec, read as the bare id
    assert next(iter(MemoryRecords(bytes(bad)))).compression == 7


def test_memory_records_repr():
    data = build_records([b"a", b"b"], base_offset=5) + DATA
    assert repr(MemoryRecords(data)) == f"<MemoryRecords {len(data)} bytes, first offset 5, 4 batches>"
    assert repr(MemoryRecords(b"")) == "<MemoryRecords 0 bytes, 0 batches>"
    corrupt = DATA + bytes(20)
    assert repr(MemoryRecords(corrupt)) == (f"<MemoryRecords {len(corrupt)} bytes, first offset 0, 3 batches, then "
                                            f"corrupt data at byte {len(DATA)}>")


@pytest.mark.parametrize("call", [lambda: RecordsBuilder(2, "gzip", gzip_level=0),
                                  lambda: RecordsBuilder(2, "gzip", gzip_level="9"),
                                  lambda: down_convert(DATA, 1, gzip_level=10),
                                  lambda: LazyDownConvertRecords(DATA, 1, gzip_level=None)])
def test_gzip_level_must_be_one_to_nine(call):
    with pytest.raises(InvalidArgumentError, match="gzip_level"):
        call()


def test_records_of_a_descriptor_own_it_also_when_refused(tmp_path):
    import os
    path = tmp_path / "000.log"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDONLY)
    with FileRecords.of_descriptor(fd, path, 10, 60) as records:
        assert (records.start, records.end, records.fileno()) == (10, 60, fd)
    with pytest.raises(OSError):
        os.fstat(fd)                                     # closed with the records
    fd = os.open(path, os.O_RDONLY)
    with pytest.raises(InvalidArgumentError, match="invalid slice"):
        FileRecords.of_descriptor(fd, path, 70, 60)
    with pytest.raises(OSError):
        os.fstat(fd)                                     # closed although refused


def test_records_of_a_descriptor_of_known_size_are_bounded_by_it(tmp_path):
    import os
    path = tmp_path / "000.log"
    path.write_bytes(b"x" * 100)
    with FileRecords.of_descriptor(os.open(path, os.O_RDONLY), path, 10, 90, file_size=60) as records:
        assert (records.start, records.end) == (10, 60)        # the size given, not the file's
    fd = os.open(path, os.O_RDONLY)
    with pytest.raises(InvalidArgumentError, match="file_size"):
        FileRecords.of_descriptor(fd, path, 0, 10, file_size=-1)
    with pytest.raises(OSError):
        os.fstat(fd)                                     # closed although refused


def test_records_hand_their_descriptor_to_their_send(tmp_path):
    import os
    path = tmp_path / "000.log"
    path.write_bytes(bytes(range(100)))
    records = FileRecords(path, 10, 60)
    fd = records.fileno()
    send = records.into_send()
    assert records.fileno() is None and send.size == 50
    os.fstat(fd)                                         # still open: the send owns it now
    records.close()
    out = bytearray()

    class Sink:
        def write(self, data):
            out.extend(data)
            return len(data)
    while not send.completed:
        send.write_to(Sink())
    assert bytes(out) == bytes(range(10, 60))
    with pytest.raises(OSError):
        os.fstat(fd)                                     # closed once sent
    with FileRecords(path) as whole:                     # a slice shares its parent's descriptor: it duplicates
        part = whole.slice(5, 10)
        shared = part.into_send()
        assert whole.fileno() is not None and part.fileno() == whole.fileno()
        shared.close()
