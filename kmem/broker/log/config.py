"""The broker's storage settings, with Kafka's names, defaults and validation.

``BrokerConfig.from_properties({"log.segment.bytes": 1 << 20, ...}, num_partitions=3)`` takes Kafka's
dotted broker names (values as ints, bools or the strings of a ``server.properties`` file) and
snake_case overrides of the same settings. ``broker.topic_config({"retention.ms": "1000"})`` gives a
``LogConfig``: the broker's defaults under their topic-level names (Kafka's ``LogConfig``), overridden by
the topic's own settings. Anything out of range, of the wrong type or unknown raises ``ConfigError``
naming the setting (INVALID_CONFIG on the wire).

Broker setting (default)                       topic setting
- ``num.partitions`` (1), ``auto.create.topics.enable`` (true), ``producer.id.expiration.ms`` (1 day),
  ``producer.id.expiration.check.interval.ms`` (10 min: how often expired producers are forgotten)
- ``log.segment.bytes`` (1 GiB)                 ``segment.bytes``
- ``log.roll.ms`` / ``log.roll.hours`` (168 h)  ``segment.ms``
- ``log.roll.jitter.ms`` (0)                    ``segment.jitter.ms``
- ``log.retention.ms`` / ``.minutes`` / ``.hours`` (168 h; -1 keeps forever)  ``retention.ms``
- ``log.retention.bytes`` (-1: no limit)        ``retention.bytes``
- ``message.max.bytes`` (1048588)              ``max.message.bytes``
- ``log.message.timestamp.type`` (CreateTime)  ``message.timestamp.type``
- ``log.message.downconversion.enable`` (true) ``message.downconversion.enable``
- ``log.index.interval.bytes`` (4096)          ``index.interval.bytes``
- ``log.index.size.max.bytes`` (10 MiB)        ``segment.index.bytes``
- ``compression.type`` (producer)              ``compression.type``: ``producer`` keeps each batch's codec;
  ``uncompressed``, ``gzip``, ``snappy``, ``lz4`` or ``zstd`` recompress batches of another codec
  (``kmem.broker.log.validator``), as Kafka's ``LogValidator``.
- ``log.cleanup.policy`` (delete)               ``cleanup.policy``: ``delete`` (retention), ``compact`` (the
  log cleaner, ``kmem.broker.log.cleaner``) or ``compact,delete`` (both).
- ``log.cleaner.delete.retention.ms`` (1 day)   ``delete.retention.ms``: how long a tombstone outlives the
  clean that first kept it.
- ``log.cleaner.min.compaction.lag.ms`` (0)     ``min.compaction.lag.ms``: records younger than this stay.
- ``log.cleaner.max.compaction.lag.ms`` (none)  ``max.compaction.lag.ms``: a dirty record older than this is
  cleaned whatever the dirty ratio (KIP-354).
- ``log.cleaner.min.cleanable.ratio`` (0.5)     ``min.cleanable.dirty.ratio``: the dirty share of a log
  that makes it worth cleaning.
- The cleaner's own: ``log.cleaner.enable`` (true), ``log.cleaner.threads`` (1, the only value),
  ``log.cleaner.dedupe.buffer.size`` (128 MiB: the key map, 24 bytes per key),
  ``log.cleaner.io.buffer.size`` (512 KiB), ``log.cleaner.io.buffer.load.factor`` (0.9),
  ``log.cleaner.io.max.bytes.per.second`` (no limit), ``log.cleaner.backoff.ms`` (15 s: the wait when no
  log needs cleaning).
- ``min.insync.replicas`` (1)                   ``min.insync.replicas``: 1, the only replica (a larger
  value would make every ``acks=all`` produce fail with NOT_ENOUGH_REPLICAS, as in Kafka: refused).
- ``max.request.partition.size.limit`` (2000): the most partitions a DescribeTopicPartitions response
  describes (KIP-966), however many its request allows.

Every other topic config of Kafka 3.9's ``LogConfig`` is accepted with Kafka's type, range, valid values
and default (values trimmed, names and values case-sensitive, as Kafka's ``ConfigDef``, except that
``compression.type`` and ``cleanup.policy`` take any case), and kept and described, but some have no
effect here:

- ``message.timestamp.before.max.ms`` and ``message.timestamp.after.max.ms`` (KIP-937; each, while at its
  default, falls back to the deprecated ``message.timestamp.difference.max.ms``) are enforced on a
  CreateTime topic, on each batch's first and largest timestamp (``kmem.broker.log.validator``:
  INVALID_TIMESTAMP).
- ``min.compaction.lag.ms`` above ``max.compaction.lag.ms`` is refused, as Kafka does.
- No effect, nothing to act on a single node without tiered storage: ``unclean.leader.election.enable``,
  ``leader.replication.throttled.replicas`` and ``follower.replication.throttled.replicas`` (replication:
  ``*`` or ``partition:broker`` lists);
  ``local.retention.ms``, ``local.retention.bytes`` (-2: ``retention.*``), ``remote.log.copy.disable`` and
  ``remote.log.delete.on.disable`` (tiered storage; ``remote.storage.enable=true`` is refused, as Kafka
  refuses it while ``remote.log.storage.system.enable`` is false).
- No effect, kmem keeps its own behaviour: ``flush.messages`` and ``flush.ms`` (a partition is fsynced
  when its segment rolls and at shutdown, as with Kafka's defaults), ``file.delete.delay.ms`` (files are
  deleted at once), ``preallocate`` (segment files grow as written, as Kafka's default),
  ``compression.gzip.level``, ``compression.lz4.level`` and ``compression.zstd.level`` (KIP-390:
  recompression uses kmem's default level of each codec) and ``message.format.version`` (deprecated;
  Kafka 3.x ignores it too; any version Kafka's ``MetadataVersion`` reads is accepted, e.g. ``0.10.0.0``).

As in Kafka, ``log.roll.ms`` wins over ``log.roll.hours`` and ``log.retention.ms`` over the minutes and
hours forms. kmem's own settings (not Kafka's) are ``node.id`` (1), ``producer.ledger.ids`` (10,000: the
producer ids a partition's ledger file holds before it becomes a snapshot) and
``producer.state.cache.entries`` (10,000: producers per partition whose last five batches stay in memory).
"""
import functools
import re
from dataclasses import dataclass, replace

from kmem.errors import ConfigError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
LEGACY_RECORD_OVERHEAD_V0 = 14       # Kafka's minimum for segment.bytes
HOUR_MS = 3_600_000


_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_LIST_SEPARATOR = re.compile(r"\s*,\s*")
_THROTTLED_REPLICA = re.compile(r"([0-9]+:[0-9]+)?")     # partitionId:brokerId (an empty item is allowed)


def integer(name, value, low, high=INT64_MAX):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    if isinstance(value, str):
        if not _INTEGER.fullmatch(value.strip()):
            raise ConfigError(f"{name} must be an integer, not {value!r}")
        value = int(value.strip())
    if not low <= value <= high:
        raise ConfigError(f"{name} = {value} is out of range [{low}, {high}]")
    return value


def _number(name, value):
    """A DOUBLE: a number, or its decimal text."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or \
            isinstance(value, str) and not _DECIMAL.fullmatch(value.strip()):
        raise ConfigError(f"{name} must be a number, not {value!r}")
    return float(value)


def _ratio(name, value):
    """A DOUBLE between 0 and 1."""
    number = _number(name, value)
    if not 0 <= number <= 1:
        raise ConfigError(f"{name} = {value} is out of range [0, 1]")
    return number


def _load_factor(name, value):
    """A DOUBLE above 0, at most 1 (the share of the key map a pass fills)."""
    number = _ratio(name, value)
    if number <= 0:
        raise ConfigError(f"{name} = {value} must be above 0")
    return number


def _positive_number(name, value):
    number = _number(name, value)
    if number <= 0:
        raise ConfigError(f"{name} = {value} must be above 0")
    return number


def boolean(name, value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def _string(name, value):
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, not {value!r}")
    return value.strip()


def _one_of(*choices):
    def parse(name, value):
        text = _string(name, value)
        if text not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
        return text
    return parse


def _list(name, value):
    """A LIST: the comma-separated items, trimmed (none for an empty string)."""
    text = _string(name, value)
    return _LIST_SEPARATOR.split(text) if text else []


CREATE_TIME, LOG_APPEND_TIME = "CreateTime", "LogAppendTime"
_timestamp_type = _one_of(CREATE_TIME, LOG_APPEND_TIME)
COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


# compression.type and cleanup.policy take any case (Kafka only lower case), as kmem always did: topics
# stored with such values still load
def _compression(name, value):
    return _one_of(*COMPRESSION_TYPES)(name, _string(name, value).lower())


def _cleanup_policy(name, value):
    """``delete``, ``compact`` or both (``compact,delete``), as Kafka's ``ValidList``."""
    policies = [p.lower() for p in _list(name, value)]
    unknown = [p for p in policies if p not in ("compact", "delete")]
    if unknown:
        raise ConfigError(f"{name} = {value!r}: {unknown[0]!r} is not a cleanup policy (compact, delete)")
    if not policies:
        raise ConfigError(f"{name} is empty: give delete, compact or compact,delete")
    return ",".join(p for p in ("compact", "delete") if p in policies)


def _throttled_replicas(name, value):
    replicas = _list(name, value)
    if "".join(replicas) != "*" and not all(_THROTTLED_REPLICA.fullmatch(r) for r in replicas):
        raise ConfigError(f"{name} = {value!r}: must be '*' or a list of partitionId:brokerId")
    return ",".join(replicas)


# Kafka 3.9's MetadataVersion: each release and how many internal versions it has ("2.8", "2.8-IV0",
# "2.8-IV1"), plus the unreleased 4.0 ones; 0.x versions have three parts.
_RELEASES = {"0.8.0": 0, "0.8.1": 0, "0.8.2": 0, "0.9.0": 0, "0.10.0": 2, "0.10.1": 3, "0.10.2": 1, "0.11.0": 3,
             "1.0": 1, "1.1": 1, "2.0": 2, "2.1": 3, "2.2": 2, "2.3": 2, "2.4": 2, "2.5": 1, "2.6": 1, "2.7": 3,
             "2.8": 2, "3.0": 2, "3.1": 1, "3.2": 1, "3.3": 4, "3.4": 1, "3.5": 3, "3.6": 3, "3.7": 5, "3.8": 1,
             "3.9": 1}
METADATA_VERSIONS = frozenset(_RELEASES) | {f"{release}-IV{i}" for release, count in _RELEASES.items()
                                            for i in range(count)} | {"4.0-IV0", "4.0-IV1"}


def _message_format_version(name, value):
    """Any version Kafka's ``MetadataVersion.fromVersionString`` reads: a release or internal version,
    parts beyond a release's ignored (``0.10.0.0`` is 0.10.0, ``2.8.1`` is 2.8)."""
    version = _string(name, value)
    parts = version.split(".")
    while parts and not parts[-1]:          # as Java's String.split
        parts.pop()
    release_parts = 3 if version.startswith("0.") else 2
    key = version if release_parts >= len(parts) else ".".join(parts[:release_parts])
    if key not in METADATA_VERSIONS:
        raise ConfigError(f"{name} = {value!r} is not a valid version (e.g. 0.10.0, 2.8, 3.0-IV1)")
    return version


def _gzip_level(name, value):
    level = integer(name, value, -1, 9)
    if level == 0:
        raise ConfigError(f"{name} must be between 1 and 9 or -1 (the default level), not 0")
    return level


def _remote_storage(name, value):
    if boolean(name, value):
        raise ConfigError(f"{name} = true: kmem broker has no tiered storage (as Kafka while "
                          "remote.log.storage.system.enable is false)")
    return False


def at_least(low, high=INT64_MAX):
    """The parser ``(name, value)`` of an integer setting within ``[low, high]``."""
    return lambda name, value: integer(name, value, low, high)


def config_from_properties(cls, table, properties):
    """A settings dataclass ``cls`` from the Kafka names in ``properties`` that ``table`` knows
    (``name -> (field, parser(name, value))``); other names are left to other tables."""
    return cls(**{table[name][0]: table[name][1](name, value) for name, value in properties.items() if name in table})


# topic-level name -> (LogConfig field, parser with its range)
TOPIC_SETTINGS = {
    "segment.bytes": ("segment_bytes", at_least(LEGACY_RECORD_OVERHEAD_V0, INT32_MAX)),
    "segment.ms": ("segment_ms", at_least(1)),
    "segment.jitter.ms": ("segment_jitter_ms", at_least(0)),
    "retention.ms": ("retention_ms", at_least(-1)),
    "retention.bytes": ("retention_bytes", at_least(-(2**63))),
    "max.message.bytes": ("max_message_bytes", at_least(0, INT32_MAX)),
    "message.timestamp.type": ("message_timestamp_type", _timestamp_type),
    "message.downconversion.enable": ("message_downconversion_enable", boolean),
    "index.interval.bytes": ("index_interval_bytes", at_least(0, INT32_MAX)),
    "segment.index.bytes": ("segment_index_bytes", at_least(4, INT32_MAX)),
    "compression.type": ("compression_type", _compression),
    "cleanup.policy": ("cleanup_policy", _cleanup_policy),
    "min.insync.replicas": ("min_insync_replicas", at_least(1, 1)),
    "message.timestamp.before.max.ms": ("message_timestamp_before_max_ms", at_least(0)),
    "message.timestamp.after.max.ms": ("message_timestamp_after_max_ms", at_least(0)),
    "message.timestamp.difference.max.ms": ("message_timestamp_difference_max_ms", at_least(0)),
    # kept and described, no effect here (see the module docstring)
    "compression.gzip.level": ("compression_gzip_level", _gzip_level),
    "compression.lz4.level": ("compression_lz4_level", at_least(1, 17)),
    "compression.zstd.level": ("compression_zstd_level", at_least(-131072, 22)),
    "delete.retention.ms": ("delete_retention_ms", at_least(0)),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", at_least(0)),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", at_least(1)),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", _ratio),
    "file.delete.delay.ms": ("file_delete_delay_ms", at_least(0)),
    "flush.messages": ("flush_messages", at_least(1)),
    "flush.ms": ("flush_ms", at_least(0)),
    "preallocate": ("preallocate", boolean),
    "message.format.version": ("message_format_version", _message_format_version),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", boolean),
    "leader.replication.throttled.replicas": ("leader_replication_throttled_replicas", _throttled_replicas),
    "follower.replication.throttled.replicas": ("follower_replication_throttled_replicas", _throttled_replicas),
    "remote.storage.enable": ("remote_storage_enable", _remote_storage),
    "local.retention.ms": ("local_retention_ms", at_least(-2)),
    "local.retention.bytes": ("local_retention_bytes", at_least(-2)),
    "remote.log.copy.disable": ("remote_log_copy_disable", boolean),
    "remote.log.delete.on.disable": ("remote_log_delete_on_disable", boolean),
}


@dataclass(frozen=True)
class LogConfig:
    """One topic's effective settings (Kafka's ``LogConfig``); ``properties()`` gives them by name."""
    segment_bytes: int = 1 << 30
    segment_ms: int = 168 * HOUR_MS
    segment_jitter_ms: int = 0
    retention_ms: int = 168 * HOUR_MS
    retention_bytes: int = -1
    max_message_bytes: int = 1048588
    message_timestamp_type: str = CREATE_TIME
    message_downconversion_enable: bool = True
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10 << 20
    compression_type: str = "producer"
    cleanup_policy: str = "delete"
    min_insync_replicas: int = 1
    message_timestamp_before_max_ms: int = INT64_MAX
    message_timestamp_after_max_ms: int = INT64_MAX
    message_timestamp_difference_max_ms: int = INT64_MAX
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = INT64_MAX
    min_cleanable_dirty_ratio: float = 0.5
    file_delete_delay_ms: int = 60_000
    flush_messages: int = INT64_MAX
    flush_ms: int = INT64_MAX
    preallocate: bool = False
    message_format_version: str = "3.0-IV1"
    unclean_leader_election_enable: bool = False
    leader_replication_throttled_replicas: str = ""
    follower_replication_throttled_replicas: str = ""
    remote_storage_enable: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    remote_log_copy_disable: bool = False
    remote_log_delete_on_disable: bool = False

    @functools.cached_property
    def compact(self):
        """The log cleaner compacts the topic (``cleanup.policy`` holds ``compact``)."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self):
        """Retention deletes old segments (``cleanup.policy`` holds ``delete``)."""
        return "delete" in self.cleanup_policy.split(",")

    @functools.cached_property
    def target_codec(self):
        """The codec id ``compression.type`` imposes on client batches, or None for ``producer`` (kept as
        they come)."""
        if self.compression_type == "producer":
            return None
        from kmem.records import codecs
        return codecs.codec_id("none" if self.compression_type == "uncompressed" else self.compression_type)

    @functools.cached_property
    def log_append_time(self):
        return self.message_timestamp_type == LOG_APPEND_TIME

    @functools.cached_property
    def timestamp_before_max_ms(self):
        """How far before the broker's time a CreateTime timestamp may be: ``message.timestamp.before.max.ms``,
        or the deprecated ``message.timestamp.difference.max.ms`` while the former is at its default."""
        if self.message_timestamp_before_max_ms != INT64_MAX:
            return self.message_timestamp_before_max_ms
        return self.message_timestamp_difference_max_ms

    @functools.cached_property
    def timestamp_after_max_ms(self):
        """How far after the broker's time a CreateTime timestamp may be (as ``timestamp_before_max_ms``)."""
        if self.message_timestamp_after_max_ms != INT64_MAX:
            return self.message_timestamp_after_max_ms
        return self.message_timestamp_difference_max_ms

    def properties(self):
        """``{topic-level name: value}`` of every setting (what DescribeConfigs shows)."""
        return {name: getattr(self, attr) for name, (attr, _) in TOPIC_SETTINGS.items()}

    def overridden(self, overrides):
        """A copy with ``overrides`` (``{topic-level name: value}``) applied, validated."""
        changes = {}
        for name, value in (overrides or {}).items():
            if name not in TOPIC_SETTINGS:
                raise ConfigError(f"unknown topic config {name!r}")
            attr, parse = TOPIC_SETTINGS[name]
            changes[attr] = parse(name, value)
        config = replace(self, **changes)
        if config.min_compaction_lag_ms > config.max_compaction_lag_ms:     # Kafka's LogConfig.validateValues
            raise ConfigError(f"min.compaction.lag.ms ({config.min_compaction_lag_ms}) is larger than "
                              f"max.compaction.lag.ms ({config.max_compaction_lag_ms})")
        return config


# broker-level name -> (BrokerConfig field, parser)
BROKER_SETTINGS = {
    "node.id": ("node_id", at_least(0, INT32_MAX)),
    "num.partitions": ("num_partitions", at_least(1, INT32_MAX)),
    "auto.create.topics.enable": ("auto_create_topics_enable", boolean),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", at_least(1)),
    "producer.id.expiration.check.interval.ms": ("producer_id_expiration_check_interval_ms",
                                                 at_least(1, INT32_MAX)),
    "log.segment.bytes": ("log_segment_bytes", TOPIC_SETTINGS["segment.bytes"][1]),
    "log.roll.ms": ("log_roll_ms", at_least(1)),
    "log.roll.hours": ("log_roll_hours", at_least(1, INT32_MAX)),
    "log.roll.jitter.ms": ("log_roll_jitter_ms", at_least(0)),
    "log.retention.ms": ("log_retention_ms", at_least(-1)),
    "log.retention.minutes": ("log_retention_minutes", at_least(-1, INT32_MAX)),
    "log.retention.hours": ("log_retention_hours", at_least(-1, INT32_MAX)),
    "log.retention.bytes": ("log_retention_bytes", TOPIC_SETTINGS["retention.bytes"][1]),
    "message.max.bytes": ("message_max_bytes", TOPIC_SETTINGS["max.message.bytes"][1]),
    "log.message.timestamp.type": ("log_message_timestamp_type", _timestamp_type),
    "log.message.downconversion.enable": ("log_message_downconversion_enable", boolean),
    "log.index.interval.bytes": ("log_index_interval_bytes", TOPIC_SETTINGS["index.interval.bytes"][1]),
    "log.index.size.max.bytes": ("log_index_size_max_bytes", TOPIC_SETTINGS["segment.index.bytes"][1]),
    "compression.type": ("compression_type", _compression),
    "log.cleanup.policy": ("log_cleanup_policy", _cleanup_policy),
    "min.insync.replicas": ("min_insync_replicas", TOPIC_SETTINGS["min.insync.replicas"][1]),
    "log.cleaner.enable": ("log_cleaner_enable", boolean),
    "log.cleaner.threads": ("log_cleaner_threads", at_least(1, 1)),
    "log.cleaner.dedupe.buffer.size": ("log_cleaner_dedupe_buffer_size", at_least(24)),
    "log.cleaner.io.buffer.size": ("log_cleaner_io_buffer_size", at_least(512, INT32_MAX)),
    "log.cleaner.io.buffer.load.factor": ("log_cleaner_io_buffer_load_factor", _load_factor),
    "log.cleaner.io.max.bytes.per.second": ("log_cleaner_io_max_bytes_per_second", _positive_number),
    "log.cleaner.backoff.ms": ("log_cleaner_backoff_ms", at_least(0)),
    "log.cleaner.min.cleanable.ratio": ("log_cleaner_min_cleanable_ratio", _ratio),
    "log.cleaner.delete.retention.ms": ("log_cleaner_delete_retention_ms", at_least(0)),
    "log.cleaner.min.compaction.lag.ms": ("log_cleaner_min_compaction_lag_ms", at_least(0)),
    "log.cleaner.max.compaction.lag.ms": ("log_cleaner_max_compaction_lag_ms", at_least(1)),
    "producer.ledger.ids": ("producer_ledger_ids", at_least(16, INT32_MAX)),
    "producer.state.cache.entries": ("producer_state_cache_entries", at_least(1, INT32_MAX)),
    "max.request.partition.size.limit": ("max_request_partition_size_limit", at_least(1, INT32_MAX)),
}


@dataclass(frozen=True)
class BrokerConfig:
    """The broker's storage settings; build it with ``from_properties``. ``None`` means unset."""
    node_id: int = 1
    num_partitions: int = 1
    auto_create_topics_enable: bool = True
    producer_id_expiration_ms: int = 86_400_000
    producer_id_expiration_check_interval_ms: int = 600_000
    log_segment_bytes: int = 1 << 30
    log_roll_ms: int | None = None
    log_roll_hours: int = 168
    log_roll_jitter_ms: int = 0
    log_retention_ms: int | None = None
    log_retention_minutes: int | None = None
    log_retention_hours: int = 168
    log_retention_bytes: int = -1
    message_max_bytes: int = 1048588
    log_message_timestamp_type: str = CREATE_TIME
    log_message_downconversion_enable: bool = True
    log_index_interval_bytes: int = 4096
    log_index_size_max_bytes: int = 10 << 20
    compression_type: str = "producer"
    log_cleanup_policy: str = "delete"
    min_insync_replicas: int = 1
    log_cleaner_enable: bool = True
    log_cleaner_threads: int = 1
    log_cleaner_dedupe_buffer_size: int = 128 << 20
    log_cleaner_io_buffer_size: int = 512 << 10
    log_cleaner_io_buffer_load_factor: float = 0.9
    log_cleaner_io_max_bytes_per_second: float = float("inf")
    log_cleaner_backoff_ms: int = 15_000
    log_cleaner_min_cleanable_ratio: float = 0.5
    log_cleaner_delete_retention_ms: int = 86_400_000
    log_cleaner_min_compaction_lag_ms: int = 0
    log_cleaner_max_compaction_lag_ms: int = INT64_MAX
    producer_ledger_ids: int = 10_000
    producer_state_cache_entries: int = 10_000
    max_request_partition_size_limit: int = 2000

    @classmethod
    def from_properties(cls, properties=None, **overrides):
        """From Kafka's dotted names and/or snake_case field names; unknown names raise ConfigError."""
        values = {}
        attr_names = {attr: (name, parse) for name, (attr, parse) in BROKER_SETTINGS.items()}
        for name, value in (properties or {}).items():
            if name not in BROKER_SETTINGS:
                raise ConfigError(f"unknown broker config {name!r}")
            attr, parse = BROKER_SETTINGS[name]
            values[attr] = parse(name, value)
        for attr, value in overrides.items():
            if attr not in attr_names:
                raise ConfigError(f"unknown broker config {attr!r}")
            name, parse = attr_names[attr]
            values[attr] = parse(name, value)
        return cls(**values)

    @property
    def segment_ms(self):
        return self.log_roll_ms if self.log_roll_ms is not None else self.log_roll_hours * HOUR_MS

    @property
    def retention_ms(self):
        if self.log_retention_ms is not None:
            return self.log_retention_ms
        if self.log_retention_minutes is not None:
            return self.log_retention_minutes * 60_000 if self.log_retention_minutes >= 0 else -1
        return self.log_retention_hours * HOUR_MS if self.log_retention_hours >= 0 else -1

    def default_log_config(self):
        """The topic-level defaults this broker gives every topic (Kafka's ``LogConfig`` defaults)."""
        return LogConfig(
            segment_bytes=self.log_segment_bytes, segment_ms=self.segment_ms, segment_jitter_ms=self.log_roll_jitter_ms,
            retention_ms=self.retention_ms, retention_bytes=self.log_retention_bytes,
            max_message_bytes=self.message_max_bytes, message_timestamp_type=self.log_message_timestamp_type,
            message_downconversion_enable=self.log_message_downconversion_enable,
            index_interval_bytes=self.log_index_interval_bytes, segment_index_bytes=self.log_index_size_max_bytes,
            compression_type=self.compression_type, cleanup_policy=self.log_cleanup_policy,
            min_insync_replicas=self.min_insync_replicas, delete_retention_ms=self.log_cleaner_delete_retention_ms,
            min_compaction_lag_ms=self.log_cleaner_min_compaction_lag_ms,
            max_compaction_lag_ms=self.log_cleaner_max_compaction_lag_ms,
            min_cleanable_dirty_ratio=self.log_cleaner_min_cleanable_ratio)

    def topic_config(self, overrides=None):
        """The ``LogConfig`` of a topic with ``overrides`` (topic-level names) over the broker's defaults."""
        return self.default_log_config().overridden(overrides)

    def properties(self):
        """``{dotted name: value}`` of every set broker setting."""
        return {name: getattr(self, attr) for name, (attr, _) in BROKER_SETTINGS.items()
                if getattr(self, attr) is not None}

