"""A SparkSession for kmem's jobs: embedded local Spark by default, any cluster unchanged.

Under ``spark-submit`` (or wherever a session already exists) the existing master and configuration are
kept; otherwise an embedded ``local[*]`` session is started. Either way Python workers run the driver's
interpreter, so the compiled ``kmem._core`` they import is the same build the driver uses.
"""
import os
import re
import shutil
import subprocess
import sys

from kmem.errors import KmemError

MIN_JAVA = 17       # Spark 4's minimum


class JavaRuntimeError(KmemError):
    """Spark cannot start here: no Java runtime, or one older than Spark 4 needs."""


def get_session(master=None, app_name="kmem", conf=None):
    """Return a SparkSession with kmem's ``kafka-log`` data source registered.

    ``master`` overrides the master URL; by default an active or ``spark-submit`` master is used, else
    ``local[*]``. ``conf`` is a dict of extra Spark settings. Raises ``JavaRuntimeError`` before
    anything starts when Spark would need to launch a JVM and cannot find a Java 17+ runtime.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from kmem.spark.source import KafkaLogDataSource

    if SparkContext._active_spark_context is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        check_java()

    # Workers must import the same compiled core as the driver. On a cluster, ship the wheel with a
    # packed virtual environment and set spark.pyspark.python to its interpreter (see README).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Workers start as `python -m pyspark.daemon` in the driver's directory; without this, a driver run
    # from a kmem checkout would have them import the uncompiled source tree instead of the install.
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    builder = SparkSession.builder.appName(app_name)
    submitted = SparkConf().contains("spark.master")
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
