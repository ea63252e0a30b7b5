"""Transactions of ``kmem broker`` (Kafka's transaction coordinator, KIP-98).

- ``kmem.broker.txn.markers``: ``TxnMarkerWriter`` writes a transaction's COMMIT or ABORT marker to each of
  its partitions (the coordinator's EndTxn and the WriteTxnMarkers API both use it) and completes the
  transactional offsets of the ``__consumer_offsets`` partitions among them.
- ``kmem.broker.txn.coordinator``: ``TransactionCoordinator``, the transaction APIs (InitProducerId with a
  transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions, ListTransactions),
  timeouts and expiry; ``kmem.broker.txn.metadata``: a transactional id's state machine;
  ``kmem.broker.txn.state_log``: the records of ``__transaction_state``.
"""
