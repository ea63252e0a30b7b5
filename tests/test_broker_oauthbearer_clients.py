"""confluent-kafka (librdkafka), Apache's Java client 3.9.1, kafka-python and aiokafka over SASL_PLAINTEXT with
OAUTHBEARER: with Kafka's default unsecured validator (each client's own unsecured token) and with KIP-768's JWKS
validator (signed tokens: confluent-kafka's oauth_cb, the Python clients' token providers, and a token endpoint
for librdkafka's OIDC client and the Java client's OAuthBearerLoginCallbackHandler). Each produces and consumes
in a group; librdkafka and the Java client are refused a bad token with the error their own API reports."""
import uuid

import jwt
import pytest

from broker_helpers import wait_for
from java_probes import KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256, client_properties, start_probe, wheel_jar
from oauth_helpers import JWKS_VALIDATOR, OAUTHBEARER_JAAS, JsonEndpoint, SigningKey, write_jwks
from test_broker_sasl_clients import RECORDS, ROUND_TRIPS, round_trip_confluent
from kmem.broker import Broker

INVALID_TOKEN = '{"status":"invalid_token"}'
JAVA_RUNTIME_JARS = ("slf4j-api.jar", "jackson-databind.jar", "jackson-core.jar", "jackson-annotations.jar")
JAVA_LOGIN_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"


def broker_properties(**settings):
    return {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "OAUTHBEARER",
            "group.initial.rebalance.delay.ms": 0, **settings}


@pytest.fixture(scope="module")
def unsecured(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("oauth-unsecured"), properties=broker_properties()) as running:
        yield running


@pytest.fixture(scope="module")
def signing_key():
    return SigningKey("kmem-test")


@pytest.fixture(scope="module")
def signed(tmp_path_factory, signing_key):
    url = write_jwks(tmp_path_factory.mktemp("jwks") / "jwks.json", signing_key)
    properties = broker_properties(**{
        "listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class": JWKS_VALIDATOR,
        "listener.name.sasl_plaintext.oauthbearer.sasl.oauthbearer.jwks.endpoint.url": url,
        "sasl.oauthbearer.expected.audience": "kmem"})
    with Broker(tmp_path_factory.mktemp("oauth-signed"), properties=properties) as running:
        yield running


def signed_token_callback(key, subject="alice"):
    """confluent-kafka's oauth_cb: (token, expiry in epoch seconds, principal) for a token ``key`` signs."""
    def oauth_cb(config):
        token = key.token(sub=subject, aud="kmem")
        return token, jwt_expiry(token), subject
    return oauth_cb


def jwt_expiry(token):
    return jwt.decode(token, options={"verify_signature": False})["exp"]


def confluent_refused(bootstrap, config):
    """The error librdkafka reports to its error_cb when its token is refused."""
    from confluent_kafka import Producer
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "error_cb": errors.append, **config})
    producer.produce("refused", b"x")
    wait_for(lambda: producer.poll(0.1) is not None and errors, "librdkafka's error callback")
    producer.purge()
    return errors[0]


@pytest.fixture
def token_endpoint(signing_key):
    """An OAuth token endpoint (client_credentials): each POST gets a new token signed by ``endpoint.key``."""
    def token():
        access_token = endpoint.key.token(sub="alice", aud="kmem")
        return {"access_token": access_token, "token_type": "Bearer", "expires_in": 3600}
    endpoint = JsonEndpoint(token)
    endpoint.key = signing_key
    yield endpoint.start()
    endpoint.close()


# confluent-kafka

UNSECURED_CONFIG = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                    "enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": "principal=alice"}


def test_confluent_kafka_with_its_unsecured_token(unsecured):
    topic = f"unsecured-{uuid.uuid4().hex[:6]}"
    seen = round_trip_confluent(unsecured.bootstrap_servers, topic, UNSECURED_CONFIG)
    assert sorted(seen) == [b"%d" % i for i in range(RECORDS)]


def test_confluent_kafka_refused_an_unsecured_token_without_sub(unsecured):
    """librdkafka's token names its principal in a claim the broker does not read."""
    from confluent_kafka import KafkaError
    error = confluent_refused(unsecured.bootstrap_servers,
                              {**UNSECURED_CONFIG, "sasl.oauthbearer.config": "principal=alice principalClaimName=azp"})
    assert error.code() == KafkaError._AUTHENTICATION and INVALID_TOKEN in error.str()


def test_confluent_kafka_with_signed_tokens_from_oauth_cb(signed, signing_key):
    topic = f"signed-{uuid.uuid4().hex[:6]}"
    config = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
              "oauth_cb": signed_token_callback(signing_key)}
    seen = round_trip_confluent(signed.bootstrap_servers, topic, config)
    assert sorted(seen) == [b"%d" % i for i in range(RECORDS)]


def test_confluent_kafka_refused_a_token_signed_by_another_key(signed, signing_key):
    from confluent_kafka import KafkaError
    impostor = SigningKey(signing_key.kid)
    error = confluent_refused(signed.bootstrap_servers, {"security.protocol": "SASL_PLAINTEXT",
                                                         "sasl.mechanism": "OAUTHBEARER",
                                                         "oauth_cb": signed_token_callback(impostor)})
    assert error.code() == KafkaError._AUTHENTICATION and INVALID_TOKEN in error.str()


def test_confluent_kafka_with_tokens_from_a_token_endpoint(signed, token_endpoint):
    """librdkafka's own OIDC client (sasl.oauthbearer.method=oidc): client credentials at the token endpoint."""
    topic = f"oidc-{uuid.uuid4().hex[:6]}"
    config = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
              "sasl.oauthbearer.client.id": "kmem-test", "sasl.oauthbearer.client.secret": "not-checked",
              "sasl.oauthbearer.token.endpoint.url": token_endpoint.url + "token"}
    seen = round_trip_confluent(signed.bootstrap_servers, topic, config)
    assert sorted(seen) == [b"%d" % i for i in range(RECORDS)]
    assert token_endpoint.requests >= 1


# kafka-python and aiokafka: a token provider of their own each

def python_clients_config(client, key):
    """kafka-python's or aiokafka's settings, with a token provider signing with ``key``."""
    if client == "kafka-python":
        from kafka.net.sasl.oauth import AbstractTokenProvider

        class Provider(AbstractTokenProvider):
            def token(self):
                return key.token(sub="alice", aud="kmem")
    else:
        from aiokafka.abc import AbstractTokenProvider

        class Provider(AbstractTokenProvider):
            async def token(self):
                return key.token(sub="alice", aud="kmem")
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauth_token_provider": Provider()}


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_python_clients_with_signed_tokens_from_their_token_provider(signed, signing_key, client):
    topic = f"{client}-signed-{uuid.uuid4().hex[:6]}"
    seen = ROUND_TRIPS[client][0](signed.bootstrap_servers, topic, python_clients_config(client, signing_key))
    assert sorted(seen) == [b"%d" % i for i in range(RECORDS)]


# Apache's Java client 3.9.1

@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    # the Java client parses JWTs with Jackson (its unsecured login and the token endpoint's answers)
    classpath = [wheel_jar(KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256), *map(wheel_jar, JAVA_RUNTIME_JARS)]
    running = start_probe(tmp_path_factory.mktemp("java-oauth-probe"), "KafkaClientProbe.java", classpath)
    yield running
    running.close()


def java_client(path, bootstrap, **settings):
    """The probe's BOOTSTRAP for an OAUTHBEARER client over SASL_PLAINTEXT with ``settings``."""
    return client_properties(path, bootstrap, **{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                                                 **settings})


def java_round_trip(probe, client):
    topic = f"java-{uuid.uuid4().hex[:6]}"
    assert probe("produce", client, topic, "none", RECORDS) == {"offsets": list(range(RECORDS))}
    assert probe("group-read", client, topic, topic, RECORDS) == {"values": [f"none-{i}" for i in range(RECORDS)]}


def test_java_client_with_its_unsecured_login(unsecured, probe, tmp_path):
    jaas = OAUTHBEARER_JAAS.format(options=' unsecuredLoginStringClaim_sub="alice"')
    java_round_trip(probe, java_client(tmp_path / "client.properties", unsecured.bootstrap_servers,
                                       **{"sasl.jaas.config": jaas}))


def test_java_client_refused_an_unsecured_token_without_the_broker_s_scope(tmp_path, probe):
    jaas = OAUTHBEARER_JAAS.format(options=' unsecuredValidatorRequiredScope="kafka"')
    properties = broker_properties(**{"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": jaas})
    with Broker(tmp_path / "logs", properties=properties) as broker:
        client = java_client(tmp_path / "client.properties", broker.bootstrap_servers, **{
            "sasl.jaas.config": OAUTHBEARER_JAAS.format(options=' unsecuredLoginStringClaim_sub="alice"'),
            "max.block.ms": 5000})
        answer = probe("produce", client, "refused", "none", 1)
    assert answer["error"] == "SaslAuthenticationException"
    assert '{"status":"insufficient_scope", "scope":"[kafka]"}' in answer["message"]


def signed_java_client(path, bootstrap, token_endpoint):
    return java_client(path, bootstrap, **{
        "sasl.login.callback.handler.class": JAVA_LOGIN_HANDLER,
        "sasl.oauthbearer.token.endpoint.url": token_endpoint.url + "token",
        "sasl.jaas.config": OAUTHBEARER_JAAS.format(options=' clientId="kmem-test" clientSecret="not-checked"'),
        "max.block.ms": 5000})


def test_java_client_with_tokens_from_a_token_endpoint(signed, probe, tmp_path, token_endpoint):
    java_round_trip(probe, signed_java_client(tmp_path / "client.properties", signed.bootstrap_servers,
                                              token_endpoint))
    assert token_endpoint.requests >= 1


def test_java_client_refused_a_token_signed_by_another_key(signed, signing_key, probe, tmp_path, token_endpoint):
    token_endpoint.key = SigningKey(signing_key.kid)
    answer = probe("produce", signed_java_client(tmp_path / "client.properties", signed.bootstrap_servers,
                                                 token_endpoint), "refused", "none", 1)
    assert answer["error"] == "SaslAuthenticationException" and INVALID_TOKEN in answer["message"]
