"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka serves them (``ScramSaslServer``,
``ScramMessages``, ``ScramFormatter``).

A user's credential is what the server keeps instead of the password: the salt, the iteration count, the
stored key ``H(HMAC(SaltedPassword, "Client Key"))`` and the server key ``HMAC(SaltedPassword, "Server Key")``.
``ScramServer`` runs one exchange: client-first (``n,,n=user,r=nonce``), server-first (``r=nonce+ours,s=salt,i=n``),
client-final (``c=gs2-header,r=nonce,p=proof``), server-final (``v=signature``).
"""
import base64
import dataclasses
import hashlib
import hmac
import logging
import re
import secrets

from kmem.errors import InvalidArgumentError, InvalidSaslCredentialsError, SaslAuthenticationError

log = logging.getLogger(__name__)

# mechanism -> hashlib name (RFC 7677 and Kafka's ScramMechanism)
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS = tuple(HASHES)
# Kafka's ScramMechanism minimum, and the maximum AlterUserScramCredentials accepts
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096
# Kafka's ScramExtensions: the only one it knows (delegation tokens, which kmem does not serve)
TOKEN_AUTH_EXTENSION = "tokenauth"

# Kafka's ScramMessages patterns: printable characters but ','; a saslname escapes ',' and '=' as =2C and =3D
_VALUE = r"[\x21-\x2b\x2d-\x7e]+"
_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_BASE64 = r"[a-zA-Z0-9/+]*={0,2}"
_EXTENSIONS = rf"(?:,[a-zA-Z0-9]+={_VALUE})*"
_CLIENT_FIRST = re.compile(rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,(?P<bare>n=(?P<saslname>{_SASLNAME}),"
                           rf"r=(?P<nonce>{_VALUE})(?P<extensions>{_EXTENSIONS}))", re.S)
_CLIENT_FINAL = re.compile(rf"(?P<without_proof>c=(?P<channel>{_BASE64}),r=(?P<nonce>{_VALUE}){_EXTENSIONS}),"
                           rf"p=(?P<proof>{_BASE64})", re.S)


@dataclasses.dataclass(frozen=True)
class ScramCredential:
    """Kafka's ``ScramCredential``: never the password."""
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def _hmac(key, message, hash_name):
    return hmac.new(key, message, hash_name).digest()


def credential_from_password(mechanism, password, *, salt=None, iterations=DEFAULT_ITERATIONS):
    """The ``ScramCredential`` of ``password`` (a random 32-byte salt unless one is given)."""
    hash_name = hash_of(mechanism)
    check_iterations(iterations)
    salt = secrets.token_bytes(32) if salt is None else salt
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode("utf-8"), salt, iterations)
    return credential_from_salted_password(mechanism, salted, salt=salt, iterations=iterations)


def credential_from_salted_password(mechanism, salted_password, *, salt, iterations):
    hash_name = hash_of(mechanism)
    client_key = _hmac(salted_password, b"Client Key", hash_name)
    return ScramCredential(salt=salt, stored_key=hashlib.new(hash_name, client_key).digest(),
                           server_key=_hmac(salted_password, b"Server Key", hash_name), iterations=iterations)


def hash_of(mechanism):
    try:
        return HASHES[mechanism]
    except KeyError:
        raise InvalidArgumentError(f"unknown SCRAM mechanism {mechanism!r}; known: {', '.join(MECHANISMS)}") from None


def check_iterations(iterations):
    if not isinstance(iterations, int) or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise InvalidArgumentError(f"SCRAM iterations must be in [{MIN_ITERATIONS}, {MAX_ITERATIONS}], "
                                   f"got {iterations!r}")


def server_nonce():
    """The server's part of an exchange's nonce: 32 random printable characters, no comma."""
    return secrets.token_urlsafe(24)


def _saslname(name):
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One SCRAM exchange on the server's side. ``evaluate(token)`` returns the next challenge; after the
    client-final message ``complete`` is true and ``username`` is the authenticated user.

    ``credential(username)`` gives the user's ``ScramCredential`` for this mechanism, or None. Failures
    raise ``InvalidSaslCredentialsError`` (the client gets Kafka's generic message) or, for an
    authorization id other than the user, ``SaslAuthenticationError`` (as Kafka tells it).
    """

    def __init__(self, mechanism, credential):
        self.mechanism = mechanism
        self._hash = hash_of(mechanism)
        self._credential_of = credential
        self._credential = None
        self._client_first_bare = None
        self._server_first = None
        self._nonce = None
        self._gs2_header = None
        self.username = None
        self.complete = False

    def evaluate(self, token):
        try:
            text = bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidSaslCredentialsError(f"{self.mechanism}: a client message is not UTF-8") from None
        if self.complete:
            raise InvalidSaslCredentialsError(f"{self.mechanism}: a message after the exchange completed")
        if self._server_first is None:
            return self._client_first(text)
        return self._client_final(text)

    def _client_first(self, text):
        match = _CLIENT_FIRST.fullmatch(text)
        if match is None:
            raise InvalidSaslCredentialsError(f"{self.mechanism}: invalid client first message")
        username = _saslname(match["saslname"])
        extensions = dict(entry.split("=", 1) for entry in match["extensions"].split(",")[1:])
        if extensions.get(TOKEN_AUTH_EXTENSION, "").lower() == "true":
            raise InvalidSaslCredentialsError(f"{self.mechanism}: token authentication (delegation tokens) is not "
                                              "served")
        unknown = set(extensions) - {TOKEN_AUTH_EXTENSION}
        if unknown:
            log.debug("%s: ignoring the unsupported extensions %s", self.mechanism, sorted(unknown))
        credential = self._credential_of(username)
        if credential is None:
            raise InvalidSaslCredentialsError(f"{self.mechanism}: no credential for the user")
        if match["authzid"] is not None and _saslname(match["authzid"]) != username:
            raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                          "different from username")
        if credential.iterations < MIN_ITERATIONS:
            raise InvalidSaslCredentialsError(f"{self.mechanism}: iterations {credential.iterations} below "
                                              f"{MIN_ITERATIONS}")
        self.username = username
        self._credential = credential
        self._client_first_bare = match["bare"]
        self._gs2_header = text[:match.start("bare")]
        self._nonce = match["nonce"] + server_nonce()
        self._server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                              f"i={credential.iterations}")
        return self._server_first.encode()

    def _client_final(self, text):
        match = _CLIENT_FINAL.fullmatch(text)
        if match is None:
            raise InvalidSaslCredentialsError(f"{self.mechanism}: invalid client final message")
        # Kafka's ScramSaslServer checks that the nonce ends with the exchange's (librdkafka 2.0, Debian's kcat
        # among others, sends the client's part twice); the proof then covers the message as sent
        nonce, expected = match["nonce"].encode(), self._nonce.encode()
        if len(nonce) < len(expected) or not hmac.compare_digest(nonce[len(nonce) - len(expected):], expected):
            raise InvalidSaslCredentialsError(f"{self.mechanism}: invalid client nonce in the final client message")
        try:
            channel_binding = base64.b64decode(match["channel"], validate=True)
            proof = base64.b64decode(match["proof"], validate=True)
        except ValueError:
            raise InvalidSaslCredentialsError(f"{self.mechanism}: invalid base64 in the final client message") from None
        if channel_binding != self._gs2_header.encode():
            raise InvalidSaslCredentialsError(f"{self.mechanism}: channel binding does not match the gs2 header")
        auth_message = f"{self._client_first_bare},{self._server_first},{match['without_proof']}".encode()
        credential = self._credential
        client_signature = _hmac(credential.stored_key, auth_message, self._hash)
        if len(proof) != len(client_signature):
            raise InvalidSaslCredentialsError(f"{self.mechanism}: invalid client proof length")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), credential.stored_key):
            raise InvalidSaslCredentialsError(f"{self.mechanism}: invalid client credentials")
        self.complete = True
        server_signature = _hmac(credential.server_key, auth_message, self._hash)
        return b"v=" + base64.b64encode(server_signature)
