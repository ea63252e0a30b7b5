"""The small text files of a Kafka 3.9 log directory, byte for byte, and kmem's producer-id block file.

- Offset checkpoints at the log dir root (``recovery-point-offset-checkpoint``,
  ``log-start-offset-checkpoint``, ``replication-offset-checkpoint``): Kafka's ``CheckpointFile``, i.e.
  ``0\\n<count>\\n`` then ``<topic> <partition> <offset>\\n`` lines.
- ``leader-epoch-checkpoint`` in a partition directory: ``0\\n<count>\\n`` then ``<epoch> <start offset>``.
- ``partition.metadata``: ``version: 0\\ntopic_id: <id>`` (no final newline), the id as Kafka's ``Uuid``
  prints it (URL-safe base64 of 16 bytes, no padding).
- ``meta.properties``: a ``java.util.Properties`` file of ``version=1``, ``cluster.id``, ``node.id`` and
  ``directory.id`` (KRaft's layout).
- ``.kafka_cleanshutdown``: present only after a clean shutdown (written last by ``close``, holding
  ``{"version":0,"brokerEpoch":N}`` as Kafka 3.9 writes it).
- ``kmem-producer-id-block``: ``0\\n<first id not yet reserved>\\n``, kmem's own file (Kafka keeps the
  allocated blocks in its metadata log). Ids are handed out from a block of 1000 (Kafka's
  ``ProducerIdsBlock`` size) whose end is written, fsynced, before its first id is issued, so a restart
  never issues an id again, whatever the crash.

Every file is replaced atomically (temporary file, fsync, rename), as Kafka writes them. A file that
cannot be parsed raises ``CorruptCheckpointError`` naming the file and line.
"""
import base64
import os
import threading
import time
import uuid

from kmem.durable import replaced_atomically
from kmem.errors import IllegalStateError, KmemError

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"       # each compacted partition's first dirty offset
PARTITION_METADATA = "partition.metadata"
META_PROPERTIES = "meta.properties"
CLEAN_SHUTDOWN = ".kafka_cleanshutdown"
PRODUCER_ID_BLOCK = "kmem-producer-id-block"
PRODUCER_ID_BLOCK_SIZE = 1000
CHECKPOINT_VERSION = 0
_RESERVED_UUIDS = (bytes(16), bytes(15) + b"\x01")


class CorruptCheckpointError(KmemError, ValueError):
    """A checkpoint or properties file of the log directory cannot be parsed."""


def random_uuid():
    """A new id as Kafka's ``Uuid.randomUuid`` makes it: never reserved, never starting with '-'."""
    while True:
        raw = uuid.uuid4().bytes
        text = uuid_string(raw)
        if raw not in _RESERVED_UUIDS and not text.startswith("-"):
            return text


def uuid_string(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def uuid_bytes(text, path="uuid"):
    """The 16 bytes of a Kafka ``Uuid`` string."""
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != 16 or len(text) != 22:
        raise CorruptCheckpointError(f"{path}: invalid Kafka uuid {text!r}")
    return raw


def _write_text(path, text, sync_directory=True):
    with replaced_atomically(path, fsync=True, sync_directory=sync_directory) as file:
        file.write(text.encode())


def _read_lines(path):
    with open(path, "rb") as file:
        try:
            return file.read().decode().splitlines()
        except UnicodeDecodeError as e:
            raise CorruptCheckpointError(f"{path}: not UTF-8 text ({e})") from None


def _checkpoint_text(rows):
    return "".join([f"{CHECKPOINT_VERSION}\n{len(rows)}\n"] + [" ".join(map(str, row)) + "\n" for row in rows])


def _parse_checkpoint(path, fields):
    """Rows of a checkpoint file as tuples (the last ``fields`` columns int); [] if the file is absent."""
    try:
        lines = _read_lines(path)
    except FileNotFoundError:
        return []
    if len(lines) < 2 or lines[0].strip() != str(CHECKPOINT_VERSION):
        raise CorruptCheckpointError(f"{path}: unknown checkpoint version or missing count line")
    try:
        count = int(lines[1])
    except ValueError:
        raise CorruptCheckpointError(f"{path}: line 2: invalid entry count {lines[1]!r}") from None
    if count != len(lines) - 2:
        raise CorruptCheckpointError(f"{path}: expected {count} entries, found {len(lines) - 2}")
    rows = []
    for number, line in enumerate(lines[2:], 3):
        parts = line.split(" ")
        try:
            if len(parts) != fields:
                raise ValueError
            rows.append(tuple(parts[:fields - 2]) + tuple(int(p) for p in parts[fields - 2:]))
        except ValueError:
            raise CorruptCheckpointError(f"{path}: line {number}: malformed entry {line!r}") from None
    return rows


def write_offset_checkpoint(path, offsets):
    """``offsets``: ``{(topic, partition): offset}``."""
    _write_text(path, _checkpoint_text([(t, p, o) for (t, p), o in sorted(offsets.items())]))


def read_offset_checkpoint(path):
    """``{(topic, partition): offset}`` ({} when the file does not exist)."""
    return {(topic, partition): offset for topic, partition, offset in _parse_checkpoint(path, 3)}


def write_leader_epoch_checkpoint(path, entries):
    """``entries``: ``[(epoch, start offset)]`` in order."""
    _write_text(path, _checkpoint_text(entries))


def read_leader_epoch_checkpoint(path):
    return [tuple(row) for row in _parse_checkpoint(path, 2)]


def write_partition_metadata(path, topic_id, *, sync_directory=True):
    """``sync_directory=False``: the caller syncs the directory (the rename) itself."""
    uuid_bytes(topic_id, path)
    _write_text(path, f"version: 0\ntopic_id: {topic_id}", sync_directory)


def read_partition_metadata(path):
    """The topic id in ``partition.metadata``."""
    lines = _read_lines(path)
    fields = dict(line.split(": ", 1) for line in lines if ": " in line)
    if fields.get("version") != "0" or "topic_id" not in fields:
        raise CorruptCheckpointError(f"{path}: expected 'version: 0' and 'topic_id: <id>'")
    uuid_bytes(fields["topic_id"], path)
    return fields["topic_id"]


def write_properties(path, properties):
    """A ``java.util.Properties.store(writer, "")`` file: an empty comment, the date, ``key=value`` lines."""
    stamp = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())
    _write_text(path, f"#\n#{stamp}\n" + "".join(f"{k}={v}\n" for k, v in properties.items()))


def read_properties(path):
    properties = {}
    for number, line in enumerate(_read_lines(path), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        if "=" not in line:
            raise CorruptCheckpointError(f"{path}: line {number}: expected key=value, got {line!r}")
        key, value = line.split("=", 1)
        properties[key.strip()] = value.strip()
    return properties


def load_meta_properties(log_dir, node_id):
    """The log dir's ``meta.properties`` (created with a new cluster and directory id if absent).

    A file of another node id raises ``IllegalStateError``, as Kafka refuses to start on it.
    """
    path = os.path.join(log_dir, META_PROPERTIES)
    if not os.path.exists(path):
        write_properties(path, {"node.id": node_id, "directory.id": random_uuid(), "version": 1,
                                "cluster.id": random_uuid()})
    properties = read_properties(path)
    if properties.get("version") != "1" or "cluster.id" not in properties:
        raise CorruptCheckpointError(f"{path}: expected version=1 and a cluster.id")
    if properties.get("node.id") != str(node_id):
        raise IllegalStateError(f"{path} belongs to node {properties.get('node.id')}, not node {node_id}")
    return properties


class ProducerIdAllocator:
    """Producer ids that are never issued twice, across restarts and crashes (see the module docstring)."""

    def __init__(self, log_dir):
        self.path = os.path.join(log_dir, PRODUCER_ID_BLOCK)
        self._lock = threading.Lock()
        try:
            lines = _read_lines(self.path)
        except FileNotFoundError:
            lines = ["0", "0"]
        try:
            if len(lines) != 2 or lines[0] != "0" or int(lines[1]) < 0:
                raise ValueError
            self._reserved_end = int(lines[1])
        except ValueError:
            raise CorruptCheckpointError(f"{self.path}: expected '0' and the next unreserved producer id") from None
        self._next = self._reserved_end       # ids below the reserved end may have been issued: skip them

    @property
    def reserved_end(self):
        """The first producer id never reserved: every id issued is below it."""
        return self._reserved_end

    def reserve_below(self, end):
        """Never issue an id below ``end`` (the ids another broker issued, e.g. a Kafka node's
        ``ProducerIdsRecord``), on disk before this returns."""
        with self._lock:
            if end > self._reserved_end:
                _write_text(self.path, f"0\n{end}\n")
                self._reserved_end = self._next = end

    def allocate(self):
        with self._lock:
            if self._next == self._reserved_end:
                end = self._next + PRODUCER_ID_BLOCK_SIZE
                _write_text(self.path, f"0\n{end}\n")
                self._reserved_end = end
            self._next += 1
            return self._next - 1
