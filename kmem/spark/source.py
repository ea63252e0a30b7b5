"""``kafka-log``: a Spark data source (PySpark Python Data Source API) over Kafka log directories.

    spark.read.format("kafka-log").option("level", "records").load("/var/lib/kafka/data")

One Spark partition per segment file, or per byte range of a segment larger than ``split_bytes``.
``level`` is ``records`` (default: one row per record) or ``batches`` (one row per batch: headers and
sizes, nothing decompressed). Rows come as Arrow batches.

A corrupt segment never fails the job: the rows read before the damage are kept and one extra row
names the file, the byte position and what was wrong in the ``error`` column (its other data columns
are null; at ``level`` ``batches`` its ``position`` and ``size_bytes`` are the byte range left unread).
A segment ending in an incomplete batch (a size field pointing past the end) is reported the same way.
Filter ``error IS NOT NULL`` to list damaged segments. A directory without segments reads as no rows,
with a one-line warning (logger ``kmem.spark.segments``).
"""
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from kmem.errors import InvalidArgumentError
from kmem.records.codecs import codec_name
from kmem.spark.segments import (DEFAULT_SPLIT_BYTES, SEGMENT_ERRORS, batches_of_split, check_int64,
                                 list_segments)

ROWS_PER_ARROW_BATCH = 8192

COMMON = "topic string, partition int, segment string, magic int, codec string, timestamp_type string, " \
         "producer_id long, producer_epoch int, is_transactional boolean, is_control boolean"
RECORDS_SCHEMA = (COMMON + ", offset long, timestamp long, key binary, value binary, "
                  "headers array<struct<key:string,value:binary>>, sequence int, error string")
BATCHES_SCHEMA = (COMMON + ", position long, size_bytes long, base_offset long, last_offset long, "
                  "records_count int, base_sequence int, max_timestamp long, error string")


class KafkaLogDataSource(DataSource):
    """Options: ``path`` (required), ``level`` = ``records`` | ``batches``, ``split_bytes``."""

    @classmethod
    def name(cls):
        return "kafka-log"

    def _level(self):
        level = self.options.get("level", "records")
        if level not in ("records", "batches"):
            raise InvalidArgumentError(f"kafka-log option level must be 'records' or 'batches', not {level!r}")
        return level

    def _split_bytes(self):
        value = self.options.get("split_bytes", DEFAULT_SPLIT_BYTES)
        try:
            split_bytes = int(value)
        except ValueError:
            split_bytes = 0
        if split_bytes < 1:
            raise InvalidArgumentError(f"kafka-log option split_bytes must be a positive integer, not {value!r}")
        return split_bytes

    def schema(self):
        return RECORDS_SCHEMA if self._level() == "records" else BATCHES_SCHEMA

    def reader(self, schema):
        if "path" not in self.options:
            raise InvalidArgumentError("kafka-log needs a path: spark.read.format('kafka-log').load(path)")
        return KafkaLogReader(self.options["path"], self._level(), self._split_bytes(), schema)


class KafkaLogReader(DataSourceReader):
    def __init__(self, path, level, split_bytes, schema):
        self.path, self.level, self.split_bytes, self.schema = path, level, split_bytes, schema

    def partitions(self):
        # no segments: Spark reads one InputPartition(None), which yields no rows
        return [InputPartition(split) for split in list_segments(self.path, self.split_bytes)]

    def read(self, partition):
        from pyspark.sql.pandas.types import to_arrow_schema

        split = partition.value
        if split is None:
            return
        rows = ArrowRows(to_arrow_schema(self.schema))
        common = {"topic": split.topic, "partition": split.partition, "segment": split.name}
        unread_from = split.start       # the first byte not yet turned into rows
        try:
            for batch in batches_of_split(split):
                batch_columns = dict(common, magic=batch.magic, codec=codec_name(batch.compression),
                                     timestamp_type=batch.timestamp_type.name,
                                     producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
                                     is_transactional=batch.is_transactional, is_control=batch.is_control_batch)
                if self.level == "batches":
                    rows.append(batch_columns, position=batch.file_position, size_bytes=batch.size_in_bytes,
                                base_offset=batch.base_offset,
                                last_offset=check_int64(batch.last_offset, "last offset", batch),
                                records_count=batch.records_count, base_sequence=batch.base_sequence,
                                max_timestamp=batch.max_timestamp)
                else:
                    for record in batch:
                        rows.append(batch_columns, offset=record.offset, timestamp=record.timestamp,
                                    key=record.key, value=record.value,
                                    headers=[{"key": k, "value": v} for k, v in record.headers],
                                    sequence=batch.sequence_of(record.offset))
                unread_from = batch.file_position + batch.size_in_bytes
                if rows.full:
                    yield rows.flush()
        except SEGMENT_ERRORS as exc:
            rows.append(common, position=unread_from, size_bytes=split.end - unread_from,
                        error=f"{split.uri}: {exc}")
        if rows:
            yield rows.flush()


class ArrowRows:
    """Collects rows column by column and hands them out as Arrow record batches of the schema."""

    def __init__(self, schema):
        self.schema = schema
        self.columns = {name: [] for name in schema.names}
        self.count = 0

    def append(self, *parts, **values):
        for part in parts:
            values.update(part)
        for name, column in self.columns.items():
            column.append(values.get(name))
        self.count += 1

    @property
    def full(self):
        return self.count >= ROWS_PER_ARROW_BATCH

    def __bool__(self):
        return self.count > 0

    def flush(self):
        import pyarrow as pa

        batch = pa.RecordBatch.from_pydict(self.columns, schema=self.schema)
        self.columns = {name: [] for name in self.schema.names}
        self.count = 0
        return batch
