"""SCRAM credentials kept in the log directory (Kafka keeps them in its metadata log): ``scram-credentials.json``,
``{"version": 1, "credentials": {mechanism: {user: {"salt", "stored_key", "server_key", "iterations"}}}}`` with
base64 bytes. Never a password. The file is replaced atomically (temporary file, fsync, rename)."""
import base64
import os
import re
import threading

from kmem.broker.security.scram import (DEFAULT_ITERATIONS, MECHANISMS, ScramCredential, check_iterations,
                                        credential_from_password, credential_from_salted_password)
from kmem.durable import read_json, write_json
from kmem.errors import ConfigError, InvalidArgumentError

CREDENTIALS_FILE = "scram-credentials.json"
VERSION = 1
_ADD_SCRAM = re.compile(r"(?P<mechanism>[A-Z0-9-]+)=\[(?P<fields>.*)\]", re.S)
_FIELD = re.compile(r'\s*(?P<key>[a-z]+)=(?:"(?P<quoted>[^"]*)"|(?P<plain>[^,]*))\s*(?:,|$)', re.S)


class ScramCredentialStore:
    """The SCRAM credentials of a log directory: ``get(mechanism, user)`` (None when absent), ``describe``,
    ``add`` and ``alter`` (the file is replaced: a change is on disk, and in use, when it returns)."""

    def __init__(self, log_dir):
        self.path = os.path.join(os.fspath(log_dir), CREDENTIALS_FILE)
        self._lock = threading.Lock()
        self._credentials = self._read()

    def _read(self):
        credentials = read_json(self.path, VERSION, "credentials", "SCRAM credentials")
        try:
            return {mechanism: {user: ScramCredential(base64.b64decode(c["salt"]), base64.b64decode(c["stored_key"]),
                                                      base64.b64decode(c["server_key"]), int(c["iterations"]))
                                for user, c in users.items()}
                    for mechanism, users in (credentials or {}).items() if mechanism in MECHANISMS}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"{self.path}: malformed SCRAM credentials ({type(e).__name__}: {e})") from None

    def get(self, mechanism, user):
        return self._credentials.get(mechanism, {}).get(user)

    def users(self, mechanism):
        return sorted(self._credentials.get(mechanism, {}))

    def describe(self, user):
        """``[(mechanism, iterations)]`` of ``user``'s credentials, in ``MECHANISMS``' order."""
        credentials = self._credentials
        return [(m, credentials[m][user].iterations) for m in MECHANISMS if user in credentials.get(m, {})]

    def all_users(self):
        """Every user with a credential, sorted."""
        return sorted({user for users in self._credentials.values() for user in users})

    def add(self, mechanism, user, credential):
        """Store (or replace) ``user``'s credential for ``mechanism``, on disk before this returns."""
        self.alter(upsertions=[(mechanism, user, credential)])

    def alter(self, deletions=(), upsertions=()):
        """Remove the ``(mechanism, user)`` of ``deletions`` and store the ``(mechanism, user, credential)`` of
        ``upsertions``, all in one replacement of the file, on disk before this returns (and in use at once)."""
        with self._lock:
            credentials = {m: dict(users) for m, users in self._credentials.items()}
            for mechanism, user in deletions:
                credentials.get(mechanism, {}).pop(user, None)
            for mechanism, user, credential in upsertions:
                credentials.setdefault(mechanism, {})[user] = credential
            credentials = {m: users for m, users in credentials.items() if users}
            write_json(self.path, VERSION, "credentials", {
                m: {u: {"salt": base64.b64encode(c.salt).decode(), "stored_key": base64.b64encode(c.stored_key).decode(),
                        "server_key": base64.b64encode(c.server_key).decode(), "iterations": c.iterations}
                    for u, c in sorted(users.items())}
                for m, users in sorted(credentials.items())})
            self._credentials = credentials


def parse_add_scram(value):
    """``(mechanism, user, ScramCredential)`` of a ``kafka-storage format --add-scram`` argument:
    ``SCRAM-SHA-256=[name=alice,password=alice-secret]``, with ``iterations=N`` and either ``password`` or
    ``salt`` and ``saltedpassword`` (base64). ``InvalidArgumentError`` otherwise (never echoing a password)."""
    match = _ADD_SCRAM.fullmatch(value.strip())
    if match is None:
        raise InvalidArgumentError("--add-scram must read 'SCRAM-SHA-256=[name=alice,password=alice-secret]'")
    mechanism = match["mechanism"]
    if mechanism not in MECHANISMS:
        raise InvalidArgumentError(f"--add-scram: unknown SCRAM mechanism {mechanism!r}; known: {', '.join(MECHANISMS)}")
    fields, text, pos = {}, match["fields"], 0
    while pos < len(text):
        field = _FIELD.match(text, pos)
        if field is None or field.end() == pos:
            raise InvalidArgumentError("--add-scram: fields must read key=value, separated by commas")
        fields[field["key"]] = field["quoted"] if field["quoted"] is not None else field["plain"]
        pos = field.end()
    unknown = set(fields) - {"name", "password", "iterations", "salt", "saltedpassword"}
    if unknown:
        raise InvalidArgumentError(f"--add-scram: unknown field(s) {', '.join(sorted(unknown))}")
    if not fields.get("name"):
        raise InvalidArgumentError("--add-scram: name is required")
    try:
        iterations = int(fields.get("iterations", DEFAULT_ITERATIONS))
    except ValueError:
        raise InvalidArgumentError("--add-scram: iterations must be an integer") from None
    check_iterations(iterations)
    try:
        salt = base64.b64decode(fields["salt"], validate=True) if "salt" in fields else None
        if "saltedpassword" in fields:
            if "password" in fields or salt is None:
                raise InvalidArgumentError("--add-scram: saltedpassword needs salt, and no password")
            salted = base64.b64decode(fields["saltedpassword"], validate=True)
            return mechanism, fields["name"], credential_from_salted_password(mechanism, salted, salt=salt,
                                                                              iterations=iterations)
    except ValueError as e:
        if isinstance(e, InvalidArgumentError):
            raise
        raise InvalidArgumentError("--add-scram: salt and saltedpassword must be base64") from None
    if not fields.get("password"):
        raise InvalidArgumentError("--add-scram: password (or salt and saltedpassword) is required")
    return mechanism, fields["name"], credential_from_password(mechanism, fields["password"], salt=salt,
                                                               iterations=iterations)
