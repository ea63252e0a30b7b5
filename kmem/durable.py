"""Writing files so that readers see the old version or the new one, never half of it."""
import contextlib
import json
import os

from kmem.errors import ConfigError


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


def write_json(path, version, field, value):
    """The document ``{"version": version, field: value}`` as the whole of ``path`` (its directory made if need
    be): replaced atomically and fsynced, so a crash leaves the old document or the new one."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with replaced_atomically(path, fsync=True) as file:
        file.write(json.dumps({"version": version, field: value}, indent=1).encode())


def read_json(path, version, field, what):
    """``field`` of the document ``write_json`` wrote at ``path``, None when there is none; ``ConfigError`` naming
    ``what`` when it is unreadable, malformed or of another version."""
    try:
        with open(path, "rb") as file:
            document = json.load(file)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: unreadable {what} ({e})") from None
    if not isinstance(document, dict) or field not in document:
        raise ConfigError(f"{path}: malformed {what} (no {field!r})")
    if document.get("version") != version:
        raise ConfigError(f"{path}: version {document.get('version')!r}, kmem reads version {version}")
    return document[field]
