"""Kill a process writing a ledger (SIGKILL, random moments, many flushes) and reopen it each time.

The moment is counted in acknowledged updates, not in time, so what each run covers does not depend on
the machine's speed: the child has made at least that many updates (and at most what its pipe buffers
beyond them) when it is killed.
"""
import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from kmem.bloom import Shape
from kmem.ledger import PidLedger, snapshot_offset

SHAPE = Shape.from_np(300, 0.01)      # a flush every ~280 new ids: kills land inside flushes too

# The child reports each update after it returned: "pid epoch offset". Offsets only grow.
CHILD = textwrap.dedent("""
    import random, sys, time
    from kmem.bloom import Shape
    from kmem.ledger import PidLedger, ProducerEntry
    directory, seed, offset = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ledger = PidLedger(directory, Shape.from_np(300, 0.01))
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    print("ready", flush=True)
    while True:
        pid, epoch = rng.randrange(3000), rng.randrange(30000)
        ledger.update(ProducerEntry(pid, epoch, 0, offset, 0, now, 0, -1))
        print(pid, epoch, offset, flush=True)
        offset += 1
""")


# Between kills: at least MIN_ACKS updates (more distinct ids than SHAPE holds, so at least one flush).
MIN_ACKS, MAX_ACKS = 400, 2000


def run_and_kill(directory, seed, offset, rng):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(directory), str(seed), str(offset)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    lines = [child.stdout.readline() for _ in range(rng.randrange(MIN_ACKS, MAX_ACKS))]
    child.send_signal(signal.SIGKILL)
    out, _ = child.communicate()
    assert child.returncode == -signal.SIGKILL
    complete = ("".join(lines) + out).split("\n")[:-1]   # a line cut by the kill has no newline: not acknowledged
    return [tuple(map(int, line.split())) for line in complete]


def check(ledger, acknowledged):
    """Every acknowledged update is there, or one that came after it (sent, killed before reporting)."""
    for pid, (epoch, offset) in acknowledged.items():
        entry = ledger.read(pid)
        assert entry is not None, f"producer {pid} lost"
        assert entry.last_offset >= offset, f"producer {pid} went back from offset {offset} to {entry}"
        if entry.last_offset == offset:
            assert entry.epoch == epoch


def crash_many_times(directory, rounds, seed):
    rng = random.Random(seed)
    acknowledged = {}
    offset = 0
    for round_ in range(rounds):
        for pid, epoch, off in run_and_kill(directory, seed * 1000 + round_, offset, rng):
            acknowledged[pid] = (epoch, off)
            offset = max(offset, off + 1)
        offset += 1_000_000          # past anything the child may have written without reporting
        with PidLedger(directory, SHAPE) as ledger:
            check(ledger, acknowledged)
    return acknowledged


def test_sigkill_during_updates_and_flushes(tmp_path):
    acknowledged = crash_many_times(tmp_path, rounds=4, seed=1)
    assert len(acknowledged) > 300
    assert len([n for n in os.listdir(tmp_path) if snapshot_offset(n) is not None]) >= 1


@pytest.mark.slow
def test_sigkill_many_times(tmp_path):
    crash_many_times(tmp_path, rounds=40, seed=2)


def test_a_corrupt_snapshot_after_crashes_loses_only_its_own_ids(tmp_path, caplog):
    acknowledged = crash_many_times(tmp_path, rounds=2, seed=3)
    snapshots = sorted(n for n in os.listdir(tmp_path) if snapshot_offset(n) is not None)
    assert snapshots, "MIN_ACKS updates make at least one flush"
    victim = tmp_path / snapshots[0]
    from kmem.ledger import read_snapshot
    in_victim = {e.producer_id for e in read_snapshot(victim)}
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with PidLedger(tmp_path, SHAPE) as ledger:
        check(ledger, {pid: v for pid, v in acknowledged.items() if pid not in in_victim})
    assert "CRC" in caplog.text and snapshots[0] in caplog.text
