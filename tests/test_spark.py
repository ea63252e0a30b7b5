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
def spark():
    from kmem.spark import get_session

    session = get_session("local[2]", app_name="kmem-tests", conf={"spark.ui.enabled": "false"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


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
