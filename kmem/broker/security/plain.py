"""SASL/PLAIN (RFC 4616) as Kafka serves it (``PlainSaslServer``, ``PlainServerCallbackHandler``): one client
message, ``authzid NUL username NUL password``, checked against the users of the JAAS configuration."""
import hmac

from kmem.errors import SaslAuthenticationError

MECHANISM = "PLAIN"


class PlainServer:
    """One PLAIN exchange: ``evaluate(token)`` checks the client's one message (``SaslAuthenticationError``
    with Kafka's message when it fails) and returns an empty challenge. ``users`` maps names to passwords."""

    mechanism = MECHANISM

    def __init__(self, users):
        self._users = users
        self.username = None
        self.complete = False

    def evaluate(self, token):
        try:
            tokens = bytes(token).decode("utf-8").split("\0")
        except UnicodeDecodeError:
            raise SaslAuthenticationError("Invalid SASL/PLAIN response: not UTF-8") from None
        if len(tokens) != 3:
            raise SaslAuthenticationError(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(tokens)}")
        authorization_id, username, password = tokens
        if not username:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        expected = self._users.get(username)
        # compared in constant time, and compared even for an unknown user: the time says nothing either way
        matches = hmac.compare_digest(password.encode(), (expected if expected is not None else "\0" + password)
                                      .encode())
        if expected is None or not matches:
            raise SaslAuthenticationError("Authentication failed: Invalid username or password")
        if authorization_id and authorization_id != username:
            raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                          "different from username")
        self.username = username
        self.complete = True
        return b""
