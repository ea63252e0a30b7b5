"""Transactions of ``kmem broker`` (Kafka's transaction coordinator, KIP-98).

- ``kmem.broker.txn.markers``: ``TxnMarkerWriter`` writes a transaction's COMMIT or ABORT marker to each of
  its partitions (the coordinator's EndTxn and the WriteTxnMarkers API both use it) and completes the
  transactional offsets of the ``__consumer_offsets`` partitions among them.
"""
