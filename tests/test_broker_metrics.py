"""kmem broker's Prometheus endpoint (``metrics.port``): scraped while a real client produces and consumes, it
reports what the clients did and what the log directory holds, under the Prometheus JMX exporter's names."""
import os
import re
import urllib.error
import urllib.request

from confluent_kafka import Consumer, Producer
import pytest

from broker_helpers import wait_for
from kmem.broker import Broker
from kmem.errors import ConfigError

pytest.importorskip("prometheus_client")

RECORDS = 500


def scrape(broker):
    host, port = broker.metrics_endpoint.address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30) as answer:
        return answer.read().decode()


def value(text, name, **labels):
    """The sample ``name{labels}`` of a Prometheus text page (its labels in name order), or None."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    found = re.search(rf"^{re.escape(name)}{{{re.escape(wanted)}}} (\S+)$" if labels else
                      rf"^{re.escape(name)} (\S+)$", text, re.M)
    return None if found is None else float(found.group(1))


def test_a_scrape_reports_what_the_clients_did_and_what_the_log_holds(tmp_path):
    with Broker(tmp_path, properties={"metrics.port": 0, "num.partitions": 2,
                                      "group.initial.rebalance.delay.ms": 0}) as broker:
        before = scrape(broker)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        for i in range(RECORDS):
            producer.produce("metered", b"x" * 100, partition=i % 2)
        assert producer.flush(30) == 0
        after = scrape(broker)
        for partition in (0, 1):
            log_dir = os.path.join(broker.log_dir, f"metered-{partition}")
            size = sum(os.path.getsize(os.path.join(log_dir, f)) for f in os.listdir(log_dir) if f.endswith(".log"))
            assert value(after, "kafka_log_log_logendoffset", topic="metered", partition=partition) == RECORDS / 2
            assert value(after, "kafka_log_log_logstartoffset", topic="metered", partition=partition) == 0
            assert value(after, "kafka_log_log_size", topic="metered", partition=partition) == size
        produced = [float(v) for v in re.findall(r'^kafka_network_requestmetrics_requests_total\{request="Produce",'
                                                 r'version="\d+"\} (\S+)$', after, re.M)]
        assert sum(produced) >= 1 and "metered" not in before
        assert value(after, "kafka_server_delayedoperationpurgatory_purgatorysize", delayedOperation="Fetch") == 0
        assert value(after, "kafka_network_requestchannel_requestqueuesize") is not None
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "g",
                             "fetch.wait.max.ms": 10_000, "auto.offset.reset": "latest"})
        consumer.subscribe(["metered"])

        def long_polling():     # the consumer joins, then its fetches wait at the end of the log
            consumer.poll(0.2)
            return value(scrape(broker), "kafka_server_delayedoperationpurgatory_purgatorysize",
                         delayedOperation="Fetch") >= 1
        wait_for(long_polling, "a fetch waiting in the purgatory")
        consumer.close()
        del producer
        with pytest.raises(urllib.error.HTTPError) as elsewhere:
            urllib.request.urlopen(f"http://{broker.metrics_endpoint.address[0]}:"
                                   f"{broker.metrics_endpoint.address[1]}/other", timeout=30)
        assert elsewhere.value.code == 404
    assert broker.metrics_endpoint is not None


def test_no_endpoint_unless_asked_and_a_bad_port_is_refused(tmp_path):
    with Broker(tmp_path / "plain") as broker:
        assert broker.metrics_endpoint is None
    with pytest.raises(ConfigError, match="metrics.port"):
        Broker(tmp_path / "bad", properties={"metrics.port": 70000})
