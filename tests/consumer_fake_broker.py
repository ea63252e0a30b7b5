"""A one-partition broker that serves fixed record bytes, for the consumer's edge cases that no real
broker produces on demand (corrupt data, hand-built transactions). It speaks the protocol through
kmem.protocol and kmem.network.SocketServer."""
from kmem.network import SocketServer
from kmem.protocol import ApiKey, decode_request, encode_response, messages

NODE_ID = 0


class FakeBroker:
    """Serves ``records`` (bytes) as partition 0 of ``topic``, from any fetch offset below ``end``."""

    def __init__(self, topic, records, end, *, aborted=(), ssl_context=None):
        self.topic = topic
        self.records = records
        self.end = end
        self.aborted = list(aborted)        # (producer id, first offset)
        self.server = SocketServer(self._handle, ssl_context=ssl_context)
        self.server.start()
        host, port = self.server.address
        self.bootstrap = f"{host}:{port}"

    def _handle(self, request):
        header, body = decode_request(request.payload)
        handler = {ApiKey.API_VERSIONS: self._api_versions, ApiKey.METADATA: self._metadata,
                   ApiKey.LIST_OFFSETS: self._list_offsets, ApiKey.FETCH: self._fetch}[header.api_key]
        return encode_response(header, handler(body))

    def _api_versions(self, body):
        keys = {ApiKey.API_VERSIONS: (0, 2), ApiKey.METADATA: (0, 8), ApiKey.LIST_OFFSETS: (0, 5),
                ApiKey.FETCH: (0, 11)}
        return messages.ApiVersionsResponse(error_code=0, api_keys=[
            messages.ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in keys.items()])

    def _metadata(self, body):
        host, port = self.server.address
        r = messages.MetadataResponse
        return r(brokers=[r.MetadataResponseBroker(node_id=NODE_ID, host=host, port=port)], controller_id=NODE_ID,
                 topics=[r.MetadataResponseTopic(error_code=0, name=self.topic, partitions=[
                     r.MetadataResponsePartition(error_code=0, partition_index=0, leader_id=NODE_ID,
                                                 replica_nodes=[NODE_ID], isr_nodes=[NODE_ID])])])

    def _list_offsets(self, body):
        r = messages.ListOffsetsResponse
        return r(topics=[r.ListOffsetsTopicResponse(name=self.topic, partitions=[
            r.ListOffsetsPartitionResponse(partition_index=0, error_code=0, timestamp=-1,
                                           offset=0 if p.timestamp == -2 else self.end)
            for p in body.topics[0].partitions])])

    def _fetch(self, body):
        r = messages.FetchResponse
        offset = body.topics[0].partitions[0].fetch_offset
        return r(responses=[r.FetchableTopicResponse(topic=self.topic, partitions=[r.PartitionData(
            partition_index=0, error_code=0, high_watermark=self.end, last_stable_offset=self.end,
            log_start_offset=0,
            aborted_transactions=[r.AbortedTransaction(producer_id=p, first_offset=o) for p, o in self.aborted],
            records=self.records if offset < self.end else b"")])])

    def close(self):
        self.server.close()
