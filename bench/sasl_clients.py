"""SASL/SCRAM clients for bench_sasl.py, on raw sockets with kafka-python's request codec:

    python sasl_clients.py BOOTSTRAP COUNT MECHANISM USER PASSWORD

starts COUNT connections at once, each running ApiVersions, SaslHandshake v1 and the two SaslAuthenticate v2
rounds of a SCRAM exchange (RFC 5802) or PLAIN's one as its answers arrive (MECHANISM ``PLAINTEXT``: ApiVersions
alone), and prints, as JSON, the seconds until every one
was authenticated (``null`` if some failed or none finished within 120 s).

The client keeps each salted password it derives (PBKDF2, thousands of iterations): a real client derives it
once per connection, and the bench measures the broker's side of a handshake, not the client's.
"""
import base64
import errno
import functools
import hashlib
import hmac
import json
import os
import resource
import selectors
import socket
import struct
import sys
import time

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


@functools.lru_cache(maxsize=None)
def salted_password(mechanism, password, salt, iterations):
    return hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode(), salt, iterations)


class ScramExchange:
    """The client's side of one SCRAM exchange: ``first()``, then ``final(server_first)``, then
    ``verify(server_final)``."""

    def __init__(self, mechanism, user, password):
        self.mechanism, self.password = mechanism, password
        self.digest = HASHES[mechanism]
        self.bare = f"n={user},r={base64.b64encode(os.urandom(18)).decode()}"

    def first(self):
        return ("n,," + self.bare).encode()

    def final(self, server_first):
        fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
        salted = salted_password(self.mechanism, self.password, base64.b64decode(fields["s"]), int(fields["i"]))
        without_proof = f"c=biws,r={fields['r']}"
        self.auth_message = f"{self.bare},{server_first.decode()},{without_proof}".encode()
        client_key = hmac.digest(salted, b"Client Key", self.digest)
        signature = hmac.digest(hashlib.new(self.digest, client_key).digest(), self.auth_message, self.digest)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self.server_key = hmac.digest(salted, b"Server Key", self.digest)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final):
        expected = hmac.digest(self.server_key, self.auth_message, self.digest)
        return server_final == b"v=" + base64.b64encode(expected)


def encode(request, version, correlation_id):
    request.with_header(correlation_id=correlation_id, client_id="bench-sasl")
    payload = request.encode(version=version, header=True)
    return struct.pack(">i", len(payload)) + payload


class Handshake:
    """One connection's way through ApiVersions, SaslHandshake and SCRAM, one request at a time: ``next(answer)``
    returns the next frame to send, None once authenticated; raises on a refusal. Mechanism ``PLAIN``: one
    SaslAuthenticate round; ``PLAINTEXT``: the connection is ready after ApiVersions (the floor a SASL listener is
    compared with)."""

    def __init__(self, mechanism, user, password):
        self.mechanism = mechanism
        self.exchange = ScramExchange(mechanism, user, password) if mechanism in HASHES else None
        self.plain_token = f"\0{user}\0{password}".encode()
        self.step = 0

    def first_frame(self):
        return encode(ApiVersionsRequest(client_software_name="bench", client_software_version="1"), 3, 0)

    def next(self, payload):
        self.step += 1
        if self.step == 1:
            assert ApiVersionsResponse.decode(payload, version=3, header=True).error_code == 0
            if self.mechanism == "PLAINTEXT":
                return None
            return encode(SaslHandshakeRequest(mechanism=self.mechanism), 1, 1)
        if self.step == 2:
            assert SaslHandshakeResponse.decode(payload, version=1, header=True).error_code == 0
            first = self.exchange.first() if self.exchange else self.plain_token
            return encode(SaslAuthenticateRequest(auth_bytes=first), 2, 2)
        response = SaslAuthenticateResponse.decode(payload, version=2, header=True)
        assert response.error_code == 0, response.error_message
        if self.exchange is None:
            return None
        if self.step == 3:
            return encode(SaslAuthenticateRequest(auth_bytes=self.exchange.final(response.auth_bytes)), 2, 3)
        assert self.exchange.verify(response.auth_bytes), "the server's signature does not match"
        return None


def complete_frame(buffer):
    """The payload of the first whole frame in ``buffer`` (removed from it), or None."""
    if len(buffer) < 4:
        return None
    size, = struct.unpack_from(">i", buffer)
    if len(buffer) < 4 + size:
        return None
    payload = bytes(buffer[4:4 + size])
    del buffer[:4 + size]
    return payload


def authenticate(bootstrap, mechanism, user, password):
    """One blocking connection through the whole handshake; returns the connected, authenticated socket."""
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    handshake, buffer = Handshake(mechanism, user, password), bytearray()
    send = handshake.first_frame()
    while send is not None:
        sock.sendall(send)
        payload = None
        while payload is None:
            data = sock.recv(65536)
            assert data, "the broker closed the connection"
            buffer += data
            payload = complete_frame(buffer)
        send = handshake.next(payload)
    return sock


def storm(bootstrap, count, mechanism, user, password):
    """Seconds until ``count`` connections started at once are all authenticated, or None."""
    host, port = bootstrap.rsplit(":", 1)
    selector = selectors.DefaultSelector()
    started = time.monotonic()
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        error = sock.connect_ex((host, int(port)))
        assert error in (0, errno.EINPROGRESS), errno.errorcode.get(error)
        selector.register(sock, selectors.EVENT_WRITE, (Handshake(mechanism, user, password), bytearray()))
    done = 0
    while done < count and time.monotonic() - started < 120:
        for key, events in selector.select(1.0):
            sock, (handshake, buffer) = key.fileobj, key.data
            if events & selectors.EVENT_WRITE:
                sock.sendall(handshake.first_frame())
                selector.modify(sock, selectors.EVENT_READ, key.data)
                continue
            data = sock.recv(65536)
            if not data:
                return None
            buffer += data
            payload = complete_frame(buffer)
            if payload is None:
                continue
            send = handshake.next(payload)
            if send is None:
                done += 1
                selector.unregister(sock)
                sock.close()
            else:
                sock.sendall(send)
    return time.monotonic() - started if done == count else None


if __name__ == "__main__":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    bootstrap, count, mechanism, user, password = sys.argv[1:6]
    print(json.dumps(storm(bootstrap, int(count), mechanism, user, password)), flush=True)
