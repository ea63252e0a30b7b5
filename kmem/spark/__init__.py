"""kmem on Apache Spark: the ``kafka-log`` data source and the pipeline jobs (``report``, ``ledger``,
``convert``) over Kafka log directories. Needs the ``spark`` extra: ``pip install 'kmem[spark]'``."""
from kmem.spark.session import JavaRuntimeError, get_session

__all__ = ["JavaRuntimeError", "get_session"]
