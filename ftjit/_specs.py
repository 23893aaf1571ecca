"""The signatures traffic needed, as warm-up specs: ``JitFunction.warmup_specs()``,
and a file to keep them across restarts: ``save_specs`` and ``load_specs``.

A serving process learns under traffic which signatures it needs; a restart
forgets them. ``warmup_specs()`` turns the signatures now cached (the
core's own records, ftjit._signature) back into specs that ``warmup()``
takes, newest first: arrays as the compiler's array specs (JAX:
``jax.ShapeDtypeStruct`` with dtype, shape, weak type and placement),
static arguments as their values, nodes rebuilt through the compiler's
registry. Each rebuilt spec is checked to make exactly the signature it
came from; one that cannot be rebuilt is left out and reported, never
changed.

The file is JSON that holds data only (format "ftjit-specs", version 2:
ftjit._specs_format describes it): the ftjit and JAX versions that wrote
it and, per function (keyed by module and qualified name, or by the name
given to ``save_specs``), each signature as a tree of nodes, leaves (dtype
by name, shape, weak type, a single-device placement by platform and device
id) and static values. Reading it never runs code of its choosing: no
pickle, no import (classes are found only in modules already imported),
and static values only of the types a data format holds exactly (None,
bool, int, float, str, bytes, tuples and lists of them, enums, dataclasses
registered with ``register_static_dataclass``). A signature the format
cannot hold (another static value, a placement over several devices, a
class defined inside a function), or whose values do not equal their copies
read back (they compare by identity: a restored spec would never be
called), is left out at the save and listed in its report.

Who may have written it (POSIX; elsewhere only the format and the file's
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
socket). ``save_specs`` writes atomically (a temporary file in the same
directory, flushed to disk, then renamed over the old one), so a crash
mid-write leaves the old file, and concurrent writers leave one complete
file; the file keeps the mode of the one it replaces, and a new one gets
0644 less the umask.

What it does not hold: the compiler's context (JAX's configs hold objects
that exist per process). Warm up under the configuration the traffic uses
(jax_enable_x64, say): each spec is checked to make the very signature it
was saved as, and one that does not is reported, not compiled as something
else.

Shared state: none here (each call works on its own objects; the file
system serialises the rename); the registered dataclasses: see
ftjit._specs_format.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import errno
import logging
import math
import os
import secrets
import stat
import threading
from typing import Any, Iterable, NamedTuple, Union

from ._core import JitFunction
from ._hooks import CompilerHooks
from ._signature import Leaf, Node, Signature, Static
from ._specs_format import (
    FORMAT,
    MAX_BYTES,
    MAX_NESTING,
    MAX_SPEC_BYTES,
    VERSION,
    CannotHold,
    dumps,
    dumps_file,
    encode_entry,
    register_static_dataclass,
    same_record,
    shown,
)
from ._specs_read import Contents, Damaged, NotSpecs, SavedEntry, nesting, parse, read, read_record
from ._warmup import BrokenSpec, SavedSpec, Spec

logger = logging.getLogger("ftjit")

__all__ = ["LeftOut", "SpecList", "SavedSpecs", "save_specs", "load_specs", "register_static_dataclass"]

#: A path as ``open`` takes it.
StrOrBytesPath = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

#: Each kind of scalar leaf (ftjit._signature.LEAF_KINDS but "array") rebuilt
#: as a value of its type (a weak-typed leaf, as a call with one).
_SCALARS = {"bool": False, "int": 0, "float": 0.0, "complex": 0j}


class LeftOut(NamedTuple):
    """A cached signature that could not be turned into a spec, and why."""

    signature: str
    reason: str


class SpecList(list):
    """The specs of a function's cached signatures, newest first (a list of
    ``ftjit.Spec``); ``left_out``: those that could not be rebuilt, and why."""

    left_out: tuple[LeftOut, ...] = ()


class _Unbuildable(Exception):
    """Why a record cannot be rebuilt as a spec."""


def _jitted(fn: Any, what: str) -> Any:
    """``fn``, checked to be a function of ftjit.jit (whose cache holds signatures)."""
    if not isinstance(fn, JitFunction):
        raise TypeError(f"{what} takes functions of ftjit.jit, got {_describe_object(fn)}")
    return fn


def _describe_object(obj: Any) -> str:
    """``obj`` and its type, for a TypeError: ``None (a NoneType)``."""
    kind = type(obj)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{shown(obj)} (a {name})"


def _rebuild(tree: Any, hooks: CompilerHooks) -> Any:
    """A record tree as arguments warmup() takes."""
    if isinstance(tree, Static):
        return tree.value
    if isinstance(tree, Leaf):
        if tree.kind in _SCALARS:
            return _SCALARS[tree.kind]
        if hooks.spec_leaf is None:
            return ArraySpec(tree.shape, tree.dtype, tree.weak_type)
        return hooks.spec_leaf(tree)
    kind, key, children = tree
    values = [_rebuild(c, hooks) for c in children]
    if kind == "none":
        return None
    if kind == "tuple":
        return tuple(values)
    if kind == "list":
        return values
    if kind == "dict":
        return dict(zip(key, values))
    if kind == "namedtuple":
        return key(*values)
    if kind == "registered":
        if hooks.spec_node is None:
            raise _Unbuildable(f"a {key[0].__name__} node, which this compiler cannot rebuild")
        return hooks.spec_node(key, values)
    raise _Unbuildable(f"a node of the compiler's pytree hook ({key!r}), which cannot be rebuilt")


def _spec_of(sig: Signature, hooks: CompilerHooks) -> Spec:
    return Spec(tuple(_rebuild(a, hooks) for a in sig.args), {k: _rebuild(v, hooks) for k, v in sig.kwargs.items()})


def _readable(fn: Any, spec: Spec) -> str:
    return fn._signature_of(*spec.args, **spec.kwargs)


def _cached(fn: Any) -> Iterable[tuple[Signature, str, Spec | None, str | None]]:
    """(record, readable signature, spec, None) for each cached signature
    that rebuilds exactly, newest first; (record, readable, None, why) for
    each that does not."""
    hooks: CompilerHooks = fn._hooks
    current = fn._current_context()
    for sig, info in zip(fn._signatures(), fn.signatures()):
        try:
            if _differs(sig.context, current):
                raise _Unbuildable("it was compiled under another context than this thread's now")
            spec = _spec_of(sig, hooks)
            # By the values' own equality (same_record), never their printed form.
            why = same_record(sig, fn._signature_record_of(*spec.args, **spec.kwargs))
            if why is not None:
                raise _Unbuildable(f"its spec would make {_readable(fn, spec)} ({why})")
        except _Unbuildable as why:
            yield sig, info.signature, None, str(why)
            continue
        except Exception as exc:  # noqa: BLE001 - a spec that fails to rebuild is reported, never raised
            yield sig, info.signature, None, f"{type(exc).__name__}: {exc}"
            continue
        yield sig, info.signature, spec, None


def warmup_specs(fn: Any) -> SpecList:
    """``fn.warmup_specs()``: the specs of the signatures now cached, newest first."""
    out, left_out = SpecList(), []
    for _, signature, spec, why in _cached(fn):
        if spec is None:
            left_out.append(LeftOut(signature, why or ""))
        else:
            out.append(spec)
    out.left_out = tuple(left_out)
    return out


def _differs(a: Any, b: Any) -> bool:
    if a is b:
        return False
    try:
        return not bool(a == b)
    except Exception:  # noqa: BLE001
        return True


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """An array leaf for a compiler without a spec_leaf hook: what the core
    reads of an array (dtype, shape, weak type). Not a tuple: a tuple would
    be a container to flatten."""

    shape: tuple[int, ...]
    dtype: Any
    weak_type: bool = False


# --- the file ---------------------------------------------------------------------


def _versions() -> dict[str, str]:
    from ._version import __version__

    versions = {"ftjit": __version__}
    try:
        import jax

        versions["jax"] = jax.__version__
    except Exception:  # noqa: BLE001 - a process without JAX
        versions["jax"] = "none"
    return versions


def _key(fn: Any) -> str:
    """A function's key in the file: its module and qualified name."""
    return f"{getattr(fn, '__module__', None) or '?'}:{getattr(fn, '__qualname__', None) or fn.__name__}"


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


def _restored(tree: Any, hooks: CompilerHooks) -> Any:
    if isinstance(tree, Leaf):
        if tree.sharding is None:
            return tree
        if hooks.restore_placement is None:
            raise _Unbuildable("it has a placement, which this compiler cannot restore")
        return tree._replace(sharding=hooks.restore_placement(tree.sharding))
    if isinstance(tree, Node):
        return tree._replace(children=tuple(_restored(c, hooks) for c in tree.children))
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
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o644)
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


class SavedSpecs:
    """What ``load_specs`` read: ``for_function(fn)`` gives the specs to
    warm ``fn`` up with; problems come back as specs whose warm-up reports
    the error (the start goes on).

    ``error``: why the file cannot be used at all (missing, refused for its
    owner or mode, not a specs file of this version, damaged), else None.
    ``versions``: the ftjit and JAX versions that wrote it. ``functions``:
    {key: saved signatures}, each a record with ``signature`` (readable),
    ``record`` and ``error`` (why this process cannot use it, else None).

    Thread-safe: immutable once loaded; ``for_function`` may be called from
    any thread.
    """

    def __init__(self, path: str, contents: Contents | None = None, error: Exception | None = None):
        self.path = path
        self.error = error
        self.versions: dict[str, str] = {}
        self.functions: dict[str, tuple[SavedEntry, ...]] = {}
        if error is None and contents is not None:
            self.versions = dict(contents.versions)
            self.functions = dict(contents.functions)

    def for_function(self, fn: Any, name: str | None = None) -> list[SavedSpec | BrokenSpec]:
        """The specs saved for ``fn`` (by its module and qualified name, or
        by ``name`` when it was saved under one): SavedSpec for each that
        still fits, BrokenSpec (an error in the warm-up report) for each that does
        not, and one BrokenSpec for a file that cannot be used. A function
        the file does not name (a new one, or one whose module or name
        changed) gets none. Of a function with ``max_signatures=N``, only
        the N newest are read (no more could be warmed up; a warning on the
        "ftjit" logger says how many more the file holds). Never raises for
        the file's contents."""
        _jitted(fn, "SavedSpecs.for_function")
        if name is not None and type(name) is not str:
            raise TypeError(f"SavedSpecs.for_function: name must be a str (a key given to save_specs), got {name!r}")
        if self.error is not None:
            return [BrokenSpec(f"<specs file {self.path}>", self.error)]
        key = _key(fn) if name is None else name
        entries = self.functions.get(key, ())
        limit = getattr(fn, "_max_signatures", None)
        if limit is not None and len(entries) > limit:  # the rest could never be warmed up
            logger.warning("%s holds %d saved signatures of %s, more than its max_signatures=%d: only the newest %d "
                           "are read", self.path, len(entries), key, limit, limit)
            entries = entries[:limit]
        now = _versions()
        if self.versions != now:
            error = ValueError(f"{self.path} was written by {_describe(self.versions)}; this is {_describe(now)}: "
                               "save the specs again with this version")
            return [BrokenSpec(entry.signature, error) for entry in entries]
        hooks: CompilerHooks = fn._hooks
        out: list[SavedSpec | BrokenSpec] = []
        for entry in entries:
            if entry.record is None:
                out.append(BrokenSpec(entry.signature, entry.error or ValueError("no record")))
                continue
            try:
                record = entry.record
                record = Signature(tuple(_restored(a, hooks) for a in record.args),
                                   {k: _restored(v, hooks) for k, v in record.kwargs.items()}, None)
                _check_memory(record, hooks)  # before anything is traced
                spec = _spec_of(record, hooks)
                # The core's record of the rebuilt spec's signature against the saved one, by the values'
                # own equality (same_record), never their printed form.
                why = same_record(record, fn._signature_record_of(*spec.args, **spec.kwargs))
                if why is not None:
                    raise ValueError(f"the function changed: the saved spec makes {_readable(fn, spec)}, saved as "
                                     f"{entry.signature} ({why})")
            except Exception as exc:  # noqa: BLE001 - reported in the warm-up, never raised
                out.append(BrokenSpec(entry.signature, exc))
                continue
            out.append(SavedSpec(spec.args, spec.kwargs))
        return out


def _array_leaves(tree: Any) -> Iterable[Leaf]:
    if isinstance(tree, Leaf):
        if tree.kind == "array":
            yield tree
    elif isinstance(tree, Node):
        for child in tree.children:
            yield from _array_leaves(child)


def _check_memory(record: Signature, hooks: CompilerHooks) -> None:
    """ValueError unless the arrays of a saved signature (placements
    restored) fit in the memory of each device they would be on:
    ``hooks.device_memory``, or MAX_SPEC_BYTES where it is not known. A
    shape no device could hold is a damaged or foreign file, and compiling
    it can abort the process (XLA: "overflow in static extent product")."""
    needs: dict[Any, int] = {}
    for leaf in (leaf for tree in (*record.args, *record.kwargs.values()) for leaf in _array_leaves(tree)):
        key = leaf.sharding
        needs[key] = needs.get(key, 0) + math.prod(leaf.shape) * leaf.dtype.itemsize
    for placement, size in needs.items():
        memory = hooks.device_memory(placement) if hooks.device_memory is not None else None
        where = "the default device" if placement is None else (
            hooks.placement_label(placement) if hooks.placement_label is not None else shown(placement))
        if memory is None:
            if size > MAX_SPEC_BYTES:
                raise ValueError(f"its arrays would take {size} bytes on {where}, more than the {MAX_SPEC_BYTES} "
                                 "(1 TiB) a saved spec may take where the device's memory is not known: not warmed "
                                 "up (a damaged file?)")
        elif size > memory:
            raise ValueError(f"its arrays would take {size} bytes on {where}, more than the {memory} bytes of its "
                             "memory: not warmed up (a damaged file, or one saved for a larger device?)")


def _describe(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) or "an unknown version"


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


def load_specs(path: StrOrBytesPath, *, missing_ok: bool = False) -> SavedSpecs:
    """Reads a file of ``save_specs`` (``path``: str, bytes or os.PathLike,
    as ``open`` takes). Never raises for the file: a missing
    one, one refused for what it is or who may have written it (a symbolic
    link, a FIFO, another owner, writable by others, under a directory others
    can write: see ftjit/_specs.py), one that is not a specs
    file of this format version (an old pickle: save the specs again), or a
    damaged one comes back as a SavedSpecs whose ``error`` says why, and
    whose specs report it when warmed up. Reading runs no code of the
    file's: nothing is unpickled or imported. With ``missing_ok`` (a
    server's first start), a missing file is no specs and no error.

    Thread-safe (it reads the file into a new object).
    """
    path = _path_of(path, "load_specs")
    try:
        data = _read_trusted(path)
    except FileNotFoundError as exc:
        return SavedSpecs(path, Contents({}, {})) if missing_ok else SavedSpecs(path, error=exc)
    except _Refused as exc:
        return SavedSpecs(path, error=PermissionError(f"{path} is not read: {exc}"))
    except _TooBig as exc:
        return SavedSpecs(path, error=ValueError(f"{path} is not read: {exc}"))
    except OSError as exc:
        return SavedSpecs(path, error=exc)
    try:
        contents = read(data)
    except NotSpecs as exc:
        return SavedSpecs(path, error=ValueError(
            f"{path} is not a specs file of this ftjit (format {FORMAT!r} version {VERSION}): {exc}; save "
            "the specs again with this version"))
    except Damaged as exc:
        return SavedSpecs(path, error=ValueError(f"{path} is damaged at {exc.where}: {exc.what}"))
    except Exception as exc:  # noqa: BLE001 - whatever else: reported, never raised
        return SavedSpecs(path, error=ValueError(f"{path} cannot be read ({type(exc).__name__}: {exc})"))
    return SavedSpecs(path, contents)
