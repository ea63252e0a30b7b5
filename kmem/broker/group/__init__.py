"""The group coordinator (Kafka's ``GroupCoordinator`` for the classic protocol).

- ``coordinator``: ``GroupCoordinator``, the group state machine, its deadlines and the group APIs, with
  TxnOffsetCommit's pending offsets and their completion by a transaction's marker.
- ``offsets``: the key and value layouts of ``__consumer_offsets`` records, and a group's partition.
"""
