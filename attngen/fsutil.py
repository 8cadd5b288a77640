"""Writing files so that no reader ever sees half of one.

Every file attngen writes goes to a temporary name in the destination's own directory, is flushed
to disk (fsync), then renamed over the destination with os.replace, which is atomic for two names
on one filesystem. A failure at any step (a full disk, a read-only directory, a missing
permission) leaves the destination as it was, removes the temporary file, and becomes one
WriteError line (exit 3) naming the path and the reason.

Every file attngen reads that someone else may have put there (a spec, the dispatch table, a
report, an entry of the cubin cache) is read with read_regular: a regular file of bounded size,
never a FIFO (whose open or read blocks) or a device (/dev/zero reads forever); in attngen's own
stores, never a symbolic link either. Each caller words the refusal its own way. utf8_text says
where text is not UTF-8, and json_deeper_than bounds JSON nesting before a recursive parser sees it.
"""
from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
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


def reason(exc: OSError | ReadRefused) -> str:
    """The OSError's reason without its repr noise: 'No space left on device'; a ReadRefused's without
    the file's name: 'the file changed while it was opened'."""
    if isinstance(exc, ReadRefused):
        return f"the file {exc.what}"
    return exc.strerror or str(exc) or type(exc).__name__


class ReadRefused(Exception):
    """A file read_regular will not read. The message names the file by its last part and says why;
    `what` is the why alone, so that a caller can word the refusal its own way."""

    def __init__(self, name: str, what: str):
        super().__init__(f"{name} {what}")
        self.what = what


class NotRegular(ReadRefused):
    """Not a regular file: `mode` is the st_mode seen, `kind` what it is ("a FIFO")."""

    def __init__(self, name: str, mode: int):
        self.mode, self.kind = mode, kind_of(mode)
        super().__init__(name, f"is {self.kind}, not a regular file")


class TooLarge(ReadRefused):
    """Over the limit: `size` is the size stat gave, or the bytes read once past the limit when the
    file `grew` after stat."""

    def __init__(self, name: str, size: int, limit: int, grew: bool = False):
        self.size, self.limit, self.grew = size, limit, grew
        super().__init__(name, f"grew past the {limit} bytes allowed while it was read" if grew
                         else f"has {size} bytes, over the {limit} allowed")


class Changed(ReadRefused):
    """The file opened is not the one stat judged (a rename or a new link in between)."""

    def __init__(self, name: str):
        super().__init__(name, "changed while it was opened")


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def kind_of(mode: int) -> str:
    """What a file that is not regular is, for a message: "a FIFO", "a directory"."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "not a regular file"


_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


def read_regular(path: str | Path, limit: int, *, follow: bool = False) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes. Anything else is a ReadRefused
    (NotRegular, TooLarge, Changed) without being opened or read past the limit; FileNotFoundError
    and other OSErrors pass.

    With follow, a symbolic link is read as the file it names (a spec or table a user points at
    may be one); without, a link is NotRegular (attngen's own stores never hold one, and one there
    could lead a read out of them).

    stat first, so a FIFO or device is never opened (opening some has effects, reading /dev/zero
    never ends); the open never waits (O_NONBLOCK) and fstat must find the file stat judged."""
    p = Path(path)
    before = os.stat(p) if follow else os.lstat(p)
    _judge(p.name, before.st_mode, before.st_size, limit)
    try:
        fd = os.open(p, _OPEN_FLAGS | (0 if follow else getattr(os, "O_NOFOLLOW", 0)))
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:    # a link put in its place since lstat
            raise NotRegular(p.name, stat.S_IFLNK) from None
        raise
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
            raise Changed(p.name)
        data = _read_up_to(fd, limit + 1)        # one byte more than allowed tells a file that grew
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TooLarge(p.name, len(data), limit, grew=True)
    return data


def _judge(name: str, mode: int, size: int, limit: int) -> None:
    if not stat.S_ISREG(mode):
        raise NotRegular(name, mode)
    if size > limit:
        raise TooLarge(name, size, limit)


def _read_up_to(fd: int, most: int) -> bytes:
    chunks = []
    while most > 0:
        chunk = os.read(fd, min(most, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        most -= len(chunk)
    return b"".join(chunks)


class NotUtf8(ValueError):
    """Bytes that are not UTF-8: `byte` is the first bad one, at `offset`, on 1-based `line`."""

    def __init__(self, data: bytes, offset: int):
        self.byte, self.offset, self.line = data[offset], offset, data.count(b"\n", 0, offset) + 1
        super().__init__(f"not UTF-8 text (byte 0x{self.byte:02x} at offset {offset})")


def utf8_text(data: bytes) -> str:
    """`data` decoded as UTF-8; NotUtf8 says where it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8(data, exc.start) from None


# A string (escapes included, unterminated at the end): brackets inside strings do not nest.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_NOT_BRACKET = re.compile(r'[^\[\]{}]+')
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_deeper_than(text: str, limit: int) -> bool:
    """Whether JSON text nests arrays and objects more than `limit` deep, told without parsing it:
    Python's parser recurses once per level, so a deep enough text is a RecursionError (or a crash).
    The strings go first and then all but the brackets, in C; what is left is the nesting alone."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return len(brackets) > limit and max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) > limit


CACHE_ENV = "ATTNGEN_CACHE_DIR"


def cache_dir() -> Path:
    """The user's attngen cache folder (cubins, table memos): $ATTNGEN_CACHE_DIR, else
    $XDG_CACHE_HOME/attngen, else ~/.cache/attngen. Here, in a leaf, so that the table's memo finds it
    without importing the compiler (and through it the runtime and the planner)."""
    d = os.environ.get(CACHE_ENV)
    if d:
        return Path(d)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attngen"


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
