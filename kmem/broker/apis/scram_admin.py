"""SCRAM users over the wire (KIP-554), as Kafka 3.9 answers them in KRaft mode:

- DescribeUserScramCredentials v0 (``ScramImage.describe``): the mechanisms and iteration counts of the users
  asked (all users when the list is null or empty); a user named twice is DUPLICATE_RESOURCE, one without a
  credential RESOURCE_NOT_FOUND. Answered at once: it reads memory.
- AlterUserScramCredentials v0 (``ScramControlManager.alterCredentials``): deletions and upsertions, validated
  per user, then applied in one atomic replacement of the log directory's ``scram-credentials.json``; a new
  authentication uses them at once. An upsertion brings the salt and the salted password (the client derives it
  from the password); the broker keeps the stored and server keys made from it. Answered on an io thread: it
  fsyncs a file.

kmem has no authorizer yet: any client that reached the broker (authenticated, on a SASL listener) may call
them, as Kafka does with no ``authorizer.class.name``.
"""
import logging
import threading

from kmem.broker.codes import ErrorCode
from kmem.broker.security.scram import MAX_ITERATIONS, MIN_ITERATIONS, credential_from_salted_password
from kmem.protocol import ApiKey, messages

log = logging.getLogger(__name__)

SCRAM_APIS = {ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: "describe_user_scram_credentials",
              ApiKey.ALTER_USER_SCRAM_CREDENTIALS: "alter_user_scram_credentials"}
SCRAM_VERSIONS = {ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0), ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0)}
# Kafka's ScramMechanism types (org.apache.kafka.clients.admin.ScramMechanism)
MECHANISM_TYPES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
TYPE_OF_MECHANISM = {name: code for code, name in MECHANISM_TYPES.items()}
# Kafka's messages
ALTERED_TWICE = "A user credential cannot be altered twice in the same request"
DESCRIBED_TWICE = "Cannot describe SCRAM credentials for the same user twice in a single request: "
DESCRIBE_MISSING = "Attempt to describe a user credential that does not exist: "
DELETE_MISSING = "Attempt to delete a user credential that does not exist"


class ScramAdminHandlers:
    """The two KIP-554 APIs over a ``ScramCredentialStore``."""

    def __init__(self, credentials):
        self.credentials = credentials
        self._altering = threading.Lock()   # io threads alter one request at a time, as Kafka's controller does

    def describe_user_scram_credentials(self, header, request):
        Result = messages.DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult
        Info = messages.DescribeUserScramCredentialsResponse.CredentialInfo
        names = [user.name for user in request.users or ()] or self.credentials.all_users()
        results = []
        for name in dict.fromkeys(names):
            result = Result(user=name, error_code=ErrorCode.NONE, error_message=None, credential_infos=[])
            described = self.credentials.describe(name)
            if names.count(name) > 1:
                result.error_code, result.error_message = ErrorCode.DUPLICATE_RESOURCE, DESCRIBED_TWICE + name
            elif not described:
                result.error_code, result.error_message = ErrorCode.RESOURCE_NOT_FOUND, DESCRIBE_MISSING + name
            else:
                result.credential_infos = [Info(mechanism=TYPE_OF_MECHANISM[mechanism], iterations=iterations)
                                           for mechanism, iterations in described]
            results.append(result)
        return messages.DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                                                             error_message=None, results=results)

    def alter_user_scram_credentials(self, header, request):
        """Each user is altered once per request: a second deletion or upsertion of a user (whatever the
        mechanism) fails that user with DUPLICATE_RESOURCE, and what was accepted for it is dropped."""
        with self._altering:        # a deletion is checked against the credentials it then removes
            return self._alter(header, request)

    def _alter(self, header, request):
        deletions, upsertions, errors = {}, {}, {}
        for deletion in request.deletions:
            name = deletion.name
            if name in errors:
                continue
            if deletions.pop(name, None) is not None:
                errors[name] = (ErrorCode.DUPLICATE_RESOURCE, ALTERED_TWICE)
                continue
            error = self._deletion_error(deletion)
            if error is None:
                deletions[name] = (MECHANISM_TYPES[deletion.mechanism], name)
            else:
                errors[name] = error
        for upsertion in request.upsertions:
            name = upsertion.name
            if name in errors:
                continue
            if deletions.pop(name, None) is not None or upsertions.pop(name, None) is not None:
                errors[name] = (ErrorCode.DUPLICATE_RESOURCE, ALTERED_TWICE)
                continue
            error = _upsertion_error(upsertion)
            if error is None:
                upsertions[name] = upsertion
            else:
                errors[name] = error
        credentials = {}
        for name, upsertion in upsertions.items():
            if upsertion.salted_password:
                mechanism = MECHANISM_TYPES[upsertion.mechanism]
                credentials[name] = (mechanism, name, credential_from_salted_password(
                    mechanism, upsertion.salted_password, salt=upsertion.salt, iterations=upsertion.iterations))
            else:   # Kafka's HMAC refuses an empty key: UNKNOWN_SERVER_ERROR, no message (ApiError.fromThrowable)
                errors[name] = (ErrorCode.UNKNOWN_SERVER_ERROR, None)
        if deletions or credentials:
            try:
                self.credentials.alter(deletions.values(), credentials.values())
            except OSError:     # the file stays as it was: none of them is altered
                log.exception("AlterUserScramCredentials: cannot write %s", self.credentials.path)
                errors.update((name, (ErrorCode.UNKNOWN_SERVER_ERROR, None)) for name in [*deletions, *credentials])
                deletions, credentials = {}, {}
            else:
                log.info("SCRAM credentials altered (client %r): deleted %s, upserted %s", header.client_id,
                         sorted(deletions.values()) or "none",
                         sorted((mechanism, name) for mechanism, name, _ in credentials.values()) or "none")
        Result = messages.AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult
        results = [Result(user=name, error_code=ErrorCode.NONE, error_message=None)
                   for name in [*deletions, *credentials]]
        results += [Result(user=name, error_code=code, error_message=message)
                    for name, (code, message) in errors.items()]
        return messages.AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)

    def _deletion_error(self, deletion):
        error = _name_and_mechanism_error(deletion.name, deletion.mechanism)
        if error is None and self.credentials.get(MECHANISM_TYPES[deletion.mechanism], deletion.name) is None:
            return ErrorCode.RESOURCE_NOT_FOUND, DELETE_MISSING
        return error


def _name_and_mechanism_error(name, mechanism):
    if not name:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if mechanism not in MECHANISM_TYPES:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    return None


def _upsertion_error(upsertion):
    error = _name_and_mechanism_error(upsertion.name, upsertion.mechanism)
    if error is not None:
        return error
    if upsertion.iterations < MIN_ITERATIONS:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations"
    if upsertion.iterations > MAX_ITERATIONS:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations"
    return None
