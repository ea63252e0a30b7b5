"""The settings of a whole ``kmem broker``: Kafka's names split between the storage layer
(``BrokerConfig``), the network (``SocketServerConfig``) and the request handlers.

Names are Kafka's dotted ones (``{"num.partitions": 3}``, values as ints, bools or the strings of a
``server.properties`` file) or the same names in snake_case as keywords (``num_partitions=3``).

Listeners are read as Kafka reads them (``KafkaConfig``): ``listeners`` is a list of
``NAME://host:port`` (an empty host binds every interface; names and non-zero ports distinct), each name's
security protocol comes from ``listener.security.protocol.map`` (by default PLAINTEXT, SSL, SASL_PLAINTEXT
and SASL_SSL map to themselves), and the names in ``controller.listener.names`` are the KRaft controller's.
kmem is its own controller, so it ignores those (logged in one line) and serves every broker listener left,
each with its own protocol and its own settings under Kafka's prefix ``listener.name.<name>.`` (TLS:
``ssl.keystore.location``...; SASL: read by ``kmem.broker.security.SaslSettings``; connection limits:
``max.connections``, ``max.connection.creation.rate``). Without ``listeners`` the broker listens on the
``host`` and ``port`` it is given, with TLS when a keystore is set; with one listener they replace its
address; with several only ``port=0`` may be given (every listener on a free port, for tests).
``advertised.listeners`` names what Metadata, FindCoordinator and DescribeCluster tell the clients of each
listener (by default its bound address): its listener names must be among ``listeners``' (Kafka's rule), a
port 0 advertises the bound port, and another port than the bound one is allowed, as Kafka allows it for
port forwarding (NAT, containers). ``inter.broker.listener.name`` (else the listener named after
``security.inter.broker.protocol``, PLAINTEXT by default) is exempt from the broker-wide connection limits
when there are several listeners, as Kafka's inter-broker listener is (``kmem.network.quotas``).
"""
import ipaddress
import logging
import os
import socket
import ssl
from dataclasses import dataclass, replace

from kmem.broker.log.config import BROKER_SETTINGS, BrokerConfig, integer
from kmem.broker.security import SaslSettings, is_sasl_setting
from kmem.broker.security.authorizer import AUTHORIZER_SETTINGS, AuthorizerConfig
from kmem.broker.group.coordinator import GROUP_SETTINGS, GroupConfig
from kmem.broker.txn.coordinator import TXN_SETTINGS, TxnConfig
from kmem.errors import ConfigError
from kmem.network import SocketServerConfig
from kmem.network.ssl_principal import DEFAULT_RULES, SslPrincipalMapper
from kmem.network.server import check_connection_limits

log = logging.getLogger(__name__)

# SocketServerConfig's fields under Kafka's names (host and port come from the listener)
NETWORK_SETTINGS = ("num.network.threads", "num.io.threads", "queued.max.requests", "queued.max.request.bytes",
                    "socket.request.max.bytes", "connections.max.idle.ms", "socket.listen.backlog.size",
                    "max.connections", "max.connections.per.ip", "max.connections.per.ip.overrides",
                    "max.connection.creation.rate")
LISTENER_SETTINGS = ("listeners", "advertised.listeners", "listener.security.protocol.map",
                     "controller.listener.names", "inter.broker.listener.name", "security.inter.broker.protocol")
SSL_SETTINGS = ("ssl.keystore.location", "ssl.keystore.type", "ssl.key.password", "ssl.truststore.location",
                "ssl.client.auth")
# what a listener may set for itself, under listener.name.<name>.
PER_LISTENER_SETTINGS = SSL_SETTINGS + ("max.connections", "max.connection.creation.rate")
# the handlers' own settings and what they mean (Kafka's names)
HANDLER_SETTINGS = ("log.retention.check.interval.ms", "broker.id", "broker.rack", "ssl.principal.mapping.rules") \
    + SSL_SETTINGS
# the client quotas' sampled rates (Kafka's ClientQuotaManagerConfig): so many windows of so many seconds
QUOTA_SETTINGS = ("quota.window.num", "quota.window.size.seconds")
# kmem's Prometheus endpoint (kmem.metrics): the port it serves on 127.0.0.1; unset, none. With it the broker
# receives its clients' metrics (KIP-714, kmem.broker.telemetry): at most telemetry.max.bytes a push (Kafka's), and a
# client no subscription matches gets the metric prefixes of client.metrics.default.metrics every
# client.metrics.default.interval.ms (kmem's)
METRICS_SETTINGS = ("metrics.port", "telemetry.max.bytes", "client.metrics.default.metrics",
                    "client.metrics.default.interval.ms")
KNOWN_SETTINGS = frozenset(BROKER_SETTINGS) | frozenset(NETWORK_SETTINGS) | frozenset(LISTENER_SETTINGS) \
    | frozenset(HANDLER_SETTINGS) | frozenset(GROUP_SETTINGS) | frozenset(TXN_SETTINGS) | frozenset(AUTHORIZER_SETTINGS) \
    | frozenset(QUOTA_SETTINGS) | frozenset(METRICS_SETTINGS)
# Kafka's socket.listen.backlog.size is 50: a burst of 5,000 connections then took 55 s to accept here
# (refused SYNs are retried after 1, 3, 7... s), 1.0 s with 1,024. Linux caps it at net.core.somaxconn.
DEFAULT_LISTEN_BACKLOG = 1024
DEFAULT_HOST = "127.0.0.1"
# Kafka's default listener.security.protocol.map: each protocol's own name
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")


def is_known_setting(name):
    """True for a setting kmem broker reads (with a ``listener.name.<name>.`` prefix included)."""
    if name in KNOWN_SETTINGS or is_sasl_setting(name):
        return True
    return name.startswith("listener.name.") and \
        name[len("listener.name."):].partition(".")[2] in PER_LISTENER_SETTINGS


def listener_setting(merged, listener_name, name, default=None):
    """``(key, value)`` of setting ``name`` for a listener: ``listener.name.<name>.<setting>`` wins over
    ``<setting>``, as in Kafka."""
    for key in (f"listener.name.{listener_name.lower()}.{name}", name):
        if key in merged:
            return key, merged[key]
    return name, default


@dataclass(frozen=True)
class Listener:
    host: str
    port: int
    name: str = "PLAINTEXT"

    def __str__(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_listeners(setting, value):
    """Every ``NAME://host:port`` of a comma-separated listener list (Kafka's
    ``CoreUtils.listenerListToEndPoints``); names are case-insensitive and must be unique."""
    listeners = []
    for entry in str(value).split(","):
        entry = entry.strip()
        name, sep, address = entry.partition("://")
        host, colon, port = address.rpartition(":")
        if not entry or not sep or not colon or not name:
            raise ConfigError(f"{setting} must look like PLAINTEXT://host:port, not {value!r}")
        listener = Listener(host.strip("[]"), integer(setting, port, 0, 65535), name.strip().upper())
        if any(other.name == listener.name for other in listeners):
            raise ConfigError(f"Each listener must have a different name, {setting}: {value}")
        listeners.append(listener)
    return listeners


def _check_distinct_ports(listeners, value):
    """Kafka's rule: listeners on the same (non-zero) port only as one IPv4 and one IPv6 address."""
    by_port = {}
    for listener in listeners:
        if listener.port:
            by_port.setdefault(listener.port, []).append(listener.host)
    for port, hosts in by_port.items():
        versions = sorted(_ip_version(host) for host in hosts)
        if len(hosts) > 1 and versions != [4, 6]:
            raise ConfigError(f"Each listener must have a different port, listeners: {value} (port {port})")


def _ip_version(host):
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return 0


def _protocol_map(merged):
    value = merged.get("listener.security.protocol.map")
    if value is None:
        return {protocol: protocol for protocol in SECURITY_PROTOCOLS}
    mapping = {}
    for entry in str(value).split(","):
        name, colon, protocol = entry.strip().partition(":")
        if not colon or protocol.strip().upper() not in SECURITY_PROTOCOLS:
            raise ConfigError(f"listener.security.protocol.map must map NAME:PROTOCOL "
                              f"({', '.join(SECURITY_PROTOCOLS)}), not {value!r}")
        mapping[name.strip().upper()] = protocol.strip().upper()
    return mapping


def _controller_names(merged):
    return {name.strip().upper() for name in str(merged.get("controller.listener.names", "")).split(",")
            if name.strip()}


def configured_listeners(merged):
    """``[(listener, security protocol)]``: the broker listeners of ``listeners``, or None when ``listeners``
    is not set. Logs the controller listeners it ignores; raises ``ConfigError`` for what Kafka refuses and
    what kmem cannot serve."""
    if "listeners" not in merged:
        return None
    listeners = parse_listeners("listeners", merged["listeners"])
    _check_distinct_ports(listeners, merged["listeners"])
    controllers = _controller_names(merged)
    ignored = [listener for listener in listeners if listener.name in controllers]
    if ignored:
        log.warning("ignoring the controller listener%s %s (controller.listener.names): kmem broker is its own "
                    "controller", "s" if len(ignored) > 1 else "", ", ".join(map(str, ignored)))
    served = [listener for listener in listeners if listener.name not in controllers]
    if not served:
        raise ConfigError(f"listeners must name a broker listener for kmem broker to serve: {merged['listeners']!r} "
                          f"(controller.listener.names: {merged.get('controller.listener.names', '')!r})")
    protocols = _protocol_map(merged)
    unmapped = [listener.name for listener in served if listener.name not in protocols]
    if unmapped:
        raise ConfigError(f"listener {', '.join(unmapped)} has no security protocol in listener.security.protocol.map")
    return [(listener, protocols[listener.name]) for listener in served]


def advertised_listeners(merged, served, configured):
    """``{listener name: advertised listener}`` of ``advertised.listeners`` (Kafka's
    ``effectiveAdvertisedBrokerListeners``) for the ``served`` listeners; a listener without an entry advertises
    its bound address. An entry naming the port of its ``configured`` listener (that of ``listeners``) names the
    served port, also when ``port`` replaced it. Without ``listeners`` (``configured`` None), the first entry is
    the one listener's, whatever its name."""
    if "advertised.listeners" not in merged:
        return {}
    controllers = _controller_names(merged)
    advertised = [listener for listener in parse_listeners("advertised.listeners", merged["advertised.listeners"])
                  if listener.name not in controllers]
    if any(listener.host == "0.0.0.0" for listener in advertised):
        raise ConfigError("advertised.listeners cannot use the nonroutable meta-address 0.0.0.0")
    if configured is None:
        return {served[0].name: advertised[0]} if advertised else {}
    names = [listener.name for listener in served]
    unknown = [listener.name for listener in advertised if listener.name not in names]
    if unknown:
        raise ConfigError(f"advertised.listeners names {', '.join(unknown)}, not a listener kmem broker serves "
                          f"({', '.join(names)}): its listener names must be among listeners'")
    result = {}
    for entry in advertised:
        bound, = [listener for listener in served if listener.name == entry.name]
        original, = [listener for listener in configured if listener.name == entry.name]
        result[entry.name] = replace(entry, port=bound.port) if entry.port == original.port else entry
    return result


def _inter_broker_listener(merged, names):
    """The inter-broker listener's name (Kafka's ``interBrokerListenerName``): ``inter.broker.listener.name``,
    which must be served, else the listener named after ``security.inter.broker.protocol`` (PLAINTEXT)."""
    name = merged.get("inter.broker.listener.name")
    if name is None:
        return str(merged.get("security.inter.broker.protocol", "PLAINTEXT")).strip().upper()
    if "security.inter.broker.protocol" in merged:
        raise ConfigError("Only one of inter.broker.listener.name and security.inter.broker.protocol should be set.")
    name = str(name).strip().upper()
    if name not in names:
        raise ConfigError(f"inter.broker.listener.name must be a listener name defined in advertised.listeners. The "
                          f"valid options based on currently configured listeners are {','.join(names)}")
    return name


def log_dir_of(properties):
    """The log directory ``log.dirs`` (else ``log.dir``) names, or None; ``ConfigError`` for several:
    kmem broker serves one log directory."""
    for name in ("log.dirs", "log.dir"):
        directories = [d.strip() for d in str(properties.get(name, "")).split(",") if d.strip()]
        if len(directories) > 1:
            raise ConfigError(f"{name} names {len(directories)} directories ({', '.join(directories)}): kmem broker "
                              "serves one log directory")
        if directories:
            return directories[0]
    return None


def merge_settings(properties=None, keywords=None):
    """``{dotted name: value}`` of ``properties`` (dotted) then ``keywords`` (snake_case); unknown names
    raise ``ConfigError``."""
    merged = {}
    for source in (properties or {}), {k.replace("_", "."): v for k, v in (keywords or {}).items()}:
        for name, value in source.items():
            if not is_known_setting(name):
                raise ConfigError(f"unknown broker setting {name!r}")
            merged[name] = value
    return merged


@dataclass(frozen=True)
class ListenerSettings:
    """One listener kmem broker serves: where it listens (``listener``, port 0 for any free one), its security
    protocol, what it advertises (None: its bound address), its TLS context, SASL settings and connection
    limits (None: the broker-wide ones)."""
    listener: Listener
    protocol: str = "PLAINTEXT"
    advertised: Listener | None = None
    ssl_context: ssl.SSLContext | None = None
    sasl: SaslSettings | None = None
    max_connections: int | None = None
    max_connection_creation_rate: int | None = None

    @property
    def name(self):
        return self.listener.name


@dataclass(frozen=True)
class BrokerSettings:
    storage: BrokerConfig
    network: SocketServerConfig
    listeners: tuple            # ListenerSettings, in the order of listeners
    retention_check_interval_ms: int
    groups: GroupConfig
    transactions: TxnConfig = TxnConfig()
    inter_broker_listener: str | None = None
    ssl_principal_mapper: SslPrincipalMapper = SslPrincipalMapper()     # ssl.principal.mapping.rules
    authorizer: AuthorizerConfig | None = None      # authorizer.class.name's; None: every request is allowed
    quota_window_num: int = 11                      # quota.window.num
    quota_window_size_seconds: int = 1              # quota.window.size.seconds
    metrics_port: int | None = None                 # metrics.port: the Prometheus endpoint's; None, no endpoint
    rack: str | None = None                         # broker.rack: the broker's rack in Metadata and DescribeCluster
    telemetry_max_bytes: int = 1 << 20              # telemetry.max.bytes
    client_metrics_default: tuple = (("*",), 60_000)     # client.metrics.default.metrics, ...interval.ms

    @classmethod
    def build(cls, host, port, merged, ssl_context=None):
        """``host`` and ``port`` replace the one listener's (None: from ``listeners``, else 127.0.0.1 and a
        free port); with several listeners only ``port=0`` may be given: every listener on a free port."""
        storage = {name: merged[name] for name in BROKER_SETTINGS if name in merged}
        if "broker.id" in merged:
            storage.setdefault("node.id", merged["broker.id"])
        storage.setdefault("node.id", 0)
        network = {name: merged[name] for name in NETWORK_SETTINGS if name in merged}
        network.setdefault("socket.listen.backlog.size", DEFAULT_LISTEN_BACKLOG)
        configured = explicit = configured_listeners(merged)
        if configured is None:
            tls = ssl_context is not None or bool(merged.get("ssl.keystore.location"))
            implicit = Listener(DEFAULT_HOST, 0, "SSL" if tls else "PLAINTEXT")
            configured = [(implicit, implicit.name)]
        if len(configured) > 1 and (host is not None or port not in (None, 0)):
            raise ConfigError(f"host and port (--host, --port) replace the address of one listener, and listeners "
                              f"names {len(configured)}: {merged['listeners']!r}; set each address there (port 0, "
                              "alone: every listener on a free port)")
        served = [replace(listener, host=listener.host if host is None else host,
                          port=listener.port if port is None else port) for listener, _ in configured]
        advertised = advertised_listeners(merged, served, explicit and [listener for listener, _ in explicit])
        listeners = tuple(_listener_settings(merged, listener, protocol, advertised.get(listener.name), ssl_context)
                          for listener, (_, protocol) in zip(served, configured))
        interval = merged.get("log.retention.check.interval.ms", 300_000)
        first = served[0]
        return cls(BrokerConfig.from_properties(storage),
                   SocketServerConfig.from_properties(network, host=first.host, port=first.port),
                   listeners, integer("log.retention.check.interval.ms", interval, 1),
                   GroupConfig.from_properties(merged), TxnConfig.from_properties(merged),
                   _inter_broker_listener(merged, [listener.name for listener in served]),
                   SslPrincipalMapper(merged.get("ssl.principal.mapping.rules", DEFAULT_RULES)),
                   AuthorizerConfig.from_settings(merged),
                   integer("quota.window.num", merged.get("quota.window.num", 11), 1, 2**31 - 1),
                   integer("quota.window.size.seconds", merged.get("quota.window.size.seconds", 1), 1, 2**31 - 1),
                   None if merged.get("metrics.port") is None else integer("metrics.port", merged["metrics.port"], 0,
                                                                            65535),
                   None if merged.get("broker.rack") is None else str(merged["broker.rack"]),
                   integer("telemetry.max.bytes", merged.get("telemetry.max.bytes", 1 << 20), 1, 2**31 - 1),
                   _client_metrics_default(merged))


def _client_metrics_default(merged):
    """The default client metrics subscription: (metric name prefixes, interval in ms)."""
    from kmem.broker.telemetry import MAX_INTERVAL_MS, MIN_INTERVAL_MS

    metrics = merged.get("client.metrics.default.metrics", "*")
    if not isinstance(metrics, str):
        raise ConfigError(f"client.metrics.default.metrics must be metric name prefixes separated by commas, not "
                          f"{metrics!r}")
    interval = integer("client.metrics.default.interval.ms", merged.get("client.metrics.default.interval.ms", 60_000),
                       MIN_INTERVAL_MS, MAX_INTERVAL_MS)
    return tuple(m.strip() for m in metrics.split(",") if m.strip()), interval


def _listener_settings(merged, listener, protocol, advertised, ssl_context):
    """A served listener's ``ListenerSettings``: its ``listener.name.<name>.`` settings over the broker's."""
    context = None
    if protocol in TLS_PROTOCOLS:
        if listener_setting(merged, listener.name, "ssl.keystore.location")[1]:
            context = _ssl_context(merged, listener.name)
        elif ssl_context is not None:
            context = ssl_context
        else:
            raise ConfigError(f"listener {listener} is {protocol}: set ssl.keystore.location (a PEM keystore)")
    limits = {}
    for name in ("max.connections", "max.connection.creation.rate"):
        key = f"listener.name.{listener.name.lower()}.{name}"
        if key in merged:
            limits[name.replace(".", "_")] = integer(key, merged[key], 0)
    check_connection_limits(limits.get("max_connections"), limits.get("max_connection_creation_rate"),
                            f"listener.name.{listener.name.lower()}.")
    return ListenerSettings(listener, protocol, advertised, context,
                            SaslSettings.from_settings(merged, listener.name) if protocol.startswith("SASL_") else None,
                            **limits)


def _ssl_context(merged, listener_name):
    """A listener's server context from a PEM keystore (``ssl.keystore.type=PEM``: the certificate chain and
    the private key in one file, as Kafka reads PEM keystores); each setting may carry the listener's prefix."""
    def setting(name, default=None):
        return listener_setting(merged, listener_name, name, default)
    kind_key, kind = setting("ssl.keystore.type", "PEM")
    if str(kind).upper() != "PEM":
        raise ConfigError(f"{kind_key} = {kind!r}: only PEM keystores are supported")
    key, path = setting("ssl.keystore.location")
    path = os.fspath(path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(path, password=setting("ssl.key.password")[1])
        truststore = setting("ssl.truststore.location")[1]
        if truststore:
            context.load_verify_locations(os.fspath(truststore))
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{key} {path!r}: {e}") from None
    auth_key, client_auth = setting("ssl.client.auth", "none")
    client_auth = str(client_auth).lower()
    if client_auth not in ("none", "requested", "required"):
        raise ConfigError(f"{auth_key} must be none, requested or required, not {client_auth!r}")
    context.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                           "required": ssl.CERT_REQUIRED}[client_auth]
    return context


def advertised_host(bound_host):
    """The host to advertise for a listener bound to ``bound_host`` (a wildcard address advertises the
    machine's name, as Kafka does)."""
    return socket.getfqdn() if bound_host in ("", "0.0.0.0", "::") else bound_host


def _logical_lines(lines):
    """``(line number, text)`` of each logical line: a line ending in an odd number of backslashes goes on with
    the next, whose leading blanks are dropped (``java.util.Properties``; Kafka's JAAS settings are often so
    written, one option per line)."""
    number, pending = None, None
    for index, line in enumerate(lines, 1):
        text = line.lstrip() if pending is not None else line.strip()
        if pending is None:
            if not text or text[0] in "#!":
                continue
            number, pending = index, ""
        trailing = len(text) - len(text.rstrip("\\"))
        if trailing % 2:
            pending += text[:-1]
            continue
        yield number, (pending + text).strip()
        pending = None
    if pending is not None:
        yield number, pending.strip()


def read_properties_file(path):
    """``{name: value}`` of a Java properties file (``key=value`` or ``key: value`` lines, ``#``/``!``
    comments, a trailing backslash continuing a line); raises ``ConfigError`` naming the file and line of a
    malformed line."""
    properties = {}
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    for number, line in _logical_lines(lines):
        positions = [p for p in (line.find("="), line.find(":")) if p > 0]
        if not positions:
            raise ConfigError(f"{path}:{number}: expected key=value, got {line!r}")
        split = min(positions)
        properties[line[:split].strip()] = line[split + 1:].strip()
    return properties
