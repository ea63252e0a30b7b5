"""The broker's storage settings, with Kafka's names, defaults and validation.

``BrokerConfig.from_properties({"log.segment.bytes": 1 << 20, ...}, num_partitions=3)`` takes Kafka's
dotted broker names (values as ints, bools or the strings of a ``server.properties`` file) and
snake_case overrides of the same settings. ``broker.topic_config({"retention.ms": "1000"})`` gives a
``LogConfig``: the broker's defaults under their topic-level names (Kafka's ``LogConfig``), overridden by
the topic's own settings. Anything out of range, of the wrong type or unknown raises ``ConfigError``
naming the setting.

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
- ``log.cleanup.policy`` (delete)               ``cleanup.policy``: only ``delete`` (kmem does not compact);
  ``compact`` is refused rather than silently ignored.
- ``min.insync.replicas`` (1)                   ``min.insync.replicas``: 1, the only replica (a larger
  value would make every ``acks=all`` produce fail with NOT_ENOUGH_REPLICAS, as in Kafka: refused).

As in Kafka, ``log.roll.ms`` wins over ``log.roll.hours`` and ``log.retention.ms`` over the minutes and
hours forms. kmem's own settings (not Kafka's) are ``node.id`` (1), ``producer.ledger.ids`` (10,000: the
producer ids a partition's ledger file holds before it becomes a snapshot) and
``producer.state.cache.entries`` (10,000: producers per partition whose last five batches stay in memory).
"""
from dataclasses import dataclass, replace

from kmem.errors import ConfigError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
LEGACY_RECORD_OVERHEAD_V0 = 14       # Kafka's minimum for segment.bytes
CREATE_TIME, LOG_APPEND_TIME = "CreateTime", "LogAppendTime"
HOUR_MS = 3_600_000


def _int(name, value, low, high=INT64_MAX):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ConfigError(f"{name} must be an integer, not {value!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} = {value} is out of range [{low}, {high}]")
    return value


def _bool(name, value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def _timestamp_type(name, value):
    if value not in (CREATE_TIME, LOG_APPEND_TIME):
        raise ConfigError(f"{name} must be {CREATE_TIME} or {LOG_APPEND_TIME}, not {value!r}")
    return value


COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


def _compression(name, value):
    if str(value).lower() not in COMPRESSION_TYPES:
        raise ConfigError(f"{name} must be one of {', '.join(COMPRESSION_TYPES)}, not {value!r}")
    return str(value).lower()


def _cleanup_policy(name, value):
    policies = sorted({p.strip().lower() for p in str(value).split(",") if p.strip()})
    if policies != ["delete"]:
        raise ConfigError(f"{name} = {value!r}: only 'delete' is supported (kmem broker does not compact logs)")
    return "delete"


# topic-level name -> (LogConfig field, parser with its range)
TOPIC_SETTINGS = {
    "segment.bytes": ("segment_bytes", lambda n, v: _int(n, v, LEGACY_RECORD_OVERHEAD_V0, INT32_MAX)),
    "segment.ms": ("segment_ms", lambda n, v: _int(n, v, 1)),
    "segment.jitter.ms": ("segment_jitter_ms", lambda n, v: _int(n, v, 0)),
    "retention.ms": ("retention_ms", lambda n, v: _int(n, v, -1)),
    "retention.bytes": ("retention_bytes", lambda n, v: _int(n, v, -(2**63))),
    "max.message.bytes": ("max_message_bytes", lambda n, v: _int(n, v, 0, INT32_MAX)),
    "message.timestamp.type": ("message_timestamp_type", _timestamp_type),
    "message.downconversion.enable": ("message_downconversion_enable", _bool),
    "index.interval.bytes": ("index_interval_bytes", lambda n, v: _int(n, v, 0, INT32_MAX)),
    "segment.index.bytes": ("segment_index_bytes", lambda n, v: _int(n, v, 4, INT32_MAX)),
    "compression.type": ("compression_type", _compression),
    "cleanup.policy": ("cleanup_policy", _cleanup_policy),
    "min.insync.replicas": ("min_insync_replicas", lambda n, v: _int(n, v, 1, 1)),
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

    @property
    def log_append_time(self):
        return self.message_timestamp_type == LOG_APPEND_TIME

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
        return replace(self, **changes)


# broker-level name -> (BrokerConfig field, parser)
BROKER_SETTINGS = {
    "node.id": ("node_id", lambda n, v: _int(n, v, 0, INT32_MAX)),
    "num.partitions": ("num_partitions", lambda n, v: _int(n, v, 1, INT32_MAX)),
    "auto.create.topics.enable": ("auto_create_topics_enable", _bool),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", lambda n, v: _int(n, v, 1)),
    "producer.id.expiration.check.interval.ms": ("producer_id_expiration_check_interval_ms",
                                                 lambda n, v: _int(n, v, 1, INT32_MAX)),
    "log.segment.bytes": ("log_segment_bytes", TOPIC_SETTINGS["segment.bytes"][1]),
    "log.roll.ms": ("log_roll_ms", lambda n, v: _int(n, v, 1)),
    "log.roll.hours": ("log_roll_hours", lambda n, v: _int(n, v, 1, INT32_MAX)),
    "log.roll.jitter.ms": ("log_roll_jitter_ms", lambda n, v: _int(n, v, 0)),
    "log.retention.ms": ("log_retention_ms", lambda n, v: _int(n, v, -1)),
    "log.retention.minutes": ("log_retention_minutes", lambda n, v: _int(n, v, -1, INT32_MAX)),
    "log.retention.hours": ("log_retention_hours", lambda n, v: _int(n, v, -1, INT32_MAX)),
    "log.retention.bytes": ("log_retention_bytes", TOPIC_SETTINGS["retention.bytes"][1]),
    "message.max.bytes": ("message_max_bytes", TOPIC_SETTINGS["max.message.bytes"][1]),
    "log.message.timestamp.type": ("log_message_timestamp_type", _timestamp_type),
    "log.message.downconversion.enable": ("log_message_downconversion_enable", _bool),
    "log.index.interval.bytes": ("log_index_interval_bytes", TOPIC_SETTINGS["index.interval.bytes"][1]),
    "log.index.size.max.bytes": ("log_index_size_max_bytes", TOPIC_SETTINGS["segment.index.bytes"][1]),
    "compression.type": ("compression_type", _compression),
    "log.cleanup.policy": ("log_cleanup_policy", _cleanup_policy),
    "min.insync.replicas": ("min_insync_replicas", TOPIC_SETTINGS["min.insync.replicas"][1]),
    "producer.ledger.ids": ("producer_ledger_ids", lambda n, v: _int(n, v, 16, INT32_MAX)),
    "producer.state.cache.entries": ("producer_state_cache_entries", lambda n, v: _int(n, v, 1, INT32_MAX)),
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
    producer_ledger_ids: int = 10_000
    producer_state_cache_entries: int = 10_000

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
            min_insync_replicas=self.min_insync_replicas)

    def topic_config(self, overrides=None):
        """The ``LogConfig`` of a topic with ``overrides`` (topic-level names) over the broker's defaults."""
        return self.default_log_config().overridden(overrides)

    def properties(self):
        """``{dotted name: value}`` of every set broker setting."""
        return {name: getattr(self, attr) for name, (attr, _) in BROKER_SETTINGS.items()
                if getattr(self, attr) is not None}

