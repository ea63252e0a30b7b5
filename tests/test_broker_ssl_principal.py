"""The principal of an SSL client certificate (Kafka's DefaultKafkaPrincipalBuilder and SslPrincipalMapper, KIP-371):
the subject in RFC 2253 form mapped by ``ssl.principal.mapping.rules``, on every request and in the log; rules
Kafka would refuse are refused at start. The mapping cases are Kafka's own SslPrincipalMapperTest's."""
import datetime
import logging
import ssl

import pytest

from broker_helpers import wait_for
from network_helpers import closed_by_peer, connect, frame, make_tls_contexts, recv_frame
from kmem.broker import Broker
from kmem.errors import ConfigError, SslAuthenticationError
from kmem.network import SocketServer
from kmem.network.ssl_principal import SslPrincipalMapper, distinguished_name

KAFKA_RULES = ", ".join([
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
    "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
    "DEFAULT"])
ALICE_RULES = "RULE:^CN=(.*?),OU=eng,.*$/$1/L"


@pytest.mark.parametrize("dn, name", [
    ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
    ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
    ("cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
    ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
    ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
])
def test_kafkas_mapping_cases(dn, name):
    assert SslPrincipalMapper(KAFKA_RULES).name(dn) == name


def test_a_comma_escaped_in_the_name_and_literal_group_references():
    assert SslPrincipalMapper(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT").name(
        r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"
    # a group the pattern does not have is literal, as Kafka escapes it; \/ is a slash
    assert SslPrincipalMapper(r"RULE:^CN=([a-z]+)$/$1\/$2/").name("CN=duke") == "duke/$2"


@pytest.mark.parametrize("rules, dn, name", [
    ("", None, None), (",   , , ,      , , ,   ", None, None),                 # empty rules are ignored
    ("  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ", "abc", "abc"),
    (",,RULE:^x$/y/,,,DEFAULT,,", "x", "y"),
    (",,RULE:^x$/y/,,,DEFAULT,,", "z", "z"),
])
def test_rules_are_split_as_kafka_splits_them(rules, dn, name):
    mapper = SslPrincipalMapper(rules)
    if dn is None:
        assert mapper.rules == []
        with pytest.raises(SslAuthenticationError, match="no ssl.principal.mapping.rules rule applies"):
            mapper.name("CN=duke")
    else:
        assert mapper.name(dn) == name


@pytest.mark.parametrize("rules", ["default", "DEFAUL", "DEFAULT/L", "DEFAULT/U", "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
                                   "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/", "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
                                   "RULE:^CN=(.*?),OU=ServiceUsers.*$/L", "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
                                   "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU", "RULE:^CN=(.*$/$1/", "RULE:^(.*)$/$x/"])
def test_kafkas_invalid_rules_are_refused(rules):
    with pytest.raises(ConfigError, match="^ssl.principal.mapping.rules: "):
        SslPrincipalMapper(rules)


def test_the_subject_in_rfc_2253_form():
    cert = {"subject": ((("countryName", "US"),), (("organizationName", "Example, Inc."),),
                        (("organizationalUnitName", "eng"), ("userId", "7")), (("commonName", "#alice "),),
                        (("emailAddress", "a@b.c"),))}
    assert distinguished_name(cert) == \
        r"1.2.840.113549.1.9.1=#16056140622e63,CN=\#alice\ ,OU=eng+UID=7,O=Example\, Inc.,C=US"


def client_certificate(directory, common_name):
    """A self-signed client certificate C=US,O=Example,OU=eng,CN=<common_name>: (cert path, key path)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COUNTRY_NAME, "US"), x509.NameAttribute(NameOID.ORGANIZATION_NAME,
                      "Example"), x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "eng"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / f"{common_name}.pem", directory / f"{common_name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def certificates(tmp_path):
    """The server's keystore (its certificate and key in one PEM), a truststore of two client certificates (Alice's
    and Bob's), and the client contexts of each."""
    make_tls_contexts(str(tmp_path))
    keystore = tmp_path / "bundle.pem"
    keystore.write_bytes((tmp_path / "cert.pem").read_bytes() + (tmp_path / "key.pem").read_bytes())
    clients, trusted = {}, b""
    for user in ("Alice", "Bob"):
        cert, key = client_certificate(tmp_path, user)
        trusted += cert.read_bytes()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(str(tmp_path / "cert.pem"))
        context.load_cert_chain(str(cert), str(key))
        clients[user] = context
    (tmp_path / "trusted.pem").write_bytes(trusted)
    return {"ssl.keystore.location": str(keystore), "ssl.truststore.location": str(tmp_path / "trusted.pem")}, clients


def test_the_mapped_principal_is_on_every_request_and_anonymous_without_a_certificate(certificates):
    properties, clients = certificates
    principals = []

    def handler(request):
        principals.append(request.principal)
        return b"\0\0\0\1"
    with _ssl_server(properties, handler, "optional") as server:
        for context, expected in ((clients["Alice"], "User:alice"), (_no_certificate(properties), "User:ANONYMOUS")):
            with connect(server.address, context) as sock:
                sock.sendall(frame(b"\0\3\0\1\0\0\0\1\0\0"))
                assert recv_frame(sock) == b"\0\0\0\1"
            assert principals[-1] == expected


def _no_certificate(properties):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(properties["ssl.keystore.location"])
    return context


def _ssl_server(properties, handler, client_auth):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(properties["ssl.keystore.location"])
    context.load_verify_locations(properties["ssl.truststore.location"])
    context.verify_mode = ssl.CERT_OPTIONAL if client_auth == "optional" else ssl.CERT_REQUIRED
    return SocketServer(handler, ssl_context=context, ssl_principal_mapper=SslPrincipalMapper(ALICE_RULES + ",DEFAULT"))


def test_the_broker_logs_the_principal_and_closes_a_certificate_no_rule_maps(certificates, tmp_path, caplog):
    properties, clients = certificates
    properties = {**properties, "listeners": "SSL://127.0.0.1:0", "ssl.client.auth": "required",
                  "ssl.principal.mapping.rules": "RULE:^CN=(Alice),OU=eng,.*$/$1/L"}
    with caplog.at_level(logging.INFO, logger="kmem"), Broker(tmp_path / "logs", properties=properties) as broker:
        host, port = broker.server.address
        with connect((host, port), clients["Alice"]):
            wait_for(lambda: "authenticated as User:alice (SSL client certificate)" in caplog.text,
                     "the principal's log line")
        with connect((host, port), clients["Bob"]) as bob:
            assert closed_by_peer(bob)
        assert "no ssl.principal.mapping.rules rule applies to CN=Bob,OU=eng,O=Example,C=US" in caplog.text


def test_bad_rules_are_refused_at_start_in_one_line(certificates, tmp_path):
    properties, _ = certificates
    with pytest.raises(ConfigError) as refused:
        Broker(tmp_path / "logs", properties={**properties, "listeners": "SSL://127.0.0.1:0",
                                              "ssl.principal.mapping.rules": "RULE:^CN=(.*?)/$1/X"})
    assert str(refused.value) == "ssl.principal.mapping.rules: invalid rule 'RULE:^CN=(.*?)/$1/X', unmatched 'X'"
