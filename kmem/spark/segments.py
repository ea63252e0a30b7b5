"""Finding and opening Kafka log segments: ``<topic>-<partition>/<20-digit base offset>.log``.

Local paths (and ``file://`` URIs) are read as ``FileRecords``, a window at a time. Any other URI that
``pyarrow.fs`` understands (``hdfs://``, ``s3://``, ``gs://``) is read through it, one split at a time.
"""
import dataclasses
import mmap
import os
import re

from kmem.records import MemoryRecords
from kmem.records.batches import LOG_OVERHEAD
from kmem.records.files import SEGMENT_NAME, FileRecords

PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
DEFAULT_SPLIT_BYTES = 128 << 20


@dataclasses.dataclass(frozen=True)
class SegmentSplit:
    """A byte range of one segment: the batches that *start* in ``[start, end)``. Picklable."""
    uri: str
    topic: str
    partition: int
    base_offset: int
    start: int
    end: int

    @property
    def name(self):
        return self.uri.rsplit("/", 1)[-1]


def _filesystem(uri):
    from pyarrow import fs

    if _is_local(uri):
        return fs.LocalFileSystem(), os.path.abspath(uri.removeprefix("file://"))
    return fs.FileSystem.from_uri(uri)


def _is_local(uri):
    return "://" not in uri or uri.startswith("file://")


def list_segments(root, split_bytes=DEFAULT_SPLIT_BYTES):
    """Every segment under ``root`` as splits, ordered by topic, partition and base offset.

    Segments larger than ``split_bytes`` are split at batch boundaries (local files only; a remote
    file is one split). Files that are not segments (indexes, checkpoints) are ignored.
    """
    from pyarrow import fs

    filesystem, base = _filesystem(root)
    scheme = "" if _is_local(root) else root.split("://", 1)[0] + "://"
    infos = filesystem.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=False))
    splits = []
    for info in infos:
        if info.type != fs.FileType.File:
            continue
        directory, file_name = info.path.rsplit("/", 1)
        segment, partition_dir = SEGMENT_NAME.match(file_name), PARTITION_DIR.match(directory.rsplit("/", 1)[-1])
        if not segment or not partition_dir:
            continue
        uri = scheme + info.path
        topic, partition, base_offset = partition_dir["topic"], int(partition_dir["partition"]), int(segment[1])
        if _is_local(root) and info.size > split_bytes:
            bounds = _batch_aligned_bounds(info.path, info.size, split_bytes)
        else:
            bounds = [0, info.size]
        splits.extend(SegmentSplit(uri, topic, partition, base_offset, start, end)
                      for start, end in zip(bounds, bounds[1:]))
    splits.sort(key=lambda s: (s.topic, s.partition, s.base_offset, s.start))
    return splits


def _batch_aligned_bounds(path, size, split_bytes):
    """Split points at batch starts, about ``split_bytes`` apart (reads only the 12-byte entry headers)."""
    bounds = [0]
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        position = 0
        while position + LOG_OVERHEAD <= size:
            entry_size = int.from_bytes(data[position + 8:position + 12], "big", signed=True)
            if entry_size < 0:
                break     # corrupt from here on: the reader of the last split reports it
            position += LOG_OVERHEAD + entry_size
            if position - bounds[-1] >= split_bytes and position < size:
                bounds.append(position)
    bounds.append(size)
    return bounds


def open_split(split):
    """The split's records: a ``FileRecords`` slice of a local file (read in bounded windows, never
    whole), or the split's bytes read through ``pyarrow.fs``. Split bounds are batch boundaries."""
    if _is_local(split.uri):
        return FileRecords(split.uri.removeprefix("file://"), split.start, split.end)
    filesystem, path = _filesystem(split.uri)
    with filesystem.open_input_file(path) as file:
        file.seek(split.start)
        return MemoryRecords(file.read(split.end - split.start))


def batches_of_split(split):
    """Yield ``RecordBatch`` views of the split's batches; raises KmemError on corruption."""
    records = open_split(split)
    try:
        yield from records.batches()
    finally:
        if isinstance(records, FileRecords):
            records.close()
