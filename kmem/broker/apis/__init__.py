"""The request side (Kafka's ``KafkaApis``): from a decoded request to a response.

- ``handlers``: ``Handlers``, the data-plane APIs (ApiVersions, Metadata, Produce, Fetch, ListOffsets,
  InitProducerId, CreateTopics, DeleteTopics, FindCoordinator).
- ``admin``: ``AdminHandlers``, the admin APIs (configs, partitions, DeleteRecords, DescribeCluster).
- ``authorized``: the operations Kafka reports as authorized with no authorizer (KIP-430).
"""
