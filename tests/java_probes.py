"""Java probes for the broker tests: a probe (a ``.java`` file under tests/java/) is compiled with javac and runs
in one JVM for a whole test module, taking a command a line on stdin and answering a JSON line each on stdout.

The jars come from the PyPI wheel ``shigawire-apache-flink-libraries`` (the test extra; its ``pyflink/lib/``
holds kafka-clients and Flink's jars), each checked against the SHA-256 the test knows before use, so a test
says which Apache code it ran. Without a JDK or the wheel the tests are skipped."""
import importlib.metadata
import hashlib
import json
import os
import select
import shutil
import subprocess

import pytest

from broker_helpers import TIMEOUT

JARS_WHEEL = "shigawire-apache-flink-libraries"
KAFKA_CLIENTS_JAR = "kafka-clients.jar"
KAFKA_CLIENTS_SHA256 = "7568b998572d256f0b7bc0afdc1b7a2588b8b08415c62ce314c864a6851ae9d9"     # kafka-clients 3.9.1
PROBES_DIR = os.path.join(os.path.dirname(__file__), "java")
SHARED_SOURCE = "JsonLines.java"        # the command loop and JSON answers every probe uses, compiled with each


def wheel_jar(name, sha256=None):
    """The path of ``pyflink/lib/<name>`` in the wheel (the test is skipped without it); ``sha256``: the digest
    it must have."""
    try:
        path = importlib.metadata.distribution(JARS_WHEEL).locate_file(f"pyflink/lib/{name}")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{JARS_WHEEL} (the test extra) is not installed: no Apache jars")
    if sha256 is not None:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest == sha256, f"{path} is not the jar this test knows: {digest}"
    return str(path)


class JavaProbe:
    """The probe's JVM: ``probe(*words)`` sends one command and returns its decoded answer."""

    def __init__(self, main_class, classpath, log_path):
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(["java", "-cp", classpath, main_class], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, text=True)

    def __call__(self, *words):
        self.process.stdin.write(" ".join(str(word) for word in words) + "\n")
        self.process.stdin.flush()
        # every command answers within its own deadlines (30 s a step); this only catches a dead JVM
        ready, _, _ = select.select([self.process.stdout], [], [], 4 * TIMEOUT)
        line = self.process.stdout.readline() if ready else ""
        assert line, f"the Java probe gave no answer to {words}:\n{open(self.log_path).read()[-4000:]}"
        return json.loads(line)

    def close(self):
        self.process.stdin.close()
        self.process.wait(TIMEOUT)


def start_probe(directory, source_name, classpath):
    """tests/java/``source_name`` (with ``SHARED_SOURCE``) compiled into ``directory`` against ``classpath`` (jar
    paths) and started; the test is skipped without a JDK. Its JVM's stderr goes to ``directory``/probe.log."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("no JDK (javac and java): the Java probe tests need one")
    sources = [os.path.join(PROBES_DIR, name) for name in (source_name, SHARED_SOURCE)]
    compiled = subprocess.run(["javac", "-d", str(directory), "-cp", os.pathsep.join(classpath), *sources],
                              capture_output=True, text=True, timeout=120)
    assert compiled.returncode == 0, compiled.stderr
    return JavaProbe(os.path.splitext(source_name)[0], os.pathsep.join([str(directory), *classpath]),
                     os.path.join(directory, "probe.log"))


def client_properties(path, bootstrap, **settings):
    """A client properties file at ``path`` (``bootstrap.servers`` and ``settings``, Kafka's names); the probe's
    BOOTSTRAP argument that makes a command's clients read it, ``@path``. Values must hold no backslash (a
    properties file escapes them)."""
    assert not any("\\" in str(value) for value in settings.values())
    path.write_text("".join(f"{key}={value}\n" for key, value in {"bootstrap.servers": bootstrap, **settings}.items()))
    return f"@{path}"
