"""Connecting to brokers: an unreachable bootstrap server is reported once, retried with Kafka's exponential
reconnect backoff (reconnect.backoff.ms doubling up to reconnect.backoff.max.ms), and reported again when
the connection succeeds."""
import logging
import time

from kmem.broker import Broker
from kmem.consumer import Consumer
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
