"""The dispatcher's steps in the compiled core (``_core.DispatchCore``): every request is read, checked against the
versions served, counted and measured there, and the APIs a handler answers alone (``DIRECT_APIS``) are answered
there while no authorizer and no quota applies. What a client sees is Kafka's answer either way: counts exact with
two network threads, a failing handler answered as ``KafkaApis.handleError`` answers it, a follower's Fetch outside
BytesOutPerSec, and a quota set while the broker runs taking effect at the next request."""
import threading

import pytest

from broker_helpers import RawConnection, produce_raw, wait_for
from kmem import _core
from kmem.broker import Broker
from kmem.broker.apis import dispatch
from kmem.broker.codes import ErrorCode
from kmem.metrics import ALL_TOPICS, BYTES_OUT
from kmem.protocol import ApiKey, encode_request, messages
from kmem.records import build_records

F = messages.FetchRequest


def fetch(connection, version, replica_id=-1):
    """The response to a Fetch v``version`` of partition 0 of ``t`` from offset 0."""
    partition = F.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    request = F(replica_id=replica_id, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                topics=[F.FetchTopic(topic="t", partitions=[partition])])
    return connection.call(ApiKey.FETCH, version, request)


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "logs", properties={"num.network.threads": "2"}) as running:
        running.logs.create_topic("t", 1)
        yield running


def test_the_compiled_core_dispatches():
    assert _core.__file__.endswith(".so")
    assert dispatch.RequestDispatcher.__call__ is _core.DispatchCore.__call__
    # nothing the core answers goes to an io thread or needs more than (header, body), or the work after the response
    assert not (dispatch.DIRECT_APIS - dispatch.AFTER_RESPONSE_APIS) & (dispatch.BLOCKING_APIS | dispatch._CALLED_APART)
    assert not dispatch.DIRECT_APIS & {ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.INIT_PRODUCER_ID,
                                       ApiKey.ADD_OFFSETS_TO_TXN, *dispatch.GROUP_APIS}


def test_requests_from_two_network_threads_are_each_counted_and_timed_once(broker):
    """No lock: each count is one step of the core under the GIL."""
    rounds, clients = 200, 4
    before = broker.requests_served[(ApiKey.PRODUCE, 9)], broker.requests_served[(ApiKey.FETCH, 12)]

    def client():
        with RawConnection(broker.bootstrap_servers) as connection:
            for _ in range(rounds):
                assert produce_raw(connection, "t", bytes(build_records([b"v"]))).error_code == 0
                assert fetch(connection, 12).responses[0].partitions[0].error_code == 0

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert broker.requests_served[(ApiKey.PRODUCE, 9)] - before[0] == rounds * clients
    assert broker.requests_served[(ApiKey.FETCH, 12)] - before[1] == rounds * clients
    assert broker.logs.get_partition("t", 0).log_end_offset == rounds * clients

    def timed(api):         # tallied once its response is sent, which the client may see just before
        return broker.server.handler.request_times.totals()[api][0]
    wait_for(lambda: timed(ApiKey.PRODUCE) >= rounds * clients and timed(ApiKey.FETCH) >= rounds * clients,
             "every request timed")


def test_a_failing_handler_of_an_api_the_core_answers_is_answered_as_kafka_answers_it(broker, monkeypatch, caplog):
    """A Fetch (v7+ has a top-level error code) gets UNKNOWN_SERVER_ERROR, logged, and its connection stays open;
    a ListOffsets, whose errors are per partition, has its connection closed."""
    def fails(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(broker.handlers, "_read_all", fails)
    with RawConnection(broker.bootstrap_servers) as connection:
        for _ in range(2):
            assert fetch(connection, 11).error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert "FETCH v11 from 'raw' failed; answered UNKNOWN_SERVER_ERROR" in caplog.text
    monkeypatch.undo()
    monkeypatch.setattr(broker.handlers, "fetch_sent", fails)       # after the handler, before the answer is out
    with RawConnection(broker.bootstrap_servers) as connection:
        assert fetch(connection, 11).error_code == ErrorCode.UNKNOWN_SERVER_ERROR
        monkeypatch.undo()
        assert fetch(connection, 11).error_code == ErrorCode.NONE
    monkeypatch.setattr(broker.handlers, "logs", None)
    with RawConnection(broker.bootstrap_servers) as connection:
        L = messages.ListOffsetsRequest
        request = L(replica_id=-1, isolation_level=0, topics=[L.ListOffsetsTopic(name="t", partitions=[
            L.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)])])
        connection.send_frame(bytes(encode_request(request, 7, 1, client_id="raw")))
        assert connection.receive_frame() is None


def test_a_followers_fetch_sends_no_bytes_out_and_a_consumers_does(broker):
    records = build_records([b"x" * 500])
    with RawConnection(broker.bootstrap_servers) as connection:
        assert produce_raw(connection, "t", bytes(records)).error_code == 0
        def bytes_out():
            return broker.handlers.topic_stats.totals().get(ALL_TOPICS, [0] * (BYTES_OUT + 1))[BYTES_OUT]
        before = bytes_out()
        assert len(fetch(connection, 11, replica_id=1).responses[0].partitions[0].records) == len(records)
        assert bytes_out() == before
        assert len(fetch(connection, 11).responses[0].partitions[0].records) == len(records)
        assert bytes_out() == before + len(records)


def test_a_quota_set_while_the_broker_runs_throttles_the_next_produce(tmp_path):
    """With a quota set the core hands Produce to the Python path, which throttles it (KIP-219)."""
    from test_broker_quotas import Raw, entry

    with Broker(tmp_path, properties={"quota.window.num": 2}) as broker:
        broker.logs.create_topic("t", 1)
        raw = Raw(broker.bootstrap_servers)
        value = bytes(build_records([b"y" * 20_000]))
        assert produce_raw(raw.raw, "t", value).error_code == 0 and raw.raw.last_throttle_time_ms == 0
        assert raw.alter(entry({"client-id": "raw"}, producer_byte_rate=10_000)) == [(0, None)]
        assert produce_raw(raw.raw, "t", value).error_code == 0 and raw.raw.last_throttle_time_ms > 0
        raw.raw.close()
