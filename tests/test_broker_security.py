"""The SASL mechanisms (PLAIN, SCRAM-SHA-256/512), the JAAS configuration, the SCRAM credential store and the
SASL settings, without a network: each against an independent client (kafka-python's ScramClient) or RFC 7677's
exchange."""
import base64
import hashlib
import hmac
import json
import os

import pytest
from kafka.net.sasl.scram import ScramClient

from kmem.broker.security import (SaslMechanisms, SaslSettings, ScramCredentialStore, credential_from_password,
                                  parse_add_scram, plain_users)
from kmem.broker.security import scram
from kmem.broker.security.plain import PlainServer
from kmem.errors import ConfigError, InvalidArgumentError, InvalidSaslCredentialsError, SaslAuthenticationError

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
              'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')


def scram_exchange(server, user, password, mechanism):
    client = ScramClient(user, password, mechanism)
    challenge = server.evaluate(client.first_message())
    client.process_server_first_message(challenge)
    final = server.evaluate(client.final_message())
    client.process_server_final_message(final)     # checks the server's signature
    return client


@pytest.mark.parametrize("mechanism", scram.MECHANISMS)
def test_scram_exchange_with_kafka_python_client(mechanism):
    credential = credential_from_password(mechanism, "alice-secret")
    server = scram.ScramServer(mechanism, {"alice": credential}.get)
    scram_exchange(server, "alice", "alice-secret", mechanism)
    assert server.complete and server.username == "alice"


@pytest.mark.parametrize("mechanism", scram.MECHANISMS)
def test_scram_wrong_password_and_unknown_user_fail(mechanism):
    credentials = {"alice": credential_from_password(mechanism, "alice-secret")}.get
    with pytest.raises(InvalidSaslCredentialsError, match="invalid client credentials"):
        scram_exchange(scram.ScramServer(mechanism, credentials), "alice", "wrong", mechanism)
    with pytest.raises(InvalidSaslCredentialsError, match="no credential"):
        scram_exchange(scram.ScramServer(mechanism, credentials), "bob", "alice-secret", mechanism)


def test_scram_rfc7677_exchange(monkeypatch):
    """RFC 7677 section 3: user "user", password "pencil"; the server's nonce and salt as in the RFC."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = credential_from_password("SCRAM-SHA-256", "pencil", salt=salt, iterations=4096)
    monkeypatch.setattr(scram, "server_nonce", lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    server = scram.ScramServer("SCRAM-SHA-256", {"user": credential}.get)
    assert server.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == \
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert server.evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                           b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=") == \
        b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _started(mechanism="SCRAM-SHA-256"):
    credential = credential_from_password(mechanism, "alice-secret")
    server = scram.ScramServer(mechanism, {"alice": credential}.get)
    client = ScramClient("alice", "alice-secret", mechanism)
    client.process_server_first_message(server.evaluate(client.first_message()))
    return server, client


@pytest.mark.parametrize("final, reason", [
    (lambda f: f.replace(b",p=", b"x,p="), "nonce"),                  # another nonce
    (lambda f: f.replace(b",r=", b",r=x"), "credentials"),            # ends with the nonce: the proof fails
    (lambda f: f[:len(f) // 2], "invalid client final"),              # truncated
    (lambda f: f.replace(b"c=biws", b"c=eSws"), "channel binding"),   # y,, instead of n,,
    (lambda f: f[:-8] + b"AAAAAAA=", "credentials"),                  # another proof
    (lambda f: b"\xff" + f, "UTF-8"),
])
def test_scram_bad_client_final(final, reason):
    server, client = _started()
    with pytest.raises(InvalidSaslCredentialsError, match=reason):
        server.evaluate(final(client.final_message()))
    assert not server.complete


def test_scram_final_with_the_client_nonce_twice_is_accepted_as_kafka_accepts_it():
    """librdkafka 2.0 (Debian's kcat) sends ``r=<client nonce><client nonce><server nonce>`` in its final message;
    Kafka's ScramSaslServer only checks that the nonce ends with the server-first's, and the proof covers the
    message as sent."""
    server = scram.ScramServer("SCRAM-SHA-256", {"alice": credential_from_password("SCRAM-SHA-256", "alice-secret",
                                                                                  salt=b"salt")}.get)
    first_bare = "n=alice,r=client-nonce"
    server_first = server.evaluate(b"n,," + first_bare.encode()).decode()
    nonce = server_first.split(",")[0][len("r="):]
    without_proof = f"c=biws,r=client-nonce{nonce}"
    salted = hashlib.pbkdf2_hmac("sha256", b"alice-secret", b"salt", 4096)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    signature = hmac.new(hashlib.sha256(client_key).digest(), f"{first_bare},{server_first},{without_proof}".encode(),
                         "sha256").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    server.evaluate(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
    assert server.complete and server.username == "alice"


def test_scram_final_replayed_on_another_exchange_fails():
    server, client = _started()
    final = client.final_message()
    server.evaluate(final)
    other, _ = _started()
    with pytest.raises(InvalidSaslCredentialsError, match="nonce"):
        other.evaluate(final)
    with pytest.raises(InvalidSaslCredentialsError, match="after the exchange"):
        server.evaluate(final)


def test_scram_client_first_checks():
    credential = credential_from_password("SCRAM-SHA-256", "x")
    server = scram.ScramServer("SCRAM-SHA-256", {"alice": credential}.get)
    with pytest.raises(InvalidSaslCredentialsError, match="token authentication"):
        server.evaluate(b"n,,n=alice,r=abc,tokenauth=true")
    with pytest.raises(SaslAuthenticationError, match="authorization id that is different"):
        scram.ScramServer("SCRAM-SHA-256", {"alice": credential}.get).evaluate(b"n,a=bob,n=alice,r=abc")
    with pytest.raises(InvalidSaslCredentialsError, match="invalid client first"):
        scram.ScramServer("SCRAM-SHA-256", {"alice": credential}.get).evaluate(b"p=tls-unique,,n=alice,r=abc")
    # an unknown extension is ignored, as Kafka ignores it; the escaped name is unescaped
    odd = scram.ScramServer("SCRAM-SHA-256", {"a,=b": credential}.get)
    assert odd.evaluate(b"n,,n=a=2C=3Db,r=abc,other=1").startswith(b"r=abc")


def test_plain():
    users = plain_users("sasl.jaas.config", PLAIN_JAAS)
    assert users == {"admin": "admin-secret", "alice": "alice-secret"}
    server = PlainServer(users)
    assert server.evaluate(b"\0alice\0alice-secret") == b"" and server.complete and server.username == "alice"
    assert PlainServer(users).evaluate(b"alice\0alice\0alice-secret") == b""
    for token, message in [(b"\0alice\0wrong", "Invalid username or password"),
                           (b"\0bob\0alice-secret", "Invalid username or password"),
                           (b"\0\0x", "username not specified"), (b"\0alice\0", "password not specified"),
                           (b"alice\0alice-secret", "expected 3 tokens, got 2"),
                           (b"bob\0alice\0alice-secret", "authorization id that is different")]:
        server = PlainServer(users)
        with pytest.raises(SaslAuthenticationError, match=message):
            server.evaluate(token)
        assert not server.complete


@pytest.mark.parametrize("text", ["", "PlainLoginModule", "x required user_a=\"b\"", "x required user_a;",
                                  'x required user_a="b" "c";'])
def test_jaas_malformed_is_refused_without_echoing_it(text):
    with pytest.raises(ConfigError) as raised:
        plain_users("sasl.jaas.config", text)
    assert "user_a" not in str(raised.value)


def test_credential_store_survives_reopen_and_holds_no_password(tmp_path):
    store = ScramCredentialStore(tmp_path)
    for mechanism, user, credential in (parse_add_scram("SCRAM-SHA-256=[name=alice,password=alice-secret]"),
                                        parse_add_scram('SCRAM-SHA-512=[name=bob,iterations=8192,password="b,c"]')):
        store.add(mechanism, user, credential)
    text = (tmp_path / "scram-credentials.json").read_text()
    assert "alice-secret" not in text and "b,c" not in text
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    reopened = ScramCredentialStore(tmp_path)
    assert reopened.get("SCRAM-SHA-256", "alice") == store.get("SCRAM-SHA-256", "alice")
    assert reopened.get("SCRAM-SHA-512", "bob").iterations == 8192
    assert reopened.get("SCRAM-SHA-512", "alice") is None
    server = scram.ScramServer("SCRAM-SHA-512", lambda user: reopened.get("SCRAM-SHA-512", user))
    scram_exchange(server, "bob", "b,c", "SCRAM-SHA-512")


def test_credential_store_corrupt_file_is_a_config_error(tmp_path):
    (tmp_path / "scram-credentials.json").write_text(json.dumps({"version": 1, "credentials": {"SCRAM-SHA-256": 3}}))
    with pytest.raises(ConfigError, match="malformed"):
        ScramCredentialStore(tmp_path)


def test_add_scram_salted_password_form():
    """kafka-storage's documented form: salt and saltedpassword, base64."""
    mechanism, user, credential = parse_add_scram(
        'SCRAM-SHA-256=[name=alice,iterations=8192,salt="MWx2NHBkbnc0ZndxN25vdGN4bTB5eTFrN3E=",'
        'saltedpassword="mT0yyUUxnlJaC99HXgRTSYlbuqa4FSGtJCJfTMvjYCE="]')
    assert (mechanism, user, credential.iterations) == ("SCRAM-SHA-256", "alice", 8192)
    assert credential.salt == b"1lv4pdnw4fwq7notcxm0yy1k7q"


@pytest.mark.parametrize("value, message", [
    ("SCRAM-SHA-1=[name=a,password=b]", "unknown SCRAM mechanism"),
    ("SCRAM-SHA-256=[password=b]", "name is required"),
    ("SCRAM-SHA-256=[name=a]", "password"),
    ("SCRAM-SHA-256=[name=a,password=b,iterations=100]", "iterations"),
    ("SCRAM-SHA-256=[name=a,pasword=hidden]", "unknown field"),
    ("SCRAM-SHA-256 name=a", "must read"),
])
def test_add_scram_refusals(value, message):
    with pytest.raises(InvalidArgumentError, match=message) as raised:
        parse_add_scram(value)
    assert "hidden" not in str(raised.value)


def test_sasl_settings():
    listener = "SASL_PLAINTEXT"
    settings = SaslSettings.from_settings({"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
                                           "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
                                           "listener.name.sasl_plaintext.connection.failed.authentication.delay.ms":
                                               "0"}, listener)
    assert settings.enabled_mechanisms == ("PLAIN", "SCRAM-SHA-512")
    assert settings.plain_users["alice"] == "alice-secret" and "alice-secret" not in repr(settings)
    assert (settings.failed_authentication_delay_ms, settings.max_receive_size) == (0, 524288)
    assert SaslSettings.from_settings({"sasl.enabled.mechanisms": "PLAIN", "sasl.jaas.config": PLAIN_JAAS},
                                      listener).plain_users["admin"] == "admin-secret"
    mechanisms = SaslMechanisms(settings, ScramCredentialStore.__new__(ScramCredentialStore))
    assert isinstance(mechanisms.server("PLAIN"), PlainServer) and mechanisms.server("SCRAM-SHA-256") is None


@pytest.mark.parametrize("merged, message", [
    ({}, r"not GSSAPI \(Kafka default GSSAPI\)"),
    ({"sasl.enabled.mechanisms": "SCRAM-SHA-256,GSSAPI"}, "not GSSAPI$"),
    ({"sasl.enabled.mechanisms": "PLAIN"}, "set listener.name.sasl_plaintext.plain.sasl.jaas.config"),
    ({"sasl.enabled.mechanisms": "PLAIN", "sasl.jaas.config": "x required;"}, "no .*PlainLoginModule"),
    ({"sasl.enabled.mechanisms": "PLAIN", "sasl.jaas.config": PLAIN_JAAS,
      "connection.failed.authentication.delay.ms": "-1"}, "connection.failed.authentication.delay.ms"),
])
def test_sasl_settings_refused(merged, message):
    with pytest.raises(ConfigError, match=message):
        SaslSettings.from_settings(merged, "SASL_PLAINTEXT")


def test_a_jaas_setting_continued_over_lines_as_kafka_writes_it(tmp_path):
    """java.util.Properties: a trailing backslash continues the line (Kafka's documented JAAS settings)."""
    from kmem.broker.settings import read_properties_file
    path = tmp_path / "server.properties"
    path.write_text("listeners=SASL_PLAINTEXT://:9092\n"
                    "listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain."
                    "PlainLoginModule required \\\n"
                    "    username=\"admin\" \\\n"
                    "    password=\"admin-secret\" \\\n"
                    "    user_admin=\"admin-secret\" \\\n"
                    "    user_alice=\"alice-secret\";\n"
                    "# a comment \\\n"
                    "path=C:\\\\kafka\\\\\n"             # an even number of backslashes continues nothing
                    "sasl.enabled.mechanisms=PLAIN\n")
    properties = read_properties_file(path)
    assert sorted(properties) == ["listener.name.sasl_plaintext.plain.sasl.jaas.config", "listeners", "path",
                                  "sasl.enabled.mechanisms"]
    properties.pop("path")
    settings = SaslSettings.from_settings(properties, "SASL_PLAINTEXT")
    assert settings.plain_users == {"admin": "admin-secret", "alice": "alice-secret"}


JAAS_FILE = """// the broker's JAAS file, as Kafka's documentation writes it
KafkaServer {
    org.apache.kafka.common.security.plain.PlainLoginModule required
    username="admin"
    password="admin-secret"   /* the broker's own, for inter-broker connections */
    user_admin="admin-secret"
    user_alice="alice-secret";
    org.apache.kafka.common.security.scram.ScramLoginModule required;
};
sasl_ssl.KafkaServer {
    org.apache.kafka.common.security.plain.PlainLoginModule required user_bob="bob-}-secret";
};
Client { org.apache.zookeeper.server.auth.DigestLoginModule required username="zk" password="zk-secret"; };
"""


def test_a_jaas_file_gives_each_listener_its_context_as_kafkas_jaas_context(tmp_path):
    """<listener>.KafkaServer, else KafkaServer (JaasContext.loadServerContext); a sasl.jaas.config setting wins."""
    path = tmp_path / "kafka_server_jaas.conf"
    path.write_text(JAAS_FILE)
    from_file = {"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256", "java.security.auth.login.config": str(path)}
    assert SaslSettings.from_settings(from_file, "SASL_PLAINTEXT").plain_users == {"admin": "admin-secret",
                                                                                  "alice": "alice-secret"}
    assert SaslSettings.from_settings(from_file, "SASL_SSL").plain_users == {"bob": "bob-}-secret"}
    for setting in ("sasl.jaas.config", "listener.name.sasl_ssl.plain.sasl.jaas.config"):
        assert SaslSettings.from_settings({**from_file, setting: PLAIN_JAAS}, "SASL_SSL").plain_users["alice"] == \
            "alice-secret"


@pytest.mark.parametrize("text, message", [
    ('KafkaServer { org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret; };',
     "cannot read the JAAS configuration at line 1"),
    ('KafkaServer { org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret"; }',
     "the context KafkaServer must end with '};'"),
    ('KafkaServer { org.apache.kafka.common.security.plain.PlainLoginModule user_alice="alice-secret"; };',
     "a JAAS login module must read"),
    ('KafkaServer {\n org.apache.kafka.common.security.plain.PlainLoginModule required user_alice "alice-secret"; };',
     "the options of org.apache.kafka.common.security.plain.PlainLoginModule must read"),
    ('/* KafkaServer { org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";',
     "cannot read the JAAS configuration at line 1"),
    ('Client { org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret"; };',
     "could not find a 'KafkaServer' or 'sasl_plaintext.KafkaServer' entry"),
    ('KafkaServer { org.apache.kafka.common.security.scram.ScramLoginModule required user_alice="alice-secret"; };',
     "context KafkaServer has no org.apache.kafka.common.security.plain.PlainLoginModule entry"),
    (None, "cannot read the JAAS file"),
])
def test_a_bad_jaas_file_is_refused_naming_the_file_never_a_password(tmp_path, text, message):
    path = tmp_path / "jaas.conf"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=message) as raised:
        SaslSettings.from_settings({"sasl.enabled.mechanisms": "PLAIN", "java.security.auth.login.config": str(path)},
                                   "SASL_PLAINTEXT")
    assert str(path) in str(raised.value) and "alice-secret" not in str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_unreadable_sasl_jaas_config_never_echoes_a_password():
    with pytest.raises(ConfigError) as raised:
        plain_users("sasl.jaas.config", 'x required user_a="alice-secret" user_b="unclosed;')
    assert "alice-secret" not in str(raised.value)
