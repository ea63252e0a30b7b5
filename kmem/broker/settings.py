"""The settings of a whole ``kmem broker``: Kafka's names split between the storage layer
(``BrokerConfig``), the network (``SocketServerConfig``) and the request handlers.

Names are Kafka's dotted ones (``{"num.partitions": 3}``, values as ints, bools or the strings of a
``server.properties`` file) or the same names in snake_case as keywords (``num_partitions=3``).

Listeners are read as Kafka reads them (``KafkaConfig``): ``listeners`` is a list of
``NAME://host:port`` (an empty host binds every interface), each name's security protocol comes from
``listener.security.protocol.map`` (by default PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL map to
themselves), and the names in ``controller.listener.names`` are the KRaft controller's. kmem is its own
controller, so it ignores those (logged in one line) and serves the one broker listener left, of any
of the four protocols (SSL and SASL_SSL need ``ssl.keystore.location``; SASL's settings are read by
``kmem.broker.security.SaslSettings``). Several broker listeners are refused with a ``ConfigError``. Without ``listeners`` the broker listens on the ``host`` and ``port`` it
is given, with TLS when a keystore is set. ``advertised.listeners`` (by default the served listener)
names what Metadata tells clients: its listener names must be among ``listeners``' (Kafka's rule), a
port 0 advertises the bound port, and another port than the bound one is allowed, as Kafka allows it
for port forwarding (NAT, containers).
"""
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

log = logging.getLogger(__name__)

# SocketServerConfig's fields under Kafka's names (host and port come from the listener)
NETWORK_SETTINGS = ("num.network.threads", "num.io.threads", "queued.max.requests", "queued.max.request.bytes",
                    "socket.request.max.bytes", "connections.max.idle.ms", "socket.listen.backlog.size")
LISTENER_SETTINGS = ("listeners", "advertised.listeners", "listener.security.protocol.map",
                     "controller.listener.names")
# the handlers' own settings and what they mean (Kafka's names)
HANDLER_SETTINGS = ("log.retention.check.interval.ms", "ssl.keystore.location", "ssl.keystore.type",
                    "ssl.key.password", "ssl.truststore.location", "ssl.client.auth", "broker.id")
KNOWN_SETTINGS = frozenset(BROKER_SETTINGS) | frozenset(NETWORK_SETTINGS) | frozenset(LISTENER_SETTINGS) \
    | frozenset(HANDLER_SETTINGS) | frozenset(GROUP_SETTINGS) | frozenset(TXN_SETTINGS) | frozenset(AUTHORIZER_SETTINGS)
# Kafka's socket.listen.backlog.size is 50: a burst of 5,000 connections then took 55 s to accept here
# (refused SYNs are retried after 1, 3, 7... s), 1.0 s with 1,024. Linux caps it at net.core.somaxconn.
DEFAULT_LISTEN_BACKLOG = 1024
DEFAULT_HOST = "127.0.0.1"
# Kafka's default listener.security.protocol.map: each protocol's own name
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")


def is_known_setting(name):
    """True for a setting kmem broker reads (SASL's with their ``listener.name.<name>.`` prefixes included)."""
    return name in KNOWN_SETTINGS or is_sasl_setting(name)


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
            raise ConfigError(f"{setting} names listener {listener.name} twice: {value!r}")
        listeners.append(listener)
    return listeners


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


def configured_listener(merged, tls=False):
    """``(listener, security protocol)``: the one broker listener of ``listeners``, or None when
    ``listeners`` is not set (the implicit listener: SSL when ``tls``, a keystore or context being set).
    Logs the controller listeners it ignores; raises ``ConfigError`` for what kmem cannot serve."""
    if "listeners" not in merged:
        return None, "SSL" if tls else "PLAINTEXT"
    listeners = parse_listeners("listeners", merged["listeners"])
    controllers = _controller_names(merged)
    ignored = [listener for listener in listeners if listener.name in controllers]
    if ignored:
        log.warning("ignoring the controller listener%s %s (controller.listener.names): kmem broker is its own "
                    "controller", "s" if len(ignored) > 1 else "", ", ".join(map(str, ignored)))
    served = [listener for listener in listeners if listener.name not in controllers]
    if len(served) != 1:
        raise ConfigError(f"listeners must name one broker listener for kmem broker to serve, not {len(served)}: "
                          f"{merged['listeners']!r} (controller.listener.names: "
                          f"{merged.get('controller.listener.names', '')!r})")
    listener = served[0]
    protocol = _protocol_map(merged).get(listener.name)
    if protocol is None:
        raise ConfigError(f"listener {listener.name} has no security protocol in listener.security.protocol.map")
    if protocol in TLS_PROTOCOLS and not tls:
        raise ConfigError(f"listener {listener} is {protocol}: set ssl.keystore.location (a PEM keystore)")
    return listener, protocol


def advertised_listener(merged, served, configured):
    """The served listener's entry of ``advertised.listeners`` (Kafka's ``effectiveAdvertisedBrokerListeners``),
    or None to advertise the bound address. An entry naming the port of ``configured`` (the listener of
    ``listeners``, None without it) names the served port, also when ``--port`` replaced it."""
    if "advertised.listeners" not in merged:
        return None
    controllers = _controller_names(merged)
    advertised = [listener for listener in parse_listeners("advertised.listeners", merged["advertised.listeners"])
                  if listener.name not in controllers]
    if configured is not None:
        unknown = [listener.name for listener in advertised if listener.name != served.name]
        if unknown:
            raise ConfigError(f"advertised.listeners names {', '.join(unknown)}, not the listener kmem broker serves "
                              f"({configured}): its listener names must be among listeners'")
    if not advertised:
        return None
    if advertised[0].host == "0.0.0.0":
        raise ConfigError("advertised.listeners cannot use the nonroutable meta-address 0.0.0.0")
    if configured is not None and advertised[0].port == configured.port:
        return replace(advertised[0], port=served.port)
    return advertised[0]


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
class BrokerSettings:
    storage: BrokerConfig
    network: SocketServerConfig
    listener: Listener
    advertised: Listener | None
    retention_check_interval_ms: int
    groups: GroupConfig
    transactions: TxnConfig = TxnConfig()
    sasl: SaslSettings | None = None        # a SASL listener's
    authorizer: AuthorizerConfig | None = None      # authorizer.class.name's; None: every request is allowed

    @classmethod
    def build(cls, host, port, merged, ssl_context=None):
        """``host`` and ``port`` replace the served listener's (None: from ``listeners``, else 127.0.0.1
        and a free port)."""
        storage = {name: merged[name] for name in BROKER_SETTINGS if name in merged}
        if "broker.id" in merged:
            storage.setdefault("node.id", merged["broker.id"])
        storage.setdefault("node.id", 0)
        network = {name: merged[name] for name in NETWORK_SETTINGS if name in merged}
        network.setdefault("socket.listen.backlog.size", DEFAULT_LISTEN_BACKLOG)
        tls = ssl_context is not None or bool(merged.get("ssl.keystore.location"))
        configured, protocol = configured_listener(merged, tls)
        default = configured or Listener(DEFAULT_HOST, 0, protocol)
        listener = replace(default, host=default.host if host is None else host,
                           port=default.port if port is None else port)
        advertised = advertised_listener(merged, listener, configured)
        if protocol not in TLS_PROTOCOLS:
            ssl_context = None
        elif ssl_context is None:
            ssl_context = _ssl_context(merged)
        interval = merged.get("log.retention.check.interval.ms", 300_000)
        return cls(BrokerConfig.from_properties(storage),
                   SocketServerConfig.from_properties(network, host=listener.host, port=listener.port,
                                                      ssl_context=ssl_context),
                   listener, advertised,
                   integer("log.retention.check.interval.ms", interval, 1), GroupConfig.from_properties(merged),
                   TxnConfig.from_properties(merged),
                   SaslSettings.from_settings(merged, listener.name) if protocol.startswith("SASL_") else None,
                   AuthorizerConfig.from_settings(merged))


def _ssl_context(merged):
    """A server context from a PEM keystore (``ssl.keystore.type=PEM``: the certificate chain and the
    private key in one file, as Kafka reads PEM keystores)."""
    kind = str(merged.get("ssl.keystore.type", "PEM")).upper()
    if kind != "PEM":
        raise ConfigError(f"ssl.keystore.type = {kind!r}: only PEM keystores are supported")
    path = os.fspath(merged["ssl.keystore.location"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(path, password=merged.get("ssl.key.password"))
        if merged.get("ssl.truststore.location"):
            context.load_verify_locations(os.fspath(merged["ssl.truststore.location"]))
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"ssl.keystore.location {path!r}: {e}") from None
    client_auth = str(merged.get("ssl.client.auth", "none")).lower()
    if client_auth not in ("none", "requested", "required"):
        raise ConfigError(f"ssl.client.auth must be none, requested or required, not {client_auth!r}")
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
