"""Go probes for the broker tests: a probe (a ``.go`` file under tests/go/) is built with the system's Go
toolchain against the Go sources Debian packages (``GOPATH=/usr/share/gocode``, GOPATH mode) and runs once
per command, answering one JSON line on stdout.

Sarama comes from Debian's ``golang-github-shopify-sarama-dev`` (1.22), so a test says which client it ran.
A build is kept under the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``), keyed on the
probe's source, the toolchain and the GOPATH, so a run that changed none of them builds nothing. Without
``go`` or the Sarama sources the tests are skipped."""
import hashlib
import json
import os
import shutil
import subprocess

import pytest

from broker_helpers import TIMEOUT

PROBES_DIR = os.path.join(os.path.dirname(__file__), "go")
DEBIAN_GOPATH = "/usr/share/gocode"
SARAMA_PACKAGE = "github.com/Shopify/sarama"


def _gopath():
    """The first GOPATH entry (the environment's, then Debian's) holding Sarama's sources, or None."""
    entries = [p for p in os.environ.get("GOPATH", "").split(os.pathsep) if p] + [DEBIAN_GOPATH]
    return next((p for p in entries if os.path.isdir(os.path.join(p, "src", SARAMA_PACKAGE))), None)


def _cache_dir():
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kmem-tests", "go")


class GoProbe:
    """A built probe: ``probe(*words)`` runs one command and returns its decoded answer."""

    def __init__(self, binary):
        self.binary = binary

    def __call__(self, *words):
        # every command answers within its own deadlines (30 s a step); this only catches a stuck probe
        done = subprocess.run([self.binary, *map(str, words)], capture_output=True, text=True,
                              timeout=4 * TIMEOUT)
        assert done.returncode == 0 and done.stdout, f"the Go probe failed on {words}:\n{done.stderr[-4000:]}"
        return json.loads(done.stdout)


def build_probe(source_name):
    """tests/go/``source_name`` built (or found already built in the cache); the test is skipped without
    a Go toolchain or the Sarama sources."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("no Go toolchain (go): the Sarama tests need golang-go")
    gopath = _gopath()
    if gopath is None:
        pytest.skip(f"no Sarama sources ({SARAMA_PACKAGE} under GOPATH or {DEBIAN_GOPATH}): "
                    "the Sarama tests need golang-github-shopify-sarama-dev")
    with open(os.path.join(PROBES_DIR, source_name), "rb") as f:
        source = f.read()
    env = dict(os.environ, GOPATH=gopath, GO111MODULE="off", GOFLAGS="",
               GOCACHE=os.path.join(_cache_dir(), "go-build"))
    toolchain = subprocess.run([go, "version"], capture_output=True, text=True, env=env, check=True).stdout
    key = hashlib.sha256(b"\0".join([source, toolchain.encode(), gopath.encode()])).hexdigest()[:16]
    binary = os.path.join(_cache_dir(), key, os.path.splitext(source_name)[0])
    if not os.path.exists(binary):
        os.makedirs(os.path.dirname(binary), exist_ok=True)
        # built beside its final name and renamed, so a concurrent run never starts a half-written binary
        partial = f"{binary}.{os.getpid()}.partial"
        built = subprocess.run([go, "build", "-o", partial, source_name], cwd=PROBES_DIR, env=env,
                               capture_output=True, text=True, timeout=600)
        assert built.returncode == 0, built.stderr
        os.replace(partial, binary)
    return GoProbe(binary)
