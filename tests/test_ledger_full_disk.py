"""PidLedger on a file system that is really full: a small tmpfs filled with a ballast file (needs root).

Every write path must fail with ENOSPC and leave nothing half-made, keep every acknowledged entry
readable, and work again once the ballast is gone.
"""
import errno
import math
import os
import subprocess
import time

import pytest
from snapshot_files import kafka_snapshot

from kmem.bloom import Shape
from kmem.ledger import PidLedger, ProducerEntry

SMALL = Shape.from_np(200, 0.01)        # saturates after ~190 ids
LARGE = Shape.from_np(100_000, 0.01)    # a 120 KB sidecar; the active file starts at 1024 rows and grows
NOW = time.time_ns() // 1_000_000    # not expired (producer.id.expiration.ms: a day)


def entry(pid, epoch=0):
    return ProducerEntry(pid, epoch, 0, pid * 10, 0, NOW, 0, -1)


class Disk:
    """A mounted tmpfs and a ballast file that takes its free pages."""

    def __init__(self, root):
        self.root = root
        self.ballast = root / "ballast"
        self.page = os.statvfs(root).f_bsize

    def free_pages(self):
        return os.statvfs(self.root).f_bavail

    def fill(self, leave_pages=0):
        """Take every free page but ``leave_pages``."""
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while True:
                try:
                    os.write(fd, bytes(self.page))
                except OSError as e:
                    assert e.errno == errno.ENOSPC
                    break
        finally:
            os.close(fd)
        os.truncate(self.ballast, os.path.getsize(self.ballast) - leave_pages * self.page)
        assert self.free_pages() == leave_pages

    def empty(self):
        os.unlink(self.ballast)


@pytest.fixture
def disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root = tmp_path / "disk"
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield Disk(root)
    finally:
        subprocess.run(["umount", "--lazy", str(root)], check=True)


def contents(directory):
    return sorted(name for name in os.listdir(directory))


def test_a_full_disk_fails_growth_reserve_and_flush_cleanly_and_loses_nothing(disk):
    directory = disk.root / "ledger"
    ledger = PidLedger(directory, LARGE)
    for pid in range(1000):
        ledger.update(entry(pid))
    ledger.flush()
    for pid in range(1000, 2024):              # the active file's 1024 rows in use: the next new id grows it
        ledger.update(entry(pid))
    disk.fill()

    def expected(pid):
        return entry(pid, epoch=3) if pid == 1500 else entry(pid)
    before, size = contents(directory), os.path.getsize(ledger._active.path)
    for call in (lambda: ledger.update(entry(5000)), lambda: ledger.reserve(1), ledger.flush,
                 lambda: ledger.update_many([entry(5001)])):
        with pytest.raises(OSError) as failed:
            call()
        assert failed.value.errno == errno.ENOSPC
        assert contents(directory) == before and os.path.getsize(ledger._active.path) == size
    ledger.update(entry(1500, epoch=3))         # in place: no new blocks
    ledger.reserve(0)
    ledger.close()
    with PidLedger(directory, LARGE) as reader:     # opens on the full disk: it writes nothing
        assert all(reader.read(pid) == expected(pid) for pid in range(2024))
        assert reader.read(5000) is None and reader.read(5001) is None
    disk.empty()
    with PidLedger(directory, LARGE) as ledger:
        ledger.reserve(10)
        for pid in range(5000, 5010):
            ledger.update(entry(pid))
        ledger.flush()
    with PidLedger(directory, LARGE) as ledger:
        assert all(ledger.read(pid) == expected(pid) for pid in [*range(2024), *range(5000, 5010)])


def test_room_for_a_new_active_file_but_not_its_snapshot(disk):
    # The flush gets as far as its new active file, then the sidecar finds no space.
    directory = disk.root / "ledger"
    ledger = PidLedger(directory, SMALL)
    for pid in range(150):                      # the filter cannot take 100 more ids: room needs a flush
        ledger.update(entry(pid))
    active = ledger._active
    disk.fill(leave_pages=math.ceil(os.path.getsize(active.path) / disk.page))     # one more such file
    before = contents(directory)
    for _ in range(2):                          # reserve leaves the ledger as it was, each time
        with pytest.raises(OSError) as failed:
            ledger.reserve(100)
        assert failed.value.errno == errno.ENOSPC
        assert contents(directory) == before and ledger._active is active and ledger._view.sealing == ()
    with pytest.raises(OSError):                # flush keeps the filled file pending, without its sidecar
        ledger.flush()
    assert ledger._view.sealing == (active,) and not [n for n in contents(directory) if n.endswith((".bloom", ".tmp"))]
    assert all(ledger.read(pid) == entry(pid) for pid in range(150))
    ledger.update(entry(150))                   # the new active file takes updates
    disk.empty()
    ledger.reserve(100)                         # room in the new active file
    for pid in range(151, 251):
        ledger.update(entry(pid))
    ledger.flush()                              # the pending file first, then the active one
    assert ledger._view.sealing == () and [n for n in contents(directory) if n.endswith(".snapshot")] == \
        [os.path.basename(path) for path in ledger.snapshot_paths]          # one, holding every producer
    ledger.close()
    with PidLedger(directory, SMALL) as ledger:
        assert all(ledger.read(pid) == entry(pid) for pid in range(251))


def test_opening_a_directory_whose_derived_files_cannot_be_written(disk):
    # A Kafka-written snapshot needs a sidecar and a row order written beside it when a ledger opens it.
    directory = disk.root / "ledger"
    directory.mkdir()
    kafka = [entry(pid) for pid in range(5000, 3000, -1)]      # Kafka's order: not sorted by id
    (directory / "00000000000000009000.snapshot").write_bytes(kafka_snapshot(kafka))
    disk.fill()
    before = contents(directory)
    with pytest.raises(OSError) as failed:
        PidLedger(directory, LARGE, lock_directory=False)
    assert failed.value.errno == errno.ENOSPC and contents(directory) == before      # no temporary file left
    with PidLedger(directory, LARGE, read_only=True) as reader:    # a reader needs no space
        assert all(reader.read(e.producer_id) == e for e in kafka)
    disk.empty()
    with PidLedger(directory, LARGE, lock_directory=False) as ledger:
        assert all(ledger.read(e.producer_id) == e for e in kafka)
    assert {"00000000000000009000.snapshot.bloom", "00000000000000009000.snapshot.order"} <= set(contents(directory))
