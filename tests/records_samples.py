"""Shared record fixtures for the records tests: Kafka's scenarios and readers from the Python clients."""
import struct

from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords
from kafka.record import MemoryRecords as KafkaPythonMemoryRecords

from kmem import _core
from kmem.records import MemoryRecords, RecordsBuilder, codecs

# Kafka's down-conversion scenario: ten records at these offsets in three v2 batches (3, 3 and 4 records).
SCENARIO_OFFSETS = [0, 2, 3, 9, 11, 15, 16, 17, 22, 24]
SCENARIO_VALUES = [b"hello", b"goodbye", b"hello again", b"goodbye for now", b"hello again",
                   b"I sense indecision", b"what now", b"running out", b"ok, almost done", b"finally"]
SCENARIO_HEADERS = [("headerKey1", b"headerValue1"), ("headerKey2", b"headerValue2"), ("headerKey3", None)]
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# The smallest v2 record: length 6, attributes, timestamp and offset deltas 0, null key and value, no header.
MINIMAL_RECORD = bytes([12, 0, 0, 0, 1, 1, 0])


def scenario_records():
    """(offset, timestamp, key, value, headers) of the ten records."""
    return [(offset, 1000 + i, b"k%d" % (i + 1), SCENARIO_VALUES[i], SCENARIO_HEADERS if i in (7, 9) else [])
            for i, offset in enumerate(SCENARIO_OFFSETS)]


def scenario_batches(codec, magic=2):
    data = b""
    records = scenario_records()
    for chunk in (records[0:3], records[3:6], records[6:10]):
        builder = RecordsBuilder(magic, codec, base_offset=chunk[0][0])
        for offset, timestamp, key, value, headers in chunk:
            builder.append(value, key=key, timestamp=timestamp, headers=headers if magic == 2 else (),
                           offset=offset)
        data += builder.build()
    return data


def _client_rows(reader):
    rows = []
    while reader.has_next():
        batch = reader.next_batch()
        if batch is None:
            break
        for r in batch:
            rows.append((r.offset, r.timestamp if r.timestamp is not None else -1, r.key, r.value,
                         [(k, v) for k, v in (r.headers or [])]))
    return rows


def read_kafka_python(data):
    return _client_rows(KafkaPythonMemoryRecords(bytes(data)))


def read_aiokafka(data):
    return _client_rows(AioMemoryRecords(bytes(data)))


def read_kmem(data):
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in MemoryRecords(data).records()]


def v2_batch_of(section, count=1, codec=codecs.NONE):
    """A v2 batch with a valid CRC around a hand-made records section of ``count`` records, compressed
    with ``codec`` (an id)."""
    if codec:
        section = codecs.compress(codec, section, 2)
    header = bytearray(struct.pack(">qiiBIhiqqqhii", 0, 49 + len(section), 0, 2, 0, codec, count - 1, 0, 0,
                                   -1, -1, -1, count))
    struct.pack_into(">I", header, 17, _core.crc32c(section, _core.crc32c(bytes(header[21:]))))
    return bytes(header) + section


# One Produce request (v2) exactly as Sarama 1.22 sent it with config.Version = V0_10_0_0 and
# CompressionLZ4, captured on the wire (tests/go/sarama_probe.go, sync, one record): a magic 1 wrapper
# around an LZ4 frame of pierrec/lz4 (FLG 0x64: content checksum; BD 0x70: 4 MiB blocks) whose one block
# begins 16 00 01 00, bytes that read as a plausible size prefix.
SARAMA_LZ4_TOPIC = "sarama-lz4"
SARAMA_LZ4_VALUE = b"sarama-lz4-sync-0"
SARAMA_LZ4_PRODUCE = bytes.fromhex(
    "00000002000000000006736172616d61ffff0000271000000001000a736172616d612d6c7a340000000100000000000000630000"
    "00000000000000000057af6e41ac0103000001a21fa9a173ffffffff0000004104224d186470b92e00000016000100f0192795d1"
    "fadd0100000001a21fa9a173ffffffff00000011736172616d612d6c7a342d73796e632d300000000070e7357e")


def sarama_lz4_frame():
    """The LZ4 frame inside ``SARAMA_LZ4_PRODUCE``'s wrapper message (its value, the request's end)."""
    start = SARAMA_LZ4_PRODUCE.index(codecs.LZ4_MAGIC)
    size, = struct.unpack_from(">i", SARAMA_LZ4_PRODUCE, start - 4)
    return SARAMA_LZ4_PRODUCE[start:start + size]
