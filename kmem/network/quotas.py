"""``ConnectionQuotas``: Kafka's connection limits (KIP-402, KIP-612; ``kafka.network.ConnectionQuotas``).

- ``max.connections`` (broker-wide) and ``listener.name.<name>.max.connections`` (a listener's, by default the
  broker-wide value, as Kafka's listener prefix works): at the limit, the listener's acceptor stops accepting
  until a connection closes. New connections wait in the kernel's accept backlog, not in the broker: no thread
  and no descriptor is held for them.
- ``max.connection.creation.rate`` (broker-wide and per listener): connections accepted per second; over it,
  the acceptor pauses until the rate is back under the limit (a burst of at most one second's worth passes).
- ``max.connections.per.ip`` and ``max.connections.per.ip.overrides`` (``host:count,...``): a connection from
  an address at its limit is accepted and closed at once.

The inter-broker listener (``protected``) is exempt from the broker-wide limits when there are several
listeners, as in Kafka: a local listener named so keeps working when the others are full. Its own listener
limits still apply, its connections count in the total, and while they take the total over
``max.connections`` the processors close the least recently used connection of another listener
(``close_excess``), as Kafka's processors do.
"""
import ipaddress
import logging
import math
import socket
import threading
import time

from kmem.errors import ConfigError

log = logging.getLogger(__name__)

UNLIMITED = 2**31 - 1      # Kafka's default of each limit: Int.MaxValue


def normalised_ip(address):
    """The address as Kafka's ``InetAddress`` compares it (an IPv4-mapped IPv6 address is its IPv4 one)."""
    ip = ipaddress.ip_address(address.partition("%")[0])
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)


def ip_overrides(value):
    """``{ip: count}`` of ``max.connections.per.ip.overrides`` (``host:count,...``; a host name counts for each
    of its addresses); ``ConfigError`` for a malformed entry or a host that does not resolve."""
    overrides = {}
    for entry in str(value or "").split(","):
        if not entry.strip():
            continue
        host, colon, count = entry.strip().rpartition(":")
        host = host.strip().strip("[]")
        try:
            count = int(count)
        except ValueError:
            count = -1
        if not colon or not host or count < 0:
            raise ConfigError(f"max.connections.per.ip.overrides must be host:count,..., not {value!r}")
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
        except (socket.gaierror, UnicodeError):
            raise ConfigError(f"max.connections.per.ip.overrides contains invalid addresses : {host}") from None
        for address in addresses:
            overrides[normalised_ip(address)] = count
    return overrides


class _Rate:
    """At most ``rate`` events a second: a bucket of one second's worth, refilled continuously."""

    def __init__(self, rate):
        self._rate = rate
        self._tokens = float(rate)
        self._at = time.monotonic()

    def _refill(self, now):
        self._tokens = min(float(self._rate), self._tokens + (now - self._at) * self._rate)
        self._at = now

    def delay(self, now):
        """Seconds until one more event fits (0: now)."""
        self._refill(now)
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self._rate

    def record(self, now):
        self._refill(now)
        self._tokens -= 1


class ConnectionQuotas:
    """The counts of open connections, by address, by listener and in all, shared by the acceptors (which
    ask ``delay`` and ``acquire``) and the processors (which ``release`` each connection once it closes)."""

    def __init__(self, config, listeners, protected=None):
        self._lock = threading.RLock()      # reentrant: close_excess closes a connection, which releases it
        self._max_connections = config.max_connections
        self._max_per_ip = config.max_connections_per_ip
        self._per_ip_overrides = ip_overrides(config.max_connections_per_ip_overrides)
        self._broker_rate = _rate(config.max_connection_creation_rate)
        self._listener_max = {}
        self._listener_rate = {}
        for listener in listeners:
            limit = listener.max_connections
            self._listener_max[listener.name] = config.max_connections if limit is None else limit
            rate = listener.max_connection_creation_rate
            self._listener_rate[listener.name] = _rate(config.max_connection_creation_rate if rate is None else rate)
        # Kafka's protectedListener: the inter-broker listener, when there is another
        self._protected = protected if len(listeners) > 1 else None
        self._per_ip = {}
        self._per_listener = dict.fromkeys(self._listener_max, 0)
        self._total = 0
        self._waiting = {}          # listener name -> wakeup of its acceptor, paused for a free slot

    @property
    def total(self):
        return self._total

    def count(self, listener_name):
        return self._per_listener[listener_name]

    def delay(self, listener_name, wakeup):
        """Seconds the acceptor of ``listener_name`` must wait before accepting: 0 now, ``math.inf`` until a
        connection closes (then ``wakeup()`` is called), else the creation rate's delay."""
        with self._lock:
            if not self._slot_available(listener_name):
                self._waiting[listener_name] = wakeup
                return math.inf
            now = time.monotonic()
            rates = [self._listener_rate[listener_name]]
            if listener_name != self._protected:
                rates.append(self._broker_rate)
            return max((rate.delay(now) for rate in rates if rate is not None), default=0.0)

    def _slot_available(self, listener_name):
        if self._per_listener[listener_name] >= self._listener_max[listener_name]:
            return False
        return listener_name == self._protected or self._total < self._max_connections

    def protects(self, listener_name):
        """True for the protected listener (exempt from the broker-wide limits)."""
        return listener_name == self._protected

    def close_excess(self, close_one):
        """While the protected listener's connections keep the total over ``max.connections`` (Kafka's
        ``maxConnectionsExceeded``), call ``close_one()``, which closes a connection of another listener (its
        ``release`` comes back here): under the lock, so processors polling at once close no more than the
        excess."""
        if not self._over_broker_limit():       # every poll of every processor asks: no lock for the usual answer
            return
        with self._lock:
            if self._over_broker_limit():
                close_one()

    def _over_broker_limit(self):
        return self._protected is not None and self._total > self._max_connections

    def acquire(self, listener_name, ip):
        """Count a connection just accepted; False (and not counted) when its address is at its limit: the
        caller closes it, as Kafka closes a connection past ``max.connections.per.ip``."""
        with self._lock:
            now = time.monotonic()
            for rate in (self._listener_rate[listener_name],
                         None if listener_name == self._protected else self._broker_rate):
                if rate is not None:
                    rate.record(now)
            count = self._per_ip.get(ip, 0)
            limit = self._per_ip_overrides.get(ip, self._max_per_ip)
            if count >= limit:
                log.info("Rejected connection from %s, address already has the configured maximum of %d "
                         "connections.", ip, limit)
                return False
            self._per_ip[ip] = count + 1
            self._per_listener[listener_name] += 1
            self._total += 1
            return True

    def release(self, listener_name, ip):
        """A counted connection closed (for whatever reason): its slot is free again."""
        with self._lock:
            count = self._per_ip.pop(ip)
            if count > 1:
                self._per_ip[ip] = count - 1
            self._per_listener[listener_name] -= 1
            self._total -= 1
            waiting, self._waiting = self._waiting, {}
        for wakeup in waiting.values():
            wakeup()


def _rate(limit):
    return None if limit >= UNLIMITED else _Rate(limit)
