"""Kafka's framing: every message is a 4-byte big-endian size followed by that many bytes.

``NetworkReceive`` reads one frame from a transport into pool memory, asking the pool once, when the size
prefix is complete, for exactly the payload's size; when the pool refuses, the receive waits and every
later read retries. ``NetworkSend`` writes one frame: the size prefix, then bytes or any ``Send``. Both run
for every request, so they are compiled (``kmem/_framing.pxi``); this module names them.
"""
from kmem._core import NETWORK_MAX_FRAME_SIZE as MAX_FRAME_SIZE
from kmem._core import NETWORK_SIZE_PREFIX_BYTES as SIZE_PREFIX_BYTES
from kmem._core import NETWORK_UNLIMITED as UNLIMITED
from kmem._core import NetworkReceive, NetworkSend

__all__ = ["MAX_FRAME_SIZE", "SIZE_PREFIX_BYTES", "UNLIMITED", "NetworkReceive", "NetworkSend"]
