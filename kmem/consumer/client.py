"""The consumer's connections to brokers over one ``kmem.network.Selector``.

Requests are queued per connection (the selector writes one send at a time), responses are matched to
their requests in order, as Kafka's ``NetworkClient`` does. Each connection opens with ApiVersions v2
(the highest non-flexible version, which every broker answers in its own layout), then, on a SASL listener,
authenticates (SaslHandshake v1 and SaslAuthenticate, ``kmem.consumer.sasl``); each request uses the highest
version both sides know, capped by ``MAX_VERSIONS``.
"""
import collections
import itertools
import logging
import random
import time

from kmem.consumer.errors import KafkaConnectionError
from kmem.errors import KmemError, SaslAuthenticationError
from kmem.network import NetworkSend, Selector
from kmem.protocol import ApiKey, decode_response, encode_request
from kmem.protocol import messages

log = logging.getLogger(__name__)

# The highest version the consumer sends of each API: non-flexible versions for the group APIs (some
# brokers, librdkafka's mock cluster among them, mis-parse their flexible forms).
MAX_VERSIONS = {
    ApiKey.API_VERSIONS: 2, ApiKey.METADATA: 8, ApiKey.FETCH: 11, ApiKey.LIST_OFFSETS: 5,
    ApiKey.FIND_COORDINATOR: 3, ApiKey.JOIN_GROUP: 5, ApiKey.SYNC_GROUP: 3, ApiKey.HEARTBEAT: 3,
    ApiKey.LEAVE_GROUP: 1, ApiKey.OFFSET_COMMIT: 7, ApiKey.OFFSET_FETCH: 7,
}
# the SASL requests each connection to a SASL listener opens with (KIP-152: Kafka 1.0 and later)
SASL_VERSIONS = {ApiKey.SASL_HANDSHAKE: 1, ApiKey.SASL_AUTHENTICATE: 2}
UNSUPPORTED_SASL_MECHANISM = 33
MIN_VERSIONS = {ApiKey.FETCH: 4, ApiKey.LIST_OFFSETS: 1, ApiKey.METADATA: 1, ApiKey.JOIN_GROUP: 0}


class _Request:
    __slots__ = ("correlation_id", "api_key", "version", "callback", "keep_receive", "sent_at")

    def __init__(self, correlation_id, api_key, version, callback, keep_receive):
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.version = version
        self.callback = callback
        self.keep_receive = keep_receive
        self.sent_at = None


class _Connection:
    def __init__(self, channel_id, address, priority):
        self.channel_id = channel_id
        self.address = address
        self.priority = priority
        self.versions = None            # {api_key: (min, max)} once ApiVersions answered (and SASL succeeded)
        self.exchange = None            # the SASL exchange under way
        self.reauthenticate_at = None   # KIP-368: when the broker's session for this connection runs out, less a margin
        self.reauthenticating = None    # the versions to restore once a re-authentication succeeds
        self.waiting = collections.deque()      # (request, body) not yet encoded: versions unknown
        self.queued = collections.deque()       # (request, NetworkSend) encoded, not yet handed to the selector
        self.sending = None                     # request whose send the selector is writing
        self.in_flight = collections.deque()    # requests written, waiting for their responses


class NetworkClient:
    """Connections by id (a broker's node id, or a name) to addresses, over one selector and pool."""

    def __init__(self, pool, *, client_id, request_timeout_ms, reconnect_backoff_ms, reconnect_backoff_max_ms,
                 ssl_context=None, coordinator_max_receive_bytes, max_versions=MAX_VERSIONS,
                 min_versions=MIN_VERSIONS, connect_timeout_ms=None, sasl=None):
        """``max_versions``/``min_versions``: the version range of each API this client sends (the
        consumer's by default); ``connect_timeout_ms`` bounds a TCP connect (default: the request timeout);
        ``sasl``: a ``kmem.consumer.sasl.SaslClientSettings``, each connection authenticates with it."""
        self.selector = Selector(pool)
        self._max_versions = max_versions
        self._min_versions = min_versions
        self._connect_timeout = (request_timeout_ms if connect_timeout_ms is None else connect_timeout_ms) / 1000.0
        self._client_id = client_id
        self._request_timeout = request_timeout_ms / 1000.0
        self._reconnect_backoff = reconnect_backoff_ms / 1000.0
        self._reconnect_backoff_max = max(reconnect_backoff_max_ms, reconnect_backoff_ms) / 1000.0
        self._ssl_context = ssl_context
        self._sasl = sasl
        # the latest failed SASL authentication, until taken (Kafka's consumer raises it from poll)
        self._authentication_failure = None
        self._priority_max_receive = coordinator_max_receive_bytes
        self._connections = {}
        self._retry_at = {}             # channel id -> earliest time to connect again (reconnect backoff)
        self._failures = {}             # channel id -> connection failures in a row
        self._correlation = itertools.count(1)

    def is_connected(self, channel_id):
        return channel_id in self._connections

    def is_ready(self, channel_id):
        """Connected, version-negotiated and authenticated."""
        conn = self._connections.get(channel_id)
        return conn is not None and conn.versions is not None

    def in_flight_count(self, channel_id):
        conn = self._connections.get(channel_id)
        if conn is None:
            return 0
        return len(conn.in_flight) + len(conn.queued) + len(conn.waiting) + (conn.sending is not None)

    def can_connect(self, channel_id, now):
        return now >= self._retry_at.get(channel_id, 0.0)

    def _failed(self, channel_id, address, reason):
        """Back off as Kafka's ClusterConnectionStates: reconnect.backoff.ms doubled per failure in a row,
        up to reconnect.backoff.max.ms, with 20% jitter. The first failure in a row is logged, once."""
        failures = self._failures.get(channel_id, 0) + 1
        self._failures[channel_id] = failures
        backoff = min(self._reconnect_backoff * 2 ** (failures - 1), self._reconnect_backoff_max)
        self._retry_at[channel_id] = time.monotonic() + backoff * random.uniform(0.8, 1.2)
        if failures == 1:
            log.warning("cannot connect to %s:%s (%s): %s; retrying quietly, backing off up to "
                        "reconnect.backoff.max.ms", address[0], address[1], channel_id, reason)
        else:
            log.debug("connection %d to %s:%s failed: %s", failures, address[0], address[1], reason)

    def _succeeded(self, conn):
        failures = self._failures.pop(conn.channel_id, 0)
        self._retry_at.pop(conn.channel_id, None)
        if failures:        # at the level of the failure's line, so whoever saw that one sees this
            log.warning("connected to %s:%s (%s) after %d failed attempts", conn.address[0], conn.address[1],
                        conn.channel_id, failures)

    def connect(self, channel_id, address, *, priority=False, max_receive_size=None):
        """Open (a blocking TCP connect) and start ApiVersions; raises ``KafkaConnectionError``."""
        if channel_id in self._connections:
            return
        host, port = address
        try:
            channel = self.selector.connect(channel_id, (host, port), ssl_context=self._ssl_context,
                                            server_hostname=host if self._ssl_context else None,
                                            priority=priority, timeout=self._connect_timeout or None)
        except OSError as exc:
            self._failed(channel_id, address, exc)
            raise KafkaConnectionError(f"cannot connect to {host}:{port}: {exc}") from None
        if priority:
            # Read outside the pool (KIP-81), so bounded here instead: a coordinator's answers are small.
            channel.max_receive_size = self._priority_max_receive
        conn = _Connection(channel_id, (host, port), priority)
        self._connections[channel_id] = conn
        self._send_opening(conn, messages.ApiVersionsRequest(), MAX_VERSIONS[ApiKey.API_VERSIONS],
                           lambda body: self._on_api_versions(conn, body))

    def _send_opening(self, conn, body, version, on_response):
        """Send one of the requests a connection opens with, before it is ready: at ``version``, ahead of
        the requests waiting for it; ``on_response(body)`` runs unless the connection was lost."""
        def callback(_, response, error):
            if error is None:
                on_response(response)
        request = _Request(next(self._correlation), body.API_KEY, version, callback, False)
        conn.queued.append((request, NetworkSend(conn.channel_id, encode_request(body, version,
                                                                                request.correlation_id,
                                                                                self._client_id))))
        self._pump(conn)

    def _on_api_versions(self, conn, body):
        if body.error_code:
            log.warning("ApiVersions from %s: error %d", conn.address, body.error_code)
            self.close(conn.channel_id, KafkaConnectionError(f"ApiVersions failed with error {body.error_code}"))
            return
        versions = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
        if self._sasl is None:
            self._opened(conn, versions)
            return
        missing = [ApiKey(key).name for key, version in SASL_VERSIONS.items()
                   if not versions.get(key, (0, -1))[0] <= version <= versions.get(key, (0, -1))[1]]
        if missing:
            self.close(conn.channel_id, KafkaConnectionError(
                f"the broker at {conn.address[0]}:{conn.address[1]} does not serve {' and '.join(missing)} at "
                "the versions of Kafka 1.0 and later: it cannot authenticate this client with SASL"))
            return
        self._start_sasl(conn, versions)

    def _start_sasl(self, conn, versions):
        self._send_opening(conn, messages.SaslHandshakeRequest(mechanism=self._sasl.mechanism),
                           SASL_VERSIONS[ApiKey.SASL_HANDSHAKE], lambda body: self._on_handshake(conn, versions, body))

    def _maybe_reauthenticate(self, conn):
        """KIP-368, as Kafka's clients do it: once the session is near its end, requests wait while the
        connection authenticates again, which starts when nothing is in flight on it."""
        if conn.reauthenticate_at is not None and conn.versions is not None \
                and time.monotonic() >= conn.reauthenticate_at:
            conn.reauthenticating, conn.versions, conn.reauthenticate_at = conn.versions, None, None
        if conn.reauthenticating is not None and conn.sending is None and not conn.queued and not conn.in_flight:
            versions, conn.reauthenticating = conn.reauthenticating, None
            log.debug("re-authenticating connection %s to %s:%s", conn.channel_id, *conn.address)
            self._start_sasl(conn, versions)

    def _on_handshake(self, conn, versions, body):
        if body.error_code:
            enabled = ", ".join(body.mechanisms) or "none"
            reason = (f"SASL mechanism {self._sasl.mechanism} is not enabled on the broker at "
                      f"{conn.address[0]}:{conn.address[1]} (it has {enabled})"
                      if body.error_code == UNSUPPORTED_SASL_MECHANISM else f"SaslHandshake failed with error "
                                                                             f"{body.error_code}")
            self._authentication_failed(conn, SaslAuthenticationError(reason))
            return
        conn.exchange = self._sasl.exchange()
        self._authenticate(conn, versions, conn.exchange.first())

    def _authenticate(self, conn, versions, token):
        self._send_opening(conn, messages.SaslAuthenticateRequest(auth_bytes=token),
                           SASL_VERSIONS[ApiKey.SASL_AUTHENTICATE],
                           lambda body: self._on_authenticate(conn, versions, body))

    def _on_authenticate(self, conn, versions, body):
        try:
            if body.error_code:
                raise SaslAuthenticationError(body.error_message or f"SaslAuthenticate failed with error "
                                                                    f"{body.error_code}")
            token = conn.exchange.evaluate(body.auth_bytes)
        except SaslAuthenticationError as exc:
            self._authentication_failed(conn, SaslAuthenticationError(
                f"authentication as {self._sasl.username!r} with {self._sasl.mechanism} at "
                f"{conn.address[0]}:{conn.address[1]} failed: {exc}"))
            return
        if token is not None:
            self._authenticate(conn, versions, token)
            return
        conn.exchange = None
        if body.session_lifetime_ms > 0:
            # Kafka's clients start at 85-95% of the session, so not every connection does at once
            conn.reauthenticate_at = time.monotonic() + body.session_lifetime_ms / 1000 * random.uniform(0.85, 0.95)
        self._opened(conn, versions)

    def _authentication_failed(self, conn, error):
        self._authentication_failure = error
        self.close(conn.channel_id, error)

    def take_authentication_failure(self):
        """The latest failed SASL authentication (a ``SaslAuthenticationError``) since the last call, or None."""
        failure, self._authentication_failure = self._authentication_failure, None
        return failure

    def _opened(self, conn, versions):
        conn.versions = versions
        self._succeeded(conn)
        while conn.waiting:
            request, body = conn.waiting.popleft()
            self._encode(conn, request, body)
        self._pump(conn)

    def version(self, channel_id, api_key):
        """The version a request of ``api_key`` goes out at on this (negotiated) connection."""
        conn = self._connections[channel_id]
        low, high = conn.versions.get(api_key, (0, -1))
        wanted_low, wanted_high = self._min_versions.get(api_key, 0), self._max_versions[api_key]
        version = min(high, wanted_high)
        if version < max(low, wanted_low):
            if high < 0:
                raise KafkaConnectionError(f"the broker at {conn.address[0]}:{conn.address[1]} does not serve "
                                           f"{ApiKey(api_key).name}")
            raise KafkaConnectionError(f"the broker at {conn.address[0]}:{conn.address[1]} supports "
                                       f"{ApiKey(api_key).name} v{low}-{high}; this client needs "
                                       f"v{wanted_low}-{wanted_high}")
        return version

    def send(self, channel_id, body, callback, *, keep_receive=False):
        """Queue ``body``; ``callback(receive, response, error)`` runs inside a later ``poll``.

        ``error`` is None on success. With ``keep_receive`` the callback owns the receive (it must close
        it: fetch responses keep their pool memory until their records are handed out); otherwise the
        receive is closed once the callback returns, so the callback must copy what it keeps.
        """
        conn = self._connections[channel_id]
        request = _Request(next(self._correlation), body.API_KEY, None, callback, keep_receive)
        self._maybe_reauthenticate(conn)
        if conn.versions is None:
            conn.waiting.append((request, body))
        else:
            self._encode(conn, request, body)
            self._pump(conn)

    def _encode(self, conn, request, body):
        try:
            request.version = self.version(conn.channel_id, request.api_key)
        except KafkaConnectionError as exc:
            request.callback(None, None, exc)
            return
        payload = encode_request(body, request.version, request.correlation_id, self._client_id)
        conn.queued.append((request, NetworkSend(conn.channel_id, payload)))

    def _pump(self, conn):
        if conn.sending is None and conn.queued:
            request, send = conn.queued.popleft()
            request.sent_at = time.monotonic()
            conn.sending = request
            self.selector.send(send)

    def poll(self, timeout):
        """Network I/O for up to ``timeout`` seconds; runs the callbacks of completed responses."""
        selector = self.selector
        selector.poll(timeout)
        for channel_id in selector.completed_sends:
            conn = self._connections.get(channel_id)
            if conn is not None and conn.sending is not None:
                conn.in_flight.append(conn.sending)
                conn.sending = None
                self._pump(conn)
        for receive in selector.completed_receives:
            self._complete(receive)
        for channel_id, reason in selector.disconnected.items():
            self._disconnected(channel_id, reason)
        for conn in list(self._connections.values()):
            if conn.reauthenticating is not None:
                self._maybe_reauthenticate(conn)
        self._expire_requests()

    def _complete(self, receive):
        conn = self._connections.get(receive.source)
        if conn is None or not conn.in_flight:
            receive.close()
            return
        request = conn.in_flight.popleft()
        try:
            header, body = decode_response(receive.payload, request.api_key, request.version)
            if header.correlation_id != request.correlation_id:
                raise KafkaConnectionError(f"correlation id {header.correlation_id} in a response from "
                                           f"{conn.address}, expected {request.correlation_id}")
        except KmemError as exc:
            receive.close()
            conn.in_flight.appendleft(request)
            self.close(conn.channel_id, exc)
            return
        if request.keep_receive:
            request.callback(receive, body, None)
            return
        try:
            request.callback(receive, body, None)
        finally:
            del body
            receive.close()

    def _disconnected(self, channel_id, reason):
        conn = self._connections.pop(channel_id, None)
        if conn is None:
            return
        if conn.versions is None:       # lost before it was usable: a failed attempt
            self._failed(channel_id, conn.address, reason or "closed")
        else:
            self._retry_at[channel_id] = time.monotonic() + self._reconnect_backoff
        error = KafkaConnectionError(f"connection to {conn.address[0]}:{conn.address[1]} lost: "
                                     f"{reason or 'closed'}")
        error.reason = reason
        pending = list(conn.in_flight) + ([conn.sending] if conn.sending else [])
        pending += [r for r, _ in conn.queued] + [r for r, _ in conn.waiting]
        # forgotten before their callbacks run: one may close the connection while it is being opened (a request
        # refused for want of a version both sides know), and nothing may go on with them then
        conn.in_flight.clear()
        conn.queued.clear()
        conn.waiting.clear()
        conn.sending = None
        for request in pending:
            request.callback(None, None, error)

    def _expire_requests(self):
        if not self._request_timeout:
            return
        deadline = time.monotonic() - self._request_timeout
        for conn in list(self._connections.values()):
            oldest = conn.in_flight[0] if conn.in_flight else conn.sending
            if oldest is not None and oldest.sent_at < deadline:
                self.close(conn.channel_id, TimeoutError(f"no response to {ApiKey(oldest.api_key).name} "
                                                         f"within request.timeout.ms"))

    def close(self, channel_id=None, reason=None):
        """Close one connection (its pending requests fail), or every connection and the selector."""
        if channel_id is None:
            for cid in list(self._connections):
                self.close(cid)
            self.selector.close()
            return
        if channel_id in self._connections:
            self.selector.close(channel_id)
            self.selector.disconnected.pop(channel_id, None)
            self._disconnected(channel_id, reason)

