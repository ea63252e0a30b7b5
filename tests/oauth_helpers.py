"""OAUTHBEARER for the broker tests: JWTs made with PyJWT (unsigned, or signed with an RSA key of
``cryptography``), the JWKS that verifies them, RFC 7628's client initial response, and an HTTP endpoint
serving JSON (a JWKS, or tokens as an OAuth token endpoint serves them)."""
import http.server
import json
import threading
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

JWKS_VALIDATOR = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
OAUTHBEARER_JAAS = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required{options};"


class SigningKey:
    """An RSA key with id ``kid``: ``token(**claims)`` signs a JWT (``exp`` and ``iat`` from now unless given),
    ``jwk()`` is its public JWK."""

    def __init__(self, kid):
        self.kid = kid
        self.private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(self):
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.private_key.public_key()))
        return {**public, "kid": self.kid, "use": "sig", "alg": "RS256"}

    def token(self, kid=None, **claims):
        return jwt.encode(claims_from_now(**claims), self.private_key, algorithm="RS256",
                          headers={"kid": kid or self.kid})


def write_jwks(path, *keys):
    """Writes the JWKS of ``keys`` to ``path``; returns its ``file:`` URL."""
    path.write_text(json.dumps({"keys": [key.jwk() for key in keys]}))
    return path.as_uri()


def claims_from_now(lifetime_s=3600, **claims):
    now = int(time.time())
    return {"iat": now, "exp": now + lifetime_s, **claims}


def unsecured_token(**claims):
    """An unsigned JWT (``alg`` none), as librdkafka's and Kafka's unsecured login make them."""
    return jwt.encode(claims_from_now(**claims), None, algorithm="none")


def initial_response(token, authzid="", **extensions):
    """RFC 7628's client initial response: ``n,[a=authzid],^Aauth=Bearer <token>^A[key=value^A...]^A``."""
    pairs = "".join(f"{key}={value}\x01" for key, value in extensions.items())
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01{pairs}\x01".encode()


class JsonEndpoint(http.server.ThreadingHTTPServer):
    """Answers every GET and POST on 127.0.0.1 with the JSON of ``answer()``; ``requests`` counts them, and
    each waits while ``held`` is clear (an endpoint that hangs). ``start()``, ``url``, ``close()``."""

    def __init__(self, answer):
        self.answer = answer
        self.held = threading.Event()
        self.held.set()
        self.requests = 0
        super().__init__(("127.0.0.1", 0), _JsonHandler)

    def start(self):
        threading.Thread(target=self.serve_forever, name="json-endpoint", daemon=True).start()
        return self

    @property
    def url(self):
        return "http://%s:%d/" % self.server_address

    def close(self):
        self.held.set()
        self.shutdown()
        self.server_close()


class _JsonHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.requests += 1
        self.server.held.wait(30)
        body = json.dumps(self.server.answer()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.do_GET()

    def log_message(self, *args):
        pass
