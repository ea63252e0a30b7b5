"""Opening a Kafka 3.9 KRaft node's log directory: the image of ``__cluster_metadata-0``.

``read_image(log_dir)`` reads, as a KRaft broker's ``MetadataLoader`` does, the newest snapshot
(``<endOffset>-<epoch>.checkpoint``, ``Snapshots``) and then the metadata log segments from the snapshot's end
offset: record batches whose records are ``MetadataRecordSerde`` frames (frame version, api key, version, body),
control batches skipped. Every batch's CRC-32C is checked. The records are applied in order to an ``Image``
(Kafka's ``MetadataImage`` reduced to what kmem serves): topics, topic configs, the producer-id block, SCRAM
credentials and ACLs. The record schemas are those of ``kmem.admin.handover`` (Kafka's
``common/metadata/*.json``). Records kmem does not serve (other brokers, reassignments, features...) are counted
in ``Image.unserved``. A torn or corrupt tail of the metadata log ends the read at the last valid batch, as
Kafka's log recovery truncates it; a corrupt snapshot, a PartitionRecord of a topic no TopicRecord created in it,
or metadata offsets in neither the snapshot nor the log raise ``CorruptMetadataError``. The batch holding the
snapshot's end offset is replayed whole, as Kafka's ``MetadataLoader`` does.
"""
import dataclasses
import json
import logging
import os
import re
import uuid

from kmem.admin.handover import METADATA_FRAME_VERSION, SCHEMAS, SCRAM_MECHANISMS, TOPIC_RESOURCE
from kmem.broker.log import checkpoints
from kmem.broker.log.manager import METADATA_PARTITION
from kmem.durable import read_json, replaced_atomically, write_json
from kmem.errors import ConfigError, CorruptRecordError, KmemError
from kmem.protocol.codegen import decoder, read_uvarint
from kmem.records.batches import MemoryRecords

log = logging.getLogger(__name__)

SNAPSHOT_FILE = re.compile(r"([0-9]{20})-([0-9]{10})\.checkpoint")
SEGMENT_FILE = re.compile(r"([0-9]{20})\.log")
_BY_API_KEY = {message.api_key: name for name, (message, _) in SCHEMAS.items() if message.api_key is not None}
_DECODERS = {}


class CorruptMetadataError(KmemError):
    """A Kafka node's cluster metadata cannot be read whole: its newest snapshot is corrupt, or records are missing."""


@dataclasses.dataclass
class Image:
    """What kmem serves of a KRaft node's metadata: ``topics`` ``{name: topic id}``, ``partitions``
    ``{topic id: count}``, ``configs`` ``{topic: {name: value}}``, ``next_producer_id``, ``scram``
    ``{(mechanism, user): (salt, stored key, server key, iterations)}``, ``acls`` ``{uuid: record}``;
    ``partitions`` holds the partition numbers of each topic id (a topic has those numbered from 0 up to the first
    missing one);
    ``unserved`` counts the records of each kind kmem does not serve; ``end_offset`` the next metadata offset."""
    topics: dict = dataclasses.field(default_factory=dict)
    partitions: dict = dataclasses.field(default_factory=dict)
    configs: dict = dataclasses.field(default_factory=dict)
    next_producer_id: int = 0
    scram: dict = dataclasses.field(default_factory=dict)
    acls: dict = dataclasses.field(default_factory=dict)
    unserved: dict = dataclasses.field(default_factory=dict)
    end_offset: int = 0

    def topic_partitions(self):
        """``{name: (topic id as Kafka's base64 Uuid, partition count)}``."""
        counts = {}
        for name, topic_id in self.topics.items():
            numbers = self.partitions.get(topic_id, set())
            count = next(n for n in range(len(numbers) + 1) if n not in numbers)
            if count != len(numbers):
                log.warning("topic %s: partitions %s of Kafka's metadata not served by kmem (not numbered from 0 "
                            "without a gap)", name, sorted(n for n in numbers if n > count))
            counts[name] = (checkpoints.uuid_string(topic_id.bytes), count)
        return counts

    def apply(self, record_type, record):
        if record_type == "TopicRecord":
            self.topics[record.name] = record.topic_id
        elif record_type == "PartitionRecord":
            self.partitions.setdefault(record.topic_id, set()).add(record.partition_id)
            if record.replicas != record.isr or len(record.replicas) != 1 or record.adding_replicas \
                    or record.removing_replicas:
                self._unserved("PartitionRecord with replicas beyond a single leader")
        elif record_type == "RemoveTopicRecord":
            names = [name for name, topic_id in self.topics.items() if topic_id == record.topic_id]
            for name in names:
                del self.topics[name]
                self.configs.pop(name, None)
            self.partitions.pop(record.topic_id, None)
        elif record_type == "ConfigRecord" and record.resource_type == TOPIC_RESOURCE:
            configs = self.configs.setdefault(record.resource_name, {})
            if record.value is None:
                configs.pop(record.name, None)
            else:
                configs[record.name] = record.value
        elif record_type == "ProducerIdsRecord":
            self.next_producer_id = max(self.next_producer_id, record.next_producer_id)
        elif record_type == "UserScramCredentialRecord":
            mechanism = {code: name for name, code in SCRAM_MECHANISMS.items()}.get(record.mechanism)
            if mechanism is None:
                self._unserved(f"UserScramCredentialRecord of mechanism {record.mechanism}")
            else:
                self.scram[(mechanism, record.name)] = (record.salt, record.stored_key, record.server_key,
                                                        record.iterations)
        elif record_type == "AccessControlEntryRecord":
            self.acls[record.id] = record
        elif record_type == "RemoveAccessControlEntryRecord":
            self.acls.pop(record.id, None)
        elif record_type == "FeatureLevelRecord":
            pass                        # kmem speaks every version a 3.9 node's clients use
        else:
            self._unserved(record_type)

    def _unserved(self, kind):
        self.unserved[kind] = self.unserved.get(kind, 0) + 1


def metadata_dir(log_dir):
    return os.path.join(os.fspath(log_dir), METADATA_PARTITION)


def has_metadata(log_dir):
    """True when ``__cluster_metadata-0`` holds a snapshot or a non-empty metadata log segment."""
    directory = metadata_dir(log_dir)
    if not os.path.isdir(directory):
        return False
    return any(SNAPSHOT_FILE.fullmatch(name) or SEGMENT_FILE.fullmatch(name)
               and os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory))


def decode_metadata_record(value):
    """``(record type name, record)`` of one ``MetadataRecordSerde`` frame; the type is ``api key N`` when kmem
    has no schema for it (and the record None)."""
    if value is None:
        raise CorruptRecordError("a metadata record without a value", 0)
    view = memoryview(value)
    try:
        frame, pos = read_uvarint(view, 0)
        api_key, pos = read_uvarint(view, pos)
        version, pos = read_uvarint(view, pos)
    except Exception as e:      # IndexError when cut short, the codec's own error when a varint runs on
        raise CorruptRecordError(f"a metadata record's frame is malformed ({e or 'cut short'})", 0) from None
    if frame != METADATA_FRAME_VERSION:
        raise CorruptRecordError(f"metadata record frame version {frame}, expected {METADATA_FRAME_VERSION}", pos)
    name = _BY_API_KEY.get(api_key)
    if name is None:
        return f"metadata record of api key {api_key}", None
    decode = _DECODERS.get((name, version))
    if decode is None:
        decode = _DECODERS[(name, version)] = decoder(SCHEMAS[name][0], version)
    record, _ = decode(view, pos)
    return name, record


def _check_partitions_name_topics(image, decoded):
    """A PartitionRecord of a topic id no TopicRecord created is a fault of Kafka's ``MetadataDelta``, which then
    drops what it was loading: raised as ``CorruptRecordError``, before any record of the batch is applied."""
    known = set(image.topics.values())
    for record_type, record in decoded:
        if record_type == "TopicRecord":
            known.add(record.topic_id)
        elif record_type == "RemoveTopicRecord":
            known.discard(record.topic_id)
        elif record_type == "PartitionRecord" and record.topic_id not in known:
            raise CorruptRecordError(f"a PartitionRecord of topic id {record.topic_id}, which no TopicRecord "
                                     "created", 0)


def _apply_batches(image, data, path, first_offset=0):
    """Apply the metadata records of ``data``'s batches that end at or after ``first_offset``, each whole (as
    Kafka's ``MetadataLoader`` replays the whole batch holding a snapshot's end offset); raises
    ``CorruptRecordError`` (and ``CorruptMessageError``) at the first bad batch, after applying every batch before
    it; ``CorruptMetadataError`` when offsets are missing before a batch."""
    for batch in MemoryRecords(data):
        batch.ensure_valid()
        if batch.last_offset < first_offset:
            continue
        if batch.base_offset > max(first_offset, image.end_offset):
            # not a torn tail to truncate: records Kafka would need are missing ("Inconsistent snapshot state")
            raise CorruptMetadataError(f"{path}: metadata offsets {image.end_offset} to {batch.base_offset - 1} "
                                       "are in neither a snapshot nor the metadata log: kmem cannot tell the topics "
                                       "of this Kafka node's directory")
        if not batch.is_control_batch:
            # decoded and checked whole before any is applied: a batch is applied entirely or not at all
            decoded = [decode_metadata_record(record.value) for record in batch]
            _check_partitions_name_topics(image, decoded)
            for record_type, record in decoded:
                image.apply(record_type, record)
        image.end_offset = batch.next_offset
    valid = MemoryRecords(data).valid_bytes
    if valid != len(data):
        raise CorruptRecordError(f"{path}: {len(data) - valid} bytes after the last whole batch", valid)


def newest_snapshot(directory):
    snapshots = sorted((int(m.group(1)), int(m.group(2)), name) for name in os.listdir(directory)
                       if (m := SNAPSHOT_FILE.fullmatch(name)))
    return snapshots[-1] if snapshots else None


def read_image(log_dir):
    """The ``Image`` of a KRaft node's ``__cluster_metadata-0`` (see the module docstring)."""
    directory = metadata_dir(log_dir)
    image = Image()
    snapshot = newest_snapshot(directory)
    if snapshot is not None:
        end_offset, _, name = snapshot
        path = os.path.join(directory, name)
        with open(path, "rb") as file:
            data = file.read()
        try:
            _apply_batches(image, data, path)
        except CorruptMetadataError:
            raise
        except KmemError as e:
            raise CorruptMetadataError(f"{path}: the metadata snapshot is corrupt ({e}): kmem cannot tell the "
                                       "topics of this Kafka node's directory; restore the file or remove it to "
                                       "read the metadata log alone") from None
        image.end_offset = end_offset
    segments = sorted((int(m.group(1)), name) for name in os.listdir(directory) if (m := SEGMENT_FILE.fullmatch(name)))
    for index, (base, name) in enumerate(segments):
        following = segments[index + 1][0] if index + 1 < len(segments) else None
        if following is not None and following <= image.end_offset:
            continue                    # wholly below the snapshot
        path = os.path.join(directory, name)
        with open(path, "rb") as file:
            data = file.read()
        try:
            _apply_batches(image, data, path, image.end_offset)
        except CorruptMetadataError:
            raise
        except KmemError as e:
            log.warning("%s: the metadata log ends at offset %d, at a torn or corrupt batch (%s); what follows is "
                        "ignored, as Kafka's log recovery truncates it", path, image.end_offset, e)
            break
    for kind, count in sorted(image.unserved.items()):
        log.info("%s: %s not served by kmem, ignored: %d record%s", directory, kind, count, "" if count == 1 else "s")
    return image


ADOPTED_FILE = "kmem-kraft-adopted"     # the metadata files kmem's own files were made from (or agree with)


def metadata_files(log_dir):
    """``[[name, size]]`` of the snapshots and log segments of ``__cluster_metadata-0``: a Kafka node that ran
    after kmem adopted (or handed over) its directory changes them."""
    directory = metadata_dir(log_dir)
    return sorted([name, os.path.getsize(os.path.join(directory, name))] for name in os.listdir(directory)
                  if SNAPSHOT_FILE.fullmatch(name) or SEGMENT_FILE.fullmatch(name))


def record_adopted(log_dir):
    """Note that kmem's own files describe what ``__cluster_metadata-0`` holds now."""
    write_json(os.path.join(log_dir, ADOPTED_FILE), 1, "metadata", metadata_files(log_dir))


def needs_adoption(log_dir):
    """True when ``__cluster_metadata-0`` holds metadata that kmem's own files were not made from."""
    if not has_metadata(log_dir):
        return False
    try:
        adopted = read_json(os.path.join(log_dir, ADOPTED_FILE), 1, "metadata", "adopted KRaft metadata")
    except KmemError:
        adopted = None
    return adopted != metadata_files(log_dir)


def adopt(log_dir, config):
    """Make kmem's own files describe the image of a Kafka node's metadata: each topic's partitions (a partition
    Kafka's metadata names but this node had no replica of starts empty) with Kafka's topic id in
    ``partition.metadata``, ``kmem-topics.json`` the topics' configs, the producer-id block above Kafka's, and
    the SCRAM credentials and ACLs unless kmem has its own. A partition directory the metadata does not name (a
    deleted topic, another incarnation's id) is set aside as Kafka's ``LogManager`` does with a stray
    (``<name>.<id>-stray``). Every step can be repeated: ``kmem-kraft-adopted`` is written last."""
    from kmem.broker.log.manager import PARTITION_DIR, TOPICS_FILE
    from kmem.broker.security.authorizer import AclBinding, StandardAuthorizer
    from kmem.broker.security.credentials import ScramCredentialStore
    from kmem.broker.security.scram import ScramCredential

    image = read_image(log_dir)
    topics = image.topic_partitions()
    for name in sorted(os.listdir(log_dir)):
        match = PARTITION_DIR.fullmatch(name)
        path = os.path.join(log_dir, name)
        if not match or name == METADATA_PARTITION or not os.path.isdir(path):
            continue
        topic, number = match.group(1), int(match.group(2))
        topic_id, count = topics.get(topic, (None, 0))
        metadata = os.path.join(path, checkpoints.PARTITION_METADATA)
        try:
            held = checkpoints.read_partition_metadata(metadata)
        except FileNotFoundError:
            held = topic_id
        if number >= count or held != topic_id:
            stray = f"{name}.{uuid.uuid4().hex}-stray"
            log.warning("%s: not a partition of the Kafka node's metadata (topic id %s); set aside as %s",
                        name, held, stray)
            os.rename(path, os.path.join(log_dir, stray))
    for topic, (topic_id, count) in sorted(topics.items()):
        for number in range(count):
            path = os.path.join(log_dir, f"{topic}-{number}")
            os.makedirs(path, exist_ok=True)
            metadata = os.path.join(path, checkpoints.PARTITION_METADATA)
            if not os.path.exists(metadata):
                checkpoints.write_partition_metadata(metadata, topic_id)
    configs = {}
    for topic, overrides in sorted(image.configs.items()):
        if topic not in topics:
            continue
        for name, value in sorted(overrides.items()):
            try:
                config.topic_config({name: value})
            except ConfigError as e:
                log.warning("topic %s: config %s=%s of the Kafka node's metadata not served by kmem (%s)",
                            topic, name, value, e)
                continue
            configs.setdefault(topic, {})[name] = value
    with replaced_atomically(os.path.join(log_dir, TOPICS_FILE), fsync=True) as file:
        file.write(json.dumps(configs, sort_keys=True, indent=1).encode())
    checkpoints.ProducerIdAllocator(log_dir).reserve_below(image.next_producer_id)
    store = ScramCredentialStore(log_dir)
    if image.scram and not store.all_users():
        store.alter(upsertions=[(mechanism, user, ScramCredential(*credential))
                                for (mechanism, user), credential in sorted(image.scram.items())])
    authorizer = StandardAuthorizer(log_dir)
    if image.acls and not authorizer.entries():
        bindings = [AclBinding.of(record.resource_type, record.resource_name, record.pattern_type, record.principal,
                                  record.host, record.operation, record.permission_type)
                    for record in image.acls.values()]
        for acl in bindings:
            if acl.validation_error():
                log.warning("ACL %s of the Kafka node's metadata not served by kmem: %s", acl, acl.validation_error())
        authorizer.create([acl for acl in bindings if not acl.validation_error()])
    record_adopted(log_dir)
    log.info("%s: adopted the Kafka node's metadata up to offset %d: %d topics, %d partitions, %d SCRAM "
             "credentials, %d ACLs", log_dir, image.end_offset, len(topics),
             sum(count for _, count in topics.values()), len(image.scram), len(image.acls))
    return image
