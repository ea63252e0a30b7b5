"""Kafka record formats v0/v1/v2 and down-conversion (SPEC.md §4, §5).

- ``MemoryRecords(data)``: batches of a bytes-like object, without copying; ``RecordBatch`` views expose
  Kafka's batch fields (offsets, magic, codec, timestamps, producer id/epoch/sequence, flags, counts)
  and decode their ``Record``s (offset, timestamp, key, value, headers).
- ``RecordsBuilder`` / ``build_records`` / ``build_control_batch``: write v0/v1/v2 data with any codec.
- ``down_convert(records, to_magic, first_offset)`` -> ``ConvertedRecords(records, stats)``.
"""
from kmem.records.batches import (ControlRecordType, MemoryRecords, Record, RecordBatch, TimestampType)
from kmem.records.builders import RecordsBuilder, build_control_batch, build_records
from kmem.records.codecs import CODEC_NAMES, MAX_DECOMPRESSED_BYTES
from kmem.records.convert import ConvertedRecords, RecordConversionStats, down_convert

__all__ = [
    "CODEC_NAMES", "MAX_DECOMPRESSED_BYTES", "ControlRecordType", "ConvertedRecords", "MemoryRecords", "Record",
    "RecordBatch", "RecordConversionStats", "RecordsBuilder", "TimestampType", "build_control_batch",
    "build_records", "down_convert",
]
