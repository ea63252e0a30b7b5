"""``SocketServer``: Kafka's broker network layer, with requests handled where they are read.

An acceptor thread hands new connections round-robin to N processor threads, each with its own
``Selector``; all share one memory pool (``queued_max_request_bytes``) into which requests are read.
A processor calls ``handler(request)`` itself as soon as a request is complete: handing each request to
another thread costs more in Python than most requests take to answer. What the handler returns is sent
back as a size-prefixed frame: bytes, a ``kmem.send.Send``, or None for no response. A request that
cannot be answered at once is deferred instead:

- ``request.defer()`` parks it: the handler returns the ``Deferred`` and someone calls its
  ``complete(response)`` later, from any thread (Kafka's purgatory completes a delayed operation so). The
  request's memory goes back to the pool when the handler returns; a parked request holds none.
- ``request.offload(fn)`` runs ``fn(request)`` on one of ``num_io_threads`` threads (through a queue
  bounded by ``queued_max_requests``): for work that blocks, such as fsync. The request's memory is kept
  until ``fn`` returns. ``offloaded(fn)`` makes a handler that offloads every request.

A handler throttles a client over its quota with ``request.throttle(ms)`` (KIP-219): the response goes out at
once, and the connection reads nothing more until ``ms`` have passed (the server's timer ends the throttle; no
thread waits).

Work the response need not wait for goes to ``request.after_response(fn)``: the processor runs ``fn()``
once it has answered the requests of that poll, before it reads more (the markers after EndTxn).

A connection has one request in flight: it is muted from the moment its request is complete until the
last byte of its response is written, so responses go out in the order of the requests whether answered
at once or deferred. A connection that closes while its request is deferred cancels the ``Deferred``
(its ``on_cancel`` callbacks run, so what was parked can be freed); a response it leaves unsent, or one
made for it after it closed, is closed (``kmem.send.close_send``): its file descriptors go at once.
"""
import collections
import dataclasses
import errno
import functools
import heapq
import itertools
import logging
import math
import queue
import selectors
import socket
import ssl
import threading
import time

from kmem import _core
from kmem.errors import ConfigError, IllegalStateError, SslAuthenticationError
from kmem.network.channel import ChannelMuteEvent, ChannelMuteState
from kmem.network.quotas import UNLIMITED as UNLIMITED_CONNECTIONS
from kmem.network.quotas import ConnectionQuotas, ip_overrides, normalised_ip
from kmem.network.receive import UNLIMITED, NetworkSend
from kmem.network.sasl import ANONYMOUS, Outcome
from kmem.network.selector import Selector
from kmem.network.ssl_principal import SslPrincipalMapper
from kmem.network.waker import Waker
from kmem.pool import MAX_POOL_BYTES, NONE, SimpleMemoryPool
from kmem.protocol import ApiKey
from kmem.send import close_send

log = logging.getLogger(__name__)

# How long a processor or acceptor waits in select before rechecking for shutdown, new connections and
# responses (all of which also wake it at once), as Kafka's processors poll every 300 ms.
POLL_SECONDS = 0.3
# At shutdown, how long processors keep sending the responses already made (deferred ones a stopping
# broker completes included) before closing their connections.
DRAIN_SECONDS = 2.0
# Responses a processor builds for deferred requests (complete_with) take at most this long per turn of
# its loop before it reads again: a burst of parked fetches expiring together delays a request that
# arrives meanwhile by one such slice, not by the whole burst.
BUILD_SLICE_SECONDS = 0.002
# Out of descriptors (or kernel memory), accept() fails while the listener stays readable: the acceptor
# stops listening for a pause that doubles, within these bounds, until an accept succeeds.
ACCEPT_BACKOFF_MIN_SECONDS = 0.01
ACCEPT_BACKOFF_MAX_SECONDS = 1.0
# connections over their IP's creation rate held open until their throttle ends; past this many, closed at once
MAX_THROTTLED_SOCKETS = 1024
_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
AUTHENTICATION_METRICS = ("successful-authentication-total", "successful-reauthentication-total",
                          "failed-authentication-total", "failed-reauthentication-total",
                          "successful-authentication-no-reauth-total", "expired-connections-killed-count")


@dataclasses.dataclass(frozen=True)
class SocketServerConfig:
    """Server settings with Kafka's defaults; ``from_properties`` accepts Kafka's dotted names."""

    host: str = "127.0.0.1"
    port: int = 0
    # Kafka: 3. Under the GIL more processors add no parallelism, only a GIL hand-over at each system call:
    # with a thousand long-polling consumers, three processors saturated the broker and a produce waited
    # about a second (bench/bench_broker_waiting.py), one answered in milliseconds.
    num_network_threads: int = 1
    num_io_threads: int = 8
    queued_max_requests: int = 500
    queued_max_request_bytes: int = -1              # -1: no byte bound (an unbounded pool)
    socket_request_max_bytes: int = 100 * 1024 * 1024
    connections_max_idle_ms: int = 10 * 60 * 1000   # -1: never close idle connections
    socket_listen_backlog_size: int = 50
    # Kafka's connection limits (KIP-402, KIP-612; kmem.network.quotas), Int.MaxValue: none
    max_connections: int = UNLIMITED_CONNECTIONS
    max_connections_per_ip: int = UNLIMITED_CONNECTIONS
    max_connections_per_ip_overrides: str = ""
    max_connection_creation_rate: int = UNLIMITED_CONNECTIONS
    ssl_context: ssl.SSLContext | None = None

    def __post_init__(self):
        check_connection_limits(self.max_connections, self.max_connection_creation_rate)
        if not isinstance(self.max_connections_per_ip, int) or self.max_connections_per_ip < 0:
            raise ConfigError(f"max.connections.per.ip must be an integer >= 0, got {self.max_connections_per_ip!r}")
        overrides = ip_overrides(self.max_connections_per_ip_overrides)       # refused here if malformed
        if self.max_connections_per_ip == 0 and not overrides:
            raise ConfigError("max.connections.per.ip can be set to zero only if max.connections.per.ip.overrides "
                              "property is set.")
        positive = ("num_network_threads", "num_io_threads", "queued_max_requests", "socket_request_max_bytes",
                    "socket_listen_backlog_size")
        for name in positive + ("queued_max_request_bytes", "connections_max_idle_ms"):
            value = getattr(self, name)
            unset_allowed = name not in positive    # -1: unbounded, or never
            # The upper bound is what a pool can hold.
            if not isinstance(value, int) or not (1 <= value <= MAX_POOL_BYTES or unset_allowed and value == -1):
                raise ConfigError(f"{_dotted(name)} must be an integer in [1, {MAX_POOL_BYTES}]"
                                  f"{' or -1' if unset_allowed else ''}, got {value!r}")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port!r}")
        if self.queued_max_request_bytes != -1 and self.queued_max_request_bytes < self.socket_request_max_bytes:
            raise ConfigError(
                f"queued.max.request.bytes must be -1 (unbounded) or larger or equal to socket.request.max.bytes "
                f"({self.socket_request_max_bytes}), got {self.queued_max_request_bytes}")

    @classmethod
    def from_properties(cls, properties, **overrides):
        """Build from Kafka-style properties (``{"queued.max.request.bytes": "16777216", ...}``).

        Values may be strings, as in a properties file; keyword ``overrides`` use the snake_case names.
        """
        known = {_dotted(f.name): f for f in dataclasses.fields(cls) if f.name != "ssl_context"}
        values = {}
        for key, raw in properties.items():
            field = known.get(key)
            if field is None:
                raise ConfigError(f"unknown socket server property {key!r}; known: {', '.join(sorted(known))}")
            if field.type in (int, "int"):
                try:
                    values[field.name] = int(raw)
                except (TypeError, ValueError):
                    raise ConfigError(f"{key} must be an integer, got {raw!r}") from None
            else:
                values[field.name] = str(raw)
        values.update(overrides)
        return cls(**values)


def check_connection_limits(max_connections, max_connection_creation_rate, prefix=""):
    """``ConfigError`` unless ``max.connections`` >= 0 and ``max.connection.creation.rate`` >= 1 (None: unset)."""
    if max_connections is not None and (not isinstance(max_connections, int) or max_connections < 0):
        raise ConfigError(f"{prefix}max.connections must be an integer >= 0, got {max_connections!r}")
    rate = max_connection_creation_rate
    if rate is not None and (not isinstance(rate, int) or rate < 1):
        raise ConfigError(f"{prefix}max.connection.creation.rate must be an integer >= 1, got {rate!r}")


@dataclasses.dataclass(frozen=True)
class ListenerConfig:
    """One listener of a ``SocketServer`` (Kafka's ``EndPoint`` and what its channel builder needs): where it
    listens, TLS (``ssl_context``), SASL (``channel_builder``, a ``kmem.network.sasl.SaslChannelBuilder``), and its
    own connection limits (None: the server's ``max_connections`` and ``max_connection_creation_rate``)."""
    name: str = "PLAINTEXT"
    host: str = "127.0.0.1"
    port: int = 0
    ssl_context: ssl.SSLContext | None = None
    channel_builder: object = None
    max_connections: int | None = None
    max_connection_creation_rate: int | None = None

    def __post_init__(self):
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port!r}")
        check_connection_limits(self.max_connections, self.max_connection_creation_rate,
                                f"listener.name.{self.name.lower()}.")


def _somaxconn():
    """Linux's cap on a listen backlog (``net.core.somaxconn``), or None where it cannot be read."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _dotted(name):
    return name.replace("_", ".")


class Request(_core.RequestCore):
    """A complete request handed to the handler: ``payload`` is its bytes (without the size prefix). Its
    fields, times and their tally are the core's (``RequestCore``): ``Request(connection_id, processor,
    receive, principal=ANONYMOUS, listener_name="PLAINTEXT")``.

    The payload's memory returns to the pool when the handler returns (unless the request is offloaded:
    then when the offloaded function returns); a handler that needs the bytes longer must copy them
    (``bytes(request.payload)``).
    """

    __slots__ = ()

    def defer(self):
        """Park this request: return the ``Deferred`` from the handler and ``complete`` it later."""
        return Deferred(self)

    def throttle(self, ms):
        """Mute this connection for ``ms`` once its response is on its way (KIP-219). On the network thread."""
        if ms > 0:
            throttles = self.processor.throttles
            throttles[self.connection_id] = max(ms, throttles.get(self.connection_id, 0))

    def after_response(self, fn):
        """Run ``fn()`` on this network thread once the requests read with this one are answered: work the
        response must not wait for (the markers after EndTxn). Called by the handler, on the network thread."""
        self.processor.after_responses.append(fn)

    def offload(self, fn):
        """Answer this request with ``fn(request)`` run on an io thread; return the ``Deferred`` from the
        handler. The payload stays valid until ``fn`` returns."""
        deferred = Deferred(self, keeps_payload=True)
        if not self.processor.server.offload(self, fn, deferred):
            deferred.cancel()           # the server is stopping
        return deferred

    def __repr__(self):
        return f"<Request from {self.connection_id} {self._receive.size} bytes>"


class Deferred:
    """The response to a parked or offloaded request, to ``complete`` exactly once from any thread.

    ``complete(response)`` sends ``response`` (bytes, a ``Send``, or None for none) and returns True; later
    calls, and calls after ``cancel``, return False. ``complete_with(build)`` does the same with
    ``build()``, called on the network thread of the connection, in slices of its loop: the thread that
    completes the request (an append, the timer) only queues it. ``fail()`` closes the connection
    instead. ``cancel()`` (the connection closed, or the server stopped) runs the ``on_cancel``
    callbacks instead of sending.
    """

    __slots__ = ("connection_id", "_processor", "keeps_payload", "_done", "_on_cancel", "_times")

    def __init__(self, request, *, keeps_payload=False):
        self.connection_id = request.connection_id
        self._processor = request.processor
        self._times = request.times
        self.keeps_payload = keeps_payload
        self._done = threading.Lock()   # taken once, by whichever of complete, fail or cancel comes first
        self._on_cancel = []

    @property
    def done(self):
        return self._done.locked()

    def on_cancel(self, callback):
        """Call ``callback()`` if the deferred is cancelled."""
        if self._on_cancel is not None:
            self._on_cancel.append(callback)

    def complete(self, response):
        if self._claim() is None:
            close_send(response)            # never sent: what it holds goes now
            return False
        try:
            send = None if response is None else NetworkSend(self.connection_id, response)
        except BaseException:
            self._processor.respond(self.connection_id, _CLOSE)     # unframable: the connection ends
            raise
        self._processor.respond(self.connection_id, send)
        return True

    def complete_with(self, build):
        if self._claim() is None:
            return False
        self._processor.respond(self.connection_id, build)
        return True

    def fail(self):
        if self._claim() is None:
            return False
        self._processor.respond(self.connection_id, _CLOSE)
        return True

    def cancel(self):
        callbacks = self._claim()
        if callbacks is None:
            return False
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a cancel callback of the deferred response to %s failed", self.connection_id)
        return True

    def _claim(self):
        """Take the one way this deferred ends: its cancel callbacks (dropped here, as they often refer
        back to it), or None if it has ended already."""
        if not self._done.acquire(blocking=False):
            return None
        self._times[3] = time.perf_counter_ns()        # the response complete (Kafka's RemoteTimeMs ends)
        callbacks, self._on_cancel = self._on_cancel, None
        return callbacks

    def __repr__(self):
        return f"<Deferred response to {self.connection_id}{' done' if self.done else ''}>"


def offloaded(handler):
    """A handler that runs ``handler(request)`` on an io thread for every request (one that may block)."""
    return lambda request: request.offload(handler)


_CLOSE = object()       # the response that tells a processor to close the connection


class _Processor(_core.ProcessorCore, threading.Thread):
    """Runs one selector: new connections, responses, reads; each complete request is handled here (the steps
    made for every request are the core's, ``ProcessorCore``)."""

    def __init__(self, server, index):
        super().__init__(name=f"kmem-network-processor-{index}", daemon=True)
        self.server = server
        # what the core's steps use
        self.request_class, self.deferred_class, self.close_marker = Request, Deferred, _CLOSE
        self.network_send, self.close_send, self._log = NetworkSend, close_send, log
        self.request_received, self.response_sent = ChannelMuteEvent.REQUEST_RECEIVED, ChannelMuteEvent.RESPONSE_SENT
        self.muted = ChannelMuteState.MUTED
        config = server.config
        self.selector = Selector(server.pool, max_receive_size=config.socket_request_max_bytes,
                                 connections_max_idle_ms=config.connections_max_idle_ms)
        self._index = index
        self._new_connections = queue.SimpleQueue()
        self._responses = queue.SimpleQueue()
        self._deferred = {}             # connection id -> Deferred of its request in flight
        self._closing = set()           # ids that failed authentication: closed once their response is sent
        # ids still authenticating -> when they are closed if not done (connections.max.idle.ms after the
        # authentication began: bytes trickling in do not extend it); in the order of their deadlines
        self._authentication_deadlines = collections.OrderedDict()
        # Kafka's selector sensors, by metric name (every name there from the start: metrics() reads them from
        # another thread)
        self.authentication_counts = dict.fromkeys(AUTHENTICATION_METRICS, 0)
        self._ids = itertools.count()
        self.after_responses = []       # Request.after_response's work, run after each poll's receives
        self.throttles = {}             # connection id -> ms its response starts (Request.throttle)
        self.measured = {}              # connection id -> its Request in flight whose times are tallied
        self._throttles_ended = queue.SimpleQueue()     # connection ids, from the timer

    def accept(self, sock, listener, ip):
        """From an acceptor: serve ``sock``, a connection from ``ip`` to ``listener`` (a ``ListenerConfig``),
        counted in the server's connection quotas until it closes."""
        self._new_connections.put((sock, listener, ip))
        self.selector.wakeup()

    def respond(self, connection_id, send):
        """From any thread: ``send`` is a ``NetworkSend`` (a framed response), None (no response),
        ``_CLOSE``, or a callable that builds the response payload here."""
        self._responses.put((connection_id, send))
        self.selector.wakeup()

    def run(self):
        try:
            while self.server.running:
                try:
                    # each step only when it has something to do: this loop runs about once a request
                    if not self._new_connections.empty():
                        self._configure_new_connections()
                    if not self._throttles_ended.empty():
                        self._end_throttles()
                    if not self._responses.empty():
                        self._process_responses()
                    try:
                        self.selector.poll(0 if not self._responses.empty() else POLL_SECONDS)
                    except (KeyboardInterrupt, SystemExit):
                        # raised by a channel's own code (a response's Send), which closed that channel only:
                        # what the poll read, sent and saw closed for the others is handled below
                        log.exception("network processor %d: a connection's I/O raised", self._index)
                    if self.selector.connected:
                        self._establish_ssl_principals()
                    self._process_completed_receives()
                    if self.after_responses:
                        self._run_after_responses()
                    self._process_completed_sends()
                    if self.selector.disconnected:
                        self._process_disconnected()
                    if self._authentication_deadlines:
                        self._close_unauthenticated()
                    self.server.quotas.close_excess(self._close_excess_connection)
                except BaseException:
                    # Keep serving: the acceptor keeps dealing connections to this thread (KeyboardInterrupt
                    # and SystemExit, raised here only by code such as a response's Send, do not stop a
                    # server: close() does). A failure that repeats must not spin (nor flood the log): at
                    # most one per poll interval.
                    log.exception("network processor %d failed; continuing", self._index)
                    time.sleep(POLL_SECONDS)
            self._drain()
        finally:
            for deferred in list(self._deferred.values()):
                deferred.cancel()
            self._deferred.clear()
            self.selector.close()
            while not self._new_connections.empty():
                sock, listener, ip = self._new_connections.get()
                sock.close()
                self.server.quotas.release(listener.name, ip)
            while not self._responses.empty():
                close_send(self._responses.get()[1])

    def _drain(self):
        """At shutdown: send the responses already made (deferred ones completed by the stop included), for
        at most ``DRAIN_SECONDS``; new requests are not read."""
        deadline = time.monotonic() + DRAIN_SECONDS
        for channel in self.selector.channels:
            self.selector.mute(channel.id)
        while True:
            self._process_responses()
            # responses still queued (one build slice may leave some) or still being written
            queued = not self._responses.empty()
            pending = queued or any(channel.send is not None for channel in self.selector.channels)
            remaining = deadline - time.monotonic()
            if not pending or remaining <= 0:
                return
            self.selector.poll(0 if queued else min(remaining, POLL_SECONDS))
            for receive in self.selector.completed_receives:
                receive.close()
            self._process_disconnected()

    def _configure_new_connections(self):
        while not self._new_connections.empty():
            sock, listener, ip = self._new_connections.get()
            connection_id = f"{self._index}-{next(self._ids)}"
            try:
                channel = self.selector.register(connection_id, sock, ssl_context=listener.ssl_context)
            except (OSError, ssl.SSLError):
                log.info("could not register connection %s", connection_id, exc_info=True)
                sock.close()
                self.server.quotas.release(listener.name, ip)
                continue
            channel.listener = listener
            # every close (the client's, an error, idleness, a failed authentication, shutdown) frees the slot
            channel.on_close = functools.partial(self.server.quotas.release, listener.name, ip)
            builder = listener.channel_builder
            if builder is not None:
                channel.authenticator = builder.authenticator(connection_id)
                self._authentication_began(channel)

    def _authentication_began(self, channel):
        """A channel's (re-)authentication began: its frames are read under ``sasl.server.max.receive.size``
        until it completes, which it must before its deadline."""
        builder = channel.listener.channel_builder
        limit = self.selector.max_receive_size
        channel.max_receive_size = (builder.max_receive_size if limit == UNLIMITED
                                    else min(limit, builder.max_receive_size))
        idle_ms = self.server.config.connections_max_idle_ms
        if idle_ms >= 0:
            self._authentication_deadlines[channel.id] = time.monotonic() + idle_ms / 1000
            self._authentication_deadlines.move_to_end(channel.id)

    def _close_unauthenticated(self):
        """Close the channels whose authentication did not complete by its deadline (a client that stalls, or
        sends its token a byte at a time)."""
        now = time.monotonic()
        while self._authentication_deadlines:
            connection_id, deadline = next(iter(self._authentication_deadlines.items()))
            if deadline > now:
                return
            del self._authentication_deadlines[connection_id]
            channel = self.selector.channel(connection_id)
            if channel is not None and channel.authenticating:
                log.info("connection %s from %s: closed, its SASL authentication did not complete within "
                         "connections.max.idle.ms", connection_id, _peer(channel))
                self.selector.close(connection_id)

    def _establish_ssl_principals(self):
        """The principal of each connection of an SSL listener (without SASL) whose TLS handshake completed in this
        poll, before its first request is handled: its client certificate's, mapped by
        ``ssl.principal.mapping.rules``; one that no rule maps is closed."""
        mapper = self.server.ssl_principal_mapper
        for connection_id in self.selector.connected:
            channel = self.selector.channel(connection_id)
            if channel is None or channel.listener.ssl_context is None or channel.listener.channel_builder is not None:
                continue
            try:
                channel.peer_principal = mapper.principal(channel.transport.sock.getpeercert())
            except (SslAuthenticationError, ValueError, OSError) as e:
                log.info("connection %s from %s: SSL authentication failed: %s", connection_id, _peer(channel), e)
                self.selector.close(connection_id)
                continue
            if channel.peer_principal != ANONYMOUS:
                log.info("connection %s from %s: authenticated as %s (SSL client certificate)", connection_id,
                         _peer(channel), channel.peer_principal)

    def _process_responses(self):
        """Send the responses queued for this thread, building those that need it for one slice."""
        until = time.monotonic() + BUILD_SLICE_SECONDS
        while not self._responses.empty():
            connection_id, send = self._responses.get()
            self._deferred.pop(connection_id, None)
            if callable(send):
                if self.selector.channel(connection_id) is None:
                    continue
                send = self._build(connection_id, send)
                self._respond_now(connection_id, send)
                if time.monotonic() >= until:
                    return          # the rest after the next poll (which then does not wait)
            else:
                self._respond_now(connection_id, send)

    @staticmethod
    def _build(connection_id, build):
        try:
            response = build()
            return None if response is None else NetworkSend(connection_id, response)
        except BaseException:
            log.exception("building the deferred response to %s failed; closing the connection", connection_id)
            return _CLOSE

    def _start_throttle(self, channel, ms):
        """Kafka's ``ChannelThrottlingCallback``: the channel stays muted for ``ms``, its response sent or not."""
        channel.handle_mute_event(ChannelMuteEvent.THROTTLE_STARTED)
        connection_id = channel.id

        def ended():
            self._throttles_ended.put(connection_id)
            self.selector.wakeup()
        self.server.timer.schedule(time.monotonic() + ms / 1000, ended)

    def _end_throttles(self):
        while not self._throttles_ended.empty():
            connection_id = self._throttles_ended.get()
            channel = self.selector.channel(connection_id)
            if channel is None:
                continue
            channel.handle_mute_event(ChannelMuteEvent.THROTTLE_ENDED)
            if channel.mute_state is ChannelMuteState.MUTED:
                self.selector.unmute(connection_id)

    def _reauthenticate_or_expire(self, channel, receive):
        """For a SASL session with a lifetime (KIP-368): a SaslHandshake begins a re-authentication, another
        request past the session closes the connection (Kafka's ``SocketServer.processCompletedReceives``).
        True when the receive was taken so."""
        authenticator = channel.authenticator
        now = time.monotonic()
        payload = memoryview(receive.payload)
        api_key = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
        payload.release()
        if api_key == ApiKey.SASL_HANDSHAKE and authenticator.begin_reauthentication(now):
            self._authentication_began(channel)
            self._authenticate(channel, receive)
            return True
        if not authenticator.session_expired(now):
            return False
        log.info("connection %s from %s: closed, the session of %s expired without re-authentication",
                 channel.id, _peer(channel), authenticator.principal)
        self.authentication_counts["expired-connections-killed-count"] += 1
        receive.close()
        self.selector.close(channel.id)
        return True

    def _authenticate(self, channel, receive):
        """Hand a frame of a channel still authenticating to its SASL authenticator (``kmem.network.sasl``)."""
        authenticator = channel.authenticator
        again = "re" if authenticator.reauthenticating else ""     # Kafka's metric names; re-authentication
        try:
            response, outcome = authenticator.handle(receive.payload)
            send = None if response is None else NetworkSend(channel.id, response)
        except Exception:
            log.exception("SASL authentication of connection %s failed unexpectedly; closing it", channel.id)
            outcome, send = Outcome.CLOSE, None
        finally:
            receive.close()
        if outcome is Outcome.CONTINUE:
            if authenticator.complete:
                self._authentication_deadlines.pop(channel.id, None)
                channel.max_receive_size = self.selector.max_receive_size
                self._count_success(authenticator, again)
                log.info("connection %s from %s: %sauthenticated as %s (%s)", channel.id, _peer(channel),
                         again and "re-", authenticator.principal, authenticator.mechanism)
            self._respond_now(channel.id, send)
            return
        self.authentication_counts[f"failed-{again}authentication-total"] += 1
        log.info("connection %s from %s: SASL %sauthentication failed%s: %s", channel.id, _peer(channel),
                 again and "re-", f" ({authenticator.mechanism})" if authenticator.mechanism else "",
                 authenticator.failure)
        if outcome is Outcome.CLOSE:
            self.selector.close(channel.id)
            return
        # Kafka's delayed close (KIP-306): the answer and the close wait, the channel muted, without a thread
        self._closing.add(channel.id)
        delay = channel.listener.channel_builder.failed_authentication_delay_ms / 1000
        if delay <= 0:
            self._respond_now(channel.id, send)
        else:
            self.server.timer.schedule(time.monotonic() + delay, lambda: self.respond(channel.id, send))

    def _count_success(self, authenticator, again):
        self.authentication_counts[f"successful-{again}authentication-total"] += 1
        if not again and not authenticator.client_supports_reauthentication:
            self.authentication_counts["successful-authentication-no-reauth-total"] += 1

    def _run_after_responses(self):
        work, self.after_responses = self.after_responses, []
        for fn in work:
            try:
                fn()
            except Exception:
                log.exception("network processor %d: work after a response failed", self._index)

    def _process_disconnected(self):
        for connection_id in self.selector.disconnected:
            self._forget(connection_id)

    def _forget(self, connection_id):
        """A connection closed: its deferred response, if any, is cancelled; a response it left on its way is timed
        (as Kafka's ``processDisconnected`` times its in-flight responses)."""
        self._closing.discard(connection_id)
        self.throttles.pop(connection_id, None)
        request = self.measured.pop(connection_id, None)
        if request is not None and request.times[4]:
            request.tally(time.perf_counter_ns())
        self._authentication_deadlines.pop(connection_id, None)
        deferred = self._deferred.pop(connection_id, None)
        if deferred is not None:
            deferred.cancel()

    def _close_excess_connection(self):
        """Kafka's ``closeExcessConnections`` (called by ``quotas.close_excess`` while the protected listener keeps
        the total over ``max.connections``): close the least recently used connection of another listener, one a
        poll."""
        quotas = self.server.quotas
        channel = self.selector.least_recently_active(lambda channel: not quotas.protects(channel.listener.name))
        if channel is not None:
            log.info("closing connection %s from %s (listener %s): max.connections exceeded", channel.id,
                     _peer(channel), channel.listener.name)
            self.selector.close(channel.id)
            self._forget(channel.id)


def _peer(channel):
    try:
        return "%s:%d" % channel.transport.sock.getpeername()[:2]
    except (OSError, TypeError):
        return "?"


class _Acceptor(threading.Thread):
    """Accepts the connections of one listener and deals them round-robin to the server's processors, within
    the server's connection quotas: at a limit it stops listening (the kernel's backlog holds the new
    connections) until a connection closes or the creation rate allows another."""

    def __init__(self, server, listener, listen_socket):
        super().__init__(name=f"kmem-network-acceptor-{listener.name}", daemon=True)
        self.server = server
        self.listener = listener
        self._listen_socket = listen_socket
        self._selector = selectors.DefaultSelector()
        self._selector.register(listen_socket, selectors.EVENT_READ)
        self._waker = Waker(self._selector)
        self._backoff = 0.0
        self._resume_at = None      # while paused: when to listen again (math.inf: once a connection closes)
        self._throttled = []        # heap of (when to close, id, socket) of connections over their IP's rate

    def wakeup(self):
        self._waker.wakeup()

    def run(self):
        processors = itertools.cycle(self.server.processors)
        try:
            while self.server.running:
                timeout = self._close_throttled()
                if self._resume_at is not None:
                    timeout = self._resume_at - time.monotonic()
                    if timeout <= 0:
                        self._selector.register(self._listen_socket, selectors.EVENT_READ)
                        self._resume_at = None
                        timeout = POLL_SECONDS
                for key, _ in self._selector.select(min(timeout, POLL_SECONDS)):
                    if self._waker.owns(key):
                        self._waker.drain()
                        if self._resume_at == math.inf:     # a connection closed: a slot may be free
                            self._resume_at = time.monotonic()
                    else:
                        self._accept_all(processors)
        except Exception:
            log.exception("network acceptor of listener %s failed", self.listener.name)
        finally:
            for _, _, sock in self._throttled:
                sock.close()
            self._selector.close()
            self._listen_socket.close()
            self._waker.close()

    def _close_throttled(self):
        """Close the throttled connections whose time has come; the seconds until the next (at most a poll)."""
        now = time.monotonic()
        while self._throttled and self._throttled[0][0] <= now:
            heapq.heappop(self._throttled)[2].close()
        return min(POLL_SECONDS, self._throttled[0][0] - now) if self._throttled else POLL_SECONDS

    def _accept_all(self, processors):
        quotas, name = self.server.quotas, self.listener.name
        while self.server.running:
            delay = quotas.delay(name, self.wakeup)
            if delay > 0:
                self._stop_listening(delay)
                return
            try:
                sock, address = self._listen_socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:
                    self._pause(exc)
                else:
                    log.warning("accept failed: %s", exc)
                return
            self._backoff = 0.0
            ip = normalised_ip(address[0])
            refused = quotas.acquire(name, ip)
            if not refused:
                next(processors).accept(sock, self.listener, ip)
            elif refused > 0 and len(self._throttled) < MAX_THROTTLED_SOCKETS:
                # over its IP's connection_creation_rate: closed after the throttle, as Kafka does
                heapq.heappush(self._throttled, (time.monotonic() + refused, id(sock), sock))
            else:
                sock.close()        # over max.connections.per.ip: closed at once, as Kafka does

    def _pause(self, exc):
        # Keep serving the connections we have; warn once per shortage, not once per pause.
        if not self._backoff:
            log.warning("accept failed: %s; pausing accepts until it succeeds again", exc)
        self._backoff = min(max(2 * self._backoff, ACCEPT_BACKOFF_MIN_SECONDS), ACCEPT_BACKOFF_MAX_SECONDS)
        self._stop_listening(self._backoff)

    def _stop_listening(self, seconds):
        self._selector.unregister(self._listen_socket)
        self._resume_at = time.monotonic() + seconds


class SocketServer:
    """A TCP (or TLS) server for size-prefixed requests, with bounded request memory.

    ``handler(request)`` runs on the network thread that read the request and returns the response
    payload: any bytes-like object, or a ``kmem.send.Send`` (a file region, a lazy down-conversion, a
    ``SequenceSend`` of a header and records...) that the processor writes a non-blocking write at a time,
    prefixed with its ``size``; None to send nothing; or a ``Deferred`` from ``request.defer()`` or
    ``request.offload(fn)`` (see the module docstring). A handler must not block: what may, it offloads.
    A handler that raises anything, ``BaseException`` included, gets its connection closed; the thread
    keeps serving.

    With a ``channel_builder`` (``kmem.network.sasl.SaslChannelBuilder``) every connection authenticates with
    SASL before its first request reaches ``handler`` (``request.principal`` says who sent it); failed
    authentications are closed after a delay on ``timer`` (a ``kmem.broker.timer.Timer``; one of its own if
    none is given). Without one, on TLS, a client certificate's subject is the principal, mapped by
    ``ssl_principal_mapper`` (a ``kmem.network.ssl_principal.SslPrincipalMapper``; Kafka's DEFAULT rule if none).
    ``ip_connection_rate(ip)`` gives an address's KIP-612 ``connection_creation_rate`` quota (None: none), measured
    over ``quota_window`` (Kafka's ``quota.window.num``, ``quota.window.size.seconds``).

    It serves the config's ``host`` and ``port`` (with its ``ssl_context`` and the ``channel_builder``), or
    ``listeners``: several ``ListenerConfig``s at once, each with its own acceptor, TLS and SASL, all feeding
    the same processors; ``request.listener_name`` says which one a request came in on. Connections are
    limited by ``ConnectionQuotas`` (``kmem.network.quotas``; ``protected_listener``: Kafka's inter-broker
    listener, exempt from the broker-wide limits).

    Use as a context manager, or call ``start()`` and ``close()``; ``address`` is where the first listener
    listens, ``addresses`` maps each listener's name to its ``(host, port)``.
    """

    def __init__(self, handler, config=None, *, listeners=None, channel_builder=None, timer=None,
                 protected_listener=None, ssl_principal_mapper=None, ip_connection_rate=None, quota_window=(11, 1),
                 **settings):
        if config is not None and settings:
            raise ConfigError("pass either a SocketServerConfig or keyword settings, not both")
        self.config = config if config is not None else SocketServerConfig(**settings)
        if listeners is None:
            protocol = ("SASL_" if channel_builder is not None else "") + \
                ("SSL" if self.config.ssl_context is not None else "PLAINTEXT")
            listeners = [ListenerConfig(protocol, self.config.host, self.config.port, self.config.ssl_context,
                                        channel_builder)]
        elif channel_builder is not None or self.config.ssl_context is not None:
            raise ConfigError("with listeners, give each ListenerConfig its ssl_context and channel_builder")
        names = [listener.name for listener in listeners]
        if not names or len(set(names)) != len(names):
            raise ConfigError(f"a socket server needs listeners of different names, not {names}")
        self.listeners = tuple(listeners)
        self.quotas = ConnectionQuotas(self.config, self.listeners, protected_listener, ip_connection_rate,
                                       quota_window)
        self.handler = handler
        # the principals of TLS listeners without SASL: their client certificates' subjects
        self.ssl_principal_mapper = ssl_principal_mapper or SslPrincipalMapper()
        self.timer = timer
        self._own_timer = False
        bound = self.config.queued_max_request_bytes
        self.pool = NONE if bound == -1 else SimpleMemoryPool(bound, self.config.socket_request_max_bytes)
        self.requests = queue.Queue(self.config.queued_max_requests)
        self.processors = []
        self.running = False
        self._acceptors = []
        self._handlers = []
        self.address = None
        self.addresses = {}

    @property
    def bounded(self):
        return self.pool is not NONE

    def start(self):
        if self.running or self._acceptors:
            raise IllegalStateError("the server was already started")
        listen_sockets = self._listen()
        backlog = self.config.socket_listen_backlog_size
        effective = min(backlog, _somaxconn() or backlog)
        capped = ("" if effective == backlog
                  else f" (socket.listen.backlog.size {backlog}, capped by net.core.somaxconn)")
        for name, address in self.addresses.items():
            log.info("accept backlog of listener %s on %s:%d: %d%s", name, *address, effective, capped)
        if self.timer is None and any(listener.channel_builder is not None for listener in self.listeners):
            from kmem.broker.timer import Timer
            self.timer, self._own_timer = Timer("kmem-network-timer"), True
        self.running = True
        self.processors = [_Processor(self, i) for i in range(self.config.num_network_threads)]
        self._acceptors = [_Acceptor(self, listener, sock) for listener, sock in zip(self.listeners, listen_sockets)]
        self._handlers = [threading.Thread(target=self._run_offloaded, name=f"kmem-io-thread-{i}", daemon=True)
                          for i in range(self.config.num_io_threads)]
        for thread in self._handlers + self.processors + self._acceptors:
            thread.start()
        return self

    def _listen(self):
        """A listening socket per listener; should one fail (its address in use...), none is left open and the
        ``OSError`` names the address (its ``filename``)."""
        sockets = []
        try:
            for listener in self.listeners:
                try:
                    sock = socket.create_server((listener.host, listener.port),
                                                backlog=self.config.socket_listen_backlog_size)
                except OSError as e:
                    raise OSError(e.errno, e.strerror, f"{listener.host or '0.0.0.0'}:{listener.port}") from None
                sockets.append(sock)
                sock.setblocking(False)
                self.addresses[listener.name] = sock.getsockname()[:2]
        except BaseException:
            for sock in sockets:
                sock.close()
            self.addresses = {}
            raise
        self.address = self.addresses[self.listeners[0].name]
        return sockets

    def offload(self, request, fn, deferred):
        """From a processor: queue ``fn(request)`` for an io thread, waiting while the queue is full (Kafka's
        back-pressure). False once the server stops."""
        while self.running:
            try:
                self.requests.put((request, fn, deferred), timeout=POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _run_offloaded(self):
        while (item := self.requests.get()) is not None:
            self._answer_offloaded(*item)
            item = None         # nothing of the last request (its response) is kept while waiting for the next

    def _answer_offloaded(self, request, fn, deferred):
        if not self.running:
            self.release(request)
            deferred.cancel()
            return
        try:
            request.times[1] = time.perf_counter_ns()       # dequeued: Kafka's RequestQueueTimeMs ends
            response = fn(request)
            request.times[2] = time.perf_counter_ns()
            # Framed (in complete) before the payload is released: a response viewing the request's
            # memory keeps it alive until sent.
            deferred.complete(response)
        except BaseException:
            # As on a processor: whatever it is, it ends this connection, not the thread.
            log.exception("request handler failed for %r; closing the connection", request)
            deferred.fail()
        finally:
            self.release(request)

    @staticmethod
    def release(request):
        """Return a request's memory to the pool; a failure is logged, never raised (the connection must
        still get its response: it stays muted until then, and muted connections are not idle-expired)."""
        try:
            request.release()
        except Exception:
            log.exception("releasing the memory of %r failed", request)

    def metrics(self):
        """The pool's sensors under Kafka's names (none if unbounded), the request queue's length, and with a SASL
        listener the authentication counts (of every SASL listener) of Kafka's selector (``successful-authentication-total``,
        ``successful-reauthentication-total``, ``failed-authentication-total``, ``failed-reauthentication-total``,
        ``successful-authentication-no-reauth-total``, ``expired-connections-killed-count``)."""
        values = self.pool.metrics() if self.bounded else {}
        values["RequestQueueSize"] = self.requests.qsize()
        if any(listener.channel_builder is not None for listener in self.listeners):
            for name in AUTHENTICATION_METRICS:
                values[name] = sum(processor.authentication_counts[name] for processor in self.processors)
        return values

    def register_metrics(self, name="socket_server", registry=None):
        """Export the pool's sensors to Prometheus (see ``kmem.metrics``); returns the collector.

        An unbounded server has no pool, hence no sensors: ``IllegalStateError``.
        """
        if not self.bounded:
            raise IllegalStateError("an unbounded server (queued.max.request.bytes = -1) has no memory pool "
                                    "sensors to export; set queued_max_request_bytes")
        from kmem.metrics import register_pool
        return register_pool(self.pool, name, registry)

    def close(self):
        """Stop accepting, close every connection, drop queued requests (their memory released), join."""
        if not self.running:
            return
        self.running = False
        for acceptor in self._acceptors:
            acceptor.wakeup()
        for acceptor in self._acceptors:
            acceptor.join()
        for processor in self.processors:
            processor.selector.wakeup()
        for processor in self.processors:
            processor.join()
        for _ in self._handlers:
            self.requests.put(None)
        for thread in self._handlers:
            thread.join()
        if self._own_timer:
            self.timer.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = f"listening on {self.address[0]}:{self.address[1]}" if self.running else "stopped"
        return f"<SocketServer {state} pool={self.pool!r}>"
