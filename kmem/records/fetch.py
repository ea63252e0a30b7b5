"""The broker's rules for serving a fetch to an older client (Kafka's KafkaApis fetch handling, KIP-283's
down-conversion switch and KIP-110's zstd rule), as one decision.

>>> plan_fetch(fetch_version=3, log_magic=2)
FetchPlan(error=<FetchError.NONE: 0>, to_magic=1)
>>> plan_fetch(3, topic_config={"message.downconversion.enable": "false"}).error
<FetchError.UNSUPPORTED_VERSION: 35>

- Fetch v0-1 reads magic 0, v2-3 magic 1, v4 and later magic 2: data above that is down-converted.
- ``message.downconversion.enable`` (topic) overrides ``log.message.downconversion.enable`` (broker),
  both true by default; when false, a client fetch that needs conversion gets UNSUPPORTED_VERSION.
- A zstd topic fetched with Fetch < 10 gets UNSUPPORTED_COMPRESSION_TYPE.
- Replica (follower) fetches are exempt from both: they always get the data as stored.
"""
import enum
from typing import NamedTuple

from kmem.errors import ConfigError
from kmem.records.arguments import INT16, check_bool, check_choice, check_int, check_mapping

TOPIC_DOWNCONVERSION = "message.downconversion.enable"
BROKER_DOWNCONVERSION = "log.message.downconversion.enable"
ZSTD_MIN_FETCH_VERSION = 10
# Kafka's compression.type values for a topic
TOPIC_COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


class FetchError(enum.IntEnum):
    """Kafka's partition error codes for these cases."""
    NONE = 0
    UNSUPPORTED_VERSION = 35
    UNSUPPORTED_COMPRESSION_TYPE = 76


class FetchPlan(NamedTuple):
    error: FetchError
    to_magic: int | None      # the magic to down-convert to, None when the data is sent as stored


def fetch_magic(fetch_version):
    """Highest record magic a client using this Fetch version reads."""
    check_int("fetch_version", fetch_version, 0, INT16[1])
    return 0 if fetch_version <= 1 else 1 if fetch_version <= 3 else 2


def _flag(value, name):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def down_conversion_enabled(topic_config=None, broker_config=None):
    """The topic's setting if it has one, else the broker's, else true."""
    for config, name in ((topic_config, TOPIC_DOWNCONVERSION), (broker_config, BROKER_DOWNCONVERSION)):
        if config and config.get(name) is not None:
            return _flag(config[name], name)
    return True


def plan_fetch(fetch_version, log_magic=2, *, topic_compression="producer", is_follower=False,
               topic_config=None, broker_config=None):
    """What to do with one partition of a fetch: an error code, or the magic to convert to (or None).

    ``log_magic``: the topic's message format (the highest magic it stores); ``topic_compression``: its
    ``compression.type``; configs are dicts of Kafka's dotted names (values bool or "true"/"false").
    """
    client_magic = fetch_magic(fetch_version)
    check_choice("log_magic", log_magic, (0, 1, 2))
    if not isinstance(topic_compression, str) or topic_compression.lower() not in TOPIC_COMPRESSION_TYPES:
        raise ConfigError(f"topic_compression must be one of {', '.join(TOPIC_COMPRESSION_TYPES)}, "
                          f"not {topic_compression!r}")
    check_bool("is_follower", is_follower)
    check_mapping("topic_config", topic_config)
    check_mapping("broker_config", broker_config)
    if is_follower:
        return FetchPlan(FetchError.NONE, None)
    if topic_compression.lower() == "zstd" and fetch_version < ZSTD_MIN_FETCH_VERSION:
        return FetchPlan(FetchError.UNSUPPORTED_COMPRESSION_TYPE, None)
    if log_magic <= client_magic:
        return FetchPlan(FetchError.NONE, None)
    if not down_conversion_enabled(topic_config, broker_config):
        return FetchPlan(FetchError.UNSUPPORTED_VERSION, None)
    return FetchPlan(FetchError.NONE, client_magic)
