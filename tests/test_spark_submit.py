"""kmem's jobs submitted with ``spark-submit --master spark://…`` to a standalone Spark cluster (a master
and one worker from the pyspark package, on 127.0.0.1): they must run on that cluster, not on a local
master. KMEM_TEST_SPARK_PYTHON names another interpreter (with its own pyspark, e.g. the oldest the
project allows) to run the cluster, the driver and the workers; the default is the one running pytest."""
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from broker_helpers import wait_for
from kmem.ledger import PidLedger
from kmem.spark.demo import NEVER_EXPIRE_MS
from kmem.spark.sample import generate_sample
from kmem.spark.session import JavaRuntimeError, check_java
from network_helpers import free_port

pytest.importorskip("pyspark")

PYTHON = os.environ.get("KMEM_TEST_SPARK_PYTHON", sys.executable)
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"       # short-lived JVMs: less CPU spent compiling and collecting

JOB = """\
import json
import sys

from kmem.spark import get_session, jobs

data, out = sys.argv[1:]
spark = get_session(app_name="kmem-submitted")
result = {"master": spark.sparkContext.master, "app_id": spark.sparkContext.applicationId,
          "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
          "ledger": jobs.ledger(spark, data, out + "/ledger")}
with open(out + "/result.json", "w") as file:
    json.dump(result, file)
spark.stop()
"""


def master_state(ui_port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
            return json.load(response)
    except (OSError, ValueError):       # not up yet: a starting master can answer its HTML page there
        return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and a worker; yields (master URL, web UI port, environment for spark-submit)."""
    try:
        check_java()
    except JavaRuntimeError as exc:
        pytest.skip(str(exc))
    spark_home = subprocess.run([PYTHON, "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
                                capture_output=True, text=True, check=True).stdout.strip()
    directory = tmp_path_factory.mktemp("spark-cluster")
    # The worker's executors inherit its environment: their Python workers import the kmem under test.
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SPARK_", "PYSPARK_"))}
    env.update(SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1", SPARK_DAEMON_MEMORY="256m",
               SPARK_DAEMON_JAVA_OPTS=QUICK_JVM,
               SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false", PYSPARK_PYTHON=PYTHON,
               PYTHONSAFEPATH="1")
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    port, ui_port = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    daemons = {}        # log file -> process

    def start(name, *args):
        log = directory / f"{name}.log"
        with open(log, "wb") as out:
            daemons[log] = subprocess.Popen([spark_class, f"org.apache.spark.deploy.{name}", *args], stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=directory, env=env)

    def ready():
        for log, daemon in daemons.items():
            assert daemon.poll() is None, f"{log.name} exited: {log.read_text()[-4000:]}"
        return (master_state(ui_port) or {}).get("aliveworkers") == 1

    try:        # the worker retries until the master is up: both JVMs start at once
        start("master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port))
        start("worker.Worker", url, "--host", "127.0.0.1", "--webui-port", "0", "--cores", "2", "--memory", "1g",
              "--work-dir", str(directory / "work"))
        wait_for(ready, "a Spark master with its worker", timeout=120)
        yield url, ui_port, env
    finally:
        for daemon in daemons.values():
            daemon.terminate()
        for daemon in daemons.values():
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def test_a_submitted_job_runs_on_the_submitted_master(cluster, tmp_path):
    url, ui_port, env = cluster
    sample = generate_sample(tmp_path / "data", seed=5, batches_per_partition=6)
    job = tmp_path / "job.py"
    job.write_text(JOB)
    out = tmp_path / "out"
    out.mkdir()
    submit = [os.path.join(env["SPARK_HOME"], "bin", "spark-submit"), "--master", url,
              "--driver-memory", "512m", "--driver-java-options", QUICK_JVM,
              "--executor-memory", "512m", "--conf", f"spark.executor.extraJavaOptions={QUICK_JVM}",
              "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=3",
              str(job), sample.directory, str(out)]
    done = subprocess.run(submit, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())

    assert result["master"] == url
    apps = master_state(ui_port)
    assert result["app_id"] in [app["id"] for app in apps["activeapps"] + apps["completedapps"]]
    assert result["shuffle_partitions"] == "3"         # the submitted configuration is kept
    assert [p["error"] for p in result["ledger"]["partitions"]] == [None] * len(sample.partitions)
    for (topic, partition), part in sample.partitions.items():
        ledger = PidLedger(out / "ledger" / f"{topic}-{partition}", producer_id_expiration_ms=NEVER_EXPIRE_MS)
        try:
            assert {pid: ledger.read(pid) for pid in part.producers} == part.producers
        finally:
            ledger.close()
