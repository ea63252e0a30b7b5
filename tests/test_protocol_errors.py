"""kmem.protocol on bad input: truncated, corrupt and absurd messages raise kmem errors naming the API,
version and field; unknown APIs and versions are reported so a broker can answer as Kafka does; records
are views of the request buffer and Sends in responses."""
import struct
import tracemalloc

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from kafka.protocol.metadata import ApiVersionsResponse as PeerApiVersionsResponse
from kafka.protocol.consumer import FetchResponse as PeerFetchResponse
from kmem.errors import KmemError
from kmem.protocol import (SUPPORTED_VERSIONS, ApiKey, CorruptMessageError, InvalidMessageError, RequestHeader,
                           UnknownApiKeyError, UnsupportedVersionError, api_versions_fallback_response,
                           decode_request, decode_request_header, decode_response, encode_request,
                           encode_response, message_class)
from kmem.protocol.api import message
from kmem.protocol.messages import ApiVersionsRequest, FetchResponse, JoinGroupRequest, ProduceRequest
from kmem.send import BytesSend, Send

CASES = [(key, version, kind) for key, (low, high) in SUPPORTED_VERSIONS.items()
         for version in range(low, high + 1) for kind in ("Request", "Response")]
IDS = [f"{k.name}-v{v}-{d}" for k, v, d in CASES]

SAMPLE_SCALARS = {"string": "ab", "bytes": b"\x01\x02", "records": b"rec", "bool": True}


def sample(struct, version):
    """An instance with every field present at ``version`` set, and one element in every array."""
    kwargs = {}
    for field in struct.fields:
        if not field.present(version):
            continue
        if field.struct is not None:
            value = sample(field.struct, version)
            kwargs[field.name] = [value] if field.is_array else value
        elif field.is_array:
            kwargs[field.name] = [SAMPLE_SCALARS.get(field.element, 3) if field.element != "uuid" else field.default()]
        elif field.type in SAMPLE_SCALARS:
            kwargs[field.name] = SAMPLE_SCALARS[field.type]
        elif field.type not in ("uuid", "float64"):
            kwargs[field.name] = 5
    return struct.cls(**kwargs)


def encoded(api_key, version, kind):
    body = sample(message(api_key, kind), version) if message_class(api_key, kind) else None
    if kind == "Request":
        return encode_request(body, version, 1, client_id="c")
    return encode_response(RequestHeader(api_key, version, 1), body)


def decode(payload, api_key, version, kind):
    return decode_request(payload) if kind == "Request" else decode_response(payload, api_key, version)


@pytest.mark.parametrize("api_key,version,kind", CASES, ids=IDS)
def test_every_truncation_raises_a_corrupt_message_error_naming_the_field(api_key, version, kind):
    payload = encoded(api_key, version, kind)
    header, body = decode(payload, api_key, version, kind)
    assert body == sample(message(api_key, kind), version)
    if kind == "Request":
        body_start = decode_request_header(payload)[1]
    else:
        body_start = 4 + (message(api_key, kind).is_flexible(version) and api_key != ApiKey.API_VERSIONS)
    for cut in range(len(payload)):
        with pytest.raises(CorruptMessageError) as caught:
            decode(payload[:cut], api_key, version, kind)
        if cut > body_start:
            error = caught.value
            assert (error.message_name, error.version) == (message(api_key, kind).name, version)
            assert error.field and f"field {error.field} at byte" in str(error)


@pytest.mark.parametrize("api_key,version,kind", CASES, ids=IDS)
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_corrupt_bytes_raise_only_kmem_errors(api_key, version, kind, data):
    payload = bytearray(encoded(api_key, version, kind))
    for _ in range(data.draw(st.integers(1, 4))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    try:
        decode(payload, api_key, version, kind)
    except KmemError:
        pass


@given(st.binary(max_size=64))
@settings(max_examples=300, deadline=None)
def test_random_requests_raise_only_kmem_errors(tail):
    for api_key, (low, high) in SUPPORTED_VERSIONS.items():
        try:
            decode_request(struct.pack(">hhih", api_key, high, 1, -1) + tail)
        except KmemError:
            pass


@pytest.mark.parametrize("count", [2**31 - 1, 0x7FFFFFFF // 2, 1_000_000])
def test_absurd_array_lengths_allocate_nothing(count):
    header = encode_request(ProduceRequest(), 7, 1, client_id="c")[:11]      # up to client id "c"
    body = struct.pack(">hhi", -1, -1, 1000) + struct.pack(">i", count)           # topic_data: count topics
    tracemalloc.start()
    try:
        with pytest.raises(CorruptMessageError, match=r"ProduceRequest v7: field topic_data .*cannot fit"):
            decode_request(header + body + b"\x00" * 64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10


def test_absurd_string_and_records_lengths():
    header = encode_request(ProduceRequest(), 7, 1, client_id="c")[:11]
    topic = struct.pack(">hhi", -1, -1, 1000) + struct.pack(">ih", 1, 30000) + b"t"
    with pytest.raises(CorruptMessageError, match=r"topic_data\[\]\.name.*30000 bytes announced"):
        decode_request(header + topic)
    records = (struct.pack(">hhi", -1, -1, 1000) + struct.pack(">ih", 1, 1) + b"t" + struct.pack(">ii", 1, 0)
               + struct.pack(">i", 2**31 - 1) + b"abc")
    with pytest.raises(CorruptMessageError, match=r"partition_data\[\]\.records"):
        decode_request(header + records)


def test_a_compact_string_longer_than_32767_bytes_is_corrupt_as_in_kafka():
    """Kafka's readers refuse a string of more than 32767 bytes in every version, a compact one too (which
    its length could announce): a broker never takes a group id or instance id it could not store."""
    def join(group_id):
        request = encode_request(JoinGroupRequest(group_id="?", session_timeout_ms=6000, rebalance_timeout_ms=6000,
                                                  member_id="", protocol_type="consumer", protocols=[]), 7, 1, "c")
        cut = request.index(b"\x02?")                         # the compact group id: length + 1, then "?"
        return request[:cut] + uvarint(len(group_id) + 1) + group_id + request[cut + 2:]

    assert decode_request(join(b"g" * 32767))[1].group_id == "g" * 32767
    with pytest.raises(CorruptMessageError, match=r"JoinGroupRequest v7: field group_id .*32768 bytes \(at most 32767"):
        decode_request(join(b"g" * 32768))


def uvarint(value):
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def test_bad_varint_and_bad_utf8():
    request = encode_request(ApiVersionsRequest(client_software_name="k", client_software_version="1"), 3, 9,
                             client_id="c")
    cut = request.index(b"\x02k")
    with pytest.raises(CorruptMessageError, match="client_software_name.*varint longer than 5 bytes"):
        decode_request(request[:cut] + b"\xff" * 6 + request[cut + 1:])
    with pytest.raises(CorruptMessageError, match="client_software_name.*invalid UTF-8"):
        decode_request(request[:cut] + b"\x02\xff" + request[cut + 2:])
    with pytest.raises(CorruptMessageError, match="non-nullable"):
        decode_request(request[:cut] + b"\x00" + request[cut + 2:])


def test_unknown_api_key_is_reported_with_its_correlation_id():
    with pytest.raises(UnknownApiKeyError) as caught:
        decode_request(struct.pack(">hhih", 999, 0, 4711, -1))
    assert (caught.value.api_key, caught.value.api_version, caught.value.correlation_id) == (999, 0, 4711)


def test_unsupported_version_carries_the_header():
    request = struct.pack(">hhih", ApiKey.FETCH, 18, 5, 1) + b"c" + b"\x00" * 40
    with pytest.raises(UnsupportedVersionError) as caught:
        decode_request(request)
    assert caught.value.header == RequestHeader(ApiKey.FETCH, 18, 5, "c")
    assert (caught.value.api_key, caught.value.api_version) == (ApiKey.FETCH, 18)


def test_api_versions_fallback_is_read_by_the_peer_and_by_kmem():
    # a client opening with ApiVersions v5 (newer than Kafka 3.9): header v2, a body kmem does not know
    request = struct.pack(">hhih", ApiKey.API_VERSIONS, 5, 77, 3) + b"cli" + b"\x00" + b"\x02x\x02y\x00"
    with pytest.raises(UnsupportedVersionError) as caught:
        decode_request(request)
    answer = api_versions_fallback_response(caught.value.header)
    peer = PeerApiVersionsResponse.decode(answer, version=4, header=True)
    assert (peer.header.correlation_id, peer.error_code) == (77, 35)
    assert [(k.api_key, k.min_version, k.max_version) for k in peer.api_keys] == [(18, 0, 4)]
    header, body = decode_response(answer, ApiKey.API_VERSIONS, 4)
    assert header.correlation_id == 77 and body.error_code == 35
    assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == [(18, 0, 4)]


def test_request_header_v2_keeps_tagged_fields_and_a_null_client_id():
    payload = encode_request(ApiVersionsRequest(), 3, 1, client_id=None, unknown_tags={3: b"zz"})
    header, offset = decode_request_header(payload)
    assert header == RequestHeader(ApiKey.API_VERSIONS, 3, 1, None, {3: b"zz"})
    assert offset == 10 + 5          # count, tag, size, "zz"


def test_a_tagged_field_cut_short_is_reported_at_its_byte():
    header = encode_request(ApiVersionsRequest(), 3, 1, client_id=None, unknown_tags={3: b"zz"})
    with pytest.raises(CorruptMessageError) as caught:
        decode_request_header(header[:14])           # count, tag, size at bytes 10-12; one byte of "zz"
    assert caught.value.position == 13 and "tagged field of 2 bytes past the end" in str(caught.value)
    body = encode_request(ApiVersionsRequest(client_software_name="k", client_software_version="1",
                                             unknown_tags={5: b"abc"}), 3, 1)
    with pytest.raises(CorruptMessageError) as caught:
        decode_request(body[:-1])                    # the body's last tagged field loses a byte
    error = caught.value
    assert (error.field, error.position) == ("<tagged fields>", len(body) - 3)
    assert "tagged field of 3 bytes past the end" in str(error)


@pytest.mark.parametrize("cut", range(0, 13))
def test_truncated_request_header(cut):
    payload = encode_request(ApiVersionsRequest(), 3, 1, client_id="cc")
    with pytest.raises(CorruptMessageError, match="RequestHeader|ApiVersionsRequest"):
        decode_request(payload[:cut])


def test_produce_records_are_views_of_the_request_buffer():
    data = b"\x00batch" * 1000
    request = ProduceRequest(acks=1, timeout_ms=10, topic_data=[ProduceRequest.TopicProduceData(
        name="t", partition_data=[ProduceRequest.PartitionProduceData(index=0, records=data)])])
    for version in (3, 9):
        buf = bytearray(encode_request(request, version, 1))
        _, body = decode_request(buf)
        records = body.topic_data[0].partition_data[0].records
        assert isinstance(records, memoryview) and records.obj is buf and records == data
        buf[bytes(buf).index(data)] ^= 0xFF              # the view shows the buffer, not a copy
        assert records[0] == data[0] ^ 0xFF


def test_fetch_response_with_record_sends_is_one_send_the_peer_reads():
    records = [b"r%d" % i * (i * 3000) for i in range(8)]          # small ones inline, large ones spliced
    for version in (4, 11, 12):
        partitions = [FetchResponse.PartitionData(partition_index=i, high_watermark=i,
                                                  records=BytesSend(r) if i % 2 else r) for i, r in enumerate(records)]
        body = FetchResponse(responses=[FetchResponse.FetchableTopicResponse(topic="t", partitions=partitions)])
        send = encode_response(RequestHeader(ApiKey.FETCH, version, 3), body)
        assert isinstance(send, Send)
        payload = b"".join(_drain(send, step=1000))
        assert len(payload) == send.size and send.remaining == 0
        peer = PeerFetchResponse.decode(payload, version=version, header=True)
        assert [bytes(p.records) for p in peer.responses[0].partitions] == records


def test_fetch_partitions_with_or_without_aborted_transactions_reach_the_peer():
    """A partition's fixed fields, its aborted transactions' count and its records' size are written in one
    struct call when there are none (empty, or null from v4) and the records are a Send: every mix of
    the two, at non-flexible and flexible versions, reads back the same with kafka-python."""
    Aborted = FetchResponse.AbortedTransaction
    cases = [([], b"a" * 20, True), (None, b"b" * 30, True), ([Aborted(7, 40), Aborted(8, 41)], b"c", True),
             ([], b"inline", False), ([Aborted(9, 50)], b"inline too", False), (None, None, False), ([], b"", True),
             ([], b"big" * 10000, True)]
    for version in (4, 5, 11, 12, 17):
        partitions = [FetchResponse.PartitionData(partition_index=i, error_code=i, high_watermark=100 + i,
                                                  last_stable_offset=90 + i, log_start_offset=i, aborted_transactions=a,
                                                  preferred_read_replica=-1 - i, records=BytesSend(r) if send else r)
                      for i, (a, r, send) in enumerate(cases)]
        body = FetchResponse(responses=[FetchResponse.FetchableTopicResponse(topic="t", partitions=partitions)])
        send = encode_response(RequestHeader(ApiKey.FETCH, version, 3), body)
        payload = b"".join(_drain(send, step=1000))
        assert len(payload) == send.size
        read = PeerFetchResponse.decode(payload, version=version, header=True).responses[0].partitions
        assert [(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset)
                for p in read] == [(i, i, 100 + i, 90 + i, i if version >= 5 else -1) for i in range(len(cases))]
        assert [None if p.aborted_transactions is None else [(t.producer_id, t.first_offset)
                                                              for t in p.aborted_transactions] for p in read] == \
            [None if a is None else [(t.producer_id, t.first_offset) for t in a] for a, _, _ in cases]
        if version >= 11:
            assert [p.preferred_read_replica for p in read] == [-1 - i for i in range(len(cases))]
        assert [None if p.records is None else bytes(p.records) for p in read] == [r for _, r, _ in cases]


def test_response_without_sends_is_bytes():
    body = FetchResponse(responses=[FetchResponse.FetchableTopicResponse(
        topic="t", partitions=[FetchResponse.PartitionData(records=b"small")])])
    assert isinstance(encode_response(RequestHeader(ApiKey.FETCH, 11, 1), body), bytes)


@pytest.mark.parametrize("field,value,match", [
    ("throttle_time_ms", 2**31, r"FetchResponse v11: field throttle_time_ms..session_id"),
    ("responses", None, r"field responses: None in a non-nullable field"),
    ("responses", [FetchResponse.FetchableTopicResponse(topic=None)], r"field responses\[\]\.topic: None"),
    ("responses", [FetchResponse.FetchableTopicResponse(partitions=[FetchResponse.PartitionData(records=42)])],
     r"records must be bytes-like, None or a Send, not int"),
    ("responses", [FetchResponse.FetchableTopicResponse(topic="x" * 40000)], r"at most 32767"),
])
def test_unencodable_values_raise_invalid_message_error(field, value, match):
    body = FetchResponse(**{field: value})
    with pytest.raises(InvalidMessageError, match=match):
        encode_response(RequestHeader(ApiKey.FETCH, 11, 1), body)


def test_mismatched_bodies_are_refused():
    with pytest.raises(InvalidMessageError, match="the request was PRODUCE"):
        encode_response(RequestHeader(ApiKey.PRODUCE, 9, 1), FetchResponse())
    with pytest.raises(InvalidMessageError, match="request object is needed"):
        encode_request(FetchResponse(), 11, 1)
    with pytest.raises(UnsupportedVersionError):
        encode_request(ProduceRequest(), 12, 1)


def _drain(send, step=None):
    class Transport:
        def __init__(self):
            self.chunks = []

        def write(self, data):                          # a file-like writer (kmem.send.as_transport)
            data = bytes(data)[:step]
            self.chunks.append(data)
            return len(data)
    transport = Transport()
    while not send.completed:
        send.write_to(transport)
    return transport.chunks


def test_produce_records_are_views_of_a_pooled_buffer():
    from kmem.pool import SimpleMemoryPool
    request = ProduceRequest(acks=1, timeout_ms=5, topic_data=[ProduceRequest.TopicProduceData(
        name="t", partition_data=[ProduceRequest.PartitionProduceData(index=0, records=b"abc" * 100)])])
    payload = encode_request(request, 9, 1, client_id="x")
    pool = SimpleMemoryPool(size_bytes=1 << 20, max_single_allocation_bytes=1 << 16)
    buf = pool.try_allocate(len(payload))
    memoryview(buf)[:] = payload
    _, body = decode_request(buf)
    records = body.topic_data[0].partition_data[0].records
    assert records.obj is buf and records == b"abc" * 100
    del records, body
    pool.release(buf)


@pytest.mark.parametrize("kwargs,match", [
    ({"correlation_id": 2**31}, "RequestHeader v3: field correlation_id..client_id"),
    ({"correlation_id": 1, "client_id": "x" * 40000}, "RequestHeader v3"),
    ({"correlation_id": 1, "client_id": 5}, "RequestHeader v3"),
    ({"correlation_id": 1, "unknown_tags": {-1: b""}}, "RequestHeader v3"),
])
def test_bad_request_headers_raise_invalid_message_error(kwargs, match):
    with pytest.raises(InvalidMessageError, match=match):
        encode_request(ApiVersionsRequest(), 3, **kwargs)


def test_bad_response_header_raises_invalid_message_error():
    with pytest.raises(InvalidMessageError, match="ResponseHeader v12: field correlation_id"):
        encode_response(RequestHeader(ApiKey.FETCH, 12, 2**40), FetchResponse())


def test_decode_response_of_an_unknown_api_or_version():
    with pytest.raises(UnknownApiKeyError):
        decode_response(b"\x00\x00\x00\x01", 999, 0)
    with pytest.raises(UnsupportedVersionError):
        decode_response(b"\x00\x00\x00\x01", ApiKey.FETCH, 18)
