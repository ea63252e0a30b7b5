"""A small filesystem of its own for full-disk tests: a tmpfs mounted for the test (root only; the test
is skipped elsewhere), with a ballast file that fills it and goes again."""
import errno
import os
import subprocess

import pytest


class SmallFilesystem:
    def __init__(self, path, size):
        self.path = path
        self.ballast = os.path.join(path, "ballast")
        os.makedirs(path, exist_ok=True)
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root")
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                                 capture_output=True, text=True)
        if mounted.returncode:
            pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")

    def fill(self):
        """Take every free block; returns the bytes taken."""
        taken = 0
        with open(self.ballast, "ab", buffering=0) as f:
            chunk = bytes(1 << 16)
            while True:
                try:
                    taken += f.write(chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    chunk = chunk[:len(chunk) // 2]
                    if len(chunk) < 512:
                        return taken

    def free(self):
        os.unlink(self.ballast)

    def unmount(self):
        subprocess.run(["umount", "-l", self.path], check=False)

