"""A SparkSession for kmem's jobs: embedded local Spark by default, any cluster unchanged.

Under ``spark-submit`` (or wherever a session already exists) the existing master and configuration are
kept; otherwise an embedded ``local[*]`` session is started. Either way Python workers run the driver's
interpreter, so the compiled ``kmem._core`` they import is the same build the driver uses.
"""
import os
import sys


def get_session(master=None, app_name="kmem", conf=None):
    """Return a SparkSession with kmem's ``kafka-log`` data source registered.

    ``master`` overrides the master URL; by default an active or ``spark-submit`` master is used, else
    ``local[*]``. ``conf`` is a dict of extra Spark settings.
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    from kmem.spark.source import KafkaLogDataSource

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
