"""The consumer's configuration: Kafka's property names and defaults, plus ``buffer.memory`` (KIP-81).

``group.protocol`` picks the group membership: ``classic`` (the default: JoinGroup and SyncGroup, the members'
``partition.assignment.strategy`` assigns) or ``consumer`` (KIP-848: ConsumerGroupHeartbeat, the coordinator
assigns with the ``group.remote.assignor`` it serves). As Kafka 4.0's ``ConsumerConfig``, the settings one
protocol ignores may not be given with the other: ``group.remote.assignor`` with ``classic``;
``partition.assignment.strategy``, ``session.timeout.ms`` and ``heartbeat.interval.ms`` (the coordinator's
``group.consumer.*`` settings decide them) with ``consumer``.

Keyword arguments are the property names with dots as underscores (``fetch_max_bytes`` for
``fetch.max.bytes``); ``Consumer.from_properties`` takes the dotted names.
"""
import ssl

from kmem.errors import ConfigError

ASSIGNORS = ("range", "roundrobin")

# name -> (default, kind); kind is a type, or a tuple of allowed string values.
DEFAULTS = {
    "bootstrap.servers": (None, "servers"),
    "group.id": (None, "optional_str"),
    "group.instance.id": (None, "optional_str"),
    "group.protocol": ("classic", ("classic", "consumer")),
    "group.remote.assignor": (None, "optional_str"),
    "client.id": ("kmem-consumer", str),
    "buffer.memory": (100 << 20, int),
    "fetch.max.bytes": (50 << 20, int),
    "max.partition.fetch.bytes": (1 << 20, int),
    "fetch.min.bytes": (1, int),
    "fetch.max.wait.ms": (500, int),
    "max.poll.records": (500, int),
    "auto.offset.reset": ("latest", ("earliest", "latest", "none")),
    "enable.auto.commit": (True, bool),
    "auto.commit.interval.ms": (5000, int),
    "session.timeout.ms": (45000, int),
    "heartbeat.interval.ms": (3000, int),
    "max.poll.interval.ms": (300000, int),
    "request.timeout.ms": (30000, int),
    "retry.backoff.ms": (100, int),
    "reconnect.backoff.ms": (50, int),
    "reconnect.backoff.max.ms": (1000, int),
    "metadata.max.age.ms": (300000, int),
    "partition.assignment.strategy": (list(ASSIGNORS), "assignors"),
    "isolation.level": ("read_uncommitted", ("read_uncommitted", "read_committed")),
    "check.crcs": (True, bool),
    "allow.auto.create.topics": (True, bool),
    "security.protocol": ("PLAINTEXT", ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
    "sasl.mechanism": ("GSSAPI", str),
    "sasl.jaas.config": (None, "optional_str"),
    "sasl.username": (None, "optional_str"),      # librdkafka's names, for sasl.jaas.config's two options
    "sasl.password": (None, "optional_str"),
    "ssl.truststore.location": (None, "optional_str"),
    "ssl.keystore.location": (None, "optional_str"),
    "ssl.key.password": (None, "optional_str"),
    "ssl.endpoint.identification.algorithm": ("https", ("https", "")),
}

# what the consumer protocol (KIP-848) leaves to the coordinator
CLASSIC_ONLY = ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms")

# (property, smallest allowed value)
_MINIMUMS = {
    "buffer.memory": 1, "fetch.max.bytes": 0, "max.partition.fetch.bytes": 0, "fetch.min.bytes": 0,
    "fetch.max.wait.ms": 0, "max.poll.records": 1, "auto.commit.interval.ms": 0, "session.timeout.ms": 1,
    "heartbeat.interval.ms": 1, "max.poll.interval.ms": 1, "request.timeout.ms": 0, "retry.backoff.ms": 0,
    "reconnect.backoff.ms": 0, "reconnect.backoff.max.ms": 0, "metadata.max.age.ms": 0,
}
MAX_INT32 = (1 << 31) - 1


def _parse_bool(name, value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def _parse_int(name, value):
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ConfigError(f"{name} must be an integer, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    low = _MINIMUMS.get(name, 0)
    if not low <= value <= MAX_INT32:
        raise ConfigError(f"{name} must be in [{low}, {MAX_INT32}], got {value}")
    return value


def _parse_servers(value):
    if isinstance(value, str):
        value = [s for s in (part.strip() for part in value.split(",")) if s]
    servers = []
    for server in value or ():
        if isinstance(server, tuple) and len(server) == 2:
            host, port = server
        elif isinstance(server, str) and ":" in server:
            host, _, port = server.rpartition(":")
            host = host.strip("[]")
        else:
            raise ConfigError(f"bootstrap.servers entries must be host:port, not {server!r}")
        try:
            port = int(port)
        except (TypeError, ValueError):
            raise ConfigError(f"bootstrap.servers: invalid port in {server!r}") from None
        if not 0 < port < 65536:
            raise ConfigError(f"bootstrap.servers: invalid port in {server!r}")
        servers.append((host, port))
    if not servers:
        raise ConfigError("bootstrap.servers is required (host:port[,host:port...])")
    return servers


def _parse_assignors(value):
    names = [s.strip() for s in value.split(",")] if isinstance(value, str) else list(value)
    aliases = {"range": "range", "roundrobin": "roundrobin", "sticky": "sticky",
               "cooperative-sticky": "cooperative-sticky",
               "org.apache.kafka.clients.consumer.RangeAssignor": "range",
               "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
               "org.apache.kafka.clients.consumer.StickyAssignor": "sticky",
               "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": "cooperative-sticky"}
    try:
        parsed = [aliases[n] for n in names]
    except (KeyError, TypeError):
        raise ConfigError("partition.assignment.strategy must name range, roundrobin, sticky or cooperative-sticky, "
                          f"not {value!r}") from None
    if not parsed:
        raise ConfigError("partition.assignment.strategy needs at least one assignor")
    return parsed


def _parse_value(name, value):
    kind = DEFAULTS[name][1]
    if name == "security.protocol" and isinstance(value, str):
        value = value.upper()           # as Kafka's SecurityProtocol.forName reads it
    if name == "group.protocol" and isinstance(value, str):
        value = value.lower()           # as Kafka's GroupProtocol.of reads it
    if kind == "servers":
        return _parse_servers(value)
    if kind == "assignors":
        return _parse_assignors(value)
    if kind == "optional_str":
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, not {value!r}")
    elif kind is bool:
        value = _parse_bool(name, value)
    elif kind is int:
        value = _parse_int(name, value)
    elif kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, not {value!r}")
    elif value not in kind:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, kind))}, not {value!r}")
    return value


def security(properties):
    """The validated security settings (``security.protocol``, ``ssl.*``, ``sasl.*`` of ``DEFAULTS``) of a client
    other than the consumer (kmem's tools), from Kafka-named ``properties`` holding only those."""
    names = [name for name in DEFAULTS if name == "security.protocol" or name.startswith(("ssl.", "sasl."))]
    unknown = sorted(set(properties) - set(names))
    if unknown:
        raise ConfigError(f"unknown client security properties: {', '.join(map(str, unknown))}")
    return {name: _parse_value(name, properties.get(name, DEFAULTS[name][0])) for name in names}


def parse(properties):
    """Validated config dict (every name of ``DEFAULTS``) from Kafka-named ``properties``."""
    unknown = sorted(set(properties) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown consumer properties: {', '.join(map(str, unknown))}")
    config = {name: _parse_value(name, properties.get(name, default)) for name, (default, _) in DEFAULTS.items()}
    if config["buffer.memory"] < config["fetch.max.bytes"]:
        # KIP-81: a pool smaller than one fetch response could never hold it.
        raise ConfigError(f"buffer.memory ({config['buffer.memory']}) must be at least fetch.max.bytes "
                          f"({config['fetch.max.bytes']})")
    if config["group.protocol"] == "classic" and config["group.remote.assignor"] is not None:
        raise ConfigError("group.remote.assignor cannot be set when group.protocol=classic (the members assign: "
                          "partition.assignment.strategy); set group.protocol=consumer")
    if config["group.protocol"] == "consumer":
        given = [name for name in CLASSIC_ONLY if name in properties]
        if given:
            raise ConfigError(f"{', '.join(given)} cannot be set when group.protocol=consumer (the coordinator "
                              f"decides them: group.remote.assignor, group.consumer.session.timeout.ms, "
                              f"group.consumer.heartbeat.interval.ms)")
        if config["group.remote.assignor"] == "":
            raise ConfigError("group.remote.assignor must not be empty (leave it unset for the coordinator's default)")
    if config["heartbeat.interval.ms"] >= config["session.timeout.ms"]:
        raise ConfigError("heartbeat.interval.ms must be lower than session.timeout.ms")
    if config["group.id"] == "":
        raise ConfigError("group.id must not be empty (leave it unset for assign-only use)")
    if config["group.instance.id"] == "":
        raise ConfigError("group.instance.id must not be empty (leave it unset for a dynamic member)")
    return config


def from_keywords(kwargs):
    return {name.replace("_", "."): value for name, value in kwargs.items()}


def ssl_context(config):
    """An ``ssl.SSLContext`` for ``security.protocol`` SSL or SASL_SSL from PEM files, or None."""
    if config["security.protocol"] not in ("SSL", "SASL_SSL"):
        return None
    try:
        context = ssl.create_default_context(cafile=config["ssl.truststore.location"])
        if config["ssl.keystore.location"]:
            context.load_cert_chain(config["ssl.keystore.location"], password=config["ssl.key.password"])
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS files: {exc}") from None
    context.check_hostname = config["ssl.endpoint.identification.algorithm"] == "https"
    if not context.check_hostname:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def sasl_settings(config):
    """The SASL client settings (``kmem.consumer.sasl.SaslClientSettings``) for ``security.protocol``
    SASL_PLAINTEXT or SASL_SSL, or None."""
    if not config["security.protocol"].startswith("SASL_"):
        return None
    from kmem.consumer.sasl import SaslClientSettings

    return SaslClientSettings.from_config(config)
