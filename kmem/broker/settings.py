"""The settings of a whole ``kmem broker``: Kafka's names split between the storage layer
(``BrokerConfig``), the network (``SocketServerConfig``) and the request handlers.

Names are Kafka's dotted ones (``{"num.partitions": 3}``, values as ints, bools or the strings of a
``server.properties`` file) or the same names in snake_case as keywords (``num_partitions=3``).
"""
import os
import socket
import ssl
from dataclasses import dataclass

from kmem.broker.log.config import BROKER_SETTINGS, BrokerConfig, _int
from kmem.broker.group.coordinator import GROUP_SETTINGS, GroupConfig
from kmem.errors import ConfigError
from kmem.network import SocketServerConfig

# SocketServerConfig's fields under Kafka's names (host and port come from the listener)
NETWORK_SETTINGS = ("num.network.threads", "num.io.threads", "queued.max.requests", "queued.max.request.bytes",
                    "socket.request.max.bytes", "connections.max.idle.ms", "socket.listen.backlog.size")
# the handlers' own settings and what they mean (Kafka's names)
HANDLER_SETTINGS = ("advertised.listeners", "log.retention.check.interval.ms", "ssl.keystore.location",
                    "ssl.keystore.type", "ssl.key.password", "ssl.truststore.location", "ssl.client.auth",
                    "broker.id")
KNOWN_SETTINGS = frozenset(BROKER_SETTINGS) | frozenset(NETWORK_SETTINGS) | frozenset(HANDLER_SETTINGS) \
    | frozenset(GROUP_SETTINGS)
# Kafka's socket.listen.backlog.size is 50: a burst of 5,000 connections then took 55 s to accept here
# (refused SYNs are retried after 1, 3, 7... s), 1.0 s with 1,024. Linux caps it at net.core.somaxconn.
DEFAULT_LISTEN_BACKLOG = 1024


@dataclass(frozen=True)
class Listener:
    host: str
    port: int


def parse_listener(name, value):
    """The first ``SECURITY_PROTOCOL://host:port`` of a comma-separated listener list."""
    first = str(value).split(",")[0].strip()
    _, sep, address = first.rpartition("://")
    host, colon, port = address.rpartition(":")
    if not sep or not colon:
        raise ConfigError(f"{name} must look like PLAINTEXT://host:port, not {value!r}")
    return Listener(host.strip("[]"), _int(name, port, 0, 65535))


def merge_settings(properties=None, keywords=None):
    """``{dotted name: value}`` of ``properties`` (dotted) then ``keywords`` (snake_case); unknown names
    raise ``ConfigError``."""
    merged = {}
    for source in (properties or {}), {k.replace("_", "."): v for k, v in (keywords or {}).items()}:
        for name, value in source.items():
            if name not in KNOWN_SETTINGS:
                raise ConfigError(f"unknown broker setting {name!r}")
            merged[name] = value
    return merged


@dataclass(frozen=True)
class BrokerSettings:
    storage: BrokerConfig
    network: SocketServerConfig
    advertised: Listener | None
    retention_check_interval_ms: int
    groups: GroupConfig

    @classmethod
    def build(cls, host, port, merged, ssl_context=None):
        storage = {name: merged[name] for name in BROKER_SETTINGS if name in merged}
        if "broker.id" in merged:
            storage.setdefault("node.id", merged["broker.id"])
        storage.setdefault("node.id", 0)
        network = {name: merged[name] for name in NETWORK_SETTINGS if name in merged}
        network.setdefault("socket.listen.backlog.size", DEFAULT_LISTEN_BACKLOG)
        if ssl_context is None and merged.get("ssl.keystore.location"):
            ssl_context = _ssl_context(merged)
        advertised = merged.get("advertised.listeners")
        interval = merged.get("log.retention.check.interval.ms", 300_000)
        return cls(BrokerConfig.from_properties(storage),
                   SocketServerConfig.from_properties(network, host=host, port=port, ssl_context=ssl_context),
                   parse_listener("advertised.listeners", advertised) if advertised else None,
                   _int("log.retention.check.interval.ms", interval, 1), GroupConfig.from_properties(merged))


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


def read_properties_file(path):
    """``{name: value}`` of a Java properties file (``key=value`` or ``key: value`` lines, ``#``/``!``
    comments); raises ``ConfigError`` naming the file and line of a malformed line."""
    properties = {}
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        positions = [p for p in (line.find("="), line.find(":")) if p > 0]
        if not positions:
            raise ConfigError(f"{path}:{number}: expected key=value, got {line!r}")
        split = min(positions)
        properties[line[:split].strip()] = line[split + 1:].strip()
    return properties
