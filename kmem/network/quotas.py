"""``ConnectionQuotas``: Kafka's connection limits (KIP-402, KIP-612; ``kafka.network.ConnectionQuotas``).

- ``max.connections`` (broker-wide) and ``listener.name.<name>.max.connections`` (a listener's, by default the
  broker-wide value, as Kafka's listener prefix works): at the limit, the listener's acceptor stops accepting
  until a connection closes. New connections wait in the kernel's accept backlog, not in the broker: no thread
  and no descriptor is held for them.
- ``max.connection.creation.rate`` (broker-wide and per listener): connections accepted per second; over it,
  the acceptor pauses until the rate is back under the limit (a burst of at most one second's worth passes).
- ``max.connections.per.ip`` and ``max.connections.per.ip.overrides`` (``host:count,...``): a connection from
  an address at its limit is accepted and closed at once.
- The IP quota ``connection_creation_rate`` (KIP-612, set with AlterClientQuotas for an IP or the default IP;
  ``ip_connection_rate(ip)`` gives it): connections from one address per second, Kafka's sampled ``Rate`` over
  ``quota.window.num`` windows of ``quota.window.size.seconds``. A connection over it is not counted and is
  closed only after the throttle time (at most one window; Kafka's ``DelayedCloseSocket``), so the client does
  not reconnect at once.

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


class SampledRate:
    """Kafka's ``Rate`` over a ``SampledStat`` of ``samples`` windows of ``window`` seconds: the sum of the
    samples not older than ``samples * window``, over the time they cover, at least ``samples - 1`` windows."""

    def __init__(self, samples=11, window=1.0):
        self.samples_count = samples
        self.window = window
        self._samples = []          # [start, value]
        self._current = 0

    def record(self, value, now):
        sample = self._samples[self._current] if self._samples else None
        if sample is None or now >= sample[0] + self.window:
            if len(self._samples) < self.samples_count:
                self._samples.append([now, 0.0])
                self._current = len(self._samples) - 1
            else:
                self._current = (self._current + 1) % self.samples_count
                self._samples[self._current] = [now, 0.0]
            sample = self._samples[self._current]
        sample[1] += value

    def window_size(self, now):
        """Kafka's ``Rate.windowSize``: the time the samples cover, at least ``samples - 1`` full windows."""
        self._purge(now)
        oldest = min((sample[0] for sample in self._samples), default=now)
        elapsed = now - oldest
        full = int(elapsed // self.window)
        if full < self.samples_count - 1:
            elapsed += (self.samples_count - 1 - full) * self.window
        return elapsed

    def measure(self, now):
        """Units per second."""
        size = self.window_size(now)
        return sum(sample[1] for sample in self._samples) / size

    def expired(self, now):
        """True when every sample is older than the samples' span: the rate measures nothing any more."""
        return all(now - sample[0] >= self.samples_count * self.window for sample in self._samples)

    def _purge(self, now):
        expire = self.samples_count * self.window
        for sample in self._samples:
            if now - sample[0] >= expire:
                sample[0], sample[1] = now, 0.0


class ConnectionQuotas:
    """The counts of open connections, by address, by listener and in all, shared by the acceptors (which
    ask ``delay`` and ``acquire``) and the processors (which ``release`` each connection once it closes)."""

    def __init__(self, config, listeners, protected=None, ip_connection_rate=None, quota_window=(11, 1)):
        self._lock = threading.RLock()      # reentrant: close_excess closes a connection, which releases it
        self._ip_connection_rate = ip_connection_rate
        self._quota_window = quota_window
        self._ip_rates = {}                 # ip -> SampledRate, while it has a connection_creation_rate
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
        """Count a connection just accepted: 0 when counted; else not counted and the caller closes it, after
        the seconds returned for a connection over its IP's ``connection_creation_rate``, at once (``-1``) for
        one past ``max.connections.per.ip``, as Kafka closes them."""
        with self._lock:
            now = time.monotonic()
            for rate in (self._listener_rate[listener_name],
                         None if listener_name == self._protected else self._broker_rate):
                if rate is not None:
                    rate.record(now)
            throttle = self._ip_throttle(ip, now)
            if throttle:
                return throttle
            count = self._per_ip.get(ip, 0)
            limit = self._per_ip_overrides.get(ip, self._max_per_ip)
            if count >= limit:
                log.info("Rejected connection from %s, address already has the configured maximum of %d "
                         "connections.", ip, limit)
                return -1
            self._per_ip[ip] = count + 1
            self._per_listener[listener_name] += 1
            self._total += 1
            return 0

    def _ip_throttle(self, ip, now):
        """Record a connection from ``ip`` in its creation rate; the seconds it is throttled (0: within its
        quota, or none set), as Kafka's ``recordIpConnectionMaybeThrottle`` (a throttled one is not recorded)."""
        quota = None if self._ip_connection_rate is None else self._ip_connection_rate(ip)
        if quota is None:
            self._ip_rates.pop(ip, None)
            return 0
        samples, window = self._quota_window
        rate = self._ip_rates.get(ip)
        if rate is None:
            if len(self._ip_rates) >= 1024:         # forget the addresses gone quiet (a fresh rate is the same)
                self._ip_rates = {a: r for a, r in self._ip_rates.items() if not r.expired(now)}
            rate = self._ip_rates[ip] = SampledRate(samples, window)
        rate.record(1, now)
        measured = rate.measure(now)
        if measured <= quota:
            return 0
        rate.record(-1, now)
        throttle = window if quota == 0 else (measured - quota) / quota * rate.window_size(now)
        log.debug("Throttling %s for %.0f ms", ip, throttle * 1000)
        return min(throttle, window)

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
