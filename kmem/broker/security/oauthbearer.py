"""SASL/OAUTHBEARER (RFC 7628) as Kafka serves it (``OAuthBearerSaslServer``, KIP-255, KIP-768).

The client sends one message, ``n,[a=authzid],\\x01auth=Bearer <token>\\x01[key=value\\x01...]\\x01``; its
token is checked by the listener's validator:

- ``UnsecuredValidator``, Kafka's default (``OAuthBearerUnsecuredValidatorCallbackHandler``): unsigned JWTs
  (``alg`` none), for development, with the ``unsecuredValidator*`` options of the JAAS configuration;
- ``JwksValidator``, KIP-768's ``OAuthBearerValidatorCallbackHandler``: signed JWTs checked against the keys
  of ``sasl.oauthbearer.jwks.endpoint.url`` (``JwksKeys``), the expected audience and issuer, with clock skew.

A token that fails is answered, as Kafka answers it, with a challenge ``{"status":"invalid_token"}``
(``insufficient_scope`` and the required scope for a missing scope); the client's ``\\x01`` that follows
fails the exchange with that JSON as the message. The reason is logged, never sent.
"""
import base64
import binascii
import collections
import dataclasses
import http.client
import json
import logging
import math
import re
import threading
import time
import urllib.parse
import urllib.request

from kmem.broker.log.config import INT32_MAX, INT64_MAX, integer
from kmem.errors import ConfigError, InvalidSaslCredentialsError, SaslAuthenticationError

log = logging.getLogger(__name__)

MECHANISM = "OAUTHBEARER"
LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
# sasl.server.callback.handler.class values: KIP-768's validator (and its older name), and the default
JWKS_VALIDATOR_CLASSES = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
                          "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerValidatorCallbackHandler")
UNSECURED_VALIDATOR_CLASS = \
    "org.apache.kafka.common.security.oauthbearer.internals.unsecured.OAuthBearerUnsecuredValidatorCallbackHandler"
# Kafka's SaslConfigs defaults
DEFAULT_JWKS_REFRESH_MS = 3_600_000
DEFAULT_JWKS_RETRY_BACKOFF_MS = 100
DEFAULT_JWKS_RETRY_BACKOFF_MAX_MS = 10_000
DEFAULT_CLOCK_SKEW_SECONDS = 30
# Kafka's RefreshingHttpsJwks: a key id not found asks for a refresh at most once a minute (16 ids remembered;
# an id over 1,000 characters is taken for garbage and asks for none)
MISSING_KEY_ID_RETRY_S = 60
MISSING_KEY_IDS_REMEMBERED = 16
MAX_KEY_ID_LENGTH = 1000
JWKS_FETCH_TIMEOUT_S = 10
CLOSE_WAIT_S = 2
MAX_JWKS_SIZE = 1 << 20
CONTROL_A = b"\x01"
# what reading a JWKS may raise: the network, HTTP, a file, or its JSON (nested too deep included)
_FETCH_ERRORS = (OSError, http.client.HTTPException, ValueError, RecursionError)

# Kafka's OAuthBearerClientInitialResponse grammar. Its saslname, (?:[\x01-\x7F&&[^=,]]|=2C|=3D)+, is
# written unrolled (runs of plain characters, then escapes): the same strings, matched in linear time without an
# alternation per character (which took 0.2 s to refuse a 500 kB authzid, on the network thread)
_SASLNAME = r"(?=[^,])[\x01-\x2b\x2d-\x3c\x3e-\x7f]*(?:=(?:2C|3D)[\x01-\x2b\x2d-\x3c\x3e-\x7f]*)*"
_KEY = r"[A-Za-z]+"
_VALUE = r"[\x21-\x7e \t\r\n]+"
_CLIENT_INITIAL_RESPONSE = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,\x01(?P<kvpairs>(?:{_KEY}={_VALUE}\x01)*)\x01")
_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_~+/.a-zA-Z0-9]+=*)", re.ASCII)
# RFC 6749 scope-token characters (Kafka's OAuthBearerScopeUtils)
_SCOPE_ITEM = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")
# a JWS alg -> the JWK key type that verifies it
_KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP", "HS": "oct"}
# RFC 7518's private members of RSA, EC and OKP keys
_PRIVATE_MEMBERS = frozenset(("d", "p", "q", "dp", "dq", "qi", "oth"))


class TokenError(Exception):
    """Why a token was refused (logged, never sent); ``scope``: the required scope it lacked."""

    def __init__(self, reason, scope=None):
        super().__init__(reason)
        self.scope = scope


@dataclasses.dataclass(frozen=True)
class Token:
    """A validated token (Kafka's ``OAuthBearerToken``): its principal, scope and expiry (epoch ms)."""
    principal_name: str
    scope: frozenset
    lifetime_ms: int


def parse_client_initial_response(message):
    """``(token, authorization id, extensions)`` of the client's message; ``InvalidSaslCredentialsError`` (the
    client gets the generic failure, as for Kafka's ``SaslException``) when it breaks RFC 7628's grammar."""
    match = _CLIENT_INITIAL_RESPONSE.fullmatch(bytes(message).decode("utf-8", "replace"))
    if match is None:
        raise InvalidSaslCredentialsError("Invalid OAUTHBEARER client first message")
    pairs = dict(pair.split("=", 1) for pair in match["kvpairs"].split("\x01") if pair)
    auth = pairs.pop("auth", None)
    if auth is None:
        raise InvalidSaslCredentialsError("Invalid OAUTHBEARER client first message: 'auth' not specified")
    auth_match = _AUTH.fullmatch(auth)
    if auth_match is None:
        raise InvalidSaslCredentialsError("Invalid OAUTHBEARER client first message: invalid 'auth' format")
    if auth_match["scheme"].lower() != "bearer":
        raise InvalidSaslCredentialsError(f"Invalid scheme in OAUTHBEARER client first message: "
                                          f"{auth_match['scheme']}")
    return auth_match["token"], match["authzid"] or "", pairs


class OAuthBearerServer:
    """One OAUTHBEARER exchange (Kafka's ``OAuthBearerSaslServer``): ``evaluate(token)`` returns an empty
    challenge once the token is valid, else the JSON error challenge; ``credential_expiry_ms``: when the
    token expires (epoch ms), for re-authentication (KIP-368)."""

    mechanism = MECHANISM

    def __init__(self, validator):
        self._validator = validator
        self._error = None          # the JSON error challenge sent, until the client's \x01
        self._refusal = None        # its TokenError, for the log
        self.username = None
        self.complete = False
        self.credential_expiry_ms = None
        self.extensions = {}

    def evaluate(self, message):
        message = bytes(message)
        if message == CONTROL_A and self._error is not None:
            raise SaslAuthenticationError(self._error) from self._refusal
        self._error = self._refusal = None
        token_value, authorization_id, extensions = parse_client_initial_response(message)
        try:
            token = self._validator.validate(token_value)
        except TokenError as e:
            log.debug("OAUTHBEARER token refused: %s", e)
            self._refusal = e
            status = {"status": "invalid_token" if e.scope is None else "insufficient_scope"}
            if e.scope is not None:
                status["scope"] = e.scope
            self._error = json.dumps(status, separators=(", ", ":"))
            return self._error.encode()
        if authorization_id and authorization_id != token.principal_name:
            raise SaslAuthenticationError(f"Authentication failed: Client requested an authorization id "
                                          f"({authorization_id}) that is different from the token's principal "
                                          f"name ({token.principal_name})")
        # every extension is valid, as both of Kafka's validators take them
        self.extensions = extensions
        self.username = token.principal_name
        self.credential_expiry_ms = token.lifetime_ms
        self.complete = True
        return b""


def _base64url_json(section):
    try:
        decoded = base64.b64decode(section + "=" * (-len(section) % 4), altchars=b"-_", validate=True)
        value = json.loads(decoded)
    except (binascii.Error, ValueError, RecursionError):       # RecursionError: JSON nested too deep
        raise TokenError("malformed Base64 URL encoded value or JSON") from None
    if not isinstance(value, dict):
        raise TokenError("malformed JSON: not an object")
    return value


def _number(claims, name):
    value = claims.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value)):
        raise TokenError(f"The '{name}' claim was not of type Number")
    return value


def _scope(value):
    """A scope claim's set: a string is one scope, a list its non-blank items (Kafka's unsecured JWS)."""
    if isinstance(value, str):
        return frozenset([value.strip()]) if value.strip() else frozenset()
    if isinstance(value, list):
        return frozenset(str(item).strip() for item in value if str(item).strip())
    if value is None:
        return frozenset()
    raise TokenError("The scope claim was not of type List")


@dataclasses.dataclass(frozen=True)
class UnsecuredValidator:
    """Kafka's ``OAuthBearerUnsecuredValidatorCallbackHandler``: an unsigned JWS with ``exp``, a string
    principal claim, ``iat`` (optional) not after now plus the skew, ``exp`` not at or before now minus the
    skew and after ``iat``, and every required scope."""
    principal_claim_name: str = "sub"
    scope_claim_name: str = "scope"
    required_scope: tuple = ()
    allowable_clock_skew_ms: int = 0

    @classmethod
    def from_jaas_options(cls, setting, options):
        """From the JAAS options ``unsecuredValidatorPrincipalClaimName``, ``...ScopeClaimName``,
        ``...RequiredScope`` (space-delimited) and ``...AllowableClockSkewMs``; ``ConfigError`` at start."""
        skew = (options.get("unsecuredValidatorAllowableClockSkewMs") or "").strip() or "0"
        if not re.fullmatch(r"\d+", skew) or int(skew) > INT32_MAX:
            raise ConfigError(f"{setting}: unsecuredValidatorAllowableClockSkewMs = {skew!r}: a number of "
                              "milliseconds, not negative")
        scope = (options.get("unsecuredValidatorRequiredScope") or "").split()
        invalid = [item for item in scope if not _SCOPE_ITEM.fullmatch(item)]
        if invalid:
            raise ConfigError(f"{setting}: unsecuredValidatorRequiredScope: invalid scope value {invalid[0]!r}")
        return cls((options.get("unsecuredValidatorPrincipalClaimName") or "").strip() or "sub",
                   (options.get("unsecuredValidatorScopeClaimName") or "").strip() or "scope",
                   tuple(scope), int(skew))

    def validate(self, token):
        if ".." in token:
            raise TokenError("Malformed compact serialization contains '..'")
        sections = token.split(".")
        if len(sections) != 3:
            raise TokenError("Unsecured JWS compact serializations must have 3 dot-separated Base64URL-encoded "
                             "values")
        header, claims = _base64url_json(sections[0]), _base64url_json(sections[1])
        if header.get("alg") != "none":
            raise TokenError("Unsecured JWS must have 'none' for an algorithm")
        if sections[2]:
            raise TokenError("Unsecured JWS must not contain a digital signature")
        expiration, issued_at = _number(claims, "exp"), _number(claims, "iat")
        if expiration is None:
            raise TokenError("No expiration time in JWT")
        principal = claims.get(self.principal_claim_name)
        if principal is None:
            raise TokenError(f"Required claim missing: {self.principal_claim_name}")
        if not isinstance(principal, str) or not principal.strip():
            raise TokenError(f"No principal name in JWT claim: {self.principal_claim_name}")
        now_ms = time.time() * 1000
        if issued_at is not None and 1000 * issued_at > now_ms + self.allowable_clock_skew_ms:
            raise TokenError(f"The Issued At value ({issued_at} seconds) was after the indicated time "
                             f"({now_ms:.0f} ms) plus allowable clock skew ({self.allowable_clock_skew_ms} ms)")
        if now_ms - self.allowable_clock_skew_ms >= 1000 * expiration:
            raise TokenError(f"The indicated time ({now_ms:.0f} ms) minus allowable clock skew "
                             f"({self.allowable_clock_skew_ms} ms) was on or after the Expiration Time value "
                             f"({expiration} seconds)")
        if issued_at is not None and expiration <= issued_at:
            raise TokenError(f"The Expiration Time time ({expiration} seconds) was not after the Issued At time "
                             f"({issued_at} seconds)")
        scope = _scope(claims.get(self.scope_claim_name))
        for item in self.required_scope:
            if item not in scope:
                # the scope as Kafka writes a Java list: [a, b]
                raise TokenError(f"The provided scope ({sorted(scope)}) was missing a required scope ({item})",
                                 scope=f"[{', '.join(self.required_scope)}]")
        return Token(principal, scope, min(round(expiration * 1000), INT64_MAX))


@dataclasses.dataclass(frozen=True)
class JwksValidator:
    """KIP-768's ``OAuthBearerValidatorCallbackHandler`` (``ValidatorAccessTokenValidator``): a JWS signed by
    a key of ``keys`` (``JwksKeys``; ``alg`` none refused), with ``exp`` and ``iat``, within the clock skew, for
    one of the expected audiences (if set: a token with an ``aud`` is refused without them, as jose4j does),
    from the expected issuer (if set), its subject a non-blank string."""
    keys: object
    expected_audience: tuple = ()
    expected_issuer: str | None = None
    clock_skew_seconds: int = DEFAULT_CLOCK_SKEW_SECONDS
    sub_claim_name: str = "sub"
    scope_claim_name: str = "scope"

    def validate(self, token):
        # PyJWT (with cryptography, about 160 ms to import) loads only when KIP-768's validator is used
        import jwt

        token = token.strip()
        sections = token.split(".")
        if len(sections) != 3 or not all(section.strip() for section in sections):
            raise TokenError("Malformed JWT provided; expected three sections (header, payload, and signature)")
        try:
            header = jwt.get_unverified_header(token)
        except (jwt.PyJWTError, RecursionError) as e:
            raise TokenError(f"Could not validate the access token: {e}") from None
        algorithm, key_id = header.get("alg"), header.get("kid")
        if not isinstance(algorithm, str) or algorithm == "none" or algorithm[:2] not in _KEY_TYPES:
            raise TokenError(f"Could not validate the access token: algorithm {algorithm!r} is not allowed")
        if key_id is not None and not isinstance(key_id, str):
            raise TokenError("Could not validate the access token: the 'kid' header is not a string")
        key = self.keys.key(key_id, algorithm)
        if key is None:
            raise TokenError(f"Unable to find a suitable verification key for JWS w/ kid {str(key_id)[:100]!r} "
                             f"and alg {algorithm} from JWKs obtained from {self.keys.url}")
        try:
            claims = jwt.decode(token, key, algorithms=[algorithm], audience=list(self.expected_audience) or None,
                                issuer=self.expected_issuer, leeway=self.clock_skew_seconds,
                                options={"require": ["exp", "iat"]})
        except (jwt.PyJWTError, RecursionError) as e:
            raise TokenError(f"Could not validate the access token: {e}") from None
        subject = claims.get(self.sub_claim_name)
        if not isinstance(subject, str) or not subject.strip():
            raise TokenError(f"{self.sub_claim_name} value must be a non-empty string")
        scope = claims.get(self.scope_claim_name)
        scope = [scope] if isinstance(scope, str) else scope if isinstance(scope, list) else []
        if not all(isinstance(item, str) and item.strip() for item in scope):
            raise TokenError(f"{self.scope_claim_name} values must be non-empty strings")
        scope = [item.strip() for item in scope]
        if len(set(scope)) != len(scope):
            raise TokenError(f"{self.scope_claim_name} value must not contain duplicates")
        if claims["exp"] < 0 or claims["iat"] < 0:
            raise TokenError("exp and iat values must be non-negative")
        return Token(subject.strip(), frozenset(scope), min(round(claims["exp"] * 1000), INT64_MAX))


class JwksKeys:
    """The keys of a JWKS (Kafka's ``RefreshingHttpsJwks``): read at ``start`` (``ConfigError`` when it cannot
    be), then again every ``refresh_ms`` on a thread of their own, and soon after a token names a key id not
    found (at most once a minute for an id). A refresh that fails is retried with backoff, then the keys held
    are kept. ``key(key_id, alg)`` never waits for the network: a key not held is just not found."""

    def __init__(self, url, refresh_ms=DEFAULT_JWKS_REFRESH_MS, retry_backoff_ms=DEFAULT_JWKS_RETRY_BACKOFF_MS,
                 retry_backoff_max_ms=DEFAULT_JWKS_RETRY_BACKOFF_MAX_MS):
        self.url = url
        # Kafka's settings are longs; a thread cannot wait longer than TIMEOUT_MAX
        self._refresh_s = min(refresh_ms / 1000, threading.TIMEOUT_MAX)
        self._retry_backoff_s = min(retry_backoff_ms / 1000, threading.TIMEOUT_MAX)
        self._retry_backoff_max_s = min(retry_backoff_max_ms / 1000, threading.TIMEOUT_MAX)
        self._jwks = []                                 # JWK dicts, replaced whole by a refresh
        self._missing = collections.OrderedDict()       # key id -> when it may ask for a refresh again
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        try:
            self._jwks = self._fetch()
        except _FETCH_ERRORS as e:
            raise ConfigError(f"sasl.oauthbearer.jwks.endpoint.url = {self.url}: cannot read its JWKS: {e}") from None
        self._thread = threading.Thread(target=self._run, name="kmem-oauthbearer-jwks", daemon=True)
        self._thread.start()
        return self

    def close(self):
        """Stops the refresh thread; one stuck in a read of the JWKS endpoint (a daemon holding nothing) is not
        waited for beyond ``CLOSE_WAIT_S``, so a broker's shutdown does not hang on its identity provider."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_S)

    def key(self, key_id, algorithm):
        """The ``jwt.PyJWK`` that verifies ``algorithm`` with id ``key_id`` (None: any id), else None."""
        import jwt

        key_type = _KEY_TYPES[algorithm[:2]]
        for jwk in self._jwks:
            # as jose4j's VerificationJwkSelector: a key without kid, use or alg may match any
            if (key_id is None or jwk.get("kid", key_id) == key_id) and jwk.get("kty") == key_type \
                    and jwk.get("use", "sig") == "sig" and jwk.get("alg", algorithm) == algorithm:
                try:
                    # a private key's members (a JWKS published by mistake) are left out: it verifies as public
                    return jwt.PyJWK({name: value for name, value in jwk.items() if name not in _PRIVATE_MEMBERS},
                                     algorithm)
                except jwt.PyJWTError:
                    continue
        self.expedite_refresh(key_id or "")
        return None

    def expedite_refresh(self, key_id):
        """Asks the refresh thread for the JWKS now, for a key id not found; False when that id asked less than
        a minute ago (or is too long to be one)."""
        if len(key_id) > MAX_KEY_ID_LENGTH:
            return False
        now = time.monotonic()
        with self._lock:
            if self._missing.get(key_id, now) > now:
                return False
            self._missing[key_id] = now + MISSING_KEY_ID_RETRY_S
            self._missing.move_to_end(key_id)
            while len(self._missing) > MISSING_KEY_IDS_REMEMBERED:
                self._missing.popitem(last=False)
        self._wake.set()
        return True

    def _run(self):
        while not self._stop.is_set():
            self._wake.wait(self._refresh_s)
            self._wake.clear()
            if not self._stop.is_set():
                self._refresh()

    def _refresh(self):
        backoff, waited = self._retry_backoff_s, 0.0
        while True:
            try:
                jwks = self._fetch()
                break
            except _FETCH_ERRORS as e:
                if waited >= self._retry_backoff_max_s or self._stop.wait(backoff):
                    log.warning("OAuth JWKS refresh of %s failed, keeping the keys held: %s", self.url, e)
                    return
                waited += backoff
                backoff = min(2 * backoff, self._retry_backoff_max_s)
        with self._lock:
            for jwk in jwks:
                self._missing.pop(jwk.get("kid"), None)
            self._jwks = jwks
        log.info("OAuth JWKS refreshed from %s: %d keys", self.url, len(jwks))

    def _fetch(self):
        """The JWK dicts of the JWKS at ``url`` (``file:``, ``http:`` or ``https:``)."""
        parsed = urllib.parse.urlparse(self.url)
        if parsed.scheme == "file":
            with open(urllib.request.url2pathname(parsed.path), "rb") as file:
                body = file.read(MAX_JWKS_SIZE + 1)
        else:
            with urllib.request.urlopen(self.url, timeout=JWKS_FETCH_TIMEOUT_S) as response:
                body = response.read(MAX_JWKS_SIZE + 1)
        if len(body) > MAX_JWKS_SIZE:
            raise ValueError(f"the JWKS is over {MAX_JWKS_SIZE} bytes")
        jwks = json.loads(body)
        keys = jwks.get("keys") if isinstance(jwks, dict) else None
        if not isinstance(keys, list) or not all(isinstance(key, dict) for key in keys):
            raise ValueError("not a JWKS: no 'keys' list of objects")
        return keys


# the settings OAUTHBEARER reads (Kafka's SaslConfigs), each with Kafka's default
OAUTHBEARER_SETTINGS = {
    "sasl.server.callback.handler.class": None,
    "sasl.oauthbearer.jwks.endpoint.url": None,
    "sasl.oauthbearer.jwks.endpoint.refresh.ms": DEFAULT_JWKS_REFRESH_MS,
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms": DEFAULT_JWKS_RETRY_BACKOFF_MS,
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms": DEFAULT_JWKS_RETRY_BACKOFF_MAX_MS,
    "sasl.oauthbearer.expected.audience": None,
    "sasl.oauthbearer.expected.issuer": None,
    "sasl.oauthbearer.clock.skew.seconds": DEFAULT_CLOCK_SKEW_SECONDS,
    "sasl.oauthbearer.sub.claim.name": "sub",
    "sasl.oauthbearer.scope.claim.name": "scope",
}


@dataclasses.dataclass(frozen=True)
class JwksSettings:
    """KIP-768's validator, as configured: ``start()`` reads the JWKS and returns the ``JwksValidator``."""
    url: str
    refresh_ms: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    expected_audience: tuple
    expected_issuer: str | None
    clock_skew_seconds: int
    sub_claim_name: str
    scope_claim_name: str

    def start(self):
        keys = JwksKeys(self.url, self.refresh_ms, self.retry_backoff_ms, self.retry_backoff_max_ms).start()
        return JwksValidator(keys, self.expected_audience, self.expected_issuer, self.clock_skew_seconds,
                             self.sub_claim_name, self.scope_claim_name)


def validator_settings(setting, jaas_options):
    """The listener's validator: ``UnsecuredValidator`` (Kafka's default) or ``JwksSettings`` when
    ``sasl.server.callback.handler.class`` names KIP-768's. ``setting(name, default)`` returns ``(key, value)``
    of the listener's setting; ``jaas_options``: ``(setting name, options)`` of the OAuthBearerLoginModule
    entry. ``ConfigError`` for anything else."""
    key, handler = setting("sasl.server.callback.handler.class", None)
    handler = (handler or "").strip()
    if handler in ("", UNSECURED_VALIDATOR_CLASS):
        return UnsecuredValidator.from_jaas_options(*jaas_options)
    if handler not in JWKS_VALIDATOR_CLASSES:
        raise ConfigError(f"{key} = {handler!r}: kmem broker serves OAUTHBEARER with {JWKS_VALIDATOR_CLASSES[0]} "
                          f"(KIP-768) or, by default, {UNSECURED_VALIDATOR_CLASS}")

    def text(name):
        value = setting(name, OAUTHBEARER_SETTINGS[name])[1]
        return None if value is None or not str(value).strip() else str(value).strip()

    def number(name, low, high=INT64_MAX):
        return integer(*setting(name, OAUTHBEARER_SETTINGS[name]), low, high)

    url_key, url = setting("sasl.oauthbearer.jwks.endpoint.url", None)
    url = (url or "").strip()
    if urllib.parse.urlparse(url).scheme.lower() not in ("http", "https", "file"):
        raise ConfigError(f"{url_key} = {url!r}: the JWKS of KIP-768's validator, an http, https or file URL")
    audience = tuple(item.strip() for item in (text("sasl.oauthbearer.expected.audience") or "").split(",")
                     if item.strip())
    return JwksSettings(url, number("sasl.oauthbearer.jwks.endpoint.refresh.ms", 1),
                        number("sasl.oauthbearer.jwks.endpoint.retry.backoff.ms", 0),
                        number("sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms", 0), audience,
                        text("sasl.oauthbearer.expected.issuer"),
                        number("sasl.oauthbearer.clock.skew.seconds", 0, INT32_MAX),
                        text("sasl.oauthbearer.sub.claim.name") or "sub",
                        text("sasl.oauthbearer.scope.claim.name") or "scope")
