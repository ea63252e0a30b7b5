"""kmem.protocol beside kafka-python's codec (kafka.protocol) on the same messages.

- Decode of a Produce request carrying 16 KiB and 1 MiB of records (one partition): kmem's records are
  a view of the request buffer, so its time does not depend on their size.
- Encode of a Fetch response (header and fields) for 100 partitions of 1 KiB and 64 KiB of records:
  kmem splices the record Sends in, kafka-python copies the records into its output.

    .venv/bin/pytest bench/bench_protocol.py        (ratio table at the end)
"""
import uuid

import pytest
from kafka.protocol.consumer import FetchResponse as PeerFetchResponse
from kafka.protocol.producer import ProduceRequest as PeerProduceRequest

from kmem.protocol import ApiKey, RequestHeader, decode_request, encode_response
from kmem.protocol.messages import FetchResponse, ProduceRequest
from kmem.send import BytesSend

RECORD_SIZES = {"16KiB": 16 << 10, "1MiB": 1 << 20}
PARTITION_RECORDS = {"1KiB": 1 << 10, "64KiB": 64 << 10}
TOPIC_ID = uuid.UUID(int=0x1234)


def produce_request(version, records_size):
    """A Produce request as a client sends it, encoded by the peer."""
    request = PeerProduceRequest[version](
        transactional_id=None, acks=-1, timeout_ms=30000,
        topic_data=[PeerProduceRequest.TopicProduceData(version=version, name="bench-topic", partition_data=[
            PeerProduceRequest.TopicProduceData.PartitionProduceData(version=version, index=0,
                                                                     records=b"r" * records_size)])])
    request.with_header(correlation_id=7, client_id="bench")
    return request.encode(header=True)


@pytest.mark.parametrize("version", [7, 9])
@pytest.mark.parametrize("records", RECORD_SIZES)
@pytest.mark.parametrize("contender", ["kmem", "kafka-python"])
def test_decode_produce_request(compare, contender, records, version):
    payload = bytearray(produce_request(version, RECORD_SIZES[records]))     # a pooled request buffer
    if contender == "kmem":
        header, body = decode_request(payload)
        assert header.api_key == ApiKey.PRODUCE
        assert body.topic_data[0].partition_data[0].records.nbytes == RECORD_SIZES[records]
        decode = lambda: decode_request(payload)
    else:
        decode = lambda: PeerProduceRequest.decode(payload, version=version, header=True)
        assert len(decode().topic_data[0].partition_data[0].records) == RECORD_SIZES[records]
    compare(f"decode Produce v{version} request, {records} of records", contender, decode)


def kmem_fetch_response(records_size):
    records = b"f" * records_size
    partitions = [FetchResponse.PartitionData(partition_index=i, high_watermark=1000, last_stable_offset=1000,
                                              log_start_offset=0, records=BytesSend(records)) for i in range(100)]
    return FetchResponse(responses=[FetchResponse.FetchableTopicResponse(topic="bench-topic", topic_id=TOPIC_ID,
                                                                        partitions=partitions)])


def peer_fetch_response(version, records_size):
    records = b"f" * records_size
    topic = PeerFetchResponse.FetchableTopicResponse
    partitions = [topic.PartitionData(version=version, partition_index=i, high_watermark=1000,
                                      last_stable_offset=1000, log_start_offset=0, aborted_transactions=[],
                                      records=records) for i in range(100)]
    response = PeerFetchResponse[version](throttle_time_ms=0, error_code=0, session_id=0, responses=[
        topic(version=version, topic="bench-topic", topic_id=TOPIC_ID, partitions=partitions)])
    response.with_header(correlation_id=7)
    return response


@pytest.mark.parametrize("version", [11, 12, 17])
@pytest.mark.parametrize("records", PARTITION_RECORDS)
@pytest.mark.parametrize("contender", ["kmem", "kafka-python"])
def test_encode_fetch_response(compare, contender, records, version):
    size = PARTITION_RECORDS[records]
    if contender == "kmem":
        header = RequestHeader(ApiKey.FETCH, version, 7)
        body = kmem_fetch_response(size)
        assert encode_response(header, body).size == len(peer_fetch_response(version, size).encode(header=True))
        encode = lambda: encode_response(header, body)
    else:
        response = peer_fetch_response(version, size)
        encode = lambda: response.encode(header=True)
    compare(f"encode Fetch v{version} response, 100 partitions x {records}", contender, encode)
