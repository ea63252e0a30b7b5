"""Memory pools (KIP-72): bound the bytes in flight without ever blocking.

``try_allocate(n)`` returns a writable buffer of exactly ``n`` bytes, or ``None`` when the pool cannot
spare them now; a size outside ``[1, max_single_allocation_bytes]`` raises ``InvalidArgumentError``
(Kafka's IllegalArgumentException). ``release(buf)`` gives it back. A non-strict pool grants any request while some memory is left, so it may over-allocate by up
to ``max_single_allocation_bytes - 1`` (this keeps large requests from starving); a strict pool grants
only what fits. The accounting and the reuse of freed blocks live in the compiled core
(``kmem._core.PoolCore``); this module adds argument checks, sensors, listeners and leak reporting.

Buffers from a pool are ``PooledBuffer`` objects: use them wherever a writable bytes-like object goes
(``sock.recv_into(buf)``, ``memoryview(buf)``). Their contents are undefined until written (memory is
reused, not zeroed). After release a buffer refuses new views; memory still visible through an older
view is never handed out again until that view is gone.

Threads: allocate and release from any thread. Listeners run in the releasing thread and must be quick
(e.g. wake a selector).
"""
import logging
import sys
import threading
import time
import traceback
from typing import Protocol, runtime_checkable

from kmem import _core
from kmem.errors import InvalidArgumentError
from kmem.metrics import DEFAULT_SAMPLES, DEFAULT_WINDOW_SECONDS, SampledRate

log = logging.getLogger(__name__)

PooledBuffer = _core.PooledBuffer

# The core counts in signed 64 bits, and a non-strict pool may hand out nearly twice its size.
MAX_POOL_BYTES = sys.maxsize // 2


@runtime_checkable
class MemoryPool(Protocol):
    """What every kmem pool offers, and all that a ``Selector`` needs of one: Kafka's ``MemoryPool``
    interface plus listeners, which wake a selector when memory returns."""

    size: int

    def try_allocate(self, size_bytes: int): ...

    def release(self, buf) -> None: ...

    @property
    def available_memory(self) -> int: ...

    @property
    def is_out_of_memory(self) -> bool: ...

    def add_listener(self, callback) -> None: ...

    def remove_listener(self, callback) -> None: ...


class _UnboundedPool:
    """``NONE``: plain allocation, no accounting, never out of memory (Kafka's ``MemoryPool.NONE``)."""

    size = sys.maxsize
    available_memory = sys.maxsize
    is_out_of_memory = False

    def try_allocate(self, size_bytes):
        return _core.unfilled_bytearray(size_bytes)     # its reader fills it whole before anyone looks

    def release(self, buf):
        """Accepts anything, None included: there is nothing to account."""

    def add_listener(self, callback):
        """Never called back: an unbounded pool never runs out."""

    def remove_listener(self, callback):
        pass

    def __repr__(self):
        return "kmem.pool.NONE"


NONE = _UnboundedPool()


class SimpleMemoryPool(_core.PoolCore):
    """A bounded pool with Kafka's ``SimpleMemoryPool`` semantics, plus what Kafka lacks.

    Beyond Kafka: releasing a buffer twice, or one from another pool, raises ``InvalidArgumentError``
    before any counter changes; a buffer garbage-collected without release is credited back (and logged)
    instead of leaking pool memory forever; listeners hear when memory returns after a refusal.

    ``mapped=True`` gives each block its own memory mapping, returned to the system when freed: the
    process's RSS then follows the pool even when block sizes vary (see ``PoolCore``).
    """

    def __init__(self, size_bytes, max_single_allocation_bytes, strict=False, *, mapped=False,
                 window_seconds=DEFAULT_WINDOW_SECONDS, samples=DEFAULT_SAMPLES, clock=time.monotonic):
        if not isinstance(size_bytes, int) or not 0 < size_bytes <= MAX_POOL_BYTES:
            raise InvalidArgumentError(f"pool size must be an integer in [1, {MAX_POOL_BYTES}], got {size_bytes!r}")
        if not isinstance(max_single_allocation_bytes, int) or max_single_allocation_bytes <= 0:
            raise InvalidArgumentError(
                f"max single allocation must be a positive integer, got {max_single_allocation_bytes!r}")
        if max_single_allocation_bytes > size_bytes:
            raise InvalidArgumentError(
                f"max single allocation {max_single_allocation_bytes} exceeds pool size {size_bytes}")
        super().__init__(size_bytes, max_single_allocation_bytes, strict, mapped)
        self._clock = clock
        # The core flips its depletion flag atomically, but the hooks below run in whichever threads
        # allocate and release, and may overlap: their state is guarded by this lock.
        self._depletion_lock = threading.Lock()
        self._depleted_at = None
        self._depleted_seconds = 0.0
        self._depleted_rate = SampledRate(window_seconds, samples, clock)
        self._listeners = ()
        self._listeners_lock = threading.Lock()

    @property
    def available_memory(self):
        return self.available

    def add_listener(self, callback):
        """Call ``callback(pool)`` when a release lets an allocation refused earlier succeed."""
        with self._listeners_lock:
            self._listeners = self._listeners + (callback,)

    def remove_listener(self, callback):
        with self._listeners_lock:
            self._listeners = tuple(cb for cb in self._listeners if cb != callback)

    def metrics(self):
        """Current sensor values under Kafka's names (time in milliseconds, as Kafka reports it)."""
        with self._depletion_lock:
            depleted = self._depleted_seconds
            if self._depleted_at is not None:
                depleted += self._clock() - self._depleted_at
        return {
            "MemoryPoolAvailable": self.available,
            "MemoryPoolUsed": self.size - self.available,
            "MemoryPoolAvgDepletedPercent": self._depleted_rate.measure(),
            "MemoryPoolDepletedTimeTotal": depleted * 1000.0,
        }

    def __repr__(self):
        return (f"<{type(self).__name__} size={self.size} available={self.available} "
                f"outstanding={self.outstanding_count} strict={self.strict}>")

    # Hooks called by the compiled core on state transitions only.
    # Another thread's hook may run between the core's transition and ours (a new period may start
    # before the previous one's end is recorded): overlapping periods merge instead of failing.
    def _depletion_started(self):
        with self._depletion_lock:
            if self._depleted_at is None:
                self._depleted_at = self._clock()

    def _depletion_ended(self):
        with self._depletion_lock:
            if self._depleted_at is not None:
                duration = self._clock() - self._depleted_at
                self._depleted_at = None
                self._depleted_seconds += duration
                self._depleted_rate.record(duration)

    def _memory_returned(self):
        for callback in self._listeners:
            try:
                callback(self)
            except Exception:
                log.exception("memory pool listener %r failed", callback)

    def _buffer_leaked(self, size_bytes, origin):
        log.warning("Reclaimed buffer of size %d that was not released; release() every buffer "
                    "(GarbageCollectedMemoryPool shows where it was allocated).", size_bytes)


class GarbageCollectedMemoryPool(SimpleMemoryPool):
    """A debugging pool: records where each buffer was allocated and reports leaks as errors.

    A buffer dropped without release is reclaimed (as in every kmem pool) and logged at ERROR with
    the stack that allocated it. Slower than ``SimpleMemoryPool``: use it in tests and while
    hunting leaks.
    """

    def try_allocate(self, size_bytes):
        buf = super().try_allocate(size_bytes)
        if buf is not None:
            buf.origin = "".join(traceback.format_stack(limit=12)[:-1])
        return buf

    def _buffer_leaked(self, size_bytes, origin):
        log.error("Reclaimed buffer of size %d that was not properly released. This is a bug. "
                  "It was allocated at:\n%s", size_bytes, origin)
