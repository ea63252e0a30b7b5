"""Memory pools: the cases Kafka's SimpleMemoryPoolTest and GarbageCollectedMemoryPoolTest pin, and what kmem adds."""
import gc
import logging
import random
import threading
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from thread_helpers import run_racing

from kmem.errors import InvalidArgumentError
from kmem.pool import NONE, GarbageCollectedMemoryPool, MemoryPool, PooledBuffer, SimpleMemoryPool

POOL_TYPES = [SimpleMemoryPool, GarbageCollectedMemoryPool]


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("pool_type", POOL_TYPES)
@pytest.mark.parametrize("size, max_single", [(0, 7), (-1, 7), (100, 0), (100, -1), (100, 101), (2 ** 64, 10),
                                              (100.5, 10), (100, 10.5), ("100", 10)])
def test_constructor_rejects_bad_sizes(pool_type, size, max_single):
    with pytest.raises(InvalidArgumentError):
        pool_type(size, max_single)


def test_max_single_equal_to_size_is_allowed():
    assert SimpleMemoryPool(100, 100).size == 100


@pytest.mark.parametrize("pool_type", POOL_TYPES)
@pytest.mark.parametrize("request_size", [11, 0, -1, 2 ** 64, -(2 ** 64), 1.0, "5", None])
def test_allocation_size_out_of_range_rejected(pool_type, request_size):
    pool = pool_type(1000, 10)
    with pytest.raises(InvalidArgumentError, match=r"size_bytes must be an integer in \[1, 10\], not "):
        pool.try_allocate(request_size)
    assert pool.available_memory == 1000


@pytest.mark.parametrize("pool_type", POOL_TYPES)
def test_release_of_none_foreign_and_double_rejected_without_touching_counters(pool_type):
    pool, other = pool_type(1000, 10), pool_type(1000, 10)
    with pytest.raises(InvalidArgumentError):
        pool.release(None)
    with pytest.raises(InvalidArgumentError):
        pool.release(bytearray(10))
    foreign = other.try_allocate(10)
    with pytest.raises(InvalidArgumentError):
        pool.release(foreign)
    buf = pool.try_allocate(10)
    pool.release(buf)
    with pytest.raises(InvalidArgumentError, match="already released"):
        pool.release(buf)
    assert pool.available_memory == 1000
    assert other.available_memory == 990


@pytest.mark.parametrize("pool_type", POOL_TYPES)
def test_non_strict_allocation_bound(pool_type):
    # Kafka's pinning case: pool (21, 10, non-strict)
    pool = pool_type(21, 10)
    bufs = []
    for expected in (11, 1, -9):
        bufs.append(pool.try_allocate(10))
        assert bufs[-1] is not None and len(bufs[-1]) == 10
        assert pool.available_memory == expected
    assert pool.is_out_of_memory
    assert pool.try_allocate(1) is None
    pool.release(bufs.pop())
    assert pool.available_memory == 1
    bufs.append(pool.try_allocate(10))
    assert bufs[-1] is not None
    assert pool.try_allocate(1) is None


def test_strict_pool_grants_only_what_fits():
    pool = SimpleMemoryPool(21, 10, strict=True)
    a, b = pool.try_allocate(10), pool.try_allocate(10)
    assert pool.available_memory == 1 and not pool.is_out_of_memory
    assert pool.try_allocate(2) is None
    c = pool.try_allocate(1)
    assert c is not None and pool.available_memory == 0 and pool.is_out_of_memory
    for buf in (a, b, c):
        pool.release(buf)
    assert pool.available_memory == 21


@pytest.mark.parametrize("pool_type", POOL_TYPES)
def test_leaked_buffers_are_reclaimed_so_later_allocations_succeed(pool_type, caplog):
    pool = pool_type(100, 50)
    for _ in range(10):
        assert pool.try_allocate(50) is not None     # dropped at once, never released
    gc.collect()
    assert pool.available_memory == 100
    assert pool.outstanding_count == 0
    assert "not" in caplog.text and "released" in caplog.text


def test_garbage_collected_pool_logs_where_a_leak_was_allocated(caplog):
    pool = GarbageCollectedMemoryPool(100, 50)

    def leaky_function():
        pool.try_allocate(20)

    with caplog.at_level(logging.ERROR, logger="kmem.pool"):
        leaky_function()
        gc.collect()
    assert "This is a bug" in caplog.text and "leaky_function" in caplog.text
    assert pool.available_memory == 100


def test_leak_inside_reference_cycle_is_reclaimed():
    pool = SimpleMemoryPool(100, 50)
    holder = {"buf": pool.try_allocate(30)}
    holder["self"] = holder
    del holder
    gc.collect()
    assert pool.available_memory == 100


def test_buffer_is_writable_and_exactly_sized():
    pool = SimpleMemoryPool(1 << 20, 1 << 16)
    buf = pool.try_allocate(1000)
    assert isinstance(buf, PooledBuffer)
    view = memoryview(buf)
    assert view.nbytes == 1000 and not view.readonly
    view[:] = bytes(range(250)) * 4
    assert bytes(buf) == bytes(range(250)) * 4
    view.release()
    pool.release(buf)


def test_released_buffer_refuses_new_views():
    pool = SimpleMemoryPool(1000, 100)
    buf = pool.try_allocate(100)
    pool.release(buf)
    assert buf.released
    with pytest.raises(BufferError):
        memoryview(buf)


def test_freed_memory_is_reused_for_a_request_of_its_size():
    pool = SimpleMemoryPool(1 << 20, 1 << 16)
    buf = pool.try_allocate(1000)
    memoryview(buf)[:] = b"m" * 1000
    pool.release(buf)
    assert pool.cached_bytes == 1000
    again = pool.try_allocate(1000)
    assert pool.cached_bytes == 0 and pool.outstanding_bytes == 1000
    assert bytes(again)[64:] == b"m" * 936      # the same block (not zeroed; its head held the free list)
    pool.release(again)
    assert pool.trim() == 1000 and pool.cached_bytes == 0


def test_memory_seen_through_a_view_is_not_handed_out_again():
    pool = SimpleMemoryPool(1 << 20, 1 << 16)
    buf = pool.try_allocate(4096)
    view = memoryview(buf)
    view[:] = b"x" * 4096
    pool.release(buf)
    assert pool.cached_bytes == 0           # still visible through `view`: not cached
    others = [pool.try_allocate(4096) for _ in range(8)]
    for other in others:
        memoryview(other)[:] = b"y" * 4096
    assert bytes(view) == b"x" * 4096
    view.release()
    for other in others:
        pool.release(other)


@pytest.mark.parametrize("strict", [False, True])
def test_block_memory_never_exceeds_what_the_pool_may_hand_out(strict):
    pool = SimpleMemoryPool(10_000, 1000, strict=strict)
    rng = random.Random(7)
    live = []
    for _ in range(20_000):
        if live and (rng.random() < 0.5 or pool.try_allocate(1) is None):
            pool.release(live.pop(rng.randrange(len(live))))
        else:
            buf = pool.try_allocate(rng.randint(1, 1000))
            if buf is not None:
                live.append(buf)
        assert pool.cached_bytes + pool.outstanding_bytes <= pool.cache_limit
        assert pool.available_memory == 10_000 - sum(len(b) for b in live)


def test_strict_pool_full_of_small_buffers_holds_no_more_than_its_size():
    # 65 bytes is just above a size class boundary: rounding used to hold 80 bytes per buffer (123%).
    pool = SimpleMemoryPool(1 << 20, 256 << 10, strict=True)
    live = []
    while (buf := pool.try_allocate(65)) is not None:
        live.append(buf)
    assert len(live) == (1 << 20) // 65
    assert pool.outstanding_bytes + pool.cached_bytes <= pool.size
    released = live[::2]
    for buf in released:
        pool.release(buf)
    cached = pool.cached_bytes
    refill = [pool.try_allocate(65) for _ in released]    # from the cache
    assert None not in refill and cached == 65 * len(refill) and pool.cached_bytes == 0
    assert pool.outstanding_bytes + pool.cached_bytes <= pool.size
    for buf in live[1::2] + refill:
        pool.release(buf)


def test_a_cached_block_larger_than_the_request_is_not_handed_out():
    pool = SimpleMemoryPool(100, 100, strict=True)
    pool.release(pool.try_allocate(80))
    assert pool.cached_bytes == 80
    a = pool.try_allocate(65)               # same size class: the 80-byte block is freed, not reused
    b = pool.try_allocate(35)
    assert a is not None and b is not None
    assert pool.outstanding_bytes == 100 and pool.cached_bytes == 0
    pool.release(a)
    pool.release(b)


def test_listeners_hear_when_memory_returns_after_a_refusal():
    pool = SimpleMemoryPool(100, 100)
    calls = []
    pool.add_listener(calls.append)
    a = pool.try_allocate(100)
    b = pool.try_allocate(50)      # refused: out of memory
    assert b is None
    pool.release(a)
    assert calls == [pool]
    c = pool.try_allocate(10)
    pool.release(c)                 # nobody was refused since: no call
    assert calls == [pool]
    pool.remove_listener(calls.append)
    d = pool.try_allocate(100)
    assert pool.try_allocate(1) is None
    pool.release(d)
    assert calls == [pool]


def test_listeners_hear_the_release_that_ends_a_shortage_even_if_not_the_first():
    pool = SimpleMemoryPool(100, 100)
    calls = []
    pool.add_listener(calls.append)
    held = [pool.try_allocate(10), pool.try_allocate(89), pool.try_allocate(30)]    # available -29
    assert pool.try_allocate(1) is None
    pool.release(held[0])           # available -19: nobody can succeed yet
    assert calls == []
    pool.release(held[2])           # available 11: the shortage ends
    assert calls == [pool]
    pool.release(held[1])           # nobody was refused since
    assert calls == [pool]


def test_strict_pool_listeners_hear_when_each_refused_size_fits():
    pool = SimpleMemoryPool(100, 100, strict=True)
    calls = []
    pool.add_listener(calls.append)
    held = [pool.try_allocate(30) for _ in range(3)]     # available 10
    assert pool.try_allocate(20) is None and pool.try_allocate(50) is None
    pool.release(held[0])           # available 40: the 20 fits, the 50 still waits
    assert calls == [pool]
    pool.release(held[1])           # available 70: the 50 fits too
    assert calls == [pool, pool]
    pool.release(held[2])           # every refused caller could already succeed
    assert calls == [pool, pool]


def test_failing_listener_does_not_break_release(caplog):
    pool = SimpleMemoryPool(10, 10)

    def broken(_):
        raise RuntimeError("listener bug")

    pool.add_listener(broken)
    buf = pool.try_allocate(10)
    assert pool.try_allocate(1) is None
    pool.release(buf)
    assert pool.available_memory == 10
    assert "listener bug" in caplog.text


def test_depletion_sensors_follow_kafka_semantics():
    clock = FakeClock()
    pool = SimpleMemoryPool(100, 100, window_seconds=30, samples=2, clock=clock)
    buf = pool.try_allocate(100)
    assert pool.metrics()["MemoryPoolUsed"] == 100 and pool.metrics()["MemoryPoolAvailable"] == 0
    assert pool.try_allocate(1) is None           # dry spell starts
    clock.now += 3.0
    assert pool.try_allocate(1) is None           # still the same spell
    clock.now += 3.0
    pool.release(buf)                             # ends it: 6 s recorded once
    metrics = pool.metrics()
    assert metrics["MemoryPoolDepletedTimeTotal"] == pytest.approx(6000.0)
    assert metrics["MemoryPoolAvgDepletedPercent"] == pytest.approx(6.0 / 30.0)
    clock.now += 120.0                             # windows expire, the total stays
    assert pool.metrics()["MemoryPoolAvgDepletedPercent"] == 0.0
    assert pool.metrics()["MemoryPoolDepletedTimeTotal"] == pytest.approx(6000.0)


def test_prometheus_export_uses_prometheus_names():
    from prometheus_client import CollectorRegistry, generate_latest

    from kmem.metrics import register_pool

    registry = CollectorRegistry()
    pool = SimpleMemoryPool(1000, 100)
    buf = pool.try_allocate(40)
    register_pool(pool, name="requests", registry=registry)
    assert registry.get_sample_value("kmem_memory_pool_available_bytes", {"pool": "requests"}) == 960
    assert registry.get_sample_value("kmem_memory_pool_used_bytes", {"pool": "requests"}) == 40
    assert registry.get_sample_value("kmem_memory_pool_depleted_seconds_total", {"pool": "requests"}) == 0
    assert b"kmem_memory_pool_depleted_ratio" in generate_latest(registry)
    pool.release(buf)


def test_none_pool_is_unbounded_and_accepts_any_release():
    assert isinstance(NONE, MemoryPool)
    buf = NONE.try_allocate(1 << 20)
    assert len(buf) == 1 << 20
    NONE.release(buf)
    NONE.release(None)
    assert not NONE.is_out_of_memory and NONE.available_memory == NONE.size


class ProtocolOnlyPool:
    """A user's pool with exactly the members of ``MemoryPool``, and nothing else of kmem's pools."""

    def __init__(self, size):
        self.size = self.available_memory = size
        self.listeners = []

    @property
    def is_out_of_memory(self):
        return self.available_memory <= 0

    def try_allocate(self, size_bytes):
        if self.available_memory < size_bytes:
            return None
        self.available_memory -= size_bytes
        return bytearray(size_bytes)

    def release(self, buf):
        self.available_memory += len(buf)
        for callback in self.listeners:
            callback(self)

    def add_listener(self, callback):
        self.listeners.append(callback)

    def remove_listener(self, callback):
        self.listeners.remove(callback)


def test_a_selector_needs_no_more_of_a_pool_than_the_protocol():
    import socket

    from kmem.network import Selector

    pool = ProtocolOnlyPool(100)
    assert isinstance(pool, MemoryPool)
    client, server = socket.socketpair()
    with Selector(pool) as selector:
        selector.register("c", server)
        client.sendall(b"\0\0\0\x05hello")
        received = []
        for _ in range(50):
            selector.poll(0.1)
            received += selector.completed_receives
            if received:
                break
        assert bytes(received[0].payload) == b"hello" and pool.available_memory == 95
        received[0].close()
        assert pool.available_memory == 100
    assert pool.listeners == []
    client.close()


def test_threads_lose_or_double_count_nothing():
    pool = SimpleMemoryPool(1 << 20, 4096)
    operations_per_thread = 250_000
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        held = []
        try:
            for _ in range(operations_per_thread):
                if held and rng.random() < 0.5:
                    pool.release(held.pop())
                else:
                    buf = pool.try_allocate(rng.randint(1, 4096))
                    if buf is not None:
                        held.append(buf)
            for buf in held:
                pool.release(buf)
        except Exception as exc:  # surfaced below: a thread's exception would otherwise vanish
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert pool.available_memory == 1 << 20
    assert pool.outstanding_count == 0 and pool.outstanding_bytes == 0


def test_depletion_bookkeeping_survives_racing_threads():
    """Depletion periods end and start in whichever threads release and allocate; metrics read them."""
    pool = SimpleMemoryPool(100, 100, window_seconds=0.001, samples=2)
    deadline = time.monotonic() + 1.5
    errors = []

    def churn():
        try:
            while time.monotonic() < deadline:
                buf = pool.try_allocate(100)
                if buf is not None:
                    pool.try_allocate(1)        # refused: a depletion period starts
                    pool.release(buf)           # and ends
        except Exception as exc:  # surfaced below: a thread's exception would otherwise vanish
            errors.append(exc)

    def scrape():
        try:
            while time.monotonic() < deadline:
                pool.metrics()
        except Exception as exc:
            errors.append(exc)

    run_racing(churn, churn, scrape, scrape)       # switching threads inside the hooks, where the races are
    assert errors == []
    assert pool.available_memory == 100 and pool.metrics()["MemoryPoolDepletedTimeTotal"] > 0


class PoolMachine(RuleBasedStateMachine):
    """Random allocate/release/drop sequences keep Kafka's accounting and kmem's bounds."""

    def __init__(self):
        super().__init__()
        self.pool = SimpleMemoryPool(5000, 1000)
        self.live = []

    @rule(size=st.integers(1, 1000))
    def allocate(self, size):
        expected_ok = self.pool.available_memory >= 1
        buf = self.pool.try_allocate(size)
        assert (buf is not None) == expected_ok
        if buf is not None:
            self.live.append(buf)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 10_000))
    def release(self, index):
        self.pool.release(self.live.pop(index % len(self.live)))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 10_000))
    def drop(self, index):
        self.live.pop(index % len(self.live))
        gc.collect()

    @invariant()
    def accounting_matches(self):
        assert self.pool.available_memory == 5000 - sum(len(b) for b in self.live)
        assert self.pool.available_memory >= 1 - 1000
        assert self.pool.outstanding_count == len(self.live)

    def teardown(self):
        for buf in self.live:
            self.pool.release(buf)


class TestPoolMachine(PoolMachine.TestCase):
    # drop's gc.collect() walks every object of the process: in a full test run that heap made this test
    # take 80 s. Frozen, the objects made before it are left out of the walks (the buffers are not).
    settings = settings(max_examples=60, stateful_step_count=40, deadline=None)

    def setUp(self):
        gc.freeze()

    def tearDown(self):
        gc.unfreeze()


RSS_SCRIPT = r"""
import random, sys
from kmem.pool import SimpleMemoryPool

def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

pool = SimpleMemoryPool(16 << 20, 1 << 20, mapped=sys.argv[1] == "mapped")
rng = random.Random(1)
live = []
before = rss_anon()
peak = before
for step in range(20_000):
    buf = pool.try_allocate(rng.randint(1, 1 << 20))
    if buf is None:
        for _ in range(len(live) // 2):
            pool.release(live.pop(rng.randrange(len(live))))
        continue
    memoryview(buf)[::4096] = b"x" * len(range(0, len(buf), 4096))   # touch every page
    live.append(buf)
    if step % 50 == 0:
        peak = max(peak, rss_anon())
print(peak - before)
"""


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_process_memory_stays_within_the_pool_bound_under_churn(tmp_path):
    import subprocess
    import sys

    # run outside the source tree, so that the kmem under test is imported, not the uncompiled sources
    result = subprocess.run([sys.executable, "-c", RSS_SCRIPT, "heap"], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    growth = int(result.stdout)
    bound = (16 << 20) + (1 << 20) - 1
    # blocks hold exactly what was handed out; beyond that, the allocator's fragmentation (random sizes up
    # to 1 MiB) and a few MiB for the interpreter
    assert growth <= bound * 1.25 + (8 << 20), growth


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_a_mapped_pool_holds_the_process_to_its_bound_under_churn(tmp_path):
    # The same churn: mapped blocks leave no heap holes behind (the heap pool above grows ~9 MiB past its
    # bound), and cached blocks stay within the size, so growth is the pool's bound plus the interpreter's.
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", RSS_SCRIPT, "mapped"], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) <= (16 << 20) + (1 << 20) + (1 << 20), int(result.stdout)


def test_a_mapped_pool_caches_blocks_only_within_its_size():
    pool = SimpleMemoryPool(10_000, 1000, mapped=True)
    rng = random.Random(7)
    live = []
    for _ in range(5_000):
        if live and (rng.random() < 0.5 or pool.try_allocate(1) is None):
            pool.release(live.pop(rng.randrange(len(live))))
        else:
            buf = pool.try_allocate(rng.randint(1, 1000))
            if buf is not None:
                memoryview(buf)[:] = b"m" * len(buf)
                live.append(buf)
        assert pool.cached_bytes <= max(0, 10_000 - pool.outstanding_bytes)
    assert all(bytes(memoryview(b)) == b"m" * len(b) for b in live)


def test_a_reclaimed_leak_returns_memory_like_a_release():
    clock = FakeClock()
    pool = SimpleMemoryPool(100, 100, clock=clock)
    calls = []
    pool.add_listener(calls.append)
    pool.try_allocate(10)                   # leaked at once, nobody waiting: no call
    gc.collect()
    assert calls == []
    held = pool.try_allocate(100)
    assert pool.try_allocate(1) is None    # a refusal starts a dry spell
    clock.now += 2.0
    del held                                # reclaimed: ends the spell and wakes the refused
    gc.collect()
    assert calls == [pool]
    assert pool.metrics()["MemoryPoolDepletedTimeTotal"] == pytest.approx(2000.0)


MALLOC_SCRIPT = r"""
import ctypes
from kmem.pool import SimpleMemoryPool

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
pool = SimpleMemoryPool(64 << 20, 4 << 20)
held = [pool.try_allocate(3 << 20) for _ in range(4)]     # kept by the pool: glibc never sees them freed
mapped_before = libc.mallinfo2().hblks
copies = [bytes(memoryview(buf)) for buf in held]         # what a request handler does with a payload
print(libc.mallinfo2().hblks - mapped_before)
"""


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"), reason="needs glibc >= 2.33")
def test_pool_keeps_large_allocations_elsewhere_off_fresh_mappings(tmp_path):
    # glibc serves large allocations with fresh (page-faulted, zeroed) mappings until it sees a large
    # chunk freed; a pool that caches its blocks must not keep the rest of the process in that state.
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", MALLOC_SCRIPT], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == 0


def test_unbounded_pool_gives_unfilled_writable_buffers_of_the_size_asked():
    """NONE's buffers are not zeroed (a receive fills them whole), but are the size asked and writable."""
    from kmem import _core

    first, second = NONE.try_allocate(1 << 20), NONE.try_allocate(0)
    assert (type(first), len(first), len(second)) == (bytearray, 1 << 20, 0)
    first[-3:] = b"end"
    assert bytes(first[-3:]) == b"end"
    with pytest.raises(InvalidArgumentError):
        _core.unfilled_bytearray(-1)
