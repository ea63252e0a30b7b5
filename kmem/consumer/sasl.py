"""The client's side of SASL (Kafka's ``SaslClientAuthenticator``) for kmem's consumer and tools: PLAIN and
SCRAM-SHA-256/512, over SaslHandshake v1 and SaslAuthenticate (KIP-152), after the connection's ApiVersions.

``SaslClientSettings.from_config`` reads Kafka's client settings: ``sasl.mechanism`` and the credentials of
``sasl.jaas.config`` (``PlainLoginModule``/``ScramLoginModule required username="..." password="...";``), or
librdkafka's ``sasl.username`` and ``sasl.password``. ``exchange()`` starts one authentication: ``first()`` is
the first token, ``evaluate(challenge)`` the next one (None once the broker's last message is checked).
"""
import base64
import dataclasses
import hashlib
import hmac
import secrets

from kmem.broker.security.jaas import PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE, parse_jaas_config
from kmem.broker.security.scram import HASHES as SCRAM_HASHES
from kmem.broker.security.scram import MIN_ITERATIONS
from kmem.errors import ConfigError, SaslAuthenticationError

MECHANISMS = ("PLAIN", *SCRAM_HASHES)
# Kafka's default sasl.mechanism, which kmem's clients do not speak
DEFAULT_MECHANISM = "GSSAPI"
LOGIN_MODULES = {"PLAIN": PLAIN_LOGIN_MODULE, "SCRAM-SHA-256": SCRAM_LOGIN_MODULE, "SCRAM-SHA-512": SCRAM_LOGIN_MODULE}


@dataclasses.dataclass(frozen=True)
class SaslClientSettings:
    mechanism: str
    username: str
    password: str = dataclasses.field(repr=False)       # never in a repr, a log line or an error

    @classmethod
    def from_config(cls, config):
        """The settings of a ``SASL_PLAINTEXT``/``SASL_SSL`` client from its properties (``ConfigError`` for a
        mechanism kmem does not speak or credentials that are missing; the message never holds a password)."""
        mechanism = str(config.get("sasl.mechanism") or DEFAULT_MECHANISM).strip()
        if mechanism not in MECHANISMS:
            raise ConfigError(f"sasl.mechanism = {mechanism!r}: kmem's clients speak {', '.join(MECHANISMS)}"
                              f"{' (GSSAPI is Kafka default)' if mechanism == DEFAULT_MECHANISM else ''}")
        jaas = config.get("sasl.jaas.config")
        if jaas:
            module = LOGIN_MODULES[mechanism]
            options = next((opts for name, opts in parse_jaas_config("sasl.jaas.config", jaas) if name == module), None)
            if options is None:
                raise ConfigError(f"sasl.jaas.config has no {module} entry for sasl.mechanism={mechanism}")
            username, password = options.get("username"), options.get("password")
        else:
            username, password = config.get("sasl.username"), config.get("sasl.password")
        if not username or password is None:
            raise ConfigError(f"sasl.mechanism={mechanism} needs a user: set sasl.jaas.config "
                              f"({LOGIN_MODULES[mechanism]} required username=\"...\" password=\"...\";) or "
                              "sasl.username and sasl.password")
        return cls(mechanism, str(username), str(password))

    def exchange(self):
        if self.mechanism == "PLAIN":
            return PlainExchange(self.username, self.password)
        return ScramExchange(self.mechanism, self.username, self.password)


class PlainExchange:
    """RFC 4616: one message, ``NUL username NUL password``; the broker's empty answer completes it."""

    def __init__(self, username, password):
        self._token = b"\0" + username.encode() + b"\0" + password.encode()

    def first(self):
        return self._token

    def evaluate(self, challenge):
        return None


def _saslname(name):
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramExchange:
    """RFC 5802 (Kafka's ``ScramSaslClient``): client-first, then client-final with the proof; the server-final
    message's signature is checked, so a broker that does not know the password cannot pass for one that does."""

    def __init__(self, mechanism, username, password):
        self.mechanism = mechanism
        self._hash = SCRAM_HASHES[mechanism]
        self._password = password.encode()
        self._nonce = secrets.token_urlsafe(24)
        self._bare = f"n={_saslname(username)},r={self._nonce}"
        self._server_signature = None

    def first(self):
        return f"n,,{self._bare}".encode()

    def evaluate(self, challenge):
        if self._server_signature is None:
            return self._final(challenge)
        return self._check_server_final(challenge)

    def _final(self, server_first):
        try:
            text = bytes(server_first).decode()
            fields = dict(item.split("=", 1) for item in text.split(","))
            nonce, salt, iterations = fields["r"], base64.b64decode(fields["s"], validate=True), int(fields["i"])
        except (UnicodeDecodeError, ValueError, KeyError):
            raise SaslAuthenticationError(f"{self.mechanism}: the broker's first message is not a SCRAM "
                                          "server-first message") from None
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslAuthenticationError(f"{self.mechanism}: the broker's nonce does not extend the client's")
        if iterations < MIN_ITERATIONS:
            raise SaslAuthenticationError(f"{self.mechanism}: the broker asks for {iterations} iterations, fewer "
                                          f"than the minimum {MIN_ITERATIONS}")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, salt, iterations)
        without_proof = f"c=biws,r={nonce}"         # biws: base64 of the gs2 header "n,,"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        client_key = hmac.digest(salted, b"Client Key", self._hash)
        signature = hmac.digest(hashlib.new(self._hash, client_key).digest(), auth_message, self._hash)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = hmac.digest(hmac.digest(salted, b"Server Key", self._hash), auth_message,
                                             self._hash)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _check_server_final(self, server_final):
        text = bytes(server_final)
        if text.startswith(b"e="):
            raise SaslAuthenticationError(f"{self.mechanism}: the broker refused: {text[2:].decode(errors='replace')}")
        if not text.startswith(b"v=") or not hmac.compare_digest(text[2:],
                                                                  base64.b64encode(self._server_signature)):
            raise SaslAuthenticationError(f"{self.mechanism}: the broker's signature does not match: it does not "
                                          "hold this user's credential")
        return None
