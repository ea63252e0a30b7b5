"""The pipeline's jobs over Kafka log directories: ``report``, ``ledger`` and ``convert``.

Each takes a SparkSession (``kmem.spark.get_session()`` gives an embedded local one, or in a driver started by
spark-submit one on the submitted master) and plain paths, runs on whatever cluster the session is attached
to, and returns a small summary dict. Arguments are checked before any Spark work: a bad one raises
``InvalidArgumentError`` naming it, a missing input directory too, and an output directory that overlaps the
input or holds files the job did not write (``kmem.spark.outputs``). An input directory without segments gives
an empty result and a one-line warning.
Damaged segments never fail a job: each result lists them.
"""
import itertools
import json
import os

from kmem.errors import CorruptRecordError, InvalidArgumentError
from kmem.spark.outputs import check_apart, prepare_partition_output
from kmem.spark.segments import (DEFAULT_SPLIT_BYTES, SEGMENT_ERRORS, batches_of_split, check_int64,
                                 list_segments)


def _path(name, value):
    if not isinstance(value, (str, os.PathLike)):
        raise InvalidArgumentError(f"{name} must be a path, not {value!r}")
    return os.fspath(value)


def _check_rate(false_positive_rate):
    if not (isinstance(false_positive_rate, (int, float)) and 0 < false_positive_rate < 1):
        raise InvalidArgumentError(f"false_positive_rate must be between 0 and 1 (exclusive), "
                                   f"not {false_positive_rate!r}")


# ---------------------------------------------------------------------------------------------- report

def report(spark, input_path, output_dir=None, false_positive_rate=0.01):
    """Per topic-partition counts, bytes, batches by magic and codec, producer-id cardinality, and the
    Bloom filter shape that cardinality calls for. Written as ``report.json`` and ``report.png`` when
    ``output_dir`` is given; returned as a dict either way.

    A damaged segment is listed in ``corrupt_segments`` (byte position, bytes left unread, error) and
    its partition keeps the batches read before the damage, with ``unread_bytes`` summed."""
    input_path = _path("input_path", input_path)
    output_dir = None if output_dir is None else _path("output_dir", output_dir)
    _check_rate(false_positive_rate)
    if output_dir is not None:
        check_apart(output_dir, input_path, "report output", may_hold=True)
    if list_segments(input_path):
        partitions, corrupt = _report_rows(spark, input_path, false_positive_rate)
    else:
        partitions, corrupt = [], []
    result = {"input": input_path, "partitions": partitions, "corrupt_segments": corrupt}
    result["totals"] = {name: sum(p[name] for p in partitions)
                        for name in ("records", "batches", "control_batches", "bytes", "unread_bytes",
                                     "producer_ids")}
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, "report.json"), "w") as file:
            json.dump(result, file, indent=2)
        plot_report(result, os.path.join(output_dir, "report.png"))
    return result


def _report_rows(spark, input_path, false_positive_rate):
    from pyspark.sql import functions as F

    from kmem.bloom import Shape

    batches = spark.read.format("kafka-log").option("level", "batches").load(input_path)
    healthy = batches.where(F.col("error").isNull())
    data = F.col("is_control") == F.lit(False)
    per_partition = healthy.groupBy("topic", "partition").agg(
        F.count("*").alias("batches"),
        F.sum(F.when(data, F.col("records_count")).otherwise(0)).alias("records"),
        F.sum(F.when(~data, 1).otherwise(0)).alias("control_batches"),
        F.sum("size_bytes").alias("bytes"),
        F.countDistinct(F.when(F.col("producer_id") >= 0, F.col("producer_id"))).alias("producer_ids"),
        F.min("base_offset").alias("first_offset"),
        F.max("last_offset").alias("last_offset"),
    )
    formats = healthy.groupBy("topic", "partition", "magic", "codec").count()
    errors = (batches.where(F.col("error").isNotNull())
              .select("topic", "partition", "segment", "position", F.col("size_bytes").alias("unread_bytes"),
                      "error"))
    corrupt = sorted((row.asDict() for row in errors.collect()),
                     key=lambda c: (c["topic"], c["partition"], c["segment"]))

    partitions = {}

    def partition(topic, number, producer_ids=0):
        if (topic, number) not in partitions:
            shape = Shape.from_np(max(producer_ids, 1), false_positive_rate)
            partitions[(topic, number)] = {
                "topic": topic, "partition": number, "records": 0, "batches": 0, "control_batches": 0,
                "bytes": 0, "unread_bytes": 0, "first_offset": None, "last_offset": None,
                "producer_ids": producer_ids,
                "bloom_shape": {"bits": shape.number_of_bits, "hash_functions": shape.number_of_hash_functions,
                                "false_positive_rate": false_positive_rate},
                "batches_by_format": {},
            }
        return partitions[(topic, number)]

    for row in per_partition.collect():
        partition(row.topic, row.partition, row.producer_ids).update(
            records=row.records, batches=row.batches, control_batches=row.control_batches, bytes=row.bytes,
            first_offset=row.first_offset, last_offset=row.last_offset)
    for row in formats.collect():
        partitions[(row.topic, row.partition)]["batches_by_format"][f"v{row.magic}/{row.codec}"] = row["count"]
    for damaged in corrupt:     # a partition whose segments are all damaged is still listed
        partition(damaged["topic"], damaged["partition"])["unread_bytes"] += damaged["unread_bytes"]
    return [partitions[key] for key in sorted(partitions)], corrupt


def plot_report(result, path):
    """The report as one PNG: batches per partition stacked by format (magic/codec), and producer ids
    per partition."""
    report_figure(result).savefig(path, dpi=100)


def report_figure(result):
    """The matplotlib ``Figure`` ``plot_report`` saves (not registered with pyplot: no GUI, no close)."""
    from matplotlib.figure import Figure

    rows = result["partitions"]
    labels = [f"{p['topic']}-{p['partition']}" for p in rows]
    formats = sorted({f for p in rows for f in p["batches_by_format"]})
    figure = Figure(figsize=(12, 4.5))
    left, right = figure.subplots(1, 2)
    figure.suptitle(f"kmem report of {result['input']}")
    bottom = [0] * len(rows)
    for name in formats:
        counts = [p["batches_by_format"].get(name, 0) for p in rows]
        left.bar(labels, counts, bottom=bottom, label=name)
        bottom = [b + c for b, c in zip(bottom, counts)]
    left.set_title("batches by format (magic/codec)")
    left.set_ylabel("batches")
    if formats:
        left.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    right.bar(labels, [p["producer_ids"] for p in rows], color="tab:purple")
    right.set_title("producer ids (cardinality)")
    right.set_ylabel("distinct producer ids")
    for axis in (left, right):
        axis.set_xlabel("topic-partition")
        axis.yaxis.get_major_locator().set_params(integer=True)
        axis.tick_params(axis="x", rotation=60, labelsize="small")
    figure.tight_layout()
    return figure


# ---------------------------------------------------------------------------------------------- ledger

def partition_splits(input_path, split_bytes=DEFAULT_SPLIT_BYTES):
    """``[((topic, partition), [splits in offset order]), ...]``: the unit of work of per-partition jobs."""
    splits = list_segments(input_path, split_bytes)
    return [(key, list(group)) for key, group in itertools.groupby(splits, lambda s: (s.topic, s.partition))]


def rebuild_producer_state(batches):
    """Kafka's log recovery over a partition's batches in offset order: each producer id's last state.

    A data batch sets the epoch, last sequence, last offset, offset delta and timestamp, and opens a
    transaction when transactional; a transaction marker sets the epoch, coordinator epoch and
    timestamp and closes the transaction. Batches without a producer id are skipped.
    Returns ``{producer_id: ProducerEntry}``.
    """
    from kmem.ledger import NO_TXN, ProducerEntry

    state = {}
    for batch in batches:
        producer_id = batch.producer_id
        if producer_id < 0:
            continue
        entry = state.get(producer_id) or ProducerEntry(producer_id, batch.producer_epoch, -1, -1, 0, -1, -1, NO_TXN)
        if batch.is_control_batch:
            marker = next(iter(batch), None)
            if marker is None:
                continue    # an empty control batch: its transaction was cleaned from the log
            if marker.value is None or len(marker.value) < 6:
                raise CorruptRecordError("transaction marker value shorter than version + coordinator epoch",
                                         batch.position)
            coordinator_epoch = int.from_bytes(marker.value[2:6], "big", signed=True)
            state[producer_id] = entry._replace(epoch=batch.producer_epoch, coordinator_epoch=coordinator_epoch,
                                                timestamp=marker.timestamp, current_txn_first_offset=NO_TXN)
        else:
            txn_first = NO_TXN
            if batch.is_transactional:
                open_txn = entry.current_txn_first_offset
                txn_first = open_txn if open_txn != NO_TXN else batch.base_offset
            state[producer_id] = entry._replace(
                epoch=batch.producer_epoch, last_sequence=batch.last_sequence,
                last_offset=check_int64(batch.last_offset, "last offset", batch),
                offset_delta=batch.last_offset - batch.base_offset, timestamp=batch.max_timestamp,
                current_txn_first_offset=txn_first)
    return state


def _write_partition_ledger(item, output_dir, false_positive_rate):
    from kmem.bloom import Shape
    from kmem.ledger import write_ledger_snapshot

    (topic, partition), splits = item
    directory = os.path.join(output_dir, f"{topic}-{partition}")
    try:
        state = rebuild_producer_state(batch for split in splits for batch in batches_of_split(split))
        os.makedirs(directory, exist_ok=True)
        shape = Shape.from_np(max(len(state), 1), false_positive_rate)
        path = write_ledger_snapshot(directory, sorted(state.values()), shape=shape) if state else None
    except SEGMENT_ERRORS as exc:
        return {"topic": topic, "partition": partition, "error": str(exc)}
    return {"topic": topic, "partition": partition, "producer_ids": len(state), "snapshot": path, "error": None}


def ledger(spark, input_path, output_dir, false_positive_rate=0.01):
    """Rebuild producer state per partition from its batches and write one kmem ledger per partition
    (``<output>/<topic>-<partition>/``: a sorted Kafka snapshot plus its ``.bloom`` sidecar) that
    ``PidLedger`` opens. A partition with a damaged segment is listed with its error, not written.
    ``output_dir`` must be new, empty or a previous ledger output (``kmem.spark.outputs``)."""
    input_path, output_dir = _path("input_path", input_path), os.path.abspath(_path("output_dir", output_dir))
    _check_rate(false_positive_rate)
    work = partition_splits(input_path)
    if not work:
        return {"partitions": []}
    prepare_partition_output(output_dir, "ledger", input_path)
    results = (spark.sparkContext.parallelize(work, len(work))
               .map(lambda item: _write_partition_ledger(item, output_dir, false_positive_rate)).collect())
    return {"partitions": sorted(results, key=lambda r: (r["topic"], r["partition"]))}


# --------------------------------------------------------------------------------------------- convert

def _check_conversion(to_magic, chunk_size):
    if to_magic not in (0, 1) or isinstance(to_magic, bool):
        raise InvalidArgumentError(f"to_magic must be 0 or 1, not {to_magic!r}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise InvalidArgumentError(f"chunk_size must be a positive number of bytes, not {chunk_size!r}")


def convert_segment(split, output_dir, to_magic, chunk_size, trace_memory=False):
    """Convert one segment (a ``SegmentSplit`` covering the whole file) into ``output_dir``: the work of
    one ``convert`` task, callable without Spark. A segment that cannot be converted gives a result with
    its ``error`` and leaves no file behind. With ``trace_memory`` the result also holds the peak of
    Python-allocated memory during the conversion (tracemalloc, which slows it down)."""
    import tracemalloc

    from kmem.records import LazyDownConvertRecords, RecordConversionStats
    from kmem.spark.segments import check_complete, open_split

    _check_conversion(to_magic, chunk_size)
    directory = os.path.join(output_dir, f"{split.topic}-{split.partition}")
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, split.name)
    partial = target + ".partial"       # renamed to the target only once the whole segment converted
    stats, written = RecordConversionStats(), 0
    result = {"topic": split.topic, "partition": split.partition, "segment": split.name,
              "input_bytes": split.end - split.start}
    if trace_memory:
        tracemalloc.start()
    try:
        with open(partial, "wb") as out, open_split(split) as source:
            lazy = LazyDownConvertRecords(source, to_magic, 0, chunk_size)
            for converted, chunk_stats in lazy.chunks():
                written += out.write(converted)
                stats.add(chunk_stats)
            check_complete(split, source)     # conversion stops silently at an incomplete batch
        os.replace(partial, target)
    except SEGMENT_ERRORS as exc:
        return dict(result, error=f"{split.uri}: {exc}")
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
        if trace_memory:
            result["peak_memory_bytes"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    return dict(result, error=None, output_bytes=written, records_converted=stats.num_records_converted,
                temporary_memory_bytes=stats.temporary_memory_bytes,
                conversion_time_ms=stats.conversion_time_nanos / 1e6)


def convert(spark, input_path, output_dir, to_magic=1, chunk_size=128 << 10, trace_memory=False):
    """Down-convert every segment to ``to_magic`` (0 or 1) into ``<output>/<topic>-<partition>/`` under
    the same file names, one task per segment, at most ``chunk_size`` bytes of input converted at a
    time. Segments that cannot be converted (damaged, or zstd below magic 2) are listed in ``errors``
    and leave no output file. Conversion stats are summed over the cluster; with ``trace_memory`` the
    largest per-task peak of Python memory is reported too.

    ``output_dir`` must be a directory every executor can write (local, or a shared mount): new, empty or
    a previous convert output (``kmem.spark.outputs``)."""
    _check_conversion(to_magic, chunk_size)
    input_path, output_dir = _path("input_path", input_path), os.path.abspath(_path("output_dir", output_dir))
    segments = list_segments(input_path, split_bytes=float("inf"))
    results = []
    if segments:
        prepare_partition_output(output_dir, "convert", input_path)
        results = (spark.sparkContext.parallelize(segments, len(segments))
                   .map(lambda split: convert_segment(split, output_dir, to_magic, chunk_size, trace_memory))
                   .collect())
    done = [r for r in results if r["error"] is None]
    totals = {name: sum(r[name] for r in done)
              for name in ("input_bytes", "output_bytes", "records_converted", "temporary_memory_bytes",
                           "conversion_time_ms")}
    if trace_memory:
        totals["max_task_peak_memory_bytes"] = max((r["peak_memory_bytes"] for r in results), default=0)
    return {"to_magic": to_magic, "segments_found": len(results), "segments": len(done), "totals": totals,
            "errors": [{k: r[k] for k in ("topic", "partition", "segment", "error")} for r in results if r["error"]]}
