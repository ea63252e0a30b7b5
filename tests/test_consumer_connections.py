"""Connecting to brokers: an unreachable bootstrap server is reported once, retried with Kafka's exponential
reconnect backoff (reconnect.backoff.ms doubling up to reconnect.backoff.max.ms), and reported again when
the connection succeeds."""
import logging
import time

from kmem.broker import Broker
from kmem.consumer import Consumer
from kmem.consumer.client import MAX_VERSIONS, MIN_VERSIONS, NetworkClient
from kmem.consumer.errors import KafkaConnectionError
from kmem.pool import SimpleMemoryPool
from kmem.protocol import ApiKey, messages
from network_helpers import free_port


def test_an_unreachable_bootstrap_server_is_reported_once_and_retried_with_backoff(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="kmem.consumer")
    port = free_port()
    with Consumer(f"127.0.0.1:{port}", reconnect_backoff_ms=50, reconnect_backoff_max_ms=1000) as consumer:
        consumer.assign([("later", 0)])
        end = time.monotonic() + 3
        while time.monotonic() < end:       # the application polls for 3 s, nothing listens
            consumer.poll(100)
        failures = [r for r in caplog.records if "127.0.0.1:%d" % port in r.getMessage()]
        warnings = [r for r in failures if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "cannot connect" in warnings[0].getMessage()
        # 50 ms doubling (x0.8-1.2) to 1 s: at most 8 attempts in 3 s, against 30 at a fixed 100 ms
        assert 4 <= len(failures) <= 8
        with Broker(str(tmp_path / "logs"), port=port, num_partitions=1):
            deadline = time.monotonic() + 30
            while not any("connected to" in r.getMessage() for r in caplog.records) \
                    and time.monotonic() < deadline:
                consumer.poll(100)
        connected = [r for r in caplog.records if "connected to 127.0.0.1:%d" % port in r.getMessage()]
        assert len(connected) == 1 and connected[0].levelno == logging.WARNING


def test_a_request_callback_closing_its_connection_while_the_connection_opens(tmp_path):
    """A request queued before ApiVersions answered, refused once it did (no version both sides know), whose
    callback closes the connection: the requests after it fail, and nothing is sent on the closed connection."""
    with Broker(str(tmp_path / "logs"), port=0, num_partitions=1) as broker:
        client = NetworkClient(SimpleMemoryPool(1 << 20, 1 << 20), client_id="t", request_timeout_ms=5000,
                               reconnect_backoff_ms=50, reconnect_backoff_max_ms=1000,
                               coordinator_max_receive_bytes=1 << 20,
                               min_versions={**MIN_VERSIONS, ApiKey.OFFSET_FETCH: 99},
                               max_versions={**MAX_VERSIONS, ApiKey.OFFSET_FETCH: 99})
        host, port = broker.bootstrap_servers.rsplit(":", 1)
        client.connect("b", (host, int(port)))
        answers = []

        def refused(receive, body, error):
            answers.append(error)
            client.close("b")
        client.send("b", messages.OffsetFetchRequest(group_id="g", topics=None), refused)
        client.send("b", messages.MetadataRequest(topics=[], allow_auto_topic_creation=False),
                    lambda r, b, e: answers.append(e))
        deadline = time.monotonic() + 10
        while len(answers) < 2:
            assert time.monotonic() < deadline, "no answers"
            client.poll(0.05)
        assert "supports OFFSET_FETCH" in str(answers[0]) and isinstance(answers[1], KafkaConnectionError)
        assert not client.is_connected("b")
        client.close()
