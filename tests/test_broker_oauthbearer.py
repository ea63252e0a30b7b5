"""SASL/OAUTHBEARER on a kmem broker's listener, byte by byte (Kafka's OAuthBearerSaslServer, RFC 7628): Kafka's
default unsecured validator and KIP-768's JWKS validator, and every bad token answered as Kafka answers it: the
challenge {"status":"invalid_token"}, then, after the client's ^A, SASL_AUTHENTICATION_FAILED with that JSON and
the close. Tokens are made with PyJWT and cryptography, which nobody here wrote."""
import base64
import hmac
import itertools
import json
import logging
import re
import struct
import threading
import time

import jwt
import pytest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from broker_helpers import RawConnection, wait_for
from network_helpers import closed_by_peer
from oauth_helpers import (JWKS_VALIDATOR, OAUTHBEARER_JAAS, JsonEndpoint, SigningKey, claims_from_now,
                           initial_response, unsecured_token, write_jwks)
from test_broker_sasl import DELAY_SECONDS, authenticate, handshake, metadata_works, pool_is_full
from kmem.broker import Broker
from kmem.broker.security import SaslMechanisms, SaslSettings
from kmem.broker.security.oauthbearer import JwksKeys, parse_client_initial_response
from kmem.errors import ConfigError, InvalidSaslCredentialsError
from kmem.network import SaslChannelBuilder

INVALID_TOKEN = '{"status":"invalid_token"}'
GENERIC_FAILURE = "Authentication failed during authentication due to invalid credentials with SASL mechanism " \
                  "OAUTHBEARER"
ISSUER = "https://issuer.example"
LISTENER = "listener.name.sasl_plaintext."


def oauthbearer_properties(**settings):
    return {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "OAUTHBEARER", **settings}


@pytest.fixture(scope="module")
def unsecured(tmp_path_factory):
    """Kafka's default validator, with no JAAS options at all."""
    with Broker(tmp_path_factory.mktemp("oauth-unsecured"), properties=oauthbearer_properties()) as running:
        yield running


@pytest.fixture(scope="module")
def signing_key():
    return SigningKey("key-1")


@pytest.fixture(scope="module")
def jwks_file(tmp_path_factory, signing_key):
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    write_jwks(path, signing_key)
    return path


@pytest.fixture(scope="module")
def signed(tmp_path_factory, jwks_file):
    """KIP-768's validator, its JWKS from a file: URL, an audience and an issuer expected."""
    properties = oauthbearer_properties(**{
        f"{LISTENER}oauthbearer.sasl.server.callback.handler.class": JWKS_VALIDATOR,
        "sasl.oauthbearer.jwks.endpoint.url": jwks_file.as_uri(),
        "sasl.oauthbearer.expected.audience": "other,kmem",
        "sasl.oauthbearer.expected.issuer": ISSUER})
    with Broker(tmp_path_factory.mktemp("oauth-signed"), properties=properties) as running:
        yield running


def signed_claims(**claims):
    return {"sub": "alice", "aud": "kmem", "iss": ISSUER, **claims}


def authenticates(broker, token, *, expired=False, **extensions):
    """The token authenticates, and the session lasts until its ``exp``: a token already expired (``expired``:
    accepted within the clock skew) gets a session of 0 ms, and its next request closes the connection, as
    Kafka's SaslServerAuthenticator bounds a session by the credential's lifetime (KIP-368)."""
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "OAUTHBEARER").error_code == 0
        response = authenticate(connection, initial_response(token, **extensions))
        if response.error_code != 0 or response.auth_bytes != b"":
            return False
        if expired:
            connection.send_frame(struct.pack(">hhi", 3, 1, 9) + struct.pack(">h", 1) + b"x" + struct.pack(">i", 0))
            return response.session_lifetime_ms == 0 and closed_by_peer(connection.sock)
        return response.session_lifetime_ms > 0 and metadata_works(connection)


def refused_as_kafka_refuses(broker, token, challenge=INVALID_TOKEN):
    """The token is answered with the JSON challenge (no error yet: RFC 7628), the client's ^A with
    SASL_AUTHENTICATION_FAILED and that JSON, then the close after the failed-authentication delay."""
    with RawConnection(broker.bootstrap_servers) as connection:
        assert handshake(connection, "OAUTHBEARER").error_code == 0
        response = authenticate(connection, initial_response(token))
        assert (response.error_code, response.auth_bytes) == (0, challenge.encode())
        started = time.monotonic()
        response = authenticate(connection, b"\x01")
        assert (response.error_code, response.error_message) == (58, challenge)
        assert closed_by_peer(connection.sock)
        assert time.monotonic() - started >= DELAY_SECONDS * 0.9
    return True


# Kafka's default validator: unsigned JWTs

def test_an_unsecured_token_authenticates_its_sub(unsecured, caplog):
    with caplog.at_level(logging.INFO, logger="kmem"):
        assert authenticates(unsecured, unsecured_token(sub="alice"))
    assert "authenticated as User:alice (OAUTHBEARER)" in caplog.text


def test_the_authorization_id_and_extensions(unsecured):
    token = unsecured_token(sub="alice")
    with RawConnection(unsecured.bootstrap_servers) as connection:
        assert handshake(connection, "OAUTHBEARER").error_code == 0
        response = authenticate(connection, initial_response(token, authzid="alice", traceId="abc 123"))
        assert response.error_code == 0 and metadata_works(connection)
    with RawConnection(unsecured.bootstrap_servers) as connection:
        assert handshake(connection, "OAUTHBEARER").error_code == 0
        response = authenticate(connection, initial_response(token, authzid="bob"))
        assert (response.error_code, response.error_message) == (
            58, "Authentication failed: Client requested an authorization id (bob) that is different from the "
                "token's principal name (alice)")
        assert closed_by_peer(connection.sock)


@pytest.mark.parametrize("token", [
    pytest.param(unsecured_token(sub="alice", lifetime_s=-1), id="expired"),
    pytest.param(jwt.encode({"sub": "alice", "iat": int(time.time()) + 600, "exp": int(time.time()) + 3600}, None,
                            algorithm="none"), id="issued-in-the-future"),
    pytest.param(jwt.encode({"sub": "alice", "iat": int(time.time()), "exp": int(time.time()) - 10 ** 9}, None,
                            algorithm="none"), id="expires-before-issued"),
    pytest.param(unsecured_token(), id="no-sub"),
    pytest.param(unsecured_token(sub=" "), id="blank-sub"),
    pytest.param(unsecured_token(sub=42), id="sub-not-a-string"),
    pytest.param(jwt.encode({"sub": "alice"}, None, algorithm="none"), id="no-exp"),
    pytest.param(unsecured_token(sub="alice", exp="tomorrow"), id="exp-not-a-number"),
    pytest.param(SigningKey("k").token(sub="alice"), id="signed"),
    pytest.param(unsecured_token(sub="alice")[:-1] + "..", id="double-dot"),
    pytest.param("e30.e30", id="two-sections"),
    pytest.param("~~~~.e30.", id="garbage-base64"),
    pytest.param("abcde.e30.", id="truncated-base64"),
    pytest.param("bm90IGpzb24.e30.", id="not-json"),
    pytest.param("W10.W10.", id="json-not-an-object"),
    pytest.param(base64.urlsafe_b64encode(b"[" * 100_000).decode().rstrip("=") + ".e30.", id="json-nested-too-deep"),
])
def test_a_bad_unsecured_token_is_refused_as_kafka_refuses_it(unsecured, token):
    assert refused_as_kafka_refuses(unsecured, token)


@pytest.mark.parametrize("message", [
    b"",
    b"n,,\x01\x01",                                             # no auth
    b"n,,\x01auth=Basic abc\x01\x01",                            # not a bearer token
    b"n,,\x01auth=Bearer \x01\x01",                              # an empty token
    b"n,,\x01auth=Bearer a.b.c\x01",                             # no final ^A
    b"p=tls-unique,,\x01auth=Bearer a.b.c\x01\x01",             # channel binding
    b"n,,\x01auth=Bearer a.b.c\x01bad_key=1\x01\x01",            # an extension name outside [A-Za-z]
    "n,,\x01auth=Bearer a.b.c\x01k=caf\u00e9\x01\x01".encode(),  # a value outside printable ASCII
    b"\xff\xfe" * 100,
])
def test_a_malformed_client_message_gets_kafkas_generic_failure(unsecured, message):
    with RawConnection(unsecured.bootstrap_servers) as connection:
        assert handshake(connection, "OAUTHBEARER").error_code == 0
        response = authenticate(connection, message)
        assert (response.error_code, response.error_message) == (58, GENERIC_FAILURE)
        assert closed_by_peer(connection.sock)


def test_the_authorization_id_is_read_with_kafkas_grammar():
    """kmem writes Kafka's saslname, (?:[\\x01-\\x7F&&[^=,]]|=2C|=3D)+, unrolled: the same names are read."""
    kafkas = re.compile(r"n,(?:a=(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+)?,\x01auth=Bearer t\x01\x01")
    for length in range(5):
        for name in map("".join, itertools.product(["a", "=", "2", "C", "3", "D", ",", "\x01", "\x80"],
                                                   repeat=length)):
            message = f"n,a={name},\x01auth=Bearer t\x01\x01"
            try:
                parse_client_initial_response(message.encode())
                read = True
            except InvalidSaslCredentialsError:
                read = False
            assert read == bool(kafkas.fullmatch(message)), repr(name)


def test_after_a_v0_handshake_the_challenge_is_raw_and_the_failure_closes(unsecured):
    with RawConnection(unsecured.bootstrap_servers) as connection:
        assert handshake(connection, "OAUTHBEARER", version=0).error_code == 0
        connection.send_frame(initial_response(unsecured_token(sub="alice", lifetime_s=-1)))
        assert connection.receive_frame() == INVALID_TOKEN.encode()
        connection.send_frame(b"\x01")
        assert connection.receive_frame() is None
    with RawConnection(unsecured.bootstrap_servers) as connection:
        assert handshake(connection, "OAUTHBEARER", version=0).error_code == 0
        connection.send_frame(initial_response(unsecured_token(sub="alice")))
        assert connection.receive_frame() == b""
        assert metadata_works(connection)


def test_a_token_over_the_max_receive_size_closes_and_gives_the_memory_back(unsecured):
    with RawConnection(unsecured.bootstrap_servers) as connection:
        assert handshake(connection, "OAUTHBEARER", version=0).error_code == 0
        connection.sock.sendall(struct.pack(">i", 524288 + 1) + b"n,,\x01auth=Bearer ")
        assert closed_by_peer(connection.sock)
    wait_for(lambda: pool_is_full(unsecured), "the pool memory back")


def test_the_unsecured_validators_jaas_options(tmp_path):
    jaas = OAUTHBEARER_JAAS.format(options=' unsecuredValidatorPrincipalClaimName="client_id" '
                                           'unsecuredValidatorRequiredScope="kafka write" '
                                           'unsecuredValidatorAllowableClockSkewMs="60000"')
    properties = oauthbearer_properties(**{f"{LISTENER}oauthbearer.sasl.jaas.config": jaas})
    now = int(time.time())
    with Broker(tmp_path, properties=properties) as broker:
        # expired 30 s ago: within the minute of skew
        assert authenticates(broker, unsecured_token(client_id="svc", scope=["kafka", "write"], iat=now - 100,
                                                     exp=now - 30), expired=True)
        assert authenticates(broker, unsecured_token(client_id="svc", scope=["write", "kafka", "read"]))
        assert refused_as_kafka_refuses(broker, unsecured_token(client_id="svc", scope="kafka"),
                                        '{"status":"insufficient_scope", "scope":"[kafka, write]"}')
        assert refused_as_kafka_refuses(broker, unsecured_token(sub="svc", scope=["kafka", "write"]))
        assert refused_as_kafka_refuses(broker, unsecured_token(client_id="svc", scope=["kafka", "write"],
                                                                iat=now - 100, exp=now - 90))


def test_the_credential_expiry_is_on_the_authenticator(unsecured):
    """For re-authentication (KIP-368): the token's exp, in epoch ms."""
    settings = SaslSettings.from_settings(oauthbearer_properties(), "SASL_PLAINTEXT")
    authenticator = SaslChannelBuilder(SaslMechanisms(settings, None), api_versions=None).authenticator("c")
    for request, version in ((SaslHandshakeRequest(mechanism="OAUTHBEARER"), 1),
                             (SaslAuthenticateRequest(auth_bytes=initial_response(unsecured_token(
                                 sub="alice", exp=2_000_000_000.5))), 2)):
        request.with_header(correlation_id=1, client_id="c")
        authenticator.handle(request.encode(version=version, header=True))
    assert authenticator.complete and authenticator.principal == "User:alice"
    assert authenticator.credential_expiry_ms == 2_000_000_000_500


# KIP-768's validator: signed JWTs and a JWKS

def test_a_signed_token_authenticates_its_sub(signed, signing_key):
    assert authenticates(signed, signing_key.token(**signed_claims()))


def test_an_expired_token_within_the_clock_skew_is_still_valid(signed, signing_key):
    """sasl.oauthbearer.clock.skew.seconds: 30 by default."""
    assert authenticates(signed, signing_key.token(**signed_claims(iat=int(time.time()) - 100,
                                                                   exp=int(time.time()) - 10)), expired=True)


@pytest.mark.parametrize("bad", ["expired", "not-yet-valid", "wrong-audience", "no-audience", "wrong-issuer",
                                 "bad-signature", "alg-none", "hmac-with-the-public-key", "no-exp", "no-iat",
                                 "no-sub", "sub-not-a-string", "tampered-claims", "garbage", "one-section",
                                 "long-kid"])
def test_a_bad_signed_token_is_refused_as_kafka_refuses_it(signed, signing_key, bad):
    now = int(time.time())
    impostor = SigningKey(signing_key.kid)
    good = signing_key.token(**signed_claims())
    header, claims, signature = good.split(".")
    tokens = {
        "expired": signing_key.token(**signed_claims(iat=now - 200, exp=now - 60)),
        "not-yet-valid": signing_key.token(**signed_claims(nbf=now + 120)),
        "wrong-audience": signing_key.token(**signed_claims(aud="someone-else")),
        "no-audience": signing_key.token(sub="alice", iss=ISSUER),
        "wrong-issuer": signing_key.token(**signed_claims(iss="https://evil.example")),
        "bad-signature": impostor.token(**signed_claims()),
        "alg-none": jwt.encode(claims_from_now(**signed_claims()), None, algorithm="none"),
        "hmac-with-the-public-key": hmac_signed_with_the_public_key(signing_key),
        "no-exp": jwt.encode({**signed_claims(), "iat": now}, signing_key.private_key, algorithm="RS256",
                             headers={"kid": signing_key.kid}),
        "no-iat": jwt.encode({**signed_claims(), "exp": now + 60}, signing_key.private_key, algorithm="RS256",
                             headers={"kid": signing_key.kid}),
        "no-sub": signing_key.token(aud="kmem", iss=ISSUER),
        "sub-not-a-string": signing_key.token(**signed_claims(sub=7)),
        "tampered-claims": f"{header}.{unsecured_token(**signed_claims(sub='root')).split('.')[1]}.{signature}",
        "garbage": "a.b.c",
        "one-section": "abc",
        "long-kid": signing_key.token(kid="k" * 5000, **signed_claims()),
    }
    assert refused_as_kafka_refuses(signed, tokens[bad])


def hmac_signed_with_the_public_key(signing_key):
    """Algorithm confusion: HS256 with the RSA public key's JWK as the secret (PyJWT refuses to make one)."""
    signing_input = ".".join(base64url(json.dumps(part).encode()) for part in (
        {"alg": "HS256", "kid": signing_key.kid}, claims_from_now(**signed_claims())))
    secret = json.dumps(signing_key.jwk()).encode()
    return f"{signing_input}.{base64url(hmac.new(secret, signing_input.encode(), 'sha256').digest())}"


def base64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_missing_kid_is_refused_at_once_and_fetches_the_jwks_again(signed, signing_key, jwks_file):
    """Kafka's RefreshingHttpsJwks: an unknown key id gets invalid_token without waiting, and asks for a refresh
    (sasl.oauthbearer.jwks.endpoint.refresh.ms is an hour here), so a rotated key is soon accepted."""
    rotated = SigningKey("key-2")
    write_jwks(jwks_file, signing_key, rotated)
    token = rotated.token(**signed_claims())
    assert refused_as_kafka_refuses(signed, token)
    wait_for(lambda: authenticates(signed, token), "the rotated key accepted")
    assert authenticates(signed, signing_key.token(**signed_claims()))


def test_a_jwks_holding_a_private_key_verifies_with_its_public_part(tmp_path, signing_key):
    private = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.private_key))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**private, "kid": signing_key.kid}]}))
    properties = oauthbearer_properties(**{"sasl.server.callback.handler.class": JWKS_VALIDATOR,
                                           "sasl.oauthbearer.jwks.endpoint.url": (tmp_path / "jwks.json").as_uri()})
    with Broker(tmp_path / "logs", properties=properties) as broker:
        assert authenticates(broker, signing_key.token(sub="alice"))
        assert refused_as_kafka_refuses(broker, SigningKey(signing_key.kid).token(sub="alice"))


def test_a_jwks_key_without_kid_use_or_alg_verifies_any_token_of_its_type(tmp_path, signing_key):
    """As jose4j's VerificationJwkSelector selects keys for Kafka's validator."""
    bare = {name: value for name, value in signing_key.jwk().items() if name not in ("kid", "use", "alg")}
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**bare, "use": "enc"}, bare]}))
    keys = JwksKeys((tmp_path / "jwks.json").as_uri()).start()
    try:
        assert keys.key("any", "RS256") is not None and keys.key("any", "PS384") is not None
        assert keys.key("any", "ES256") is None
    finally:
        keys.close()


def test_a_missing_kid_asks_for_a_refresh_at_most_once_a_minute(tmp_path, signing_key):
    keys = JwksKeys(write_jwks(tmp_path / "jwks.json", signing_key)).start()
    try:
        assert keys.key(signing_key.kid, "RS256") is not None and keys.key(signing_key.kid, "ES256") is None
        assert keys.key(None, "RS256") is not None and keys.key("other", "RS256") is None
        assert keys.expedite_refresh("unknown") and not keys.expedite_refresh("unknown")
        assert not keys.expedite_refresh("k" * 1001)         # garbage: never asks, never remembered
        for i in range(16):
            assert keys.expedite_refresh(f"other-{i}")
        assert keys.expedite_refresh("unknown")             # forgotten: 16 ids are remembered
    finally:
        keys.close()


def test_the_jwks_is_read_every_refresh_ms_and_a_failed_read_keeps_the_keys(signing_key):
    answers = [{"keys": [signing_key.jwk()]}]
    endpoint = JsonEndpoint(lambda: answers[-1]).start()
    keys = JwksKeys(endpoint.url, refresh_ms=50, retry_backoff_ms=10, retry_backoff_max_ms=20).start()
    try:
        wait_for(lambda: endpoint.requests >= 3, "the JWKS read again")
        answers.append(["not", "a", "jwks"])
        requests = endpoint.requests
        wait_for(lambda: endpoint.requests >= requests + 6, "failed reads retried, then read again")
        assert keys.key(signing_key.kid, "RS256") is not None
        rotated = SigningKey("key-2")
        answers.append({"keys": [rotated.jwk()]})
        wait_for(lambda: keys.key("key-2", "RS256") is not None, "the new JWKS")
        assert keys.key(signing_key.kid, "RS256") is None
    finally:
        keys.close()
        endpoint.close()


def test_a_jwks_over_http_and_a_refresh_that_hangs_stalls_no_client(tmp_path, signing_key):
    jwks = {"keys": [signing_key.jwk()]}
    server = JsonEndpoint(lambda: jwks).start()
    properties = oauthbearer_properties(**{
        "sasl.server.callback.handler.class": JWKS_VALIDATOR, "sasl.oauthbearer.jwks.endpoint.url": server.url,
        "sasl.oauthbearer.jwks.endpoint.refresh.ms": "3600000"})
    try:
        with Broker(tmp_path, properties=properties) as broker:
            assert authenticates(broker, signing_key.token(sub="alice"))
            server.held.clear()         # the JWKS endpoint stops answering
            rotated = SigningKey("key-2")
            started = time.monotonic()
            assert refused_as_kafka_refuses(broker, rotated.token(sub="alice"))
            wait_for(lambda: server.requests == 2, "the refresh the missing kid asked for")
            assert authenticates(broker, signing_key.token(sub="alice"))
            assert time.monotonic() - started < 5       # nothing waited for the hanging endpoint
            jwks["keys"].append(rotated.jwk())
            server.held.set()
            wait_for(lambda: authenticates(broker, rotated.token(sub="alice")), "the rotated key accepted")
    finally:
        server.close()


def jwks_threads():
    return sum(thread.name == "kmem-oauthbearer-jwks" for thread in threading.enumerate())


def test_the_jwks_refresh_ends_with_the_broker_and_with_a_failed_start(tmp_path, jwks_file):
    properties = oauthbearer_properties(**{"sasl.server.callback.handler.class": JWKS_VALIDATOR,
                                           "sasl.oauthbearer.jwks.endpoint.url": jwks_file.as_uri()})
    before = jwks_threads()
    with Broker(tmp_path / "a", properties=properties) as broker:
        assert jwks_threads() == before + 1
        # the same port again: the listener cannot bind, and the start undoes itself
        host, port = broker.server.address
        with pytest.raises(OSError):
            Broker(tmp_path / "b", port=port, properties=properties).start()
        assert jwks_threads() == before + 1
    assert jwks_threads() == before


@pytest.mark.parametrize("settings, message", [
    ({"sasl.server.callback.handler.class": "com.example.MyHandler"}, "com.example.MyHandler"),
    ({"sasl.server.callback.handler.class": JWKS_VALIDATOR}, "sasl.oauthbearer.jwks.endpoint.url"),
    ({"sasl.server.callback.handler.class": JWKS_VALIDATOR, "sasl.oauthbearer.jwks.endpoint.url": "ftp://x/jwks"},
     "ftp://x/jwks"),
    ({"sasl.server.callback.handler.class": JWKS_VALIDATOR, "sasl.oauthbearer.jwks.endpoint.url": "file:/nowhere",
      "sasl.oauthbearer.jwks.endpoint.refresh.ms": "0"}, "sasl.oauthbearer.jwks.endpoint.refresh.ms"),
    ({"sasl.server.callback.handler.class": JWKS_VALIDATOR, "sasl.oauthbearer.jwks.endpoint.url": "file:/x",
      "sasl.oauthbearer.clock.skew.seconds": "-1"}, "sasl.oauthbearer.clock.skew.seconds"),
    ({"sasl.jaas.config": OAUTHBEARER_JAAS.format(options=' unsecuredValidatorAllowableClockSkewMs="-5"')},
     "unsecuredValidatorAllowableClockSkewMs"),
    ({"sasl.jaas.config": OAUTHBEARER_JAAS.format(options=' unsecuredValidatorRequiredScope="a\\"b"')},
     "unsecuredValidatorRequiredScope"),
])
def test_a_bad_oauthbearer_setting_is_refused_at_start(tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        Broker(tmp_path, properties=oauthbearer_properties(**settings)).start()


@pytest.mark.parametrize("url", ["file:/nowhere/jwks.json", "http://127.0.0.1:9/jwks"])
def test_a_jwks_that_cannot_be_read_is_refused_at_start(tmp_path, url):
    properties = oauthbearer_properties(**{"sasl.server.callback.handler.class": JWKS_VALIDATOR,
                                           "sasl.oauthbearer.jwks.endpoint.url": url})
    with pytest.raises(ConfigError, match="cannot read its JWKS"):
        Broker(tmp_path / "logs", properties=properties).start()
    (tmp_path / "bad.json").write_text('{"keys": "none"}')
    properties["sasl.oauthbearer.jwks.endpoint.url"] = (tmp_path / "bad.json").as_uri()
    with pytest.raises(ConfigError, match="not a JWKS"):
        Broker(tmp_path / "logs2", properties=properties).start()
