"""Writing a specs file: ``save_specs`` (ftjit._specs describes the file,
ftjit._specs_format its format).

``save_specs`` writes atomically (a temporary file in the same
directory, flushed to disk, then renamed over the old one), so a crash
mid-write leaves the old file, and concurrent writers leave one complete
file; the file keeps the mode of the one it replaces, and a new one gets
0644 less the umask. A signature the format cannot hold is left out, with the
reason, and so is one whose values do not read back equal.

Shared state: none (each call works on its own objects; the file system
serialises the rename).
"""

from __future__ import annotations

import collections.abc
import errno
import os
import secrets
import stat
import threading
from typing import Any

from ._core import JitFunction
from ._hooks import CompilerHooks
from ._signature import Leaf, Node, Signature
from ._specs import LeftOut, _cached, _describe_object, _jitted, _key, _Unbuildable, _versions
from ._specs_format import MAX_BYTES, MAX_NESTING, CannotHold, dumps, dumps_file, encode_entry, same_record
from ._specs_read import Damaged, nesting, parse, read_record
from ._specs_trust import StrOrBytesPath, _check_trusted, _path_of, _Refused, _resolved

__all__ = ["save_specs"]


def _portable(tree: Any, hooks: CompilerHooks) -> Any:
    """A record tree as the file holds it: placements as the compiler's
    portable description (JAX: platform and device id)."""
    if isinstance(tree, Leaf):
        if tree.sharding is None:
            return tree
        save = hooks.portable_placement
        portable = save(tree.sharding) if save is not None else None
        if portable is None:
            raise _Unbuildable(f"its placement {tree.sharding!r} cannot be saved")
        return tree._replace(sharding=portable)
    if isinstance(tree, Node):
        return tree._replace(children=tuple(_portable(c, hooks) for c in tree.children))
    return tree

def _named(fn_or_fns: Any) -> dict[str, Any]:
    """{key in the file: function} of save_specs' argument (see there)."""
    what = "save_specs"
    if isinstance(fn_or_fns, JitFunction):
        return {_key(fn_or_fns): fn_or_fns}
    if isinstance(fn_or_fns, collections.abc.Mapping):
        named = {}
        for name, fn in fn_or_fns.items():
            if type(name) is not str:
                raise TypeError(f"{what}: a dict's keys name the functions in the file (str), got {name!r}")
            named[name] = _jitted(fn, f"{what} (the function named {name!r})")
        return named
    if not isinstance(fn_or_fns, (list, tuple, set, frozenset)):
        raise TypeError(f"{what} takes a function of ftjit.jit, a list or tuple of them, or a dict {{name: function}}, "
                        f"got {_describe_object(fn_or_fns)}")
    named = {}
    for i, fn in enumerate(fn_or_fns):
        _jitted(fn, f"{what} (item {i})")
        key = _key(fn)
        other = named.get(key)
        if other is not None and other is not fn:
            raise ValueError(f"save_specs: {other!r} and {fn!r} both have the key {key!r} (module:qualname), "
                             "so a file could keep only one of them: pass a dict {name: function} to name each")
        named[key] = fn
    return named


def save_specs(path: StrOrBytesPath, fn_or_fns: Any) -> dict[str, tuple[int, tuple[LeftOut, ...]]]:
    """Writes the specs of each function's cached signatures to ``path``,
    atomically; returns {key: (specs written, what was left out)}.

    ``fn_or_fns``: a function of ``ftjit.jit``, a list or tuple of them
    (each keyed by its module and qualified name; two distinct functions of
    one key are a ValueError), or a dict ``{name: function}`` (keyed by
    those names: ``SavedSpecs.for_function(fn, name=...)`` finds them). A
    signature the file cannot hold (see ftjit/_specs.py) is left out, with
    the reason. Nothing is pickled. ``path``: str, bytes or os.PathLike, as
    ``open`` takes. An existing file keeps its mode; a new one gets 0644
    less the umask. Raises PermissionError (naming the path and why) where
    the load would refuse the file: not a regular file (a device, a FIFO, a
    socket, a directory, a symbolic link), another owner, writable by
    others, or under a directory others can write or own (see
    ftjit/_specs.py); FileNotFoundError when its directory is missing.

    Thread-safe: concurrent calls each write a complete file, and the last
    rename wins.
    """
    path = _path_of(path, "save_specs")
    named = _named(fn_or_fns)
    functions: dict[str, list[str]] = {}
    summary: dict[str, tuple[int, tuple[LeftOut, ...]]] = {}
    for key, fn in named.items():
        hooks: CompilerHooks = fn._hooks
        entries, left_out = [], []
        for sig, signature, spec, why in _cached(fn):
            if spec is None:
                left_out.append(LeftOut(signature, why or ""))
                continue
            try:
                entries.append(_entry_of(sig, signature, hooks))
            except (_Unbuildable, CannotHold) as exc:
                left_out.append(LeftOut(signature, str(exc)))
            except Exception as exc:  # noqa: BLE001 - reported
                left_out.append(LeftOut(signature, f"it cannot be written ({type(exc).__name__}: {exc})"))
        functions[key] = entries
        summary[key] = (len(entries), tuple(left_out))
    data = dumps_file(_versions(), functions).encode("ascii")
    if len(data) > MAX_BYTES:
        raise ValueError(f"save_specs: the specs would take {len(data)} bytes, more than the {MAX_BYTES} that "
                         f"load_specs reads; nothing was written to {path}")
    target = _resolved(path)
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise FileNotFoundError(errno.ENOENT, f"its directory {directory} does not exist", path)
    try:
        st: os.stat_result | None = os.lstat(target)
    except FileNotFoundError:
        st = None
    try:
        _check_trusted(target, st, "written only to")
    except _Refused as exc:
        raise PermissionError(f"{path} is not written: {exc}") from None
    # An existing file keeps its mode (checked above: no one else can write it); a new one gets 0644 less the umask.
    _write_atomically(target, data, None if st is None else stat.S_IMODE(st.st_mode) & 0o777)
    return summary


def _entry_of(sig: Signature, signature: str, hooks: CompilerHooks) -> str:
    """A cached signature as the file's entry (JSON text), checked to read
    back as the same record by the values' own equality (_Unbuildable,
    CannotHold: why not)."""
    record = Signature(tuple(_portable(a, hooks) for a in sig.args),
                       {k: _portable(v, hooks) for k, v in sig.kwargs.items()}, None)
    entry = encode_entry(signature, record)
    text = dumps(entry)
    # The file around an entry is three levels: the file, its functions, one function's entries.
    if nesting(text.encode("ascii")) + 3 > MAX_NESTING:
        raise CannotHold(f"its arguments nest deeper than the {MAX_NESTING} levels of JSON a specs file may "
                             "have")
    try:
        back, unusable = read_record(parse(text))
    except Damaged as exc:
        raise CannotHold(f"it does not read back ({exc.where}: {exc.what})") from None
    if unusable is not None:
        raise CannotHold(f"it does not read back: {unusable}")
    why = same_record(record, back)
    if why is not None:
        raise CannotHold(why)
    return text


def _write_atomically(path: str, data: bytes, mode: int | None) -> None:
    """Writes ``path`` (its directory resolved and checked) through a temporary
    file beside it, flushed to disk, then renamed over it; with ``mode``, or
    0644 less the umask (others may read it, a replica running as another
    user, never write it)."""
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, f".ftjit-specs-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o644)
    except OSError as exc:  # a read-only directory, a full disk: said of the file asked for, not of the temporary
        try:  # some kernels (gVisor) make the file before finding no descriptor for it
            os.unlink(temporary)
        except OSError:
            pass
        raise type(exc)(exc.errno, f"{exc.strerror} (making a temporary file in {directory} to replace it "
                        "atomically)", path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None and hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
