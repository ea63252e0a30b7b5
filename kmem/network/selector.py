"""``Selector``: many non-blocking channels in one thread, with Kafka's memory-pressure behaviour.

Each ``poll`` first lifts memory mutes if the pool has recovered, waits for socket readiness, then reads
at most one complete frame per channel and writes pending sends. Results of the poll are in
``completed_receives`` (the caller must ``close()`` each to free its memory), ``completed_sends``,
``connected`` and ``disconnected`` until the next poll.

Beyond Kafka: the selector listens to its pool, so a release that ends an out-of-memory period wakes a
blocked ``poll`` at once instead of after its timeout; idle connections are closed (a client that sends a
size prefix and stalls, or stops reading its response, cannot pin memory forever), except those that
wait for us: for a response to be produced, or for pool memory.

It runs once per turn of a network thread and handles every request's channel several times, so it is
compiled (``kmem/_selector.pxi``); this module names it.
"""
from kmem._core import SELECTOR_LOW_MEMORY_FRACTION as LOW_MEMORY_FRACTION
from kmem._core import Selector

__all__ = ["LOW_MEMORY_FRACTION", "Selector"]
