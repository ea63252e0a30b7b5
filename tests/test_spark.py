"""The pipeline on embedded local Spark, against generated logs whose contents are known."""
import json
import os
import shutil

import pytest

from kmem.ledger import PidLedger
from kmem.records import down_convert
from kmem.spark import jobs
from kmem.spark.demo import NEVER_EXPIRE_MS
from kmem.spark.sample import generate_sample
from kmem.spark.segments import list_segments

pytest.importorskip("pyspark")


@pytest.fixture(scope="session")
def sample(tmp_path_factory):
    directory = tmp_path_factory.mktemp("logs")
    return generate_sample(directory, seed=3, batches_per_partition=30)


def expected_records(manifest, skip_zstd=False):
    return sorted((topic, partition, offset, key, value)
                  for (topic, partition), part in manifest.partitions.items()
                  if not (skip_zstd and (2, "zstd") in part.batches_by_format)
                  for offset, key, value in part.records)


def test_every_record_comes_back_once_with_its_fields(spark, sample):
    df = spark.read.format("kafka-log").load(sample.directory)
    rows = df.collect()
    assert not any(r.error for r in rows)
    data = [r for r in rows if not r.is_control]
    assert sorted((r.topic, r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in data) == \
        expected_records(sample)
    for row in data:
        if row.magic == 2:
            assert [(h.key, bytes(h.value)) for h in row.headers] == [("source", b"kmem-demo")]
            producer = sample.partitions[(row.topic, row.partition)].producers[row.producer_id]
            assert row.producer_epoch == producer.epoch and row.sequence >= 0
        else:
            assert row.headers == [] and row.producer_id == -1 and row.sequence == -1
            assert row.topic == "clicks"        # the topic whose first segment predates v2
    controls = [r for r in rows if r.is_control]
    assert len(controls) == sum(p.control_batches for p in sample.partitions.values())
    assert all(r.is_transactional and r.codec == "none" for r in controls)


def test_byte_range_splits_read_each_record_exactly_once(spark, sample):
    splits = list_segments(sample.directory, split_bytes=2048)
    assert len(splits) > len(list_segments(sample.directory))
    df = spark.read.format("kafka-log").option("split_bytes", 2048).load(sample.directory)
    data = df.where("not is_control").select("topic", "partition", "offset", "key", "value").collect()
    assert sorted((r.topic, r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in data) == \
        expected_records(sample)


def test_batch_level_rows(spark, sample):
    rows = spark.read.format("kafka-log").option("level", "batches").load(sample.directory).collect()
    assert len(rows) == sum(p.batches for p in sample.partitions.values())
    for (topic, partition), part in sample.partitions.items():
        mine = [r for r in rows if (r.topic, r.partition) == (topic, partition)]
        assert sum(r.size_bytes for r in mine) == part.size_bytes
        formats = {}
        for r in mine:
            formats[(r.magic, r.codec)] = formats.get((r.magic, r.codec), 0) + 1
        assert formats == part.batches_by_format


def test_unknown_level_is_a_clear_error(spark, sample):
    with pytest.raises(Exception, match="level must be"):
        spark.read.format("kafka-log").option("level", "bytes").load(sample.directory).collect()


def test_report_counts_match_the_sample(spark, sample, tmp_path):
    result = jobs.report(spark, sample.directory, str(tmp_path))
    assert json.loads((tmp_path / "report.json").read_text()) == json.loads(json.dumps(result))
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    by_key = {(p["topic"], p["partition"]): p for p in result["partitions"]}
    assert by_key.keys() == sample.partitions.keys()
    for key, part in sample.partitions.items():
        got = by_key[key]
        assert (got["records"], got["batches"], got["bytes"], got["control_batches"], got["producer_ids"]) == \
            (len(part.records), part.batches, part.size_bytes, part.control_batches, len(part.producers))
        assert got["bloom_shape"]["bits"] >= got["producer_ids"]
    assert result["totals"]["records"] == sample.record_count


def test_ledger_equals_the_producer_state_written(spark, sample, tmp_path):
    result = jobs.ledger(spark, sample.directory, str(tmp_path))
    assert all(p["error"] is None for p in result["partitions"])
    for (topic, partition), part in sample.partitions.items():
        ledger = PidLedger(tmp_path / f"{topic}-{partition}", producer_id_expiration_ms=NEVER_EXPIRE_MS)
        try:
            assert {pid: ledger.read(pid) for pid in part.producers} == part.producers
            assert ledger.read(-5) is None
        finally:
            ledger.close()


def test_convert_output_equals_down_convert_and_parses_with_kafka_python(spark, sample, tmp_path):
    from kafka.record.memory_records import MemoryRecords as KafkaPythonRecords

    result = jobs.convert(spark, sample.directory, str(tmp_path), to_magic=1, chunk_size=4096)
    assert result["totals"]["records_converted"] > 0
    converted_records = []
    for split in list_segments(sample.directory):
        source = open(split.uri, "rb").read()
        output = tmp_path / f"{split.topic}-{split.partition}" / split.name
        if split.topic == "metrics":        # zstd: reported, not written
            assert not output.exists()
            continue
        written = output.read_bytes()
        assert written == bytes(down_convert(source, 1).records.buffer)
        reader = KafkaPythonRecords(written)
        while reader.has_next():
            batch = reader.next_batch()
            assert batch.magic == 1
            converted_records.extend((split.topic, split.partition, r.offset, r.key, r.value) for r in batch)
    assert sorted(converted_records) == expected_records(sample, skip_zstd=True)
    assert {e["topic"] for e in result["errors"]} == {"metrics"}


def test_a_corrupt_segment_is_reported_and_the_rest_processed(spark, sample, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(sample.directory, logs)
    victim = sorted((logs / "orders-0").iterdir())[0]
    data = bytearray(victim.read_bytes())
    first_size = int.from_bytes(data[8:12], "big")
    data[12 + first_size + 16] = 9          # the second batch's magic byte: no such format
    victim.write_bytes(bytes(data))

    result = jobs.report(spark, str(logs))
    assert [(c["topic"], c["partition"], c["segment"]) for c in result["corrupt_segments"]] == \
        [("orders", 0, victim.name)]
    assert "magic" in result["corrupt_segments"][0]["error"]
    untouched = {(p["topic"], p["partition"]): p["records"] for p in result["partitions"]}
    for key, part in sample.partitions.items():
        if key != ("orders", 0):
            assert untouched[key] == len(part.records)

    rows = spark.read.format("kafka-log").load(str(logs)).where("error is not null").collect()
    assert [(r.topic, r.partition, r.segment) for r in rows] == [("orders", 0, victim.name)]
    converted = jobs.convert(spark, str(logs), str(tmp_path / "out"))
    assert ("orders", 0, victim.name) in {(e["topic"], e["partition"], e["segment"]) for e in converted["errors"]}
    assert not (tmp_path / "out" / "orders-0" / victim.name).exists()
    ledgers = jobs.ledger(spark, str(logs), str(tmp_path / "ledger"))
    assert [p["error"] is not None for p in ledgers["partitions"]].count(True) == 1


def test_the_demo_command_runs_every_job_and_its_checks_pass(spark, tmp_path, capsys):
    from kmem.cli import main

    assert main(["pipeline", "demo", "--output", str(tmp_path / "demo"), "--no-progress",
                 "--batches-per-partition", "12"]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and out.count("[ok]") == 5
    assert os.path.exists(tmp_path / "demo" / "report.png")


def write_segment(path, batch, copies):
    """A segment of ``copies`` times the same batch (conversion does not need increasing offsets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        for _ in range(copies):
            file.write(batch)


def test_convert_task_memory_is_bounded_by_the_chunk_not_the_segment(spark, tmp_path):
    from kmem.records import build_records

    batch = build_records([bytes([i % 251]) * 1024 for i in range(100)], magic=2)     # ~100 KiB
    write_segment(tmp_path / "logs" / "big-0" / "00000000000000000000.log", batch, 160)   # ~16 MiB
    chunk = 64 << 10
    result = jobs.convert(spark, str(tmp_path / "logs"), str(tmp_path / "out"), 1, chunk, trace_memory=True)
    assert result["errors"] == [] and result["totals"]["records_converted"] == 16_000
    peak = result["totals"]["max_task_peak_memory_bytes"]
    # at most one source batch (100 KiB here) and its conversion are alive at a time
    assert 0 < peak < 4 * max(chunk, len(batch)) + (256 << 10), peak


def test_splitting_a_segment_with_a_corrupt_size_still_covers_the_file_and_reports_it(tmp_path):
    from kmem.errors import KmemError
    from kmem.records import build_records
    from kmem.spark.segments import batches_of_split

    batch = build_records([b"x" * 100] * 10, magic=2)
    path = tmp_path / "t-0" / "00000000000000000000.log"
    path.parent.mkdir()
    data = bytearray(batch * 40)
    data[len(batch) * 20 + 8:len(batch) * 20 + 12] = (-7).to_bytes(4, "big", signed=True)  # 21st batch size
    path.write_bytes(bytes(data))

    splits = list_segments(str(tmp_path), split_bytes=len(batch) * 5)
    assert splits[0].start == 0 and splits[-1].end == len(data) and len(splits) > 1
    assert all(a.end == b.start for a, b in zip(splits, splits[1:]))     # contiguous, nothing skipped
    read, failures = 0, 0
    for split in splits:
        try:
            read += sum(1 for _ in batches_of_split(split))
        except KmemError:
            failures += 1
    assert read == 20 and failures == 1


def test_a_transaction_marker_too_short_to_hold_its_coordinator_epoch_is_corrupt():
    from kmem.errors import CorruptRecordError
    from kmem.records import MemoryRecords, RecordsBuilder

    builder = RecordsBuilder(2, base_offset=5, producer_id=9, producer_epoch=0, transactional=True, control=True)
    builder.append(b"\x00\x00", key=b"\x00\x00\x00\x01", timestamp=1)       # version only, no epoch
    with pytest.raises(CorruptRecordError, match="coordinator epoch"):
        jobs.rebuild_producer_state(MemoryRecords(builder.build()))


# ------------------------------------------------------------------ empty, damaged and hostile input

def log_dir_with(tmp_path, data, name="t-0"):
    """A log directory holding one segment with the bytes ``data``."""
    path = tmp_path / "logs" / name / "00000000000000000000.log"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return tmp_path / "logs"


def test_an_empty_log_directory_gives_empty_results_and_one_warning(spark, tmp_path, caplog):
    empty = tmp_path / "empty"
    (empty / "not-a-partition").mkdir(parents=True)
    for level in ("records", "batches"):
        assert spark.read.format("kafka-log").option("level", level).load(str(empty)).collect() == []
    caplog.clear()
    result = jobs.report(spark, empty, tmp_path / "report")
    assert result["partitions"] == [] and result["corrupt_segments"] == [] and set(result["totals"].values()) == {0}
    assert (tmp_path / "report" / "report.png").exists()
    assert jobs.ledger(spark, empty, tmp_path / "ledger") == {"partitions": []}
    converted = jobs.convert(spark, empty, tmp_path / "out")
    assert converted["segments_found"] == 0 and converted["errors"] == []
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 3 and all("no Kafka log segments" in w and str(empty) in w for w in warnings)


def test_a_first_size_field_past_the_end_keeps_the_partition_and_reports_the_unread_bytes(spark, tmp_path):
    from kmem.records import build_records

    batch = bytearray(build_records([b"v" * 50] * 4, magic=2))
    batch[8:12] = (1 << 20).to_bytes(4, "big")          # claims 1 MiB; the file is a few hundred bytes
    logs = log_dir_with(tmp_path, bytes(batch))

    result = jobs.report(spark, logs)
    assert [(p["topic"], p["partition"], p["batches"], p["unread_bytes"]) for p in result["partitions"]] == \
        [("t", 0, 0, len(batch))]
    [corrupt] = result["corrupt_segments"]
    assert (corrupt["position"], corrupt["unread_bytes"]) == (0, len(batch))
    assert "incomplete batch" in corrupt["error"] and str(1 << 20) in corrupt["error"]
    assert result["totals"]["unread_bytes"] == len(batch)
    [row] = spark.read.format("kafka-log").option("level", "batches").load(str(logs)).collect()
    assert (row.position, row.size_bytes) == (0, len(batch)) and "incomplete batch" in row.error

    converted = jobs.convert(spark, logs, tmp_path / "out")
    assert converted["segments"] == 0 and "incomplete batch" in converted["errors"][0]["error"]
    assert list((tmp_path / "out" / "t-0").iterdir()) == []
    [ledger] = jobs.ledger(spark, logs, tmp_path / "ledger")["partitions"]
    assert "incomplete batch" in ledger["error"]


def test_whole_batches_before_an_incomplete_tail_are_counted_and_the_tail_reported(spark, tmp_path):
    from kmem.records import build_records

    whole = build_records([b"v" * 50] * 4, magic=2) * 3
    tail = build_records([b"w" * 50] * 4, magic=2)[:40]
    logs = log_dir_with(tmp_path, whole + tail)
    [partition] = jobs.report(spark, logs)["partitions"]
    assert (partition["batches"], partition["records"], partition["bytes"], partition["unread_bytes"]) == \
        (3, 12, len(whole), len(tail))
    rows = spark.read.format("kafka-log").load(str(logs)).collect()
    assert len([r for r in rows if r.error is None]) == 12 and "incomplete batch" in rows[-1].error


def offset_overflow_segment(records=3):
    """A valid idempotent batch followed by one whose base offset is INT64_MAX (not covered by the CRC),
    so its last offset overflows int64."""
    from kmem.records import RecordsBuilder

    def batch(base_offset):
        builder = RecordsBuilder(2, base_offset=base_offset, producer_id=7, producer_epoch=0, base_sequence=0)
        for i in range(records):
            builder.append(b"v", key=b"k", timestamp=1 + i)
        return bytearray(builder.build())

    hostile = batch(0)
    hostile[0:8] = ((1 << 63) - 1).to_bytes(8, "big")
    good = batch(0)
    return bytes(good + hostile), len(good)


def test_a_base_offset_of_int64_max_is_an_error_row_not_a_failed_job(spark, tmp_path):
    data, good_size = offset_overflow_segment()
    logs = log_dir_with(tmp_path, data)
    rows = spark.read.format("kafka-log").option("level", "batches").load(str(logs)).collect()
    assert [r.base_offset for r in rows if r.error is None] == [0]
    [error] = [r for r in rows if r.error]
    assert "int64" in error.error and (error.position, error.size_bytes) == (good_size, len(data) - good_size)
    records = spark.read.format("kafka-log").load(str(logs)).collect()     # the job completes
    assert [r.offset for r in records[:3]] == [0, 1, 2]
    [partition] = jobs.report(spark, logs)["partitions"]
    assert (partition["batches"], partition["unread_bytes"]) == (1, len(data) - good_size)
    [ledger] = jobs.ledger(spark, logs, tmp_path / "ledger")["partitions"]
    assert "int64" in ledger["error"]


@pytest.mark.parametrize("failure", [OverflowError("int too big"), RuntimeError("unexpected")])
def test_convert_leaves_nothing_behind_when_a_conversion_raises(tmp_path, monkeypatch, failure):
    import kmem.records
    from kmem.records import build_records

    logs = log_dir_with(tmp_path, build_records([b"v" * 50] * 4, magic=2) * 3)
    [split] = list_segments(logs, split_bytes=float("inf"))
    chunks_before_failure = 2

    class FailingConversion(kmem.records.LazyDownConvertRecords):
        def chunks(self):
            for index, chunk in enumerate(super().chunks()):
                if index == chunks_before_failure:
                    raise failure
                yield chunk

    monkeypatch.setattr(kmem.records, "LazyDownConvertRecords", FailingConversion)
    output = tmp_path / "out"
    if isinstance(failure, OverflowError):
        result = jobs.convert_segment(split, str(output), 1, 1)
        assert "int too big" in result["error"]
    else:       # not a segment's fault: raised, but the half-written file is still removed
        with pytest.raises(RuntimeError):
            jobs.convert_segment(split, str(output), 1, 1)
    assert list((output / "t-0").iterdir()) == []


@pytest.mark.parametrize("call, argument", [
    (lambda logs, out: jobs.convert(None, logs, out, chunk_size=0), "chunk_size"),
    (lambda logs, out: jobs.convert(None, logs, out, chunk_size=-5), "chunk_size"),
    (lambda logs, out: jobs.convert(None, logs, out, chunk_size="4096"), "chunk_size"),
    (lambda logs, out: jobs.convert(None, logs, out, chunk_size=True), "chunk_size"),
    (lambda logs, out: jobs.convert(None, logs, out, to_magic=2), "to_magic"),
    (lambda logs, out: jobs.convert_segment(list_segments(logs)[0], out, 1, 0), "chunk_size"),
    (lambda logs, out: jobs.convert(None, None, out), "input_path"),
    (lambda logs, out: jobs.convert(None, logs, 5), "output_dir"),
    (lambda logs, out: jobs.ledger(None, logs, out, false_positive_rate=0), "false_positive_rate"),
    (lambda logs, out: jobs.report(None, logs, false_positive_rate=1.5), "false_positive_rate"),
    (lambda logs, out: jobs.report(None, logs / "missing"), "missing does not exist"),
    (lambda logs, out: jobs.ledger(None, logs / "missing", out), "missing does not exist"),
    (lambda logs, out: jobs.convert(None, logs / "missing", out), "missing does not exist"),
])
def test_job_arguments_are_checked_before_spark_is_used(sample, tmp_path, call, argument):
    from kmem.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=argument):
        call(sample.directory if argument != "missing does not exist" else tmp_path, tmp_path / "out")
    # the session is None: nothing reached Spark, and nothing was written
    assert not (tmp_path / "out").exists()


def test_a_bad_split_bytes_option_names_the_option(spark, sample):
    with pytest.raises(Exception, match="split_bytes must be a positive integer"):
        spark.read.format("kafka-log").option("split_bytes", "0").load(sample.directory).collect()


def test_the_report_figure_labels_its_axes_with_what_the_bars_count():
    from kmem.spark.jobs import report_figure

    result = {"input": "/var/kafka", "partitions": [
        {"topic": "t", "partition": 0, "producer_ids": 3, "batches_by_format": {"v2/none": 4, "v1/gzip": 2}}]}
    figure = report_figure(result)
    batches, producers = figure.axes
    assert batches.get_ylabel() == "batches" and "batches" in batches.get_title()
    assert [bar.get_height() for bar in batches.patches] == [2, 4]
    assert "producer ids" in producers.get_ylabel() and producers.patches[0].get_height() == 3
    assert all(axis.get_xlabel() == "topic-partition" for axis in (batches, producers))
    assert "/var/kafka" in figure.get_suptitle()


def test_convert_on_the_demo_sample_reads_as_a_partial_success(spark, sample, tmp_path, capsys):
    from kmem.cli import main

    assert main(["pipeline", "convert", sample.directory, str(tmp_path), "--no-progress"]) == 1
    captured = capsys.readouterr()
    zstd_segments = sum(len(p.segments) for (topic, _), p in sample.partitions.items() if topic == "metrics")
    total = len(list_segments(sample.directory))
    assert f"converted {total - zstd_segments} of {total} segments to magic 1" in captured.out
    assert captured.out.count("NOT CONVERTED metrics-") == zstd_segments
    assert captured.err.strip().splitlines()[-1] == \
        f"partial success: {zstd_segments} of {total} segments were not converted (NOT CONVERTED above)"


def test_the_ledger_command_lists_every_partition_and_exits_0(spark, sample, tmp_path, capsys):
    from kmem.cli import main

    assert main(["pipeline", "ledger", sample.directory, str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {len(sample.partitions)} of {len(sample.partitions)} ledgers" in out
    for (topic, partition), part in sample.partitions.items():
        assert f"{topic}-{partition}" in out


def test_listing_ignores_directories_that_cannot_be_kafka_partitions_and_refuses_a_missing_root(tmp_path):
    from kmem.errors import InvalidArgumentError
    from kmem.records import build_records

    for name in ("t-0", f"t-{1 << 31}", "no_partition_number"):       # partition ids are int32
        (tmp_path / name).mkdir()
        (tmp_path / name / "00000000000000000000.log").write_bytes(build_records([b"v"], magic=2))
    assert [(s.topic, s.partition) for s in list_segments(tmp_path)] == [("t", 0)]
    for missing in (tmp_path / "missing", tmp_path / "t-0" / "00000000000000000000.log"):
        with pytest.raises(InvalidArgumentError, match="does not exist or is not a directory"):
            list_segments(missing)
