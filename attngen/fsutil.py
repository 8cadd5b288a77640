"""Writing files so that no reader ever sees half of one.

Every file attngen writes goes to a temporary name in the destination's own directory, is flushed
to disk (fsync), then renamed over the destination with os.replace, which is atomic for two names
on one filesystem. A failure at any step (a full disk, a read-only directory, a missing
permission) leaves the destination as it was, removes the temporary file, and becomes one
WriteError line (exit 3) naming the path and the reason.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import WriteError

def _current_umask() -> int:
    """The process umask. Linux reports it in /proc; elsewhere os.umask can only read it by setting
    it, so that is done once, at import, not while other threads may be creating files."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Mode bits for new files are 0666 minus this, as open() would give them.
_UMASK = _current_umask()


def reason(exc: OSError) -> str:
    """The OSError's reason without its repr noise: 'No space left on device'."""
    return exc.strerror or str(exc) or type(exc).__name__


def ensure_dir(path: str | Path) -> Path:
    """Create a directory and its parents; any failure is a WriteError."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise WriteError(f"cannot create directory {p}: a file of that name is in the way") from None
    except OSError as exc:
        raise WriteError(f"cannot create directory {p}: {reason(exc)}") from None
    return p


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable; best effort (not every filesystem or OS allows it)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` atomically: readers see the old file or the new one, never a part.

    The directory must exist. An existing file keeps its permission bits; a new one gets the
    usual 0666 minus the umask.
    """
    dest = Path(path)
    parent = dest.parent
    try:
        mode = os.stat(dest).st_mode & 0o7777
    except OSError:
        mode = 0o666 & ~_UMASK
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{dest.name}.", suffix=".tmp")
    except OSError as exc:
        raise WriteError(f"cannot write {dest}: {reason(exc)}") from None
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise WriteError(f"cannot write {dest}: {reason(exc)}") from None
    _fsync_dir(parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """atomic_write_bytes of `text` as UTF-8, newlines as given."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold an exclusive advisory lock (flock) on `path`, created if missing, for the with-block.

    Other processes and threads taking the same lock wait. Where there is no fcntl (Windows), or
    the filesystem refuses the lock (ENOLCK or EOPNOTSUPP on NFS without a lock daemon, some FUSE
    filesystems), the block runs unlocked: every write is still atomic, concurrent writers only
    repeat work. A lock file that cannot be created is a WriteError.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise WriteError(f"cannot create lock file {path}: {reason(exc)}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass       # no locks on this filesystem: run unlocked (errors of the block itself pass through)
        yield
    finally:
        os.close(fd)   # closing the descriptor releases the lock
