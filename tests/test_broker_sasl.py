"""SASL on a kmem broker's listener, byte by byte (Kafka's SaslServerAuthenticator): the handshake, KIP-152 and
KIP-43 raw tokens, and every bad input: each answered as Kafka answers it, then closed, with the pool memory back.
Requests and SCRAM tokens are built with kafka-python's codec and ScramClient, which nobody here wrote."""
import logging
import socket
import struct
import threading
import time

import pytest
from kafka.net.sasl.scram import ScramClient
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

from broker_helpers import RawConnection, wait_for
from network_helpers import closed_by_peer
from kmem.broker import Broker
from kmem.broker.codes import ErrorCode
from kmem.broker.security import ScramCredentialStore, parse_add_scram
from kmem.network import SaslChannelBuilder, SocketServer
from kmem.network.sasl import SaslState

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
              'user_alice="alice-secret" user_bob="bob-secret";')
SASL_PROPERTIES = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                   "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
                   "queued.max.request.bytes": str(4 << 20), "socket.request.max.bytes": str(1 << 20)}
SCRAM_FAILED = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
DELAY_SECONDS = 0.1     # connection.failed.authentication.delay.ms, Kafka's default


def add_scram_users(log_dir):
    store = ScramCredentialStore(log_dir)
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        store.add(*parse_add_scram(f"{mechanism}=[name=alice,password=alice-secret]"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("sasl")
    add_scram_users(log_dir)
    with Broker(log_dir, properties=SASL_PROPERTIES) as running:
        yield running


def pool_is_full(broker):
    pool = broker.server.pool
    return pool.available_memory == pool.size


def handshake(connection, mechanism, version=1):
    return connection.request(SaslHandshakeRequest(mechanism=mechanism), SaslHandshakeResponse, version)


def authenticate(connection, token, version=2):
    return connection.request(SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse, version)


def metadata_works(connection):
    response = connection.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), MetadataResponse, 1,
                                  correlation_id=9)
    return response.brokers[0].port > 0


def refused_after_delay(connection, started):
    """The broker closes the connection, and not before the failed-authentication delay."""
    assert closed_by_peer(connection.sock)
    assert time.monotonic() - started >= DELAY_SECONDS * 0.9


def test_api_versions_before_the_handshake_lists_the_sasl_apis(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        versions = connection.request(ApiVersionsRequest(), ApiVersionsResponse, 3)
        served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert served[17] == (0, 1) and served[36] == (0, 2)
        assert handshake(connection, "PLAIN").error_code == 0
        assert authenticate(connection, b"\0alice\0alice-secret").error_code == 0
        assert metadata_works(connection)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("version", [0, 1, 2])
def test_scram_with_sasl_authenticate(broker, mechanism, version):
    with RawConnection(broker.bootstrap_servers) as connection:
        response = handshake(connection, mechanism)
        assert (response.error_code, response.mechanisms) == (0, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
        client = ScramClient("alice", "alice-secret", mechanism)
        first = authenticate(connection, client.first_message(), version)
        assert first.error_code == 0
        client.process_server_first_message(first.auth_bytes)
        final = authenticate(connection, client.final_message(), version)
        assert final.error_code == 0
        client.process_server_final_message(final.auth_bytes)      # the server's signature checks out
        assert metadata_works(connection)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_v0_handshake_then_raw_tokens(broker, mechanism):
    """KIP-43: after a v0 handshake the tokens are size-prefixed frames without a request header."""
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, mechanism, version=0).error_code == 0
        if mechanism == "PLAIN":
            connection.send_frame(b"\0alice\0alice-secret")
            assert connection.receive_frame() == b""
        else:
            client = ScramClient("alice", "alice-secret", mechanism)
            connection.send_frame(client.first_message())
            client.process_server_first_message(connection.receive_frame())
            connection.send_frame(client.final_message())
            client.process_server_final_message(connection.receive_frame())
        assert metadata_works(connection)


def test_v0_raw_token_with_a_wrong_password_closes_without_an_answer(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "PLAIN", version=0).error_code == 0
        started = time.monotonic()
        connection.send_frame(b"\0alice\0wrong")
        assert connection.receive_frame() is None
        assert time.monotonic() - started >= DELAY_SECONDS * 0.9


@pytest.mark.parametrize("before", [[], ["api_versions"], ["api_versions", "handshake"]])
def test_a_request_before_authentication_completes_closes_the_connection(broker, before):
    with RawConnection(broker.bootstrap_servers) as connection:
        if "api_versions" in before:
            connection.request(ApiVersionsRequest(), ApiVersionsResponse, 3)
        if "handshake" in before:
            assert handshake(connection, "PLAIN").error_code == 0
        request = MetadataRequest(topics=[], allow_auto_topic_creation=False)
        request.with_header(correlation_id=5, client_id="raw")
        connection.send_frame(request.encode(version=1, header=True))
        assert connection.receive_frame() is None
    wait_for(lambda: pool_is_full(broker), "the pool back to full")


def test_an_unknown_mechanism_is_answered_with_the_enabled_ones_then_closed(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        started = time.monotonic()
        response = handshake(connection, "GSSAPI")
        assert response.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert response.mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        refused_after_delay(connection, started)


@pytest.mark.parametrize("token, message", [
    (b"\0alice\0wrong-password", "Authentication failed: Invalid username or password"),
    (b"\0mallory\0alice-secret", "Authentication failed: Invalid username or password"),
    (b"\0alice", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
])
def test_plain_refused_with_kafkas_message_after_the_delay(broker, caplog, token, message):
    with caplog.at_level(logging.INFO, logger="kmem"), RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "PLAIN").error_code == 0
        started = time.monotonic()
        response = authenticate(connection, token)
        assert (response.error_code, response.error_message) == (ErrorCode.SASL_AUTHENTICATION_FAILED, message)
        assert time.monotonic() - started >= DELAY_SECONDS * 0.9
        assert closed_by_peer(connection.sock)
    assert "SASL authentication failed" in caplog.text
    assert "wrong-password" not in caplog.text and "alice-secret" not in caplog.text


def scram_started(connection, mechanism="SCRAM-SHA-256", user="alice", password="alice-secret"):
    assert handshake(connection, mechanism).error_code == 0
    client = ScramClient(user, password, mechanism)
    first = authenticate(connection, client.first_message())
    assert first.error_code == 0
    client.process_server_first_message(first.auth_bytes)
    return client


def scram_refused(connection, token, mechanism="SCRAM-SHA-256"):
    started = time.monotonic()
    response = authenticate(connection, token)
    assert (response.error_code, response.error_message) == (ErrorCode.SASL_AUTHENTICATION_FAILED,
                                                              SCRAM_FAILED.format(mechanism))
    refused_after_delay(connection, started)


@pytest.mark.parametrize("bad_final", [
    lambda final: final.replace(b",r=", b",r=another"),               # a nonce that is not the exchange's
    lambda final: final[:len(final) - 10],                            # truncated
    lambda final: final[:-6] + b"AAAA==",                             # a wrong proof
])
def test_scram_bad_client_final(broker, bad_final):
    with RawConnection(broker.bootstrap_servers) as connection:
        client = scram_started(connection)
        scram_refused(connection, bad_final(client.final_message()))


def test_scram_replayed_client_final_is_refused(broker):
    with RawConnection(broker.bootstrap_servers) as first:
        client = scram_started(first)
        final = client.final_message()
        assert authenticate(first, final).error_code == 0
    with RawConnection(broker.bootstrap_servers) as second:
        scram_started(second)
        scram_refused(second, final)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_wrong_password_and_unknown_user(broker, mechanism):
    for user, password in (("alice", "wrong"), ("mallory", "alice-secret")):
        with RawConnection(broker.bootstrap_servers) as connection:
            assert handshake(connection, mechanism).error_code == 0
            client = ScramClient(user, password, mechanism)
            first = authenticate(connection, client.first_message())
            if user == "mallory":       # Kafka refuses an unknown user at the first message
                assert first.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
                assert first.error_message == SCRAM_FAILED.format(mechanism)
                assert closed_by_peer(connection.sock)
                continue
            client.process_server_first_message(first.auth_bytes)
            scram_refused(connection, client.final_message(), mechanism)


def test_scram_token_authentication_extension_is_refused(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "SCRAM-SHA-256").error_code == 0
        scram_refused(connection, b"n,,n=alice,r=abcdef,tokenauth=true")


def test_a_token_over_sasl_server_max_receive_size_closes_at_its_size_prefix(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "PLAIN").error_code == 0
        connection.sock.sendall(struct.pack(">i", 524288 + 1))
        assert connection.receive_frame() is None
    assert pool_is_full(broker)


def test_a_connection_closed_mid_token_gives_its_pool_memory_back(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "PLAIN").error_code == 0
        connection.sock.sendall(struct.pack(">i", 400_000) + b"\0" * 1000)
        wait_for(lambda: broker.server.pool.available_memory <= broker.server.pool.size - 400_000,
                 "the token's memory taken from the pool")
    wait_for(lambda: pool_is_full(broker), "the pool back to full")


def test_sasl_handshake_after_authentication_is_an_illegal_state(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "PLAIN").error_code == 0
        assert authenticate(connection, b"\0alice\0alice-secret").error_code == 0
        assert handshake(connection, "PLAIN").error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert authenticate(connection, b"\0alice\0alice-secret").error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert metadata_works(connection)


def test_a_handshake_that_never_completes_is_closed_by_the_idle_timeout(tmp_path):
    with Broker(tmp_path, properties={**SASL_PROPERTIES, "connections.max.idle.ms": "300"}) as idle_broker:
        with RawConnection(idle_broker.bootstrap_servers) as connection:
            assert handshake(connection, "PLAIN").error_code == 0
            assert connection.receive_frame() is None


def test_a_token_sent_a_byte_at_a_time_is_cut_off_by_the_same_deadline(tmp_path):
    """Each byte is progress to the idle timeout, but not to the authentication's deadline: connections.max.idle.ms
    after the connection came (the token's size is bounded by sasl.server.max.receive.size as well)."""
    idle_ms = 500
    with Broker(tmp_path, properties={**SASL_PROPERTIES, "connections.max.idle.ms": str(idle_ms)}) as idle_broker:
        with RawConnection(idle_broker.bootstrap_servers) as connection:
            began = time.monotonic()
            assert handshake(connection, "PLAIN").error_code == 0
            request = SaslAuthenticateRequest(auth_bytes=b"\0alice\0alice-secret" + b"x" * 200)
            request.with_header(correlation_id=2, client_id="raw")
            frame = request.encode(version=2, header=True)
            frame = struct.pack(">i", len(frame)) + frame
            connection.sock.settimeout(0.05)
            closed_after = None
            for byte in frame:      # 50 ms a byte: 12 s for the whole token
                try:
                    connection.sock.sendall(bytes([byte]))
                    if connection.sock.recv(1) == b"":
                        closed_after = time.monotonic() - began
                        break
                except (TimeoutError, socket.timeout):
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    closed_after = time.monotonic() - began
                    break
            assert closed_after is not None, "the trickled token was read to its end"
            assert closed_after < 4 * idle_ms / 1000


def test_the_principal_is_on_the_request_and_anonymous_without_sasl():
    class Mechanisms:
        enabled = ["PLAIN"]

        @staticmethod
        def server(mechanism):
            from kmem.broker.security.plain import PlainServer
            return PlainServer({"alice": "alice-secret"})

    principals = []

    def handler(request):
        principals.append(request.principal)
        return b"\0\0\0\1"
    builder = SaslChannelBuilder(Mechanisms(), api_versions=None)
    for server, expected in ((SocketServer(handler, channel_builder=builder), "User:alice"),
                             (SocketServer(handler), "User:ANONYMOUS")):
        with server:
            with RawConnection("%s:%d" % server.address) as connection:
                if server.listeners[0].channel_builder is not None:
                    assert handshake(connection, "PLAIN").error_code == 0
                    assert authenticate(connection, b"\0alice\0alice-secret").error_code == 0
                connection.send_frame(b"\0\3\0\1\0\0\0\1\0\0")
                assert connection.receive_frame() == b"\0\0\0\1"
        assert principals[-1] == expected
    assert builder.authenticator("x").state is SaslState.HANDSHAKE_OR_VERSIONS_REQUEST


def test_api_versions_at_a_version_too_new_gets_the_fallback_and_may_be_retried(broker):
    """Kafka's authenticator answers it UNSUPPORTED_VERSION and stays ready for ApiVersions: the client retries at
    a version both know, then authenticates."""
    with RawConnection(broker.bootstrap_servers) as connection:
        connection.send_frame(struct.pack(">hhih", 18, 9, 42, -1) + b"\x00")
        correlation_id, error_code = struct.unpack_from(">ih", connection.receive_frame())
        assert (correlation_id, error_code) == (42, 35)
        assert connection.request(ApiVersionsRequest(), ApiVersionsResponse, 3).error_code == 0
        assert handshake(connection, "PLAIN").error_code == 0
        assert authenticate(connection, b"\0alice\0alice-secret").error_code == 0


def test_a_burst_of_failed_authentications_holds_no_thread_and_gives_all_memory_back(broker):
    threads = threading.active_count()
    connections = [RawConnection(broker.bootstrap_servers) for _ in range(40)]
    try:
        for connection in connections:
            assert handshake(connection, "PLAIN").error_code == 0
        for connection in connections:      # the tokens of all, before any answer
            request = SaslAuthenticateRequest(auth_bytes=b"\0alice\0wrong")
            request.with_header(correlation_id=2, client_id="raw")
            connection.send_frame(request.encode(version=2, header=True))
        assert threading.active_count() == threads      # 40 delayed closes wait on the broker's timer
        for connection in connections:
            response = SaslAuthenticateResponse.decode(connection.receive_frame(), version=2, header=True)
            assert response.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert closed_by_peer(connection.sock)
    finally:
        for connection in connections:
            connection.close()
    wait_for(lambda: pool_is_full(broker), "the pool back to full")
    with RawConnection(broker.bootstrap_servers) as connection:     # the others are untouched
        assert handshake(connection, "PLAIN").error_code == 0
        assert authenticate(connection, b"\0alice\0alice-secret").error_code == 0


JAAS_FILE = """KafkaServer {
    org.apache.kafka.common.security.plain.PlainLoginModule required
    user_carol="carol-secret";
};
"""


@pytest.mark.parametrize("how", ["--jaas", "KAFKA_OPTS"])
def test_kmem_broker_takes_a_jaas_file_as_kafka_does(tmp_path, monkeypatch, how):
    """``kmem broker --jaas FILE``, or Kafka's ``KAFKA_OPTS=-Djava.security.auth.login.config=FILE``."""
    from broker_helpers import start_broker_process
    jaas = tmp_path / "kafka_server_jaas.conf"
    jaas.write_text(JAAS_FILE)
    args = ["--override", "listeners=SASL_PLAINTEXT://127.0.0.1:0", "--override", "sasl.enabled.mechanisms=PLAIN"]
    if how == "--jaas":
        args += ["--jaas", str(jaas)]
    else:
        monkeypatch.setenv("KAFKA_OPTS", f"-Xmx1G -Djava.security.auth.login.config={jaas} -Dother=1")
    process, bootstrap = start_broker_process(tmp_path / "logs", *args)
    try:
        with RawConnection(bootstrap) as connection:
            assert handshake(connection, "PLAIN").error_code == 0
            assert authenticate(connection, b"\0carol\0carol-secret").error_code == 0
            assert metadata_works(connection)
        with RawConnection(bootstrap) as connection:
            assert handshake(connection, "PLAIN").error_code == 0
            assert authenticate(connection, b"\0carol\0wrong").error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    finally:
        process.terminate()
        process.wait(30)
    assert "carol-secret" not in "".join(process.log_lines)


def test_kmem_broker_refuses_a_bad_jaas_file_in_one_line_without_the_password(tmp_path, capsys):
    from kmem.cli import main as kmem_main
    jaas = tmp_path / "kafka_server_jaas.conf"
    jaas.write_text(JAAS_FILE.replace('"carol-secret";', '"carol-secret"'))      # the entry never ends
    assert kmem_main(["broker", "--log-dir", str(tmp_path / "logs"), "--port", "0", "--jaas", str(jaas),
                      "--override", "listeners=SASL_PLAINTEXT://127.0.0.1:0",
                      "--override", "sasl.enabled.mechanisms=PLAIN"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"kmem broker: JAAS file {jaas}") and error.count("\n") == 1
    assert "carol-secret" not in error
