"""The ``kmem`` command line as a user runs it (a child process, from outside the source tree): what it
checks before Spark starts, in one line each, and the exit codes its help documents; ``kmem broker``'s
settings (Kafka's sample ``server.properties``, listeners) and the messages of a start that fails."""
import fcntl
import io
import os
import pathlib
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import types

import pytest

import kmem
import kmem.errors
from broker_helpers import start_broker_process, wait_for
from network_helpers import free_port
from kmem.records import build_records

SOURCE_TREE = pathlib.Path(__file__).resolve().parent.parent / "kmem"


def kmem_cli(*args, cwd, env=None, timeout=60):
    """Run ``kmem ARGS``; PYTHONSAFEPATH keeps a checkout's uncompiled tree off the child's sys.path."""
    return subprocess.run([sys.executable, "-m", "kmem.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(env or os.environ, PYTHONSAFEPATH="1"))


@pytest.fixture
def logs(tmp_path):
    """A log directory with one small segment."""
    segment = tmp_path / "logs" / "orders-0" / "00000000000000000000.log"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(build_records([b"v"] * 3, magic=2))
    return tmp_path / "logs"


def test_version(tmp_path):
    result = kmem_cli("--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == f"kmem {kmem.__version__}"


@pytest.mark.parametrize("command", [[], ["pipeline"], ["pipeline", "report"], ["pipeline", "convert"],
                                     ["pipeline", "ledger"], ["pipeline", "demo"]])
def test_help_documents_the_exit_codes(tmp_path, command):
    result = kmem_cli(*command, "--help", cwd=tmp_path)
    assert result.returncode == 0
    for code, meaning in (("0", "done"), ("1", "partial success"), ("2", "nothing done"), ("3", "nothing to do")):
        assert f"  {code}  {meaning}" in result.stdout


@pytest.mark.parametrize("job", [["report"], ["ledger", "OUT"], ["convert", "OUT"]])
def test_an_input_without_segments_is_one_warning_and_exit_3_before_spark_starts(tmp_path, job):
    (tmp_path / "empty" / "not-a-partition").mkdir(parents=True)
    name, *output = job
    result = kmem_cli("pipeline", name, tmp_path / "empty", *[tmp_path / o for o in output], cwd=tmp_path)
    assert result.returncode == 3
    assert result.stderr.splitlines() == [f"kmem: warning: no Kafka log segments "
                                          f"(<topic>-<partition>/<20-digit offset>.log) under {tmp_path / 'empty'}"]
    assert result.stdout == "" and not (tmp_path / "OUT").exists()


@pytest.mark.parametrize("job", [["report"], ["ledger", "OUT"], ["convert", "OUT"]])
def test_a_missing_input_directory_is_one_line_and_exit_2(tmp_path, job):
    name, *output = job
    result = kmem_cli("pipeline", name, tmp_path / "missing", *output, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"kmem: error: input directory {tmp_path / 'missing'} does not exist "
                                          "or is not a directory"]


@pytest.mark.parametrize("value", ["0", "-1", "lots"])
def test_a_chunk_size_that_is_not_positive_is_refused_naming_the_argument(tmp_path, logs, value):
    result = kmem_cli("pipeline", "convert", logs, tmp_path / "out", "--chunk-size", value, cwd=tmp_path)
    assert result.returncode == 2
    assert f"argument --chunk-size: must be a positive integer, not '{value}'" in result.stderr
    assert not (tmp_path / "out").exists()


def test_no_java_is_one_line_with_the_fix_before_spark_starts(tmp_path, logs):
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    result = kmem_cli("pipeline", "report", logs, cwd=tmp_path, env=dict(env, PATH=str(tmp_path / "no-bin")))
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["kmem: error: Spark needs Java and no java on the PATH: install a Java 17 "
                                          "(or newer) runtime, e.g. apt-get install openjdk-17-jre-headless"]
    result = kmem_cli("pipeline", "report", logs, cwd=tmp_path, env=dict(env, JAVA_HOME=str(tmp_path / "jdk")))
    assert result.returncode == 2 and f"JAVA_HOME={tmp_path / 'jdk'} has no bin/java" in result.stderr


def test_a_java_older_than_17_is_named(tmp_path, logs):
    jdk = tmp_path / "jdk" / "bin"
    jdk.mkdir(parents=True)
    (jdk / "java").write_text('#!/bin/sh\necho \'openjdk version "11.0.22" 2024-01-16\' >&2\n')
    (jdk / "java").chmod(0o755)
    result = kmem_cli("pipeline", "report", logs, cwd=tmp_path, env=dict(os.environ, JAVA_HOME=str(tmp_path / "jdk")))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert f"Spark 4 needs Java 17 or newer, {jdk / 'java'} is Java 11" in result.stderr


def test_the_demo_refuses_a_non_empty_directory_it_did_not_write_and_deletes_nothing(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = kmem_cli("pipeline", "demo", "--output", tmp_path / "mine", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"kmem: error: demo output directory {tmp_path / 'mine'} is not empty and "
                                          "is not a previous demo output (no .kmem-demo file): give a new or empty "
                                          "directory"]
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]
    result = kmem_cli("pipeline", "demo", "--output", ".", cwd=tmp_path / "mine")
    assert result.returncode == 2 and os.listdir(tmp_path / "mine") == ["notes.txt"]


def no_java(tmp_path):
    """An environment where Spark cannot start: what is refused there is refused before Spark starts."""
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    return dict(env, PATH=str(tmp_path / "no-bin"))


def tree(directory):
    return {str(path.relative_to(directory)): path.read_bytes() if path.is_file() else None
            for path in sorted(directory.rglob("*"))}


@pytest.mark.parametrize("job", ["convert", "ledger"])
@pytest.mark.parametrize("output, where", [(".", "is"), ("out", "is inside"), ("..", "holds")])
def test_an_output_that_is_the_input_inside_it_or_holding_it_is_refused_before_spark_starts(tmp_path, logs, job,
                                                                                           output, where):
    before = tree(logs)
    result = kmem_cli("pipeline", job, logs, logs / output, cwd=tmp_path, env=no_java(tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"kmem: error: {job} output directory {logs / output} {where} the input "
                                          f"directory {logs}: give a directory apart from it"]
    assert tree(logs) == before


def test_a_report_output_inside_the_input_is_refused(tmp_path, logs):
    result = kmem_cli("pipeline", "report", logs, "--output", logs, cwd=tmp_path, env=no_java(tmp_path))
    assert result.returncode == 2
    assert "report output directory" in result.stderr and "is the input directory" in result.stderr
    assert not (logs / "report.json").exists()


@pytest.mark.parametrize("job", ["convert", "ledger"])
def test_a_non_empty_output_the_job_did_not_write_is_refused_and_left_alone(tmp_path, logs, job):
    (tmp_path / "mine" / "orders-0").mkdir(parents=True)
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = kmem_cli("pipeline", job, logs, tmp_path / "mine", cwd=tmp_path, env=no_java(tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"kmem: error: {job} output directory {tmp_path / 'mine'} is not empty and "
                                          f"is not a previous {job} output (no .kmem-{job} file): give a new or empty "
                                          "directory"]
    assert tree(tmp_path / "mine") == {"notes.txt": b"keep me", "orders-0": None}


def test_a_previous_ledger_or_convert_output_loses_only_its_partition_directories(tmp_path, logs):
    from kmem.spark.outputs import prepare_partition_output

    output = tmp_path / "out"
    prepare_partition_output(output, "convert", logs)
    assert os.listdir(output) == [".kmem-convert"]
    (output / "orders-0").mkdir()
    (output / "orders-0" / "00000000000000000000.log").write_bytes(b"old")
    (output / "notes-1").write_text("a file, not a partition directory")
    prepare_partition_output(output, "convert", logs)
    assert sorted(os.listdir(output)) == [".kmem-convert", "notes-1"]
    with pytest.raises(kmem.errors.InvalidArgumentError, match="is not a previous ledger output"):
        prepare_partition_output(output, "ledger", logs)


def test_a_previous_demo_output_loses_only_what_the_demo_wrote(tmp_path):
    from kmem.spark.demo import MARKER, OUTPUTS, prepare_output

    output = tmp_path / "demo"
    prepare_output(output)                      # a new directory: created and marked
    assert os.listdir(output) == [MARKER]
    for name in OUTPUTS:
        if name.endswith((".json", ".png")):
            (output / name).write_text("old")
        else:
            (output / name / "sub").mkdir(parents=True)
    (output / "notes.txt").write_text("keep me")
    prepare_output(output)
    assert sorted(os.listdir(output)) == sorted([MARKER, "notes.txt"])


def test_a_source_tree_without_its_compiled_core_says_how_to_fix_the_import(tmp_path):
    tree = tmp_path / "kmem"
    tree.mkdir()
    for name in ("__init__.py", "_core.pyx"):
        shutil.copy(SOURCE_TREE / name, tree / name)
    result = subprocess.run([sys.executable, "-S", "-c", "import kmem"], capture_output=True, text=True,
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert result.returncode != 0
    assert "unbuilt source tree" in result.stderr and "build_ext --inplace" in result.stderr


# --- kmem broker ------------------------------------------------------------------------------------

# The settings of Kafka's sample config/kraft/server.properties (a combined broker and controller)
KRAFT_SAMPLE = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@localhost:9093
listeners=PLAINTEXT://:9092,CONTROLLER://:9093
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://localhost:9092,CONTROLLER://localhost:9093
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,\
SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs={log_dir}
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
"""


def produce_and_read_back(bootstrap, topic):
    """A kafka-python producer and consumer through ``bootstrap``: what the broker advertises must work."""
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(topic, b"hello").get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=10000)
    values = [record.value for record in consumer]
    consumer.close()
    return values


def stop(process):
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0


def test_a_sigterm_the_kernel_gives_another_thread_stops_the_broker(tmp_path):
    """SIGTERM is process-wide and the kernel may hand it to any thread not blocking it: sent here to one of the
    broker's own threads (tgkill), it must still stop the broker cleanly, and soon."""
    import ctypes
    process, _ = start_broker_process(tmp_path / "logs")
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{process.pid}/task") if int(tid) != process.pid]
        tgkill = 234 if os.uname().machine == "x86_64" else 131        # the syscall's number: x86_64, aarch64
        assert ctypes.CDLL(None, use_errno=True).syscall(tgkill, process.pid, threads[0], signal.SIGTERM) == 0
        assert process.wait(10) == 0
    finally:
        process.kill()
        process.wait()
    assert os.path.exists(tmp_path / "logs" / ".kafka_cleanshutdown")


def test_kafkas_sample_kraft_config_starts_the_broker_on_its_broker_listener(tmp_path):
    config = tmp_path / "server.properties"
    config.write_text(KRAFT_SAMPLE.format(log_dir=tmp_path / "kraft-logs"))
    process, address = start_broker_process(None, "--config", config, port=0)
    try:
        port = int(address.rsplit(":", 1)[1])
        assert address == f"0.0.0.0:{port}"        # PLAINTEXT://:9092 binds every interface, at --port's port
        # advertised.listeners named the listener's port, so it names the port served
        assert produce_and_read_back(f"127.0.0.1:{port}", "sample") == [b"hello"]
    finally:
        stop(process)
    log = "".join(process.log_lines)
    assert log.count("ignoring the controller listener CONTROLLER://:9093 (controller.listener.names)") == 1
    ignored = [line for line in process.log_lines if "ignoring settings kmem broker does not use" in line]
    assert len(ignored) == 1
    assert ignored[0].rsplit(": ", 1)[1].strip().split(", ") == [
        "controller.quorum.voters", "num.recovery.threads.per.data.dir",
        "offsets.topic.replication.factor", "process.roles", "socket.receive.buffer.bytes", "socket.send.buffer.bytes",
        "transaction.state.log.min.isr", "transaction.state.log.replication.factor"]
    assert (tmp_path / "kraft-logs" / "meta.properties").exists()      # log.dirs is used


def test_the_listener_host_and_port_come_from_listeners_and_clients_reach_the_advertised_one(tmp_path):
    port = free_port()
    config = tmp_path / "server.properties"
    config.write_text(f"listeners=PLAINTEXT://127.0.0.1:{port}\nadvertised.listeners=PLAINTEXT://localhost:{port}\n"
                      f"log.dirs={tmp_path / 'logs'}\n")
    process, address = start_broker_process(None, "--config", config, port=None)
    try:
        assert address == f"127.0.0.1:{port}"
        assert produce_and_read_back(f"localhost:{port}", "configured") == [b"hello"]
    finally:
        stop(process)
    assert not any("ignoring settings" in line for line in process.log_lines)


def run_broker_cli(*args, cwd):
    return kmem_cli("broker", *args, cwd=cwd, timeout=60)


def test_several_log_dirs_are_refused_in_one_line(tmp_path):
    config = tmp_path / "server.properties"
    config.write_text(f"log.dirs={tmp_path / 'a'},{tmp_path / 'b'}\n")
    result = run_broker_cli("--config", config, "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"kmem broker: log.dirs names 2 directories ({tmp_path / 'a'}, "
                                          f"{tmp_path / 'b'}): kmem broker serves one log directory"]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_log_dir_that_is_a_file_is_not_a_directory(tmp_path):
    (tmp_path / "logs").write_text("")
    result = run_broker_cli("--log-dir", tmp_path / "logs", "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"kmem broker: log directory {tmp_path / 'logs'} is not a directory"]


@pytest.mark.parametrize("existing", [False, True])
def test_a_busy_port_names_port_option_and_leaves_no_log_directory_behind(tmp_path, existing):
    log_dir = tmp_path / "new" / "logs"
    if existing:
        log_dir.mkdir(parents=True)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_broker_cli("--log-dir", log_dir, "--port", port, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (f"kmem broker: cannot listen on 127.0.0.1:{port}: the address is in use "
                                              "(another broker?): stop it, or choose another port with --port")
    assert os.listdir(log_dir) == [] if existing else not (tmp_path / "new").exists()


@pytest.mark.parametrize("listeners, message", [
    ("PLAINTEXT://:9092,SASL_PLAINTEXT://:9092", "Each listener must have a different port, listeners: "
                                                 "PLAINTEXT://:9092,SASL_PLAINTEXT://:9092 (port 9092)"),
    ("PLAINTEXT://127.0.0.1:9092,PLAINTEXT://[::1]:9092", "Each listener must have a different name"),
    ("PLAINTEXT://:9092,SSL://:9093", "listener SSL://:9093 is SSL: set ssl.keystore.location (a PEM keystore)"),
    ("PLAINTEXT://:9092,EXTERNAL://:9093", "listener EXTERNAL has no security protocol in "
                                           "listener.security.protocol.map"),
    ("SASL_SSL://:9092", "listener SASL_SSL://:9092 is SASL_SSL: set ssl.keystore.location (a PEM keystore)"),
    ("SASL_PLAINTEXT://:9092", "sasl.enabled.mechanisms = 'GSSAPI': kmem broker serves the SASL mechanisms PLAIN, "
                               "SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, not GSSAPI (Kafka default GSSAPI)"),
    ("SSL://:9092", "listener SSL://:9092 is SSL: set ssl.keystore.location (a PEM keystore)"),
    ("CONTROLLER://:9093", "listeners must name a broker listener for kmem broker to serve"),
    ("EXTERNAL://:9092", "listener EXTERNAL has no security protocol in listener.security.protocol.map"),
    ("localhost:9092", "listeners must look like PLAINTEXT://host:port"),
])
def test_listeners_kmem_cannot_serve_are_refused_naming_them(tmp_path, listeners, message):
    from kmem.broker import Broker
    from kmem.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        Broker(tmp_path, properties={"listeners": listeners, "controller.listener.names": "CONTROLLER"})
    assert str(refused.value).startswith(message)


def test_the_listener_from_listeners_is_replaced_by_host_and_port_and_advertised_as_kafka_does(tmp_path):
    from kmem.broker import Broker
    from kmem.errors import ConfigError

    sample = {"listeners": "PLAINTEXT://:9092,CONTROLLER://:9093", "controller.listener.names": "CONTROLLER",
              "advertised.listeners": "PLAINTEXT://localhost:9092,CONTROLLER://localhost:9093"}
    settings = Broker(tmp_path, **{k.replace(".", "_"): v for k, v in sample.items()}).settings
    served, = settings.listeners
    assert (served.listener.host, served.listener.port) == ("", 9092)
    assert (served.advertised.host, served.advertised.port) == ("localhost", 9092)
    served, = Broker(tmp_path, 9095, host="127.0.0.1", properties=sample).settings.listeners
    assert (served.listener.host, served.listener.port) == ("127.0.0.1", 9095)
    assert (served.advertised.host, served.advertised.port) == ("localhost", 9095)   # it named the served port
    forwarded = dict(sample, **{"advertised.listeners": "PLAINTEXT://gateway:29092"})     # NAT: Kafka allows it
    served, = Broker(tmp_path, 9095, properties=forwarded).settings.listeners
    assert (served.advertised.host, served.advertised.port) == ("gateway", 29092)
    with pytest.raises(ConfigError, match="advertised.listeners names EXTERNAL, not a listener kmem broker serves"):
        Broker(tmp_path, properties=dict(sample, **{"advertised.listeners": "EXTERNAL://gateway:29092"}))
    with pytest.raises(ConfigError, match="cannot use the nonroutable meta-address 0.0.0.0"):
        Broker(tmp_path, properties=dict(sample, **{"advertised.listeners": "PLAINTEXT://0.0.0.0:9092"}))


def test_an_embedded_broker_whose_start_fails_leaves_no_log_directory(tmp_path):
    from kmem.broker import Broker

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        broker = Broker(tmp_path / "new" / "logs", busy.getsockname()[1])
        with pytest.raises(OSError):
            broker.start()
    assert not (tmp_path / "new").exists()
    broker.settings = Broker(tmp_path / "new" / "logs").settings       # a free port this time: it starts
    with broker:
        assert (tmp_path / "new" / "logs" / "meta.properties").exists()


def test_broker_help_describes_the_command_and_every_option(tmp_path):
    result = kmem_cli("broker", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "Run a single-node Kafka broker on a log directory" in result.stdout
    options = result.stdout.split("options:")[1].split("exit codes:")[0]
    described = {entry.split()[0]: entry.split()[2:] for entry in options.split("\n  -")[1:]}
    assert sorted(described) == ["-config", "-host", "-jaas", "-log-dir", "-override", "-port", "h,"]
    assert all(len(words) > 4 for words in described.values()), described
    assert "  2  not started" in result.stdout


def test_top_level_help_is_plain_text_and_names_both_commands_exit_codes(tmp_path):
    result = kmem_cli("--help", cwd=tmp_path)
    assert "``" not in result.stdout
    assert "kmem broker's exit codes:" in result.stdout and "kmem pipeline's exit codes:" in result.stdout


# --- kmem pipeline as a person sees it ---------------------------------------------------------------

def test_without_the_spark_extra_the_pipeline_says_what_to_install(tmp_path, logs):
    script = ("import sys; sys.modules['pyspark'] = None; from kmem.cli import main; "
              f"sys.exit(main(['pipeline', 'report', {str(logs)!r}]))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                            env=dict(os.environ, PYTHONSAFEPATH="1"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["kmem: error: kmem pipeline needs the spark extra (pyspark, pyarrow, "
                                          "matplotlib, tqdm), and pyspark is not installed: pip install 'kmem[spark]'"]


def test_the_report_table_keeps_its_columns_for_long_partition_names():
    from kmem.cli import print_report

    def partition(topic, number, records):
        return {"topic": topic, "partition": number, "records": records, "batches": 1, "bytes": 85, "unread_bytes": 0,
                "producer_ids": 0, "bloom_shape": {"bits": 10, "hash_functions": 7},
                "batches_by_format": {"v2/none": 1}}
    result = {"partitions": [partition("a", 0, 3), partition("orders.eu-west.payments-v2", 11, 123456)],
              "totals": {"records": 123459, "batches": 2, "bytes": 170, "unread_bytes": 0, "producer_ids": 0},
              "corrupt_segments": []}
    stream = io.StringIO()
    print_report(result, stream)
    lines = stream.getvalue().splitlines()
    assert [line.split() for line in lines] == [
        ["partition", "records", "batches", "bytes", "unread", "pids", "bloom", "m/k", "formats"],
        ["a-0", "3", "1", "85", "0", "0", "10/7", "v2/none:1"],
        ["orders.eu-west.payments-v2-11", "123456", "1", "85", "0", "0", "10/7", "v2/none:1"],
        ["total", "123459", "2", "170", "0", "0"]]
    records_end = lines[0].index("records") + len("records")
    assert all(line[:records_end].endswith(words.split()[1]) for line, words in zip(lines[1:], lines[1:]))


class FakeTracker:
    """A SparkContext status tracker whose one stage has finished its 4 tasks."""

    def getActiveStageIds(self):
        return [0]

    def getStageInfo(self, stage_id):
        return types.SimpleNamespace(numCompletedTasks=4, numTasks=4)


def terminal(columns):
    """A pseudo-terminal of ``columns`` columns (0: one that reports no size): (its writer, its reader fd)."""
    reader, writer = os.openpty()
    fcntl.ioctl(writer, termios.TIOCSWINSZ, struct.pack("HHHH", 0, columns, 0, 0))
    return os.fdopen(writer, "w"), reader


@pytest.mark.parametrize("columns", [0, 100])
def test_the_progress_bar_draws_on_a_terminal_also_one_that_reports_no_size(columns):
    pytest.importorskip("tqdm")
    from kmem.spark.progress import stage_progress

    spark = types.SimpleNamespace(sparkContext=types.SimpleNamespace(statusTracker=FakeTracker))
    stream, reader = terminal(columns)
    with stream:
        with stage_progress(spark, "report", stream=stream, interval=0.01):
            pass
    drawn = b""
    while chunk := _read_terminal(reader):
        drawn += chunk
    drawn = drawn.decode()
    os.close(reader)
    assert "report: 100%" in drawn and "4/4" in drawn


def test_a_pipeline_run_on_a_terminal_shows_progress_and_no_jvm_start_notices(tmp_path, logs):
    (logs / "orders.eu-west.payments-v2-11").mkdir()
    (logs / "orders-0" / "00000000000000000000.log").rename(
        logs / "orders.eu-west.payments-v2-11" / "00000000000000000000.log")
    stream, reader = terminal(0)
    with stream:
        process = subprocess.Popen([sys.executable, "-m", "kmem.cli", "pipeline", "report", logs], cwd=tmp_path,
                                   stdout=subprocess.PIPE, stderr=stream, env=dict(os.environ, PYTHONSAFEPATH="1"))
    shown = b""
    while chunk := _read_terminal(reader):
        shown += chunk
    out = process.stdout.read().decode()
    assert process.wait(120) == 0
    os.close(reader)
    lines = [line for line in shown.decode().replace("\r\n", "\n").split("\n") if line.strip()]
    assert len(lines) == 1 and "report: 100%" in lines[0], lines        # the bar, redrawn in place with \r
    assert out.splitlines()[1].split() == ["orders.eu-west.payments-v2-11", "3", "1", "85", "0", "0", "10/7",
                                           "v2/none:1"]


def _read_terminal(reader):
    try:
        return os.read(reader, 65536)
    except OSError:             # EIO: every writer has closed the terminal
        return b""


def test_a_second_spark_on_the_machine_is_no_notice_for_the_pipeline():
    """Two pipelines at once: the second one's UI takes the next port, which Spark says at start; the pipeline
    keeps that line off the terminal with the other start notices (the real errors still show)."""
    from kmem.spark.session import JVM_START_NOTICES
    moved = "26/11/28 14:35:55 WARN Utils: Service 'SparkUI' could not bind on port 4040. Attempting port 4041."
    assert JVM_START_NOTICES.search(moved)
    assert not JVM_START_NOTICES.search("26/11/28 14:35:55 WARN Utils: Service 'sparkDriver' could not bind on a "
                                        "random free port. You may check whether configuring an appropriate "
                                        "binding address.")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_as_soon_as_the_broker_listens_stops_it_cleanly(tmp_path, signum):
    """A signal sent the moment the broker logs where it listens (what a supervisor or a test waits for), while its
    start-up still runs (here held for a second), stops it with exit 0 once started, not by the signal's default
    action."""
    process, _ = start_broker_process(tmp_path / "logs", before="import gc, time\ngc.freeze = lambda: time.sleep(1)")
    process.send_signal(signum)
    assert process.wait(30) == 0, "".join(process.log_lines)
    wait_for(lambda: any("shutting down" in line for line in process.log_lines), "its shutdown logged")
