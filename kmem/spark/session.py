"""A SparkSession for kmem's jobs: embedded local Spark by default, any cluster unchanged.

In a driver started by ``spark-submit`` (or wherever a session already exists) the submitted master and
configuration are kept; otherwise an embedded ``local[*]`` session is started. Either way Python workers run
the driver's interpreter, so the compiled ``kmem._core`` they import is the same build the driver uses.
"""
import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading

from kmem.errors import KmemError

MIN_JAVA = 17       # Spark 4's minimum
# What a local Spark prints on every start, whatever the job: Java's notice for the incubator module
# Spark's launcher always adds, log4j's default-profile lines, and Spark's warnings about the host
# (its name resolving to a loopback address, no native Hadoop library, another Spark holding the UI's port, so
# that this one's UI takes the next).
JVM_START_NOTICES = re.compile(
    r"WARNING: Using incubator modules|Using Spark's default log4j profile|Setting default log level to|"
    r"To adjust logging level use sc\.setLogLevel|"
    r" WARN (Utils: Your hostname, .* resolves to a loopback address|Utils: Set SPARK_LOCAL_IP if you need|"
    r"NativeCodeLoader: Unable to load native-hadoop library|"
    r"Utils: Service 'SparkUI' could not bind on port \d+\. Attempting port \d+\.)")


class JavaRuntimeError(KmemError):
    """Spark cannot start here: no Java runtime, or one older than Spark 4 needs."""


def get_session(master=None, app_name="kmem", conf=None):
    """Return a SparkSession with kmem's ``kafka-log`` data source registered.

    ``master`` overrides the master URL. Without it, a driver started by ``spark-submit`` runs on the
    submitted ``--master`` and keeps the submitted configuration, an active session is reused,
    and anywhere else an embedded ``local[*]`` session starts. ``conf`` is a dict of extra Spark settings.
    Raises ``JavaRuntimeError`` before anything starts when Spark would need to launch a JVM and cannot
    find a Java 17+ runtime.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from kmem.spark.source import KafkaLogDataSource

    # spark-submit starts the driver's JVM first, with the submitted master among its system properties,
    # and hands the Python driver that JVM's Py4J gateway in PYSPARK_GATEWAY_PORT (pyspark's
    # launch_gateway connects to it instead of launching one). Before a SparkContext connects,
    # SparkConf() cannot see the JVM's settings, so it cannot tell a submitted driver from a plain one.
    submitted = SparkContext._active_spark_context is not None or "PYSPARK_GATEWAY_PORT" in os.environ
    if not submitted:
        check_java()

    # Workers must import the same compiled core as the driver. On a cluster, ship the wheel with a
    # packed virtual environment and set spark.pyspark.python to its interpreter (docs/pipeline.md).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Workers start as `python -m pyspark.daemon` in the driver's directory; without this, a driver run
    # from a kmem checkout would have them import the uncompiled source tree instead of the install.
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    builder = SparkSession.builder.appName(app_name)
    if master or not submitted:
        builder = builder.master(master or "local[*]")
        builder = builder.config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        builder = builder.config("spark.ui.showConsoleProgress", "false")   # kmem draws its own bar
        builder = builder.config("spark.sql.shuffle.partitions", "8")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.dataSource.register(KafkaLogDataSource)
    return spark


@contextlib.contextmanager
def quiet_jvm_start():
    """A JVM started inside the block (``get_session``) gets a pipe as its standard error, and a thread
    passes each line on to this process's standard error except ``JVM_START_NOTICES``: errors and
    Python workers' tracebacks still show. For the command line; embedded users keep Spark's output."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    stderr = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    threading.Thread(target=_pass_on, args=(read_end, stderr), name="kmem-jvm-stderr", daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(stderr, 2)      # the JVM and its workers keep the pipe: the thread ends when they do


def _pass_on(read_end, stderr):
    with open(read_end, "rb") as lines, open(stderr, "wb", buffering=0) as out:
        for line in lines:
            if not JVM_START_NOTICES.search(line.decode(errors="replace")):
                out.write(line)


def check_java():
    """The Java runtime Spark would launch (``$JAVA_HOME/bin/java``, else ``java`` on the PATH), checked
    in under a second instead of after a failed JVM start; raises ``JavaRuntimeError`` with the fix."""
    fix = f"install a Java {MIN_JAVA} (or newer) runtime, e.g. apt-get install openjdk-{MIN_JAVA}-jre-headless"
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={java_home} has no bin/java" if java_home else "no java on the PATH"
        raise JavaRuntimeError(f"Spark needs Java and {where}: {fix}")
    try:
        banner = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaRuntimeError(f"{java} -version failed ({exc}): {fix}") from None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', banner)
    if found:
        major = int(found[2] or 0) if found[1] == "1" else int(found[1])      # "1.8.0" is Java 8
        if major < MIN_JAVA:
            raise JavaRuntimeError(f"Spark 4 needs Java {MIN_JAVA} or newer, {java} is Java {major}: {fix}")
