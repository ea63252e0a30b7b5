"""SCRAM users over the wire (KIP-554): DescribeUserScramCredentials and AlterUserScramCredentials answered as
Kafka 3.9 answers them (``ScramImage.describe``, ``ScramControlManager.alterCredentials``), kept in the log
directory, and used by the next authentication. Requests, salted passwords and SCRAM exchanges are built with
kafka-python's codec, ScramClient and hashlib, which nobody here wrote."""
import hashlib
import threading

import pytest
from kafka.net.sasl.scram import ScramClient
from kafka.protocol.admin import (AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
                                  DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from broker_helpers import RawConnection
from test_broker_sasl import SASL_PROPERTIES, authenticate, handshake, metadata_works
from kmem.broker import Broker
from kmem.broker.codes import ErrorCode

SHA_256, SHA_512 = 1, 2         # Kafka's ScramMechanism types
HASHES = {SHA_256: "sha256", SHA_512: "sha512"}
NAMES = {SHA_256: "SCRAM-SHA-256", SHA_512: "SCRAM-SHA-512"}


def upsertion(user, password, mechanism=SHA_256, iterations=4096, salt=b"a-salt-of-the-client"):
    """What an admin client sends: its salt and the password salted with it (RFC 5802's Hi)."""
    salted = hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode(), salt, iterations) if password else b""
    return user, mechanism, iterations, salt, salted


def alter(broker, deletions=(), upsertions=()):
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "PLAIN").error_code == 0
        assert authenticate(connection, b"\0alice\0alice-secret").error_code == 0
        response = connection.request(AlterUserScramCredentialsRequest(deletions=list(deletions),
                                                                       upsertions=list(upsertions)),
                                      AlterUserScramCredentialsResponse, 0)
    return {r.user: (r.error_code, r.error_message) for r in response.results}


def describe(broker, users=None):
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "PLAIN").error_code == 0
        assert authenticate(connection, b"\0alice\0alice-secret").error_code == 0
        request = DescribeUserScramCredentialsRequest(users=None if users is None else [(u,) for u in users])
        response = connection.request(request, DescribeUserScramCredentialsResponse, 0)
    assert (response.error_code, response.error_message) == (0, None)
    return {r.user: (r.error_code, r.error_message, [(c.mechanism, c.iterations) for c in r.credential_infos])
            for r in response.results}


def scram_authenticates(broker, user, password, mechanism):
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, NAMES[mechanism]).error_code == 0
        client = ScramClient(user, password, NAMES[mechanism])
        first = authenticate(connection, client.first_message())
        if first.error_code:
            return False
        client.process_server_first_message(first.auth_bytes)
        final = authenticate(connection, client.final_message())
        if final.error_code:
            return False
        client.process_server_final_message(final.auth_bytes)
        return metadata_works(connection)


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path, properties=SASL_PROPERTIES) as running:
        yield running


def test_api_versions_lists_the_scram_admin_apis(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        versions = connection.request(ApiVersionsRequest(), ApiVersionsResponse, 3)
    served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert served[50] == (0, 0) and served[51] == (0, 0)


def test_an_upserted_user_authenticates_at_once_and_after_a_restart(tmp_path):
    with Broker(tmp_path, properties=SASL_PROPERTIES) as broker:
        assert describe(broker) == {}
        assert alter(broker, upsertions=[upsertion("carol", "carol-secret", SHA_256, 8192),
                                         upsertion("dave", "dave-secret", SHA_512)]) == {
            "carol": (0, None), "dave": (0, None)}
        assert alter(broker, upsertions=[upsertion("carol", "carol-512", SHA_512, 4096)]) == {"carol": (0, None)}
        assert scram_authenticates(broker, "carol", "carol-secret", SHA_256)
        assert scram_authenticates(broker, "carol", "carol-512", SHA_512)
        assert not scram_authenticates(broker, "carol", "wrong", SHA_256)
        assert describe(broker) == {"carol": (0, None, [(SHA_256, 8192), (SHA_512, 4096)]),
                                    "dave": (0, None, [(SHA_512, 4096)])}
    stored = (tmp_path / "scram-credentials.json").read_text()
    assert "carol-secret" not in stored and "dave-secret" not in stored
    with Broker(tmp_path, properties=SASL_PROPERTIES) as broker:
        assert scram_authenticates(broker, "dave", "dave-secret", SHA_512)
        assert describe(broker, ["dave"]) == {"dave": (0, None, [(SHA_512, 4096)])}
        # a deletion applies to the next authentication; the user's other mechanism stays
        assert alter(broker, deletions=[("carol", SHA_256)]) == {"carol": (0, None)}
        assert not scram_authenticates(broker, "carol", "carol-secret", SHA_256)
        assert scram_authenticates(broker, "carol", "carol-512", SHA_512)
    with Broker(tmp_path, properties=SASL_PROPERTIES) as broker:
        assert describe(broker, ["carol"]) == {"carol": (0, None, [(SHA_512, 4096)])}


def test_describe_answers_duplicates_and_unknown_users_as_kafka(broker):
    alter(broker, upsertions=[upsertion("carol", "carol-secret")])
    assert describe(broker, ["carol", "nobody", "carol"]) == {
        "carol": (ErrorCode.DUPLICATE_RESOURCE,
                  "Cannot describe SCRAM credentials for the same user twice in a single request: carol", []),
        "nobody": (ErrorCode.RESOURCE_NOT_FOUND, "Attempt to describe a user credential that does not exist: nobody",
                   [])}
    assert describe(broker, []) == describe(broker, None) == {"carol": (0, None, [(SHA_256, 4096)])}


def test_alter_validates_each_user_as_kafkas_controller(broker):
    alter(broker, upsertions=[upsertion("carol", "carol-secret"), upsertion("erin", "erin-secret"),
                              upsertion("gina", "gina-secret")])
    results = alter(broker, deletions=[("nobody", SHA_256), ("", SHA_256), ("frank", 3), ("carol", SHA_256),
                                       ("gina", SHA_256), ("gina", SHA_512), ("erin", SHA_512)],
                    upsertions=[upsertion("few", "x", iterations=4095), upsertion("many", "x", iterations=16385),
                                upsertion("", "x"), ("bad-mechanism", 0, 4096, b"salt", b"salted"),
                                upsertion("carol", "new"), upsertion("twice", "a"), upsertion("twice", "b"),
                                upsertion("empty", ""), upsertion("max", "max-secret", SHA_512, 16384)])
    altered_twice = (ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
    assert results == {
        "nobody": (ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"),
        "": (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"),
        "frank": (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
        "carol": altered_twice,        # a deletion and an upsertion of one user
        "gina": altered_twice,         # two deletions of one user, whatever their mechanisms
        "erin": (ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"),
        "few": (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations"),
        "many": (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations"),
        "bad-mechanism": (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
        "twice": altered_twice,
        "empty": (ErrorCode.UNKNOWN_SERVER_ERROR, None),
        "max": (0, None)}
    # nothing refused was applied: carol keeps her credential, the refused users have none
    assert scram_authenticates(broker, "carol", "carol-secret", SHA_256)
    assert set(describe(broker)) == {"carol", "erin", "gina", "max"}


def test_alter_runs_on_an_io_thread_and_a_failed_write_alters_nothing(broker, monkeypatch):
    alter(broker, upsertions=[upsertion("carol", "carol-secret")])
    store = broker.scram_credentials
    before = open(store.path, "rb").read()
    threads = []

    def full_disk(*args, **kwargs):
        threads.append(threading.current_thread().name)
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("kmem.broker.security.credentials.write_json", full_disk)
    results = alter(broker, deletions=[("carol", SHA_256)], upsertions=[upsertion("dave", "dave-secret")])
    assert results == {"carol": (ErrorCode.UNKNOWN_SERVER_ERROR, None), "dave": (ErrorCode.UNKNOWN_SERVER_ERROR, None)}
    assert threads and all(name.startswith("kmem-io-thread-") for name in threads)     # not a network processor
    assert open(store.path, "rb").read() == before
    assert scram_authenticates(broker, "carol", "carol-secret", SHA_256)
    assert "dave" not in describe(broker)
