"""Re-authentication (KIP-368) on a kmem broker's SASL listener, byte by byte: ``connections.max.reauth.ms`` gives
each session a lifetime; a client that re-authenticates in time keeps its connection, one past its session is closed
at its next request, and a re-authentication as someone else, or with another mechanism, is refused as Kafka's
SaslServerAuthenticator refuses it."""
import time

import pytest
from kafka.net.sasl.scram import ScramClient
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

from broker_helpers import RawConnection, produce_raw, wait_for
from network_helpers import closed_by_peer
from test_broker_sasl import SASL_PROPERTIES, add_scram_users, authenticate, handshake, metadata_works, pool_is_full
from kmem.broker import Broker
from kmem.broker.codes import ErrorCode
from kmem.broker.security import SaslSettings
from kmem.broker.security.plain import PlainServer
from kmem.errors import ConfigError
from kmem.network import SaslChannelBuilder
from kmem.records import RecordsBuilder

REAUTH_MS = 1000
PLAIN_ALICE = b"\0alice\0alice-secret"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("sasl-reauth")
    add_scram_users(log_dir)
    with Broker(log_dir, properties={**SASL_PROPERTIES, "connections.max.reauth.ms": REAUTH_MS}) as running:
        running.logs.create_topic("reauth", 1)
        yield running


def counts(broker):
    return broker.server.metrics()


def plain_login(connection, token=PLAIN_ALICE, version=2):
    assert handshake(connection, "PLAIN").error_code == 0
    response = authenticate(connection, token, version)
    assert response.error_code == 0
    return response


def sleep_past(session_began, lifetime_ms):
    """Let a session run out: its end is the thing under test, not an event to wait for."""
    time.sleep(max(0.0, session_began + lifetime_ms / 1000 + 0.05 - time.monotonic()))


def a_batch():
    builder = RecordsBuilder(2, "none")
    builder.append(b"record", timestamp=int(time.time() * 1000))
    return builder.build()


def send_produce(connection):
    data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=a_batch())
    request = ProduceRequest(acks=-1, timeout_ms=1000,
                             topic_data=[ProduceRequest.TopicProduceData(name="reauth", partition_data=[data])])
    request.with_header(correlation_id=7, client_id="raw")
    connection.send_frame(request.encode(version=9, header=True))


def test_the_session_lifetime_is_connections_max_reauth_ms(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        assert plain_login(connection).session_lifetime_ms == REAUTH_MS


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_a_client_that_re_authenticates_in_time_keeps_its_connection(broker, mechanism):
    def login(connection):
        if mechanism == "PLAIN":
            return plain_login(connection)
        assert handshake(connection, mechanism).error_code == 0
        client = ScramClient("alice", "alice-secret", mechanism)
        first = authenticate(connection, client.first_message())
        client.process_server_first_message(first.auth_bytes)
        final = authenticate(connection, client.final_message())
        assert final.error_code == 0
        client.process_server_final_message(final.auth_bytes)
        return final

    before = counts(broker)["successful-reauthentication-total"]
    with RawConnection(broker.bootstrap_servers) as connection:
        first_began = time.monotonic()
        login(connection)
        sleep_past(first_began, REAUTH_MS * 0.6)
        began = time.monotonic()
        assert login(connection).session_lifetime_ms == REAUTH_MS       # a new session...
        sleep_past(first_began, REAUTH_MS)
        assert time.monotonic() - began < REAUTH_MS / 1000
        assert produce_raw(connection, "reauth", a_batch()).error_code == 0     # ...past the first one's end
    assert counts(broker)["successful-reauthentication-total"] == before + 1


def test_a_session_past_its_lifetime_is_closed_at_its_next_request(broker):
    before = counts(broker)["expired-connections-killed-count"]
    end_offset = broker.logs.get_partition("reauth", 0).log_end_offset
    with RawConnection(broker.bootstrap_servers) as connection:
        began = time.monotonic()
        lifetime_ms = plain_login(connection).session_lifetime_ms
        assert metadata_works(connection)
        sleep_past(began, lifetime_ms)
        send_produce(connection)
        assert connection.receive_frame() is None
    assert counts(broker)["expired-connections-killed-count"] == before + 1
    assert broker.logs.get_partition("reauth", 0).log_end_offset == end_offset       # nothing of the request was done
    wait_for(lambda: pool_is_full(broker), "the pool back to full")


def test_a_session_may_re_authenticate_after_its_end_before_any_other_request(broker):
    """Kafka's SocketServer begins a re-authentication before it looks at the session's end."""
    with RawConnection(broker.bootstrap_servers) as connection:
        began = time.monotonic()
        plain_login(connection)
        sleep_past(began, REAUTH_MS)
        plain_login(connection)
        assert metadata_works(connection)


def test_re_authentication_as_another_user_is_refused(broker):
    before = counts(broker)["failed-reauthentication-total"]
    with RawConnection(broker.bootstrap_servers) as connection:
        plain_login(connection)
        assert handshake(connection, "PLAIN").error_code == 0
        response = authenticate(connection, b"\0bob\0bob-secret")
        assert (response.error_code, response.error_message) == (
            ErrorCode.SASL_AUTHENTICATION_FAILED, "Cannot change principals during re-authentication from User.alice: "
                                                  "User.bob")
        assert closed_by_peer(connection.sock)
    assert counts(broker)["failed-reauthentication-total"] == before + 1


def test_re_authentication_with_a_wrong_password_names_re_authentication(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "SCRAM-SHA-256").error_code == 0
        client = ScramClient("alice", "alice-secret", "SCRAM-SHA-256")
        client.process_server_first_message(authenticate(connection, client.first_message()).auth_bytes)
        assert authenticate(connection, client.final_message()).error_code == 0
        assert handshake(connection, "SCRAM-SHA-256").error_code == 0
        client = ScramClient("alice", "wrong", "SCRAM-SHA-256")
        client.process_server_first_message(authenticate(connection, client.first_message()).auth_bytes)
        response = authenticate(connection, client.final_message())
        assert response.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert response.error_message == ("Authentication failed during re-authentication due to invalid credentials "
                                          "with SASL mechanism SCRAM-SHA-256")
        assert closed_by_peer(connection.sock)


def test_re_authentication_with_another_mechanism_fails_at_its_first_token_unanswered(broker):
    """Kafka's REAUTH_BAD_MECHANISM: the handshake is answered (the mechanism is enabled), its first token is not."""
    with RawConnection(broker.bootstrap_servers) as connection:
        plain_login(connection)
        assert handshake(connection, "SCRAM-SHA-256").error_code == 0
        request_token = ScramClient("alice", "alice-secret", "SCRAM-SHA-256").first_message()
        request = SaslAuthenticateRequest(auth_bytes=request_token)
        request.with_header(correlation_id=3, client_id="raw")
        connection.send_frame(request.encode(version=2, header=True))
        assert connection.receive_frame() is None


def test_a_second_handshake_within_a_second_of_the_last_re_authentication_is_an_illegal_state(broker):
    """Kafka's KafkaChannel re-authenticates at most once a second: a handshake sooner is an ordinary request."""
    with RawConnection(broker.bootstrap_servers) as connection:
        plain_login(connection)
        plain_login(connection)
        assert handshake(connection, "PLAIN").error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert metadata_works(connection)


def test_a_request_pipelined_behind_the_re_authentication_handshake_ends_the_connection(broker):
    """While re-authenticating Kafka reads only the exchange's frames: another request there is an illegal state
    that closes the connection (after the responses already due: the handshake's)."""
    with RawConnection(broker.bootstrap_servers) as connection:
        plain_login(connection)
        request = SaslHandshakeRequest(mechanism="PLAIN")
        request.with_header(correlation_id=4, client_id="raw")
        connection.send_frame(request.encode(version=1, header=True))
        send_produce(connection)
        response = SaslHandshakeResponse.decode(connection.receive_frame(), version=1, header=True)
        assert response.error_code == 0
        assert closed_by_peer(connection.sock)


def test_a_response_in_flight_is_sent_before_the_re_authentication_pipelined_behind_it(broker):
    """The Java client may begin re-authenticating while a fetch waits on the broker: the fetch's answer comes first,
    then the handshake's (a connection's next request is read once its response is sent)."""
    with RawConnection(broker.bootstrap_servers) as connection:
        plain_login(connection)
        end = broker.logs.get_partition("reauth", 0).log_end_offset
        partition = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=end, partition_max_bytes=1 << 20)
        fetch = FetchRequest(replica_id=-1, max_wait_ms=300, min_bytes=1, max_bytes=1 << 20,
                             topics=[FetchRequest.FetchTopic(topic="reauth", partitions=[partition])])
        fetch.with_header(correlation_id=11, client_id="raw")
        connection.send_frame(fetch.encode(version=4, header=True))
        handshake_request = SaslHandshakeRequest(mechanism="PLAIN")
        handshake_request.with_header(correlation_id=12, client_id="raw")
        connection.send_frame(handshake_request.encode(version=1, header=True))
        fetched = FetchResponse.decode(connection.receive_frame(), version=4, header=True)
        assert fetched.responses[0].partitions[0].error_code == 0
        response = SaslHandshakeResponse.decode(connection.receive_frame(), version=1, header=True)
        assert response.error_code == 0
        assert authenticate(connection, PLAIN_ALICE).error_code == 0
        assert metadata_works(connection)


def test_a_sasl_authenticate_v0_client_gets_no_lifetime_and_is_closed_past_its_session(broker):
    """SaslAuthenticate v0 cannot tell the lifetime; Kafka still ends the session (the client reconnects), and
    counts the client in successful-authentication-no-reauth-total."""
    before = counts(broker)["successful-authentication-no-reauth-total"]
    with RawConnection(broker.bootstrap_servers) as connection:
        began = time.monotonic()
        plain_login(connection, version=0)
        assert metadata_works(connection)
        sleep_past(began, REAUTH_MS)
        send_produce(connection)
        assert connection.receive_frame() is None
    assert counts(broker)["successful-authentication-no-reauth-total"] == before + 1


def test_without_connections_max_reauth_ms_sessions_never_end(tmp_path):
    with Broker(tmp_path, properties=SASL_PROPERTIES) as plain_broker, \
            RawConnection(plain_broker.bootstrap_servers) as connection:
        assert plain_login(connection).session_lifetime_ms == 0
        assert handshake(connection, "PLAIN").error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert plain_broker.server.metrics()["successful-authentication-total"] == 1


def test_connections_max_reauth_ms_per_listener_and_per_mechanism():
    merged = {**SASL_PROPERTIES, "connections.max.reauth.ms": "5000",
              "listener.name.sasl_plaintext.connections.max.reauth.ms": "4000",
              "listener.name.sasl_plaintext.scram-sha-512.connections.max.reauth.ms": "3000"}
    settings = SaslSettings.from_settings(merged, "SASL_PLAINTEXT")
    assert settings.max_reauth_ms == {"PLAIN": 4000, "SCRAM-SHA-256": 4000, "SCRAM-SHA-512": 3000}
    assert SaslSettings.from_settings(SASL_PROPERTIES, "SASL_PLAINTEXT").max_reauth_ms["PLAIN"] == 0
    with pytest.raises(ConfigError, match="connections.max.reauth.ms"):
        SaslSettings.from_settings({**SASL_PROPERTIES, "connections.max.reauth.ms": "soon"}, "SASL_PLAINTEXT")


def test_a_credential_expiry_bounds_the_session():
    """A mechanism server reporting ``credential_expiry_ms`` (OAUTHBEARER's token ``exp``) shortens the session."""
    class ExpiringPlain(PlainServer):
        credential_expiry_ms = time.time() * 1000 + 400

    class Mechanisms:
        enabled = ["PLAIN"]

        @staticmethod
        def server(mechanism):
            return ExpiringPlain({"alice": "alice-secret"})

    authenticator = SaslChannelBuilder(Mechanisms(), None, connections_max_reauth_ms={"PLAIN": 60_000}) \
        .authenticator("x")
    request = SaslHandshakeRequest(mechanism="PLAIN")
    request.with_header(correlation_id=1, client_id="raw")
    authenticator.handle(request.encode(version=1, header=True))
    request = SaslAuthenticateRequest(auth_bytes=PLAIN_ALICE)
    request.with_header(correlation_id=2, client_id="raw")
    response, _ = authenticator.handle(request.encode(version=2, header=True))
    lifetime = SaslAuthenticateResponse.decode(response, version=2, header=True).session_lifetime_ms
    assert 0 < lifetime <= 400
    assert not authenticator.session_expired(time.monotonic())
    assert authenticator.session_expired(time.monotonic() + 0.5)
