"""Writing files so that readers see the old version or the new one, never half of it."""
import contextlib
import os


def fsync_directory(directory):
    """Make a rename or a new file in ``directory`` survive power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def replaced_atomically(path, fsync=False, sync_directory=True):
    """Write ``path`` through a temporary file that replaces it once the block completes.

    A crash or an exception leaves ``path`` as it was (a crash also leaves a ``.tmp`` file). With ``fsync`` the data
    and the rename are on disk before the block's caller continues; the rename only once the caller syncs the
    directory itself when ``sync_directory`` is false (one directory sync for several files).
    """
    path = os.fspath(path)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as file:
            yield file
            if fsync:
                file.flush()
                os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)          # a failed write (a full disk) does not keep its space
        raise
    if fsync and sync_directory:
        fsync_directory(os.path.dirname(path) or ".")
