"""The main job: a generated Kafka log directory through every pipeline job, outputs cross-checked.

Each check compares two things computed independently: the generator's own record of what it wrote,
the ``report`` job, the ledgers that ``PidLedger`` reads back, and the converted segments read through
the ``kafka-log`` data source.

The output directory must be new, empty, or a previous demo output (it holds a ``.kmem-demo`` file);
only what the demo writes is replaced there, anything else is left alone.
"""
import contextlib
import os

from kmem.spark import jobs, outputs
from kmem.spark.sample import generate_sample

# the sample's timestamps are from 2023: ledgers must not expire them while checking
NEVER_EXPIRE_MS = 1 << 62
MARKER = outputs.marker("demo")
OUTPUTS = ("logs", "ledger", "converted-v1", "report.json", "report.png")


def prepare_output(output_dir):
    """Make ``output_dir`` ready for a run: created when missing; in a previous demo output, the demo's
    own outputs removed. Refuses (``InvalidArgumentError``) any other non-empty directory, and a file."""
    outputs.prepare_output(output_dir, "demo", OUTPUTS.__contains__)


def run_demo(spark, output_dir, seed=0, batches_per_partition=40, progress=None):
    """Generate the sample under ``output_dir``/logs, run every job on it, and cross-check the outputs.
    Returns the jobs' results and ``checks``: {description: passed}."""
    progress = progress or (lambda name: contextlib.nullcontext())
    output_dir = os.fspath(output_dir)
    prepare_output(output_dir)
    logs = os.path.join(output_dir, "logs")
    manifest = generate_sample(logs, seed=seed, batches_per_partition=batches_per_partition)
    with progress("report"):
        report = jobs.report(spark, logs, output_dir)
    with progress("ledger"):
        ledgers = jobs.ledger(spark, logs, os.path.join(output_dir, "ledger"))
    converted_dir = os.path.join(output_dir, "converted-v1")
    with progress("convert to v1"):
        converted = jobs.convert(spark, logs, converted_dir, to_magic=1)
    with progress("read back"):
        checks = {
            "report counts equal what was generated": _report_matches(report, manifest),
            "ledgers hold every producer's state, as PidLedger reads it": _ledgers_match(
                ledgers, manifest, os.path.join(output_dir, "ledger")),
            "report's producer-id cardinality equals the ledgers'": _cardinality_matches(report, ledgers),
            "converted segments hold every record once, at magic 1": _conversion_matches(
                spark, converted_dir, manifest),
            "zstd segments are reported as unconvertible, not written": _zstd_reported(converted, manifest),
        }
    return {"report": report, "ledger": ledgers, "convert": converted, "checks": checks}


def _report_matches(report, manifest):
    by_key = {(p["topic"], p["partition"]): p for p in report["partitions"]}
    return not report["corrupt_segments"] and by_key.keys() == manifest.partitions.keys() and all(
        by_key[key]["records"] == len(part.records) and by_key[key]["batches"] == part.batches
        and by_key[key]["bytes"] == part.size_bytes and by_key[key]["control_batches"] == part.control_batches
        and by_key[key]["producer_ids"] == len(part.producers)
        for key, part in manifest.partitions.items())


def _ledgers_match(ledgers, manifest, ledger_dir):
    from kmem.ledger import PidLedger

    if any(p["error"] for p in ledgers["partitions"]):
        return False
    for (topic, partition), part in manifest.partitions.items():
        ledger = PidLedger(os.path.join(ledger_dir, f"{topic}-{partition}"), producer_id_expiration_ms=NEVER_EXPIRE_MS,
                           read_only=True)
        try:
            if any(ledger.read(pid) != entry for pid, entry in part.producers.items()):
                return False
            if ledger.read(max(part.producers) + 1_000_000) is not None:
                return False
        finally:
            ledger.close()
    return True


def _cardinality_matches(report, ledgers):
    return ({(p["topic"], p["partition"]): p["producer_ids"] for p in report["partitions"]}
            == {(p["topic"], p["partition"]): p["producer_ids"] for p in ledgers["partitions"]})


def _conversion_matches(spark, converted_dir, manifest):
    rows = (spark.read.format("kafka-log").load(converted_dir)
            .select("topic", "partition", "offset", "key", "value", "magic", "error").collect())
    if any(row.error or row.magic != 1 for row in rows):
        return False
    got = sorted((r.topic, r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in rows)
    expected = sorted((topic, partition, offset, key, value)
                      for (topic, partition), part in manifest.partitions.items()
                      if (2, "zstd") not in part.batches_by_format
                      for offset, key, value in part.records)
    return got == expected


def _zstd_reported(converted, manifest):
    zstd_segments = {(topic, partition, os.path.basename(path))
                     for (topic, partition), part in manifest.partitions.items()
                     if (2, "zstd") in part.batches_by_format for path in part.segments}
    reported = {(e["topic"], e["partition"], e["segment"]) for e in converted["errors"]}
    return bool(zstd_segments) and reported == zstd_segments and all("zstandard" in e["error"]
                                                                     for e in converted["errors"])
