"""Who may have written a specs file, as ssh's StrictModes sees a key: one
check for ``load_specs`` (ftjit._specs) and ``save_specs``
(ftjit._specs_save), and reading a file's bytes once it passed.

Who may have written the file (POSIX; elsewhere only the format and the file's
kind are checked), as ssh's StrictModes sees a key (``_check_trusted``,
one check for the load and the save): the path's directories are resolved
first (symbolic links among them followed), the file itself is not
followed; the file must be a regular file (not a link, a directory, a
FIFO, a socket or a device), owned by the process's effective user or
root, and not writable by group or others; and every directory from the
file's own up to / must be owned by the user or root and not writable by
group or others, unless it is sticky (as /tmp). ``load_specs`` refuses
what fails, naming the file or the directory; ``save_specs`` refuses to
write there, the same way (it never replaces a device, a FIFO or a
socket).

Shared state: none (each call works on its own objects).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any, Union

from ._specs_format import MAX_BYTES

#: A path as ``open`` takes it.
StrOrBytesPath = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


class _Refused(Exception):
    """The file is not read or written: who may have written it, or what it is."""


class _TooBig(Exception):
    """The file is not read: it is larger than a specs file may be."""


def _path_of(path: Any, what: str) -> str:
    """``path`` as ``open`` takes it (str, bytes, os.PathLike), as a str
    (bytes decoded as the file system's names are); TypeError for another
    type, ValueError for an empty path."""
    path = os.fsdecode(os.fspath(path))
    if not path:
        raise ValueError(f"{what}: the path is empty: give the specs file's path")
    return path


def _resolved(path: str) -> str:
    """``path`` with its directories resolved (symbolic links followed, as
    ssh resolves a key's path), so that the directories checked are the
    ones the file is in; not the file itself, which must not be a link."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(os.path.realpath(directory), name)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _writable(mode: int) -> str:
    """Who besides the owner can write, by ``mode`` (which has 0o022 bits)."""
    if mode & 0o022 == 0o022:
        return "group- and world-writable"
    return "group-writable" if mode & 0o020 else "world-writable"


def _check_trusted(path: str, st: os.stat_result | None, verb: str, directories: bool = True) -> None:
    """Who may have written the file at ``path`` (directories resolved), or
    may replace it, as ssh's StrictModes sees a key: _Refused (naming the
    file or the directory, and why) unless the file (``st``: its lstat, None
    if there is none yet) is a regular file, owned by this process's
    effective user or root, not writable by group or others; and (with
    ``directories``) every directory from its own up to / is owned by the
    user or root and not writable by group or others, unless sticky (as
    /tmp: no one else can replace a file they do not own). POSIX; elsewhere
    the file's kind alone. The load and the save check alike (``verb``:
    "read only from", "written only to")."""
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise _Refused(f"it is a symbolic link (a specs file is {verb} the file itself: give its own path)")
        if not stat.S_ISREG(st.st_mode):
            kind = next((what for test, what in _KINDS if test(st.st_mode)), "something else")
            raise _Refused(f"it is {kind}, not a regular file")
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:  # not POSIX: no owners to check
        return
    uid = geteuid()
    if st is not None:
        if st.st_uid not in (uid, 0):
            raise _Refused(f"it is owned by uid {st.st_uid}, not by this process's user (uid {uid}) or root")
        if st.st_mode & 0o022:
            raise _Refused(f"it is {_writable(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):04o}): others could have "
                           f"written it; chmod go-w {path}")
    directory = os.path.dirname(path)
    while directories:
        dst = os.stat(directory)
        if dst.st_uid not in (uid, 0):
            raise _Refused(f"the directory {directory} is owned by uid {dst.st_uid}, not by this process's user "
                           f"(uid {uid}) or root: its owner can replace the file")
        if dst.st_mode & 0o022 and not dst.st_mode & stat.S_ISVTX:
            raise _Refused(f"the directory {directory} is {_writable(dst.st_mode)} (mode "
                           f"{stat.S_IMODE(dst.st_mode):04o}) without the sticky bit: another user can replace the "
                           f"file; chmod go-w {directory}")
        parent = os.path.dirname(directory)
        if parent == directory:
            return
        directory = parent


def _read_trusted(path: str) -> bytes:
    """The file's bytes, if no one but this process's user (or root) can
    have written it (_check_trusted); _Refused (why not), _TooBig, or
    OSError (FileNotFoundError naming ``path``, for the file or a directory
    of it missing)."""
    resolved = _resolved(path)
    try:
        st = os.lstat(resolved)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
    _check_trusted(resolved, st, "read only from")
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    # Not through a link, never blocking, should another process of this user put something else there meanwhile.
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(resolved, flags)
    try:
        st = os.fstat(fd)
        _check_trusted(resolved, st, "read only from", directories=False)
        if st.st_size > MAX_BYTES:
            raise _TooBig(f"it is {st.st_size} bytes, more than the {MAX_BYTES} a specs file may have")
        chunks, size = [], 0
        while size <= MAX_BYTES:  # a file growing meanwhile is still bounded
            chunk = os.read(fd, min(1 << 20, MAX_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_BYTES:
            raise _TooBig(f"it is more than the {MAX_BYTES} bytes a specs file may have")
        return b"".join(chunks)
    finally:
        os.close(fd)
