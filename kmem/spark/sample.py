"""A generated Kafka log directory for the demo and the tests, with the answers it should give.

The layout is a broker's: ``<dir>/<topic>-<partition>/<20-digit base offset>.log`` segments (only the
``.log`` files; indexes are not needed to read them). The data mixes what a real cluster holds:
segments written before a message-format upgrade (magic 1), v2 batches with every codec, idempotent
producers, transactional producers with commit and abort markers, and log-append-time batches.

``generate_sample`` returns a ``SampleManifest`` computed while writing (not by reading the files
back), so tests can check kmem's readers and jobs against it.
"""
import dataclasses
import os
import random

from kmem.ledger import NO_TXN, ProducerEntry
from kmem.records import ControlRecordType, RecordsBuilder, TimestampType, build_control_batch
from kmem.records.files import segment_file_name

BASE_TIMESTAMP = 1_700_000_000_000


@dataclasses.dataclass
class PartitionManifest:
    topic: str
    partition: int
    records: list = dataclasses.field(default_factory=list)       # (offset, key, value) of data records
    batches: int = 0
    control_batches: int = 0
    size_bytes: int = 0
    batches_by_format: dict = dataclasses.field(default_factory=dict)   # (magic, codec) -> count
    producers: dict = dataclasses.field(default_factory=dict)            # producer id -> ProducerEntry
    segments: list = dataclasses.field(default_factory=list)             # file paths


@dataclasses.dataclass
class SampleManifest:
    directory: str
    partitions: dict      # (topic, partition) -> PartitionManifest

    @property
    def record_count(self):
        return sum(len(p.records) for p in self.partitions.values())


# topic -> (codecs used by its v2 batches, whether its first segment predates the v2 format)
DEFAULT_TOPICS = {
    "orders": (("lz4", "none"), False),
    "payments": (("gzip", "none"), False),
    "clicks": (("snappy", "none"), True),
    "metrics": (("zstd",), False),      # zstd cannot be down-converted: convert reports it
}


def generate_sample(directory, topics=None, partitions=2, batches_per_partition=40, max_records_per_batch=20,
                    batches_per_segment=12, seed=0):
    """Write a sample log directory under ``directory`` and return its ``SampleManifest``."""
    rng = random.Random(seed)
    topics = DEFAULT_TOPICS if topics is None else topics
    manifest = SampleManifest(str(directory), {})
    next_producer_id = 1000
    for topic, (codecs, legacy_first) in topics.items():
        for partition in range(partitions):
            part = PartitionManifest(topic, partition)
            manifest.partitions[(topic, partition)] = part
            writer = _PartitionWriter(os.path.join(directory, f"{topic}-{partition}"), part, batches_per_segment)
            idempotent = list(range(next_producer_id, next_producer_id + rng.randint(1, 8)))
            transactional = idempotent[-1] + 1
            next_producer_id = transactional + 1
            sequences = dict.fromkeys(idempotent + [transactional], 0)
            open_txn = False
            for index in range(batches_per_partition):
                count = rng.randint(1, max_records_per_batch)
                if legacy_first and index < batches_per_partition // 4:
                    writer.write_batch(rng, count, magic=1, codec=rng.choice(("none", "gzip", "snappy")))
                    continue
                if open_txn and rng.random() < 0.35:
                    kind = rng.choice((ControlRecordType.COMMIT, ControlRecordType.ABORT))
                    writer.write_marker(transactional, kind, coordinator_epoch=3)
                    open_txn = False
                    continue
                use_txn = rng.random() < 0.3
                producer_id = transactional if use_txn else rng.choice(idempotent)
                writer.write_batch(rng, count, magic=2, codec=rng.choice(codecs), producer_id=producer_id,
                                   base_sequence=sequences[producer_id], transactional=use_txn,
                                   log_append_time=rng.random() < 0.15)
                sequences[producer_id] += count
                open_txn = open_txn or use_txn
            writer.close()
    return manifest


class _PartitionWriter:
    """Appends batches to a partition's segments, rolling to a new segment every few batches, and
    updates the manifest with what a reader should find."""

    def __init__(self, path, manifest, batches_per_segment):
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.manifest = manifest
        self.batches_per_segment = batches_per_segment
        self.next_offset = 0
        self.file = None
        self.in_segment = 0

    def _append(self, data, magic, codec):
        if self.file is None or self.in_segment == self.batches_per_segment:
            self.close()
            name = os.path.join(self.path, segment_file_name(self.next_offset))
            self.file = open(name, "wb")
            self.manifest.segments.append(name)
            self.in_segment = 0
        self.file.write(data)
        self.in_segment += 1
        self.manifest.size_bytes += len(data)
        key = (magic, codec)
        self.manifest.batches_by_format[key] = self.manifest.batches_by_format.get(key, 0) + 1

    def write_batch(self, rng, count, magic, codec, producer_id=-1, base_sequence=-1, transactional=False,
                    log_append_time=False):
        base = self.next_offset
        timestamp = BASE_TIMESTAMP + base * 10
        fields = {}
        if magic == 2:
            fields = dict(producer_id=producer_id, producer_epoch=0, base_sequence=base_sequence,
                          transactional=transactional)
        if log_append_time:
            fields.update(timestamp_type=TimestampType.LOG_APPEND_TIME, log_append_time=timestamp + 5_000)
        builder = RecordsBuilder(magic, codec, base_offset=base, **fields)
        records = []
        for i in range(count):
            key = f"{self.manifest.topic}-key-{rng.randrange(50)}".encode()
            value = rng.randbytes(rng.randint(0, 200))
            headers = [("source", b"kmem-demo")] if magic == 2 else ()
            builder.append(value, key=key, timestamp=timestamp + i, headers=headers)
            records.append((base + i, key, value))
        data = builder.build()
        if magic == 1 and codec == "none":
            # an uncompressed legacy run is one entry (a "batch" to readers) per record
            for _ in range(count - 1):
                self.manifest.batches += 1
                self.manifest.batches_by_format[(1, codec)] = self.manifest.batches_by_format.get((1, codec), 0) + 1
        self._append(data, magic, codec)
        self.manifest.batches += 1
        self.manifest.records.extend(records)
        self.next_offset = base + count
        if producer_id >= 0:
            max_timestamp = timestamp + 5_000 if log_append_time else timestamp + count - 1
            state = self.manifest.producers.get(producer_id)
            txn_first = NO_TXN
            if transactional:
                txn_first = state.current_txn_first_offset if state and state.current_txn_first_offset != NO_TXN else base
            self.manifest.producers[producer_id] = ProducerEntry(
                producer_id, 0, base_sequence + count - 1, base + count - 1, count - 1, max_timestamp,
                state.coordinator_epoch if state else -1, txn_first)

    def write_marker(self, producer_id, kind, coordinator_epoch):
        offset = self.next_offset
        timestamp = BASE_TIMESTAMP + offset * 10
        self._append(build_control_batch(kind, offset, producer_id, 0, timestamp, coordinator_epoch), 2, "none")
        self.manifest.batches += 1
        self.manifest.control_batches += 1
        self.next_offset = offset + 1
        # as Kafka's log recovery: a marker ends the transaction and sets the coordinator epoch and the
        # timestamp; the last offset and sequence stay those of the producer's last data batch
        self.manifest.producers[producer_id] = self.manifest.producers[producer_id]._replace(
            coordinator_epoch=coordinator_epoch, current_txn_first_offset=NO_TXN, timestamp=timestamp)

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None
