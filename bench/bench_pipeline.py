"""The ``convert`` job on embedded local[2] Spark vs the same conversion in one plain Python process,
and the per-task peak memory of ``convert`` for a 64 MiB and a 1 GiB segment."""
import os
import random
import shutil

import pytest

from kmem.records import build_records
from kmem.spark import jobs
from kmem.spark.segments import list_segments

pytest.importorskip("pyspark")

SEGMENTS = 8
BATCHES_PER_SEGMENT = 500
RECORDS_PER_BATCH = 100
VALUE_SIZE = 1024


@pytest.fixture(scope="module")
def spark():
    from kmem.spark import get_session

    session = get_session("local[2]", app_name="kmem-bench", conf={"spark.ui.enabled": "false"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def gzip_logs(directory):
    """Gzip-compressed v2 segments of 1 KiB messages: conversion is CPU-bound, as on real topics."""
    rng = random.Random(5)
    words = [rng.randbytes(16) for _ in range(64)]
    for segment in range(SEGMENTS):
        path = os.path.join(directory, f"events-{segment}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, f"{0:020d}.log"), "wb") as file:
            for index in range(BATCHES_PER_SEGMENT):
                values = [b"".join(rng.choices(words, k=VALUE_SIZE // 16)) for _ in range(RECORDS_PER_BATCH)]
                file.write(build_records(values, magic=2, compression="gzip",
                                         base_offset=index * RECORDS_PER_BATCH))
    return sum(split.end for split in list_segments(directory))


@pytest.fixture(scope="module")
def gzip_segments(tmp_path_factory):
    logs = str(tmp_path_factory.mktemp("gzip-logs"))
    return logs, gzip_logs(logs)


GROUP = "convert gzip v2->v1, 8 segments"


def test_convert_on_local2(compare, spark, gzip_segments, tmp_path):
    logs, size = gzip_segments

    def on_spark():
        assert not jobs.convert(spark, logs, str(tmp_path), to_magic=1)["errors"]

    on_spark()      # warm the Python workers, as on a running cluster
    compare(GROUP, "kmem", on_spark, unit_bytes=size)


def test_convert_in_one_process(compare, gzip_segments, tmp_path):
    logs, size = gzip_segments

    def in_one_process():
        for split in list_segments(logs, split_bytes=float("inf")):
            assert jobs.convert_segment(split, str(tmp_path), 1, 128 << 10)["error"] is None

    compare(GROUP, "one plain Python process", in_one_process, unit_bytes=size)


@pytest.mark.parametrize("segment_mib", [64, 1024])
def test_convert_task_peak_memory(benchmark, spark, tmp_path, segment_mib):
    batch = build_records([bytes([i % 251]) * VALUE_SIZE for i in range(RECORDS_PER_BATCH)], magic=2)
    path = tmp_path / "logs" / "big-0"
    path.mkdir(parents=True)
    block = batch * ((1 << 20) // len(batch))
    with open(path / f"{0:020d}.log", "wb") as file:
        for _ in range(segment_mib):
            file.write(block)

    def run():
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        return jobs.convert(spark, str(tmp_path / "logs"), str(tmp_path / "out"), 1, trace_memory=True)

    result = benchmark.pedantic(run, rounds=1, iterations=1)
    peak = result["totals"]["max_task_peak_memory_bytes"]
    benchmark.extra_info.update(segment_mib=segment_mib, task_peak_memory_bytes=peak)
    print(f"\nconvert task peak memory, {segment_mib} MiB segment: {peak / 1024:.0f} KiB")
