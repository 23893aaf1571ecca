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
kind are checked), as ssh's StrictModes sees a key (ftjit._specs_trust,
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

Writing the file: ftjit._specs_save (``save_specs``).

What it does not hold: the compiler's context (JAX's configs hold objects
that exist per process). Warm up under the configuration the traffic uses
(jax_enable_x64, say): each spec is checked to make the very signature it
was saved as, and one that does not is reported, not compiled as something
else.

Shared state: none here (each call works on its own objects); the
registered dataclasses: see ftjit._specs_format.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Iterable, NamedTuple

from ._core import JitFunction
from ._hooks import CompilerHooks
from ._signature import Leaf, Node, Signature, Static
from ._specs_format import FORMAT, MAX_SPEC_BYTES, VERSION, register_static_dataclass, same_record, shown
from ._specs_read import Contents, Damaged, NotSpecs, SavedEntry, read
from ._specs_trust import StrOrBytesPath, _path_of, _read_trusted, _Refused, _TooBig
from ._warmup import BrokenSpec, SavedSpec, Spec, cut

logger = logging.getLogger("ftjit")

#: The most saved signatures ``SavedSpecs.for_function`` reads of a function without ``max_signatures``: each
#: is a compile of the start (400 took 39 s and 635 MB on the CPU), and a file's are as many as it holds.
MAX_SAVED_SPECS = 1000

__all__ = ["LeftOut", "SpecList", "SavedSpecs", "load_specs", "register_static_dataclass"]

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
        the N newest are read (no more could be warmed up), and of one
        without, the MAX_SAVED_SPECS (1000) newest: a warning on the "ftjit"
        logger says how many more the file holds. Never raises for the
        file's contents."""
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
        elif limit is None and len(entries) > MAX_SAVED_SPECS:  # a start must not compile without end
            logger.warning("%s holds %d saved signatures of %s, more than the %d read of a function without "
                           "max_signatures: only the newest %d are read (give it max_signatures to read more)",
                           self.path, len(entries), key, MAX_SAVED_SPECS, MAX_SAVED_SPECS)
            entries = entries[:MAX_SAVED_SPECS]
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
                    raise ValueError(f"the function changed: the saved spec makes {cut(_readable(fn, spec))}, saved as "
                                     f"{cut(entry.signature)} ({why})")
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
    """The versions as a message names them: a file's, cut to MAX_TEXT characters (it may hold any number of
    any length)."""
    return cut(", ".join(f"{k} {v}" for k, v in sorted(versions.items()))) or "an unknown version"


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

