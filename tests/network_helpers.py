"""Shared pieces of the network tests: a self-signed TLS certificate, framing, simple blocking clients."""
import datetime
import ipaddress
import os
import socket
import ssl
import struct
import threading
import time

import pytest


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_tls_contexts(directory):
    """A server and a client ``SSLContext`` sharing a fresh self-signed certificate for localhost."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path = os.path.join(directory, "cert.pem")
    key_path = os.path.join(directory, "key.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_path, key_path)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(cert_path)
    return server, client


@pytest.fixture(scope="session")
def tls_contexts(tmp_path_factory):
    return make_tls_contexts(str(tmp_path_factory.mktemp("tls")))


def frame(payload):
    return struct.pack(">i", len(payload)) + payload


def recv_exactly(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock):
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, size)


def connect(address, client_context=None, timeout=10.0):
    sock = socket.create_connection(address, timeout=timeout)
    if client_context is not None:
        sock = client_context.wrap_socket(sock, server_hostname="localhost")
    return sock


def request(address, payload, client_context=None, timeout=10.0):
    """One request/response exchange on a fresh connection."""
    with connect(address, client_context, timeout) as sock:
        sock.sendall(frame(payload))
        return recv_frame(sock)


def wait_until(condition, timeout=10.0, interval=0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


class Sender(threading.Thread):
    """Connects, optionally wraps in TLS, sends bytes, then holds the connection open until stopped."""

    def __init__(self, address, data, client_context=None):
        super().__init__(daemon=True)
        self.address, self.data, self.client_context = address, data, client_context
        self.sent = threading.Event()
        self.stop = threading.Event()
        self.error = None

    def run(self):
        try:
            with connect(self.address, self.client_context) as sock:
                sock.sendall(self.data)
                self.sent.set()
                self.stop.wait(30)
        except Exception as exc:   # reported by the test through .error
            self.error = exc
            self.sent.set()


def closed_by_peer(sock, timeout=5.0):
    """True when the other end has closed (an orderly EOF, or a reset because our bytes went unread)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except (TimeoutError, socket.timeout):
        return False
