"""kmem broker's Prometheus endpoint (``metrics.port``): scraped while a real client produces and consumes, it
reports what the clients did and what the log directory holds, under the Prometheus JMX exporter's names (and
kafka-exporter's for consumer lag)."""
import os
import re
import threading
import urllib.error
import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
import pytest

from broker_helpers import RawConnection, produce_raw, wait_for
from kmem.broker import Broker
from kmem.errors import ConfigError
from kmem.metrics import REQUEST_TIMES, Tallies
from kmem.records import build_records

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


def log_bytes(broker, topic, partition):
    log_dir = os.path.join(broker.log_dir, f"{topic}-{partition}")
    return sum(os.path.getsize(os.path.join(log_dir, f)) for f in os.listdir(log_dir) if f.endswith(".log"))


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
            size = log_bytes(broker, "metered", partition)
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


COUNTED_RECORDS, VALUE_BYTES, EXTRA = 1000, 2000, 7


def test_topic_metrics_and_lag_match_what_real_clients_counted(tmp_path):
    """BrokerTopicMetrics, scraped while the load runs and after, against what a producer had acknowledged and a
    group consumer read: the records exactly, the bytes within 1% of the keys and values (the rest is the batches'
    framing, which the log holds as counted); then the group's lag as the log grows past its committed offsets."""
    with Broker(tmp_path, properties={"metrics.port": 0, "num.partitions": 2,
                                      "group.initial.rebalance.delay.ms": 0}) as broker:
        acknowledged = []

        def delivered(error, message):
            if error is None:
                acknowledged.append(len(message.key()) + len(message.value()))
        seen, loaded = [], threading.Event()

        def scrape_under_load():       # as Prometheus would, faster: the counters only ever grow
            while True:
                seen.append(value(scrape(broker), "kafka_server_brokertopicmetrics_messagesin_total") or 0)
                if loaded.wait(0.01):
                    return
        scraper = threading.Thread(target=scrape_under_load)
        scraper.start()
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
        for i in range(COUNTED_RECORDS):
            producer.produce("counted", os.urandom(VALUE_BYTES - i % 100), key=b"%d" % i, on_delivery=delivered)
        assert producer.flush(30) == 0 and len(acknowledged) == COUNTED_RECORDS
        loaded.set()
        scraper.join()
        assert seen == sorted(seen) and seen[-1] <= COUNTED_RECORDS
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "counting",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe(["counted"])
        read = []
        wait_for(lambda: read.extend(len(m.key()) + len(m.value()) for m in consumer.consume(1000, 0.2)
                                     if not m.error()) or len(read) >= COUNTED_RECORDS, "every record read")
        consumer.commit(asynchronous=False)
        text = scrape(broker)

        def topic_metric(kind, **topic):
            return value(text, f"kafka_server_brokertopicmetrics_{kind}_total", **topic)
        assert topic_metric("messagesin", topic="counted") == len(read) == COUNTED_RECORDS
        assert topic_metric("bytesin", topic="counted") == pytest.approx(sum(acknowledged), rel=0.01)
        assert topic_metric("bytesout", topic="counted") == pytest.approx(sum(read), rel=0.01)
        assert topic_metric("bytesin", topic="counted") == sum(log_bytes(broker, "counted", p) for p in (0, 1))
        assert topic_metric("bytesout", topic="counted") == topic_metric("bytesin", topic="counted")
        for kind in ("messagesin", "bytesin", "bytesout", "totalproducerequests", "totalfetchrequests"):
            assert topic_metric(kind) == topic_metric(kind, topic="counted") > 0, kind
        assert topic_metric("failedproducerequests", topic="counted") == topic_metric("failedfetchrequests") == 0
        prefix = "kafka_coordinator_group_groupmetadatamanager_"
        assert value(text, prefix + "numgroupsstable") == value(text, prefix + "numgroups") == 1
        assert value(text, prefix + "numoffsets") == 2
        assert value(text, "kafka_consumergroup_members", consumergroup="counting") == 1
        committed = {p.partition: p.offset for p in consumer.committed([TopicPartition("counted", 0),
                                                                         TopicPartition("counted", 1)])}
        for partition in (0, 1):
            labels = {"consumergroup": "counting", "topic": "counted", "partition": partition}
            assert value(text, "kafka_consumergroup_current_offset", **labels) == committed[partition]
            assert value(text, "kafka_consumergroup_lag", **labels) == 0
        consumer.close()
        for _ in range(EXTRA):
            producer.produce("counted", b"more", partition=1)
        assert producer.flush(30) == 0
        text = scrape(broker)
        lag = {"consumergroup": "counting", "topic": "counted"}
        assert value(text, "kafka_consumergroup_lag", **lag, partition=1) == EXTRA
        assert value(text, "kafka_consumergroup_lag", **lag, partition=0) == 0
        assert value(text, "kafka_consumergroup_members", consumergroup="counting") == 0
        assert value(text, prefix + "numgroupsempty") == 1 and value(text, prefix + "numgroupsstable") == 0


def test_failed_produce_requests_are_kafkas_and_a_deleted_topic_drops_its_metrics(tmp_path):
    """As Kafka's ReplicaManager: a record the topic refuses (no key on a compacted topic) is a failed request, an
    unknown partition is not (and counts for all topics only); a deleted topic's metrics go, and the topic made
    again starts from zero."""
    with Broker(tmp_path, properties={"metrics.port": 0, "auto.create.topics.enable": False}) as broker:
        broker.logs.create_topic("compacted", 1, {"cleanup.policy": "compact"})
        with RawConnection(broker.bootstrap_servers) as raw:
            keyed = bytes(build_records([{"key": b"k", "value": b"v"}]))
            assert produce_raw(raw, "compacted", keyed).error_code == 0
            assert produce_raw(raw, "compacted", bytes(build_records([b"no key"]))).error_code == 87  # INVALID_RECORD
            assert produce_raw(raw, "nowhere", keyed).error_code == 3       # UNKNOWN_TOPIC_OR_PARTITION
            text = scrape(broker)
            name = "kafka_server_brokertopicmetrics_{}_total".format
            assert value(text, name("totalproducerequests"), topic="compacted") == 2
            assert value(text, name("failedproducerequests"), topic="compacted") == 1
            assert value(text, name("messagesin"), topic="compacted") == 1
            assert value(text, name("totalproducerequests")) == 3 and value(text, name("failedproducerequests")) == 1
            assert 'topic="nowhere"' not in text
            broker.logs.delete_topic("compacted")
            text = scrape(broker)
            assert 'topic="compacted"' not in text and value(text, name("messagesin")) == 1
            broker.logs.create_topic("compacted", 1, {"cleanup.policy": "compact"})
            assert produce_raw(raw, "compacted", keyed).error_code == 0
            text = scrape(broker)
            assert value(text, name("totalproducerequests"), topic="compacted") == 1
            assert value(text, name("messagesin"), topic="compacted") == 1 and value(text, name("messagesin")) == 2


def test_a_fetch_a_quota_answers_empty_sends_no_bytes_out(tmp_path):
    """Kafka counts BytesOutPerSec as a response goes: a Fetch over consumer_byte_rate is answered empty."""
    from test_broker_quotas import Raw, entry, fetch_batch

    with Broker(tmp_path, properties={"metrics.port": 0, "quota.window.num": 2}) as broker:
        broker.logs.create_topic("data", 1)
        raw = Raw(broker.bootstrap_servers)
        for _ in range(3):
            assert produce_raw(raw.raw, "data", bytes(build_records([b"y" * 9000]))).error_code == 0
        assert raw.alter(entry({"client-id": "raw"}, consumer_byte_rate=10_000)) == [(0, None)]
        first = fetch_batch(raw.raw, "data", 0)
        sent = len(first.responses[0].partitions[0].records)
        assert first.throttle_time_ms == 0 and sent > 9000
        assert fetch_batch(raw.raw, "data", 1).responses == []       # throttled: answered empty
        text = scrape(broker)
        assert value(text, "kafka_server_brokertopicmetrics_bytesout_total", topic="data") == sent
        assert value(text, "kafka_server_brokertopicmetrics_bytesout_total") == sent
        raw.raw.close()


def test_request_times_run_from_the_read_to_the_response_sent_in_kafkas_parts(tmp_path):
    """TotalTimeMs counts each request answered and is the sum of its parts: a long poll's wait in the purgatory
    is its RemoteTimeMs, a topic creation's wait for an io thread its RequestQueueTimeMs."""
    from test_broker_quotas import fetch_batch

    with Broker(tmp_path, properties={"metrics.port": 0}) as broker:
        broker.logs.create_topic("quiet", 1)
        with RawConnection(broker.bootstrap_servers) as raw:
            assert fetch_batch(raw, "quiet", 0, max_wait_ms=1000).responses[0].partitions[0].records in (b"", None)
        # timed once its response is sent, which the client can see just before
        text = wait_for(lambda: (text := scrape(broker)) and value(
            text, "kafka_network_requestmetrics_totaltimems_count", request="Fetch") == 1 and text, "the Fetch timed")
        assert 1000 <= value(text, "kafka_network_requestmetrics_totaltimems_sum", request="Fetch") < 30_000
        # the wait in the purgatory is remote time, not local (a loaded machine may stretch the local part: the
        # first request of a fresh broker, on two busy cores, has taken 230 ms)
        local = value(text, "kafka_network_requestmetrics_localtimems_sum", request="Fetch")
        assert 1000 - local <= value(text, "kafka_network_requestmetrics_remotetimems_sum", request="Fetch") \
            < 30_000 and local < 1000
        assert value(text, "kafka_network_requestmetrics_requestqueuetimems_sum", request="Fetch") == 0
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        producer.produce("created", b"v")
        assert producer.flush(30) == 0
        text = every_request_timed(broker)
        for request in ("Fetch", "Metadata", "Produce"):
            parts = sum(value(text, f"kafka_network_requestmetrics_{timer.lower()}_sum", request=request)
                        for timer in REQUEST_TIMES[1:])
            assert parts == pytest.approx(value(text, "kafka_network_requestmetrics_totaltimems_sum",
                                                request=request), rel=1e-6), request
        # the Metadata that created the topic went to an io thread: it waited in the queue, however briefly
        assert value(text, "kafka_network_requestmetrics_requestqueuetimems_sum", request="Metadata") > 0


def every_request_timed(broker):
    """A scrape in which each API's count of every RequestMetrics timer is its requests answered (over their
    versions): requests are timed once their response is sent, which a client can see just before."""
    def timed():
        text = scrape(broker)
        served = re.findall(r'^kafka_network_requestmetrics_requests_total\{request="(\w+)",version="\d+"\} (\S+)$',
                            text, re.M)
        counts = {}
        for request, count in served:
            counts[request] = counts.get(request, 0) + float(count)
        return counts and all(value(text, f"kafka_network_requestmetrics_{timer.lower()}_count", request=request)
                              == count for request, count in counts.items() for timer in REQUEST_TIMES) and text
    return wait_for(timed, "every request answered timed")


def test_the_requests_of_a_sasl_client_are_timed_the_apiversions_before_its_handshake_too(tmp_path):
    from test_broker_sasl import SASL_PROPERTIES

    with Broker(tmp_path, properties={**SASL_PROPERTIES, "metrics.port": 0}) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
                             "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret"})
        producer.produce("secured", b"v")
        assert producer.flush(30) == 0
        text = every_request_timed(broker)
        assert value(text, "kafka_network_requestmetrics_totaltimems_count", request="ApiVersions") >= 1


def test_log_segments_flushes_and_the_cleaner_are_measured(tmp_path):
    """Each roll's flush counts in LogFlushRateAndTimeMs, NumLogSegments follows the segments on disk and a
    compacted topic's pass shows in the LogCleaner gauges."""
    with Broker(tmp_path, properties={"metrics.port": 0, "log.cleaner.backoff.ms": 50}) as broker:
        broker.logs.create_topic("rolled", 1, {"segment.bytes": 2000})
        broker.logs.create_topic("compacted", 1, {"segment.bytes": 2000, "cleanup.policy": "compact",
                                                  "min.cleanable.dirty.ratio": 0.01})
        text = scrape(broker)
        assert value(text, "kafka_log_logflushstats_logflushrateandtimems_count") == 0
        assert value(text, "kafka_log_log_numlogsegments", topic="rolled", partition=0) == 1
        assert value(text, "kafka_log_logcleanermanager_uncleanable_partitions_count",
                     logDirectory=broker.log_dir) == 0
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
        for i in range(40):
            for topic in ("rolled", "compacted"):
                producer.produce(topic, b"x" * 100, key=b"k%d" % (i % 2))
            assert producer.flush(30) == 0                      # a batch each: the segments roll
        segments = len([f for f in os.listdir(os.path.join(broker.log_dir, "rolled-0")) if f.endswith(".log")])
        assert segments > 1
        # the rolls' flushes run on the flusher thread, the pass on the cleaner's
        text = wait_for(lambda: (text := scrape(broker)) and value(
            text, "kafka_log_logcleaner_cleaner_recopy_percent") > 0 and value(
            text, "kafka_log_logflushstats_logflushrateandtimems_count") >= segments - 1 and text,
            "the rolls flushed and a cleaner pass")
        assert value(text, "kafka_log_logflushstats_logflushrateandtimems_sum") > 0
        for gauge in ("kafka_log_logcleaner_max_buffer_utilization_percent", "kafka_log_logcleaner_max_clean_time_secs",
                      "kafka_log_logcleanermanager_max_dirty_percent"):
            assert value(text, gauge) is not None, gauge
        assert value(text, "kafka_log_log_numlogsegments", topic="rolled", partition=0) == segments


def test_a_consumer_protocol_groups_members_and_lag(tmp_path):
    """KIP-848's groups (group.protocol=consumer) are reported as the classic ones: members and lag."""
    with Broker(tmp_path, properties={"metrics.port": 0}) as broker:
        broker.logs.create_topic("t", 2)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        for n in range(10):
            producer.produce("t", b"%d" % n, partition=n % 2)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "next",
                             "group.protocol": "consumer", "auto.offset.reset": "earliest",
                             "enable.auto.commit": False})
        try:
            consumer.subscribe(["t"])
            read = []
            wait_for(lambda: read.extend(m for m in consumer.consume(10, 0.5) if not m.error()) or len(read) == 10,
                     "the records read")
            consumer.commit(asynchronous=False)
            text = scrape(broker)
            assert value(text, "kafka_consumergroup_members", consumergroup="next") == 1
            assert [value(text, "kafka_consumergroup_lag", consumergroup="next", topic="t", partition=p)
                    for p in range(2)] == [0, 0]
        finally:
            consumer.close()


def test_transactional_ids_by_state(tmp_path):
    with Broker(tmp_path, properties={"metrics.port": 0, "transaction.state.log.num.partitions": 1}) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "t1"})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce("txn", b"v")
        producer.flush(30)

        def transactional_ids(state):
            return value(scrape(broker), "kmem_transaction_coordinator_transactional_ids", state=state)
        assert transactional_ids("Ongoing") == 1 and transactional_ids("CompleteCommit") == 0
        producer.commit_transaction(30)
        wait_for(lambda: transactional_ids("CompleteCommit") == 1, "the transaction completed")
        assert transactional_ids("Ongoing") == 0


def test_tallies_lose_no_addition_between_threads_and_forget_a_key():
    from kmem import _core
    from kmem.network import Request
    from kmem.network.server import _Processor
    # a row, a request's fields and the tally of its times, a processor's steps are the core's, made for every
    # request
    assert Tallies.row is _core.TalliesCore.row and Request.tally is _core.RequestCore.tally
    assert all(getattr(_Processor, step) is getattr(_core.ProcessorCore, step) for step in (
        "_process_completed_receives", "_handle", "_respond_now", "_process_completed_sends", "_response_sent"))
    tallies = Tallies(2)

    def add():
        for _ in range(20_000):
            row = tallies.row("k")
            row[0] += 1
            row[1] += 3
        tallies.row("other")[0] += 1
    threads = [threading.Thread(target=add) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tallies.totals() == {"k": [80_000, 240_000], "other": [4, 0]}
    tallies.forget(["other"])
    assert tallies.totals() == {"k": [80_000, 240_000]}


def test_a_requests_times_are_tallied_into_its_row_with_marks_never_reached_taken_as_the_one_before():
    from kmem.network import Request
    from kmem.network.sasl import ANONYMOUS

    class Processor:
        measured = {}

    class Receive:
        payload, closed = b"\0\1", False

        def close(self):
            self.closed = True
    tallies, receive = Tallies(7), Receive()
    request = Request(5, Processor, receive)
    assert (request.principal, request.listener_name, request.payload) == (ANONYMOUS, "PLAINTEXT", b"\0\1")
    assert request.times[0] == request.times[1] > 0 and request.times[2:] == [0, 0, 0]
    request.measure(tallies, "Produce")
    assert Processor.measured == {5: request}
    request.times[1:] = [request.times[0] + 10, 0, request.times[0] + 40, 0]      # never handled, never dequeued
    request.tally(request.times[0] + 100)
    assert tallies.totals() == {"Produce": [1, 100, 10, 0, 30, 0, 60]}
    request.release()
    assert receive.closed
    other = Request(6, Processor, receive, "User:alice", "SASL_PLAINTEXT")
    assert (other.connection_id, other.principal, other.listener_name) == (6, "User:alice", "SASL_PLAINTEXT")
