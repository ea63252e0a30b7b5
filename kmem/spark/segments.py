"""Finding and opening Kafka log segments: ``<topic>-<partition>/<20-digit base offset>.log``.

Local paths (and ``file://`` URIs) are read as ``FileRecords``, a window at a time. Any other URI that
``pyarrow.fs`` understands (``hdfs://``, ``s3://``, ``gs://``) is read through it, one split at a time.
"""
import contextlib
import dataclasses
import logging
import mmap
import os
import re

from kmem.errors import CorruptRecordError, InvalidArgumentError, KmemError
from kmem.records import MemoryRecords
from kmem.records.batches import LOG_OVERHEAD
from kmem.records.files import SEGMENT_NAME, FileRecords

PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
DEFAULT_SPLIT_BYTES = 128 << 20
MAX_PARTITION = (1 << 31) - 1       # partition ids are int32
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# What reading a damaged segment may raise; jobs turn it into an error row or a listed failure, never a
# failed job. OverflowError: a hostile batch's offsets overflowing int64 inside the records layer.
SEGMENT_ERRORS = (KmemError, OverflowError)

log = logging.getLogger(__name__)


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
    file is one split). Files that are not segments (indexes, checkpoints) are ignored; finding none
    logs a one-line warning. A missing ``root`` raises ``InvalidArgumentError``.
    """
    from pyarrow import fs

    root = os.fspath(root)
    filesystem, base = _filesystem(root)
    if filesystem.get_file_info(base).type != fs.FileType.Directory:
        raise InvalidArgumentError(f"input directory {root} does not exist or is not a directory")
    scheme = "" if _is_local(root) else root.split("://", 1)[0] + "://"
    infos = filesystem.get_file_info(fs.FileSelector(base, recursive=True))
    splits = []
    for info in infos:
        if info.type != fs.FileType.File:
            continue
        directory, file_name = info.path.rsplit("/", 1)
        segment, partition_dir = SEGMENT_NAME.match(file_name), PARTITION_DIR.match(directory.rsplit("/", 1)[-1])
        if not segment or not partition_dir or int(partition_dir["partition"]) > MAX_PARTITION:
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
    if not splits:
        log.warning("no Kafka log segments (<topic>-<partition>/<20-digit offset>.log) under %s", root)
    return splits


def _batch_aligned_bounds(path, size, split_bytes):
    """Split points at batch starts, about ``split_bytes`` apart (reads only the 12-byte entry headers)."""
    bounds = [0]
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for end in _entry_ends(lambda position: data[position + 8:position + 12], size):
            if end - bounds[-1] >= split_bytes and end < size:
                bounds.append(end)
    bounds.append(size)
    return bounds


def _entry_ends(size_field, size):
    """End positions of the entries in the first ``size`` bytes, judged by their size fields alone
    (``size_field(position)``: the 4 bytes at ``position + 8``). Stops at a negative size (corrupt from
    there: the reader reports it) and at an entry running past ``size``."""
    position = 0
    while position + LOG_OVERHEAD <= size:
        entry_size = int.from_bytes(size_field(position), "big", signed=True)
        if entry_size < 0 or position + LOG_OVERHEAD + entry_size > size:
            return
        position += LOG_OVERHEAD + entry_size
        yield position


def check_complete(split, records):
    """Raise ``CorruptRecordError`` when ``records`` (the split opened) ends in an incomplete batch,
    which readers skip silently, as Kafka does for a segment being appended to."""
    whole = 0
    for whole in _entry_ends(lambda position: records.read(position + 8, 4), records.size_in_bytes):
        pass
    if whole < records.size_in_bytes:
        raise _incomplete_batch(split, records, whole)


def _incomplete_batch(split, records, position):
    header = records.read(position, LOG_OVERHEAD)
    what = (f"a batch whose size field says {int.from_bytes(header[8:12], 'big', signed=True)} bytes"
            if len(header) == LOG_OVERHEAD else "a partial batch header")
    return CorruptRecordError(f"incomplete batch: the last {records.size_in_bytes - position} bytes of the "
                              f"segment are {what}, past the end of the file", split.start + position)


@contextlib.contextmanager
def open_split(split):
    """The split's records: a ``FileRecords`` slice of a local file (read in bounded windows, never
    whole, closed on exit), or the split's bytes read through ``pyarrow.fs``. Split bounds are batch
    boundaries."""
    if _is_local(split.uri):
        with FileRecords(split.uri.removeprefix("file://"), split.start, split.end) as records:
            yield records
        return
    filesystem, path = _filesystem(split.uri)
    with filesystem.open_input_file(path) as file:
        file.seek(split.start)
        data = file.read(split.end - split.start)
    yield MemoryRecords(data)


def batches_of_split(split):
    """Yield ``RecordBatch`` views of the split's batches (``file_position``: the byte in the segment
    file); raises KmemError on corruption, and ``CorruptRecordError`` when the split ends in an
    incomplete batch (a size field pointing past the end), naming the bytes left unread."""
    with open_split(split) as records:
        local = isinstance(records, FileRecords)
        read_to = split.start
        for batch in records.batches():
            if not local:
                batch.file_position += split.start
            read_to = batch.file_position + batch.size_in_bytes
            yield batch
        if read_to < split.start + records.size_in_bytes:
            raise _incomplete_batch(split, records, read_to - split.start)


def check_int64(value, name, batch):
    """``value`` (an offset the batch computes) when it fits a Kafka long; a batch whose base offset
    plus its last offset delta overflows is corrupt."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise CorruptRecordError(f"{name} {value} of the batch is beyond the int64 range", batch.file_position)
    return value
