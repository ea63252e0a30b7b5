"""Kafka record formats v0/v1/v2 (KIP-32, KIP-98), down-conversion (Kafka's RecordsUtil.downConvert) and
lazy down-conversion (KIP-283, Kafka's LazyDownConversionRecords).

- ``MemoryRecords(data)`` / ``FileRecords(path)``: batches of a bytes-like object or a log segment file,
  without copying; ``RecordBatch`` views expose Kafka's batch fields (offsets, magic, codec as a
  ``CompressionType``, timestamps, producer id/epoch/sequence, flags, counts) and decode their
  ``Record``s (offset, timestamp, key, value, headers).
- ``RecordsBuilder`` / ``build_records`` / ``build_control_batch``: write v0/v1/v2 data with any codec;
  ``build_coordinator_records``: a coordinator's own keyed records, unchecked.
- ``down_convert(records, to_magic, first_offset)`` -> ``ConvertedRecords(records, stats)``.
- ``LazyDownConvertRecords(records, to_magic, first_offset, chunk_size)`` and its ``to_send()``: KIP-283.
- ``plan_fetch(...)``: the broker's rules for which fetch gets converted records or an error.
"""
from kmem.records.batches import ControlRecordType, MemoryRecords, Record, RecordBatch, TimestampType
from kmem.records.builders import (RecordsBuilder, build_control_batch, build_coordinator_records,
                                   build_records)
from kmem.records.codecs import CODEC_NAMES, MAX_DECOMPRESSED_BYTES, CompressionType
from kmem.records.convert import ConvertedRecords, RecordConversionStats, down_convert
from kmem.records.fetch import FetchError, FetchPlan, fetch_magic, plan_fetch
from kmem.records.files import FileRecords, LogOffsetPosition, log_segments, segment_file_name
from kmem.records.lazy import LazyDownConvertRecords, LazyDownConvertRecordsSend

__all__ = [
    "CODEC_NAMES", "MAX_DECOMPRESSED_BYTES", "CompressionType", "ControlRecordType", "ConvertedRecords", "FetchError", "FetchPlan",
    "FileRecords", "LazyDownConvertRecords", "LazyDownConvertRecordsSend", "LogOffsetPosition", "MemoryRecords",
    "Record", "RecordBatch", "RecordConversionStats", "RecordsBuilder", "TimestampType", "build_control_batch",
    "build_coordinator_records", "build_records", "down_convert", "fetch_magic", "log_segments", "plan_fetch",
    "segment_file_name",
]
