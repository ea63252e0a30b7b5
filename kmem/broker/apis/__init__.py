"""The request side (Kafka's ``KafkaApis`` and its purgatory): from a request's bytes to its response.

- ``dispatch``: ``RequestDispatcher``, the socket server's handler: decodes, picks the handler, answers
  at once, parks what waits, or offloads what may block to an io thread.
- ``handlers``: ``Handlers``, the data-plane APIs (ApiVersions, Metadata, Produce, Fetch, ListOffsets,
  InitProducerId, CreateTopics, DeleteTopics, FindCoordinator, OffsetForLeaderEpoch) and ``DelayedFetch``.
- ``purgatory``: ``DelayedOperation`` and ``DelayedOperationPurgatory``: parked requests, completed by an
  event on a watched key or at their deadline, exactly once.
- ``admin``: ``AdminHandlers``, the admin APIs (configs, partitions, DeleteRecords, DescribeCluster,
  DescribeLogDirs, DescribeTopicPartitions).
- ``authorized``: the operations Kafka reports as authorized with no authorizer (KIP-430).
"""
