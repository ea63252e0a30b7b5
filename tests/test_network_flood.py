"""Flood: 200 clients sending 1 MiB requests to a server bounded at 16 MiB, with a slow handler.

Every request must be answered exactly once, the pool never holds more than its bound allows, and the
server process's RSS grows by at most that bound plus ``RSS_SLACK`` (interpreter, threads, per-connection
objects, allocator slack). The default run sends 10 requests per client (2000 MiB in all); the slow run 50.
"""
import pytest

from network_flood import FloodServer, flood

MIB = 1 << 20
BOUND = 16 * MIB
MAX_REQUEST = MIB
RSS_SLACK = 24 * MIB


def run_flood(requests_per_client):
    with FloodServer(BOUND, MAX_REQUEST, handler_delay=0.01) as server:
        failures = flood(server.address, clients=200, requests_per_client=requests_per_client, request_size=MIB)
        stats = server.stats()
    assert failures == []
    assert 0 < stats["peak_used"] <= BOUND + MAX_REQUEST
    assert stats["available"] == BOUND
    growth = stats["peak_rss"] - stats["baseline_rss"]
    assert growth <= BOUND + MAX_REQUEST + RSS_SLACK, f"RSS grew by {growth / MIB:.1f} MiB"
    return stats


def test_flood_bounded():
    run_flood(requests_per_client=10)


@pytest.mark.slow
def test_flood_bounded_long():
    run_flood(requests_per_client=50)
