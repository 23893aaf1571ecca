"""The signatures traffic needed, as warm-up specs: ``JitFunction.warmup_specs()``,
and a file to keep them across restarts: ``save_specs`` and ``load_specs``.

A serving process learns under traffic which signatures it needs; a restart
forgets them. ``warmup_specs()`` turns the signatures now cached (the
core's own records, ftjit/_signature.py) back into specs that ``warmup()``
takes, newest first: arrays as the compiler's array specs (JAX:
``jax.ShapeDtypeStruct`` with dtype, shape, weak type and placement),
static arguments as their values, nodes rebuilt through the compiler's
registry. Each rebuilt spec is checked to make exactly the signature it
came from; one that cannot be rebuilt is left out and reported, never
changed.

The file is a pickle (load only files you wrote): a format name and version,
the ftjit and JAX versions that wrote it, and per function (keyed by module
and qualified name) the signatures as records. It is written atomically (a
temporary file in the same directory, then renamed over the old one), so a
crash mid-write leaves the old file, and concurrent writers leave one
complete file. What it can hold: static values that pickle, dtypes,
single-device placements (by platform and device id), and pytree nodes whose
classes can be imported where the file is read. What it does not hold: the
compiler's context (JAX's configs hold objects that exist per process). Warm
up under the configuration the traffic uses (jax_enable_x64, say): each
spec is checked to make the very signature it was saved as, and one that
does not is reported, not compiled as something else.

Shared state: none (each call works on its own objects; the file system
serialises the rename).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import secrets
import threading
from typing import Any, Iterable, NamedTuple

from ._signature import Leaf, Node, Signature, Static
from ._warmup import BrokenSpec, SavedSpec, Spec

__all__ = ["LeftOut", "SpecList", "SavedSpecs", "save_specs", "load_specs"]

FORMAT = "ftjit-specs"
VERSION = 1

#: Python scalars rebuilt as values of their type (a weak-typed leaf, as a call with one).
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


def _hooks(fn: Any) -> Any:
    return fn._hooks


def _rebuild(tree: Any, hooks: Any) -> Any:
    """A record tree as arguments warmup() takes."""
    if isinstance(tree, Static):
        return tree.value
    if isinstance(tree, Leaf):
        if tree.kind in _SCALARS:
            return _SCALARS[tree.kind]
        make = getattr(hooks, "spec_leaf", None)
        if make is None:
            return ArraySpec(tree.shape, tree.dtype, tree.weak_type)
        return make(tree)
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
        make = getattr(hooks, "spec_node", None)
        if make is None:
            raise _Unbuildable(f"a {key[0].__name__} node, which this compiler cannot rebuild")
        return make(key, values)
    raise _Unbuildable(f"a node of the compiler's pytree hook ({key!r}), which cannot be rebuilt")


def _spec_of(sig: Signature, hooks: Any) -> Spec:
    return Spec(tuple(_rebuild(a, hooks) for a in sig.args), {k: _rebuild(v, hooks) for k, v in sig.kwargs.items()})


def _check_statics(tree: Any) -> None:
    """Every static value pickles (a spec is meant to be saved)."""
    if isinstance(tree, Static):
        try:
            pickle.dumps(tree.value)
        except Exception as exc:  # noqa: BLE001 - reported as the reason
            raise _Unbuildable(f"the static value {tree.value!r} does not pickle ({type(exc).__name__}: {exc})") from None
    elif isinstance(tree, Node):
        for child in tree.children:
            _check_statics(child)


def _readable(fn: Any, spec: Spec) -> str:
    return fn._signature_of(*spec.args, **spec.kwargs)


def _cached(fn: Any) -> Iterable[tuple[Signature, str, Spec | None, str | None]]:
    """(record, readable signature, spec, None) for each cached signature
    that rebuilds exactly, newest first; (record, readable, None, why) for
    each that does not."""
    hooks = _hooks(fn)
    current = fn._current_context()
    for sig, info in zip(fn._signatures(), fn.signatures()):
        try:
            if _differs(sig.context, current):
                raise _Unbuildable("it was compiled under another context than this thread's now")
            for tree in (*sig.args, *sig.kwargs.values()):
                _check_statics(tree)
            spec = _spec_of(sig, hooks)
            made = _readable(fn, spec)
            if made != info.signature:
                raise _Unbuildable(f"its spec would make {made}")
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


def _portable(tree: Any, hooks: Any) -> Any:
    """A record tree as the file holds it: placements as the compiler's
    portable description (JAX: platform and device id)."""
    if isinstance(tree, Leaf):
        if tree.sharding is None:
            return tree
        save = getattr(hooks, "portable_placement", None)
        portable = save(tree.sharding) if save is not None else None
        if portable is None:
            raise _Unbuildable(f"its placement {tree.sharding!r} cannot be saved")
        return tree._replace(sharding=portable)
    if isinstance(tree, Node):
        return tree._replace(children=tuple(_portable(c, hooks) for c in tree.children))
    return tree


def _restored(tree: Any, hooks: Any) -> Any:
    if isinstance(tree, Leaf):
        if tree.sharding is None:
            return tree
        load = getattr(hooks, "restore_placement", None)
        if load is None:
            raise _Unbuildable("it has a placement, which this compiler cannot restore")
        return tree._replace(sharding=load(tree.sharding))
    if isinstance(tree, Node):
        return tree._replace(children=tuple(_restored(c, hooks) for c in tree.children))
    return tree


def save_specs(path: str | os.PathLike[str], fn_or_fns: Any) -> dict[str, tuple[int, tuple[LeftOut, ...]]]:
    """Writes the specs of each function's cached signatures to ``path``,
    atomically; returns {function key: (specs written, what was left out)}.

    Thread-safe: concurrent calls each write a complete file, and the last
    rename wins.
    """
    fns = list(fn_or_fns) if isinstance(fn_or_fns, (list, tuple, set)) else [fn_or_fns]
    functions: dict[str, list[dict[str, Any]]] = {}
    summary: dict[str, tuple[int, tuple[LeftOut, ...]]] = {}
    for fn in fns:
        hooks = _hooks(fn)
        records, left_out = [], []
        for sig, signature, spec, why in _cached(fn):
            if spec is None:
                left_out.append(LeftOut(signature, why or ""))
                continue
            try:
                record = Signature(tuple(_portable(a, hooks) for a in sig.args),
                                   {k: _portable(v, hooks) for k, v in sig.kwargs.items()}, None)
                blob = pickle.dumps(record)
            except _Unbuildable as exc:
                left_out.append(LeftOut(signature, str(exc)))
                continue
            except Exception as exc:  # noqa: BLE001 - reported
                left_out.append(LeftOut(signature, f"it does not pickle ({type(exc).__name__}: {exc})"))
                continue
            records.append({"signature": signature, "record": blob})
        functions[_key(fn)] = records
        summary[_key(fn)] = (len(records), tuple(left_out))
    payload = {"format": FORMAT, "version": VERSION, "versions": _versions(), "functions": functions}
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    # A name of this process and thread, and a file made with mode 0o666 less
    # the umask, as open() would make it (mkstemp's 0o600 would keep a
    # replica running as another user from reading it).
    temporary = os.path.join(directory, f".ftjit-specs-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return summary


class SavedSpecs:
    """What ``load_specs`` read: ``for_function(fn)`` gives the specs to
    warm ``fn`` up with; problems come back as specs whose warm-up reports
    the error (the start goes on)."""

    def __init__(self, path: str, payload: Any = None, error: Exception | None = None):
        self.path = path
        self.error = error
        self.versions: dict[str, str] = {}
        self.functions: dict[str, list[dict[str, Any]]] = {}
        if error is None:
            self.versions = dict(payload.get("versions", {}))
            self.functions = payload.get("functions", {})

    def for_function(self, fn: Any) -> list[SavedSpec | BrokenSpec]:
        """The specs saved for ``fn`` (by module and qualified name): SavedSpec for
        each that still fits, BrokenSpec (an error in the warm-up report) for
        each that does not, and one BrokenSpec for a file that cannot be used.
        A function the file does not name (a new one, or one whose module or
        name changed) gets none."""
        if self.error is not None:
            return [BrokenSpec(f"<specs file {self.path}>", self.error)]
        now = _versions()
        if self.versions != now:
            error = ValueError(f"{self.path} was written by {_describe(self.versions)}; this is {_describe(now)}: "
                               "save the specs again with this version")
            return [BrokenSpec(entry["signature"], error) for entry in self.functions.get(_key(fn), [])]
        hooks = _hooks(fn)
        out: list[SavedSpec | BrokenSpec] = []
        for entry in self.functions.get(_key(fn), []):
            signature = entry["signature"]
            try:
                record = pickle.loads(entry["record"])
                record = Signature(tuple(_restored(a, hooks) for a in record.args),
                                   {k: _restored(v, hooks) for k, v in record.kwargs.items()}, None)
                spec = _spec_of(record, hooks)
                made = _readable(fn, spec)
                if made != signature:
                    raise ValueError(f"the function changed: the saved spec makes {made}, saved as {signature}")
            except Exception as exc:  # noqa: BLE001 - reported in the warm-up, never raised
                out.append(BrokenSpec(signature, exc))
                continue
            out.append(SavedSpec(spec.args, spec.kwargs))
        return out


def _describe(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) or "an unknown version"


def load_specs(path: str | os.PathLike[str], *, missing_ok: bool = False) -> SavedSpecs:
    """Reads a file of ``save_specs``. Never raises for its contents: a
    missing, corrupted or truncated file, or one of another format version,
    comes back as a SavedSpecs whose specs report the error when warmed up.
    With ``missing_ok`` (a server's first start), a missing file is no
    specs and no error."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            payload = pickle.load(f)
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ValueError(f"{path} is not an ftjit specs file")
        if payload.get("version") != VERSION:
            raise ValueError(f"{path} is of format version {payload.get('version')}; this ftjit reads version {VERSION}")
    except FileNotFoundError as exc:
        return SavedSpecs(path, {"functions": {}}) if missing_ok else SavedSpecs(path, error=exc)
    except Exception as exc:  # noqa: BLE001 - a file that cannot be used is reported, never raised
        return SavedSpecs(path, error=exc)
    return SavedSpecs(path, payload)
