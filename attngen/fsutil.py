"""Writing files so that no reader ever sees half of one.

Every file attngen writes goes to a temporary name in the destination's own directory, is flushed
to disk (fsync), then renamed over the destination with os.replace, which is atomic for two names
on one filesystem. A failure at any step (a full disk, a read-only directory, a missing
permission) leaves the destination as it was, removes the temporary file, and becomes one
WriteError line (exit 3) naming the path and the reason.

Files attngen reads back from its own stores (the cubin cache) are read with read_regular: a
regular file of bounded size, never a FIFO (whose open or read blocks), a device (/dev/zero reads
forever) or a symbolic link.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
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


class ReadRefused(Exception):
    """A file read_regular will not read; the message says why."""


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return kind
    return "not a regular file"


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes. Anything else is ReadRefused
    without being opened or read past the limit; FileNotFoundError and other OSErrors pass.

    lstat first, so a FIFO or device is never opened (opening some has effects); the open refuses a
    link (O_NOFOLLOW) and never waits (O_NONBLOCK), and fstat must find the file lstat saw."""
    p = Path(path)
    before = os.lstat(p)
    if not stat.S_ISREG(before.st_mode):
        raise ReadRefused(f"{p.name} is {_kind(before.st_mode)}, not a regular file")
    if before.st_size > limit:
        raise ReadRefused(f"{p.name} has {before.st_size} bytes, over the {limit} allowed")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ReadRefused(f"{p.name} is a symbolic link, not a regular file") from None
        raise
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(now.st_mode):
            raise ReadRefused(f"{p.name} changed while it was opened")
        chunks, left = [], limit + 1            # one byte more than allowed tells a file that grew
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise ReadRefused(f"{p.name} grew past the {limit} bytes allowed while it was read")
    return data


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


def _staged(dest: Path, data: bytes) -> str:
    """A temporary file beside `dest` holding `data`, with dest's permission bits (a new file: the
    usual 0666 minus the umask); WriteError naming dest when it cannot be made."""
    try:
        mode = os.stat(dest).st_mode & 0o7777
    except OSError:
        mode = 0o666 & ~_UMASK
    try:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    except OSError as exc:
        raise WriteError(f"cannot write {dest}: {reason(exc)}") from None
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise WriteError(f"cannot write {dest}: {reason(exc)}") from None
    return tmp


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` atomically: readers see the old file or the new one, never a part.

    The directory must exist. An existing file keeps its permission bits; a new one gets the
    usual 0666 minus the umask.
    """
    atomic_write_all([(path, data)])


def atomic_write_all(files) -> None:
    """Write every (path, bytes) of `files`, or none: each is staged beside its destination first
    (a full disk or a read-only folder fails there, before any file changes), then renamed into
    place; a rename that still fails puts the files already replaced back as they were."""
    files = [(Path(p), data) for p, data in files]
    staged = []
    try:
        for dest, data in files:
            staged.append((_staged(dest, data), dest))
    except WriteError:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    done = []      # (dest, its old bytes or None)
    for i, (tmp, dest) in enumerate(staged):
        try:
            old = dest.read_bytes() if dest.is_file() else None
            os.replace(tmp, dest)
        except OSError as exc:
            for later, _ in staged[i:]:
                with contextlib.suppress(OSError):
                    os.unlink(later)
            for earlier, previous in reversed(done):
                with contextlib.suppress(OSError, WriteError):
                    if previous is None:
                        os.unlink(earlier)
                    else:
                        os.replace(_staged(earlier, previous), earlier)
            raise WriteError(f"cannot write {dest}: {reason(exc)}") from None
        done.append((dest, old))
    for parent in dict.fromkeys(dest.parent for dest, _ in files):
        _fsync_dir(parent)


def atomic_write_texts(files) -> None:
    """atomic_write_all of (path, text) pairs, as UTF-8."""
    atomic_write_all([(p, text.encode("utf-8")) for p, text in files])


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
