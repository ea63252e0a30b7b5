"""librdkafka's mock cluster (inside confluent-kafka) as a broker for tests: third-party C code that is
not kmem's. Topics are created with a chosen partition count through librdkafka's mock API."""
import ctypes
import glob
import os

import confluent_kafka


def _library():
    libs = os.path.join(os.path.dirname(os.path.dirname(confluent_kafka.__file__)), "confluent_kafka.libs")
    lib = ctypes.CDLL(glob.glob(os.path.join(libs, "librdkafka*.so*"))[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    return lib


class MockCluster:
    """A mock cluster of ``brokers`` brokers on 127.0.0.1; ``bootstrap`` is its "host:port,..." string."""

    def __init__(self, brokers=1):
        self._lib = lib = _library()
        conf = lib.rd_kafka_conf_new()
        err = ctypes.create_string_buffer(512)
        lib.rd_kafka_conf_set(conf, b"log_level", b"0", err, 512)
        self._rk = lib.rd_kafka_new(0, conf, err, 512)      # a producer handle, as the cluster's owner
        if not self._rk:
            raise RuntimeError(err.value.decode())
        self._cluster = lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        self.bootstrap = lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()

    def create_topic(self, topic, partitions):
        code = self._lib.rd_kafka_mock_topic_create(self._cluster, topic.encode(), partitions, 1)
        if code:
            raise RuntimeError(f"rd_kafka_mock_topic_create({topic}, {partitions}) failed: {code}")

    def produce(self, topic, values, *, partitions=None, key=None, **config):
        """Produce ``values`` (bytes) with confluent_kafka.Producer, round-robin over ``partitions``."""
        producer = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5,
                                             "batch.size": 65536, **config})
        for i, value in enumerate(values):
            kwargs = {} if partitions is None else {"partition": i % partitions}
            producer.produce(topic, value, key=key, **kwargs)
            if i % 10000 == 9999:
                producer.flush()
        remaining = producer.flush(30)
        if remaining:
            raise RuntimeError(f"{remaining} records not delivered to the mock cluster")

    def close(self):
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._lib.rd_kafka_destroy(self._rk)
            self._cluster = self._rk = None
