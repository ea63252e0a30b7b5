"""SASL authentication on a channel, before any request reaches the handler (Kafka's ``SaslServerAuthenticator``,
KIP-43, KIP-152).

A channel of a SASL listener gets a ``SaslAuthenticator`` (from ``SaslChannelBuilder.authenticator``); the
processor hands it the frames the channel reads until it is ``complete``. They are read like requests, into pool
memory (KIP-72), with ``sasl.server.max.receive.size`` as the frame limit. The exchange:

1. ApiVersions (optional, KIP-35/KIP-511), answered by the broker's ``api_versions(payload)``;
2. SaslHandshake: v1 makes the tokens SaslAuthenticate requests (KIP-152), v0 makes them raw size-prefixed
   frames without a request header (KIP-43); a mechanism not enabled is answered UNSUPPORTED_SASL_MECHANISM
   with the enabled list;
3. the mechanism's tokens, until its server is complete: the principal is then ``User:<name>``.

Any other request before that, or a failed exchange, ends the connection: ``handle`` returns ``FAILED`` with
the response (SASL_AUTHENTICATION_FAILED and Kafka's message, or None), which the processor sends once
``connection.failed.authentication.delay.ms`` has passed, then closes; bytes that cannot be read as a request
(``CLOSE``) end it at once.

Re-authentication (KIP-368, Kafka's ``ReauthInfo``): with ``connections.max.reauth.ms`` > 0, or a mechanism
whose credential expires (``credential_expiry_ms``), an authentication opens a session of that many milliseconds
(the smaller of the two), told to the client in ``session_lifetime_ms``. A SaslHandshake on the authenticated
connection (``begin_reauthentication``, at most once a second as Kafka's ``KafkaChannel`` allows) runs the
exchange again: same mechanism (another one is refused at its first token, with no answer), same principal
(another one answers SASL_AUTHENTICATION_FAILED), and a new session. Past its session, a connection that did
not re-authenticate is closed at its next request (``session_expired``), whatever the client's SaslAuthenticate
version: a client of v0 does not learn its session lifetime, so it reconnects, as Kafka has it.
"""
import dataclasses
import enum
import time

from kmem.errors import InvalidSaslCredentialsError, KmemError, SaslAuthenticationError
from kmem.protocol import (SUPPORTED_VERSIONS, ApiKey, CorruptMessageError, UnknownApiKeyError, UnsupportedVersionError,
                           decode_request, decode_request_header, encode_response, error_response, messages)

ANONYMOUS = "User:ANONYMOUS"
# Kafka's Errors codes the authenticator answers with
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
# Kafka's KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS: a handshake sooner after the last re-authentication
# began is an ordinary request (answered ILLEGAL_SASL_STATE by the broker)
MIN_REAUTH_INTERVAL_SECONDS = 1.0


class Outcome(enum.Enum):
    CONTINUE = "CONTINUE"   # send the response, read the next frame
    FAILED = "FAILED"       # send the response (if any) after the failed-authentication delay, then close
    CLOSE = "CLOSE"         # close now


class SaslState(enum.Enum):
    HANDSHAKE_OR_VERSIONS_REQUEST = "HANDSHAKE_OR_VERSIONS_REQUEST"
    HANDSHAKE_REQUEST = "HANDSHAKE_REQUEST"
    AUTHENTICATE = "AUTHENTICATE"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


@dataclasses.dataclass(frozen=True)
class SaslChannelBuilder:
    """What the channels of a SASL listener authenticate with (Kafka's ``SaslChannelBuilder``).

    ``mechanisms`` has ``enabled`` (names) and ``server(name)``, a new exchange: ``evaluate(token)`` returns the
    challenge and raises ``SaslAuthenticationError`` (its message goes to the client) or
    ``InvalidSaslCredentialsError`` (the client gets Kafka's generic message); then ``complete``, ``username``,
    and optionally ``credential_expiry_ms``: when the credential expires (milliseconds since the epoch, as a
    JWT's ``exp`` times 1000; None or absent: never), which bounds the session (Kafka's
    ``CREDENTIAL_LIFETIME_MS`` negotiated property).
    ``api_versions(payload)`` answers an ApiVersions request (the encoded response).
    ``connections_max_reauth_ms``: ``{mechanism: ms}`` (``connections.max.reauth.ms``; absent or 0: no session
    limit but the credential's)."""
    mechanisms: object
    api_versions: object
    max_receive_size: int = 524288                  # sasl.server.max.receive.size
    failed_authentication_delay_ms: int = 100       # connection.failed.authentication.delay.ms
    connections_max_reauth_ms: dict = dataclasses.field(default_factory=dict)

    def authenticator(self, connection_id):
        return SaslAuthenticator(connection_id, self.mechanisms, self.api_versions, self.connections_max_reauth_ms)


class SaslAuthenticator:
    """One channel's exchange (see the module docstring): ``handle(payload)`` returns ``(response, Outcome)``;
    ``complete``, ``principal``, ``mechanism`` and ``credential_expiry_ms`` (None: the credential does not
    expire) once authenticated, ``session_expires_at`` (``time.monotonic()`` seconds, None: never) while a session
    has a lifetime."""

    def __init__(self, connection_id, mechanisms, api_versions, connections_max_reauth_ms=None):
        self.connection_id = connection_id
        self._mechanisms = mechanisms
        self._api_versions = api_versions
        self._max_reauth_ms = connections_max_reauth_ms or {}
        self.state = SaslState.HANDSHAKE_OR_VERSIONS_REQUEST
        self.mechanism = None
        self.principal = None
        self.credential_expiry_ms = None
        self.failure = None         # why it failed, for the log (never a secret)
        self.session_expires_at = None
        self.client_supports_reauthentication = False   # it sent a SaslAuthenticate of v1 or later
        self._server = None
        self._kafka_headers = True  # SaslAuthenticate requests (handshake v1), else raw tokens (v0)
        self._previous = None       # (mechanism, principal) of the session being re-authenticated
        self._bad_mechanism = None  # why a re-authentication with another mechanism fails at its first token
        self._reauthentication_began = None

    @property
    def complete(self):
        return self.state is SaslState.COMPLETE

    @property
    def reauthenticating(self):
        return self._previous is not None

    def session_expired(self, now):
        """True when the session has a lifetime and it is over at ``now`` (``time.monotonic()``)."""
        return self.session_expires_at is not None and now > self.session_expires_at

    def begin_reauthentication(self, now):
        """A SaslHandshake came on the authenticated connection: start re-authenticating (then ``handle`` it), or
        return False when the session has no lifetime or the last re-authentication began less than a second ago
        (Kafka's ``KafkaChannel.maybeBeginServerReauthentication``; the broker then answers it ILLEGAL_SASL_STATE)."""
        if not self.complete or self.session_expires_at is None:
            return False
        if self._reauthentication_began is not None and now - self._reauthentication_began < \
                MIN_REAUTH_INTERVAL_SECONDS:
            return False
        self._reauthentication_began = now
        self._previous = (self.mechanism, self.principal)
        self._server = None
        self.state = SaslState.HANDSHAKE_REQUEST
        return True

    def handle(self, payload):
        try:
            if self.state is SaslState.AUTHENTICATE:
                if self._bad_mechanism is not None:
                    # Kafka's REAUTH_BAD_MECHANISM: the handshake was answered, the first token fails unanswered
                    return self._fail(None, self._bad_mechanism)
                if self._kafka_headers:
                    return self._authenticate_request(payload)
                return self._evaluate(bytes(payload), None)
            return self._handshake_request(payload)
        except (CorruptMessageError, UnsupportedVersionError, KmemError, ValueError) as e:
            return self._fail(None, f"unreadable request during SASL authentication: {e}", Outcome.CLOSE)

    def _fail(self, response, reason, outcome=Outcome.FAILED):
        self.state = SaslState.FAILED
        self.failure = reason
        return response, outcome

    def _handshake_request(self, payload):
        try:
            header, _ = decode_request_header(payload)
        except UnknownApiKeyError as e:
            # Kafka takes a first frame that is no request as a GSSAPI token (0.9 clients), which kmem does not serve
            return self._fail(None, f"not a SaslHandshake request (api key {e.api_key}); GSSAPI is not served")
        if header.api_key == ApiKey.API_VERSIONS and self.state is SaslState.HANDSHAKE_OR_VERSIONS_REQUEST:
            low, high = SUPPORTED_VERSIONS[ApiKey.API_VERSIONS]
            if low <= header.api_version <= high:
                self.state = SaslState.HANDSHAKE_REQUEST
            # else its answer is UNSUPPORTED_VERSION, and the client retries at a version both know (KIP-511)
            return self._api_versions(payload), Outcome.CONTINUE
        if header.api_key != ApiKey.SASL_HANDSHAKE:
            return self._fail(None, f"unexpected Kafka request of type {header.api_key.name} during SASL handshake")
        header, request = decode_request(payload)
        enabled = list(self._mechanisms.enabled)
        server = self._mechanisms.server(request.mechanism)
        if server is None:
            response = messages.SaslHandshakeResponse(error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=enabled)
            return self._fail(encode_response(header, response), f"unsupported SASL mechanism {request.mechanism!r}")
        if self.reauthenticating and request.mechanism != self._previous[0]:
            self._bad_mechanism = f"SASL mechanism '{request.mechanism}' requested by client is not supported for " \
                                  f"re-authentication of mechanism '{self._previous[0]}'"
        self._server, self.mechanism = server, request.mechanism
        self._kafka_headers = header.api_version >= 1
        self.state = SaslState.AUTHENTICATE
        return encode_response(header, messages.SaslHandshakeResponse(error_code=0, mechanisms=enabled)), \
            Outcome.CONTINUE

    def _authenticate_request(self, payload):
        header, _ = decode_request_header(payload)
        if header.api_key != ApiKey.SASL_AUTHENTICATE:
            try:
                body = error_response(header.api_key, header.api_version, ILLEGAL_SASL_STATE)
                response = None if body is None else encode_response(header, body)
            except (KmemError, ValueError):
                response = None
            return self._fail(response, f"unexpected Kafka request of type {header.api_key.name} during SASL "
                                        "authentication")
        header, request = decode_request(payload)
        if header.api_version >= 1:
            self.client_supports_reauthentication = True
        return self._evaluate(request.auth_bytes, header)

    def _evaluate(self, token, header):
        """The mechanism's answer to ``token``: a SaslAuthenticate response (``header``: the request's) or the
        raw challenge (no header: after a v0 handshake)."""
        try:
            challenge = self._server.evaluate(token)
        except SaslAuthenticationError as e:
            # the cause, if any, says why (an OAUTHBEARER token's fault): for the log, not the client
            reason = str(e) if e.__cause__ is None else f"{e}: {e.__cause__}"
            return self._fail(self._authenticate_failure(header, str(e)), reason)
        except InvalidSaslCredentialsError as e:
            message = f"Authentication failed during {'re-' if self.reauthenticating else ''}authentication due to " \
                      f"invalid credentials with SASL mechanism {self.mechanism}"
            return self._fail(self._authenticate_failure(header, message), str(e))
        session_lifetime_ms = 0
        if self._server.complete:
            principal = f"User:{self._server.username}"
            if self.reauthenticating and principal != self._previous[1]:
                message = f"Cannot change principals during re-authentication from " \
                          f"{self._previous[1].replace(':', '.', 1)}: {principal.replace(':', '.', 1)}"
                return self._fail(self._authenticate_failure(header, message), message)
            self.state = SaslState.COMPLETE
            self.principal = principal
            self._previous = None
            self.credential_expiry_ms = getattr(self._server, "credential_expiry_ms", None)
            session_lifetime_ms = self._start_session()
        if header is None:
            return challenge, Outcome.CONTINUE
        response = messages.SaslAuthenticateResponse(error_code=0, error_message=None, auth_bytes=challenge,
                                                      session_lifetime_ms=session_lifetime_ms)
        return encode_response(header, response), Outcome.CONTINUE

    def _start_session(self):
        """The new session's lifetime in ms (0: none): ``connections.max.reauth.ms`` of the mechanism, bounded by
        the credential's expiry (Kafka's ``ReauthInfo.calcCompletionTimesAndReturnSessionLifetimeMs``)."""
        lifetimes = []
        max_reauth_ms = self._max_reauth_ms.get(self.mechanism, 0)
        if max_reauth_ms > 0:
            lifetimes.append(max_reauth_ms)
        if self.credential_expiry_ms is not None:
            lifetimes.append(max(0, int(self.credential_expiry_ms - time.time() * 1000)))
        if not lifetimes:
            self.session_expires_at = None
            return 0
        lifetime_ms = min(lifetimes)
        self.session_expires_at = time.monotonic() + lifetime_ms / 1000
        return lifetime_ms

    @staticmethod
    def _authenticate_failure(header, message):
        if header is None:
            return None         # raw tokens have no error response: the connection just closes
        return encode_response(header, messages.SaslAuthenticateResponse(
            error_code=SASL_AUTHENTICATION_FAILED, error_message=message, auth_bytes=b"", session_lifetime_ms=0))

    def __repr__(self):
        return f"<SaslAuthenticator {self.connection_id} {self.state.name} {self.mechanism or ''}>"
