"""Observability and guards: compile logging, miss explanations, recompile limits, stats().

Everything here runs on the miss path (or on demand), never on a cache hit.
Read top to bottom: the explanation switch, the core's logging hooks, how a
call is described (Describer, CallDescription), how two descriptions are
compared (explain), the guard (GuardState, GuardedCompiler), stats().

Shared state and what guards it:

| _explain_all          | a bool rebound whole (set_explain_misses): atomic  |
| GuardState (one per function and options, shared by its wrappers):       |
|   seen, running, compiled, warned, by_structure, recent | GuardState.lock  |
| GuardedCompiler.state | rebound once (share_state) before any call         |

Lock order: GuardState.lock is a leaf. Only dict/set operations on keys
(strings, hashes, weak references) run under it; the compile, describing a
call, logging and warnings run outside it, and it is never held while
calling into the core.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from ._core import _ahead_enter, _ahead_exit, _compiling_ahead, _live_functions
from .errors import RecompileLimitError

logger = logging.getLogger("ftjit")
#: Miss explanations, at WARNING: asked for explicitly (explain_misses=True,
#: set_explain_misses, FTJIT_EXPLAIN_MISSES=1), they show with Python's
#: default logging setup (stderr), as jax's explain_cache_misses do. A
#: logger of their own, so that they can be routed or silenced apart.
miss_logger = logging.getLogger("ftjit.misses")

# The global switch for miss explanations (jit(explain_misses=None) follows it).
_explain_all = os.environ.get("FTJIT_EXPLAIN_MISSES", "") not in ("", "0")


def set_explain_misses(enabled: bool) -> None:
    """Turns miss explanations on or off for every function jitted with ``explain_misses=None``.

    Thread-safe (a single flag, read at each miss).
    """
    global _explain_all
    numpy_bool = type(enabled).__module__ == "numpy" and type(enabled).__name__ in ("bool", "bool_")
    if not (isinstance(enabled, (bool, int)) or numpy_bool):  # "no" would otherwise mean True
        raise TypeError(f"set_explain_misses expects a bool, got {enabled!r}")
    _explain_all = bool(enabled)


def explain_misses_enabled() -> bool:
    return _explain_all


@contextlib.contextmanager
def compiling_ahead() -> Iterator[None]:
    """Marks this thread's compiles as requested ahead of traffic
    (``precompile``/``warmup``): they are not explained as misses (the
    ``max_signatures`` guard still counts them). The mark is the core's
    (``JitFunction.precompile`` sets it too)."""
    _ahead_enter()
    try:
        yield
    finally:
        _ahead_exit()


# --- logging hooks (called by the C++ core after each compile / wait) --------


def on_compile(name: str, signature: str, seconds: float, error: BaseException | None) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    thread = threading.current_thread().name
    if error is None:
        logger.info("compiled %s in %.3f s (thread %s)", signature, seconds, thread)
    else:
        logger.info(
            "compile of %s failed after %.3f s (thread %s): %s: %s",
            signature,
            seconds,
            thread,
            type(error).__name__,
            error,
        )


def on_wait(name: str, signature: str, seconds: float) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "waited %.3f s for %s, compiled by another thread (thread %s)",
            seconds,
            signature,
            threading.current_thread().name,
        )


# --- call descriptions, for miss explanations --------------------------------


def _safe_repr(x: Any) -> str:
    """repr(x), or a placeholder when its __repr__ raises: describing a call
    must never fail the compile it describes."""
    try:
        return repr(x)
    except Exception:  # noqa: BLE001
        return f"<{type(x).__name__} object (repr failed)>"


def _safe_str(x: Any) -> str:
    try:
        return str(x)
    except Exception:  # noqa: BLE001
        return _safe_repr(x)


def placement_label(sharding: Any) -> str:
    """How a committed array's placement prints in signatures and explanations:
    the device ('cpu:1') of a single-device sharding, else str(sharding)."""
    devices = getattr(sharding, "_device_assignment", None)
    if type(sharding).__name__ == "SingleDeviceSharding" and devices and len(devices) == 1:
        return _safe_str(devices[0])
    return _safe_str(sharding)


def _placement(x: Any) -> str:
    """'@devices' for a committed jax Array (the core keys those on their
    sharding) and a jax.ShapeDtypeStruct with a sharding (keyed alike), ''
    otherwise."""
    t = type(x)
    if t.__name__ == "ShapeDtypeStruct" and t.__module__.split(".")[0] == "jax":
        sharding = getattr(x, "sharding", None)
        return "" if sharding is None else f"@{placement_label(sharding)}"
    if not getattr(x, "_committed", False):
        return ""
    return f"@{placement_label(getattr(x, '_sharding', None))}"


def _leaf(x: Any) -> str:
    if type(x) is bool:
        return "bool"
    if type(x) in (int, float, complex):
        return type(x).__name__
    dtype = getattr(x, "dtype", None)
    shape = getattr(x, "shape", None)
    if dtype is not None and isinstance(shape, tuple):
        weak = "{weak}" if getattr(x, "weak_type", False) else ""
        return f"{dtype}[{','.join(str(d) for d in shape)}]{weak}{_placement(x)}"
    return f"<{type(x).__name__}>"


def _flatten_builtin(x: Any, path: str, out: list[tuple[str, str]], shape: list[str]) -> None:
    """Leaves as (path, description) and a skeleton of the containers."""
    if x is None:
        shape.append("None")
    elif type(x) in (tuple, list) or (isinstance(x, tuple) and hasattr(type(x), "_fields")):
        open_, close = ("[", "]") if type(x) is list else (f"{type(x).__name__}(", ")")
        shape.append(f"{open_}{len(x)}")
        for i, item in enumerate(x):
            _flatten_builtin(item, f"{path}[{i}]", out, shape)
        shape.append(close)
    elif type(x) is dict:
        try:
            keys = sorted(x)
        except TypeError:
            keys = list(x)
        shape.append("{" + ",".join(_safe_repr(k) for k in keys))
        for k in keys:
            _flatten_builtin(x[k], f"{path}[{_safe_repr(k)}]", out, shape)
        shape.append("}")
    else:
        shape.append("*")
        out.append((path, _leaf(x)))


def _flatten_jax(x: Any, path: str, out: list[tuple[str, str]], shape: list[str]) -> None:
    from jax import tree_util

    try:
        leaves, treedef = tree_util.tree_flatten_with_path(x)
    except Exception:
        return _flatten_builtin(x, path, out, shape)
    # Shown as JAX prints it; keyed by its structure (_tree_key), since the
    # core compares aux data by equality, not by how it prints.
    shape.append(_TreeText(str(treedef), _tree_key(treedef)))
    for key_path, leaf in leaves:
        out.append((path + tree_util.keystr(key_path), _leaf(leaf)))


class _TreeText(str):
    """A pytree skeleton as printed, carrying its key (see _tree_key)."""

    tree_key: Any

    def __new__(cls, text: str, tree_key: Any) -> "_TreeText":
        obj = super().__new__(cls, text)
        obj.tree_key = tree_key
        return obj


def _tree_key(treedef: Any) -> Any:
    """A JAX pytree definition as the guard keys it, node by node: (weak
    reference to the node type, aux data by hash, children). Equal aux data
    (2.0 and np.float64(2.0), equal objects whose repr shows an address) is
    one key and an aux object compared by identity (a new one per call) a
    new one, as in the core; unhashable aux data (which JAX accepts) is keyed
    by its repr. Holds no user object."""
    data = treedef.node_data()
    if data is None:
        return "*"
    node_type, aux = data
    if type(aux) is list:  # dict keys
        aux = tuple(aux)
    try:
        aux_key: Any = ("hash", hash(aux))
    except TypeError:
        aux_key = ("repr", _safe_repr(aux))
    return (_type_key(node_type), aux_key, tuple(_tree_key(child) for child in treedef.children()))


def _context_key(value: Any) -> Any:
    """The compiler's context as the guard keys it: plain values as they are,
    other objects by (weak reference to their type, hash), as static
    arguments, so that the guard's state (kept for as long as the function
    lives, outside the GC's view) holds no user object."""
    if value is None or type(value) in (bool, int, float, complex, str, bytes):  # exact: not an IntEnum member
        return value
    if type(value) is tuple:
        return tuple(_context_key(v) for v in value)
    if type(value) is frozenset:
        return frozenset(_context_key(v) for v in value)
    return _ObjectKey(_type_key(type(value)), hash(value), _cut(_safe_repr(value)))


class _ObjectKey:
    """A context value that is not a plain value, as the guard keys it: by
    (weak reference to its type, hash), never the value itself; its repr is
    kept (cut to _MAX_CONTEXT_TEXT characters) for explanations only."""

    __slots__ = ("type_key", "hash", "text")

    def __init__(self, type_key: Any, hash_: int, text: str):
        self.type_key, self.hash, self.text = type_key, hash_, text

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _ObjectKey):
            return NotImplemented
        return self.type_key == other.type_key and self.hash == other.hash

    def __hash__(self) -> int:
        return hash((self.type_key, self.hash))

    def __repr__(self) -> str:
        return self.text


#: A context value in an explanation is cut to this many characters.
_MAX_CONTEXT_TEXT = 80


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_CONTEXT_TEXT else text[: _MAX_CONTEXT_TEXT - 3] + "..."


def _type_key(t: type) -> Any:
    """A static argument's type as the guard remembers it: a weak reference
    (equal while the type lives), so that the remembered signatures, kept by
    the cache's entries for as long as the function lives, never keep a class
    alive (a class may hold its own jitted function)."""
    try:
        return weakref.ref(t)
    except TypeError:
        return t


@dataclasses.dataclass(frozen=True)
class CallDescription:
    """A call's signature as comparable parts: leaves by path, statics by name, tree skeletons."""

    leaves: tuple[tuple[str, str], ...]
    statics: tuple[tuple[str, str], ...]
    trees: tuple[tuple[str, str], ...]
    #: how the call passed its arguments: ("f(x, y=)" style), so f(a) and f(x=a) differ
    layout: str = ""
    #: the compiler's tracing context (e.g. jax config) when the call was made
    context: Any = None
    #: statics as the core keys them, by (name, type, hash): equal statics
    #: whose reprs differ (e.g. the default repr, with an address) are one
    statics_key: tuple = ()
    #: trees as the core keys them: the builtin skeletons' text and, for
    #: JAX pytree definitions, their structure with aux data by hash
    trees_key: tuple = ()

    def key(self) -> tuple:
        return (self.leaves, self.statics_key, self.trees_key, self.layout, self.context)

    def structure(self) -> tuple:
        """How the call is shaped: how it passed its arguments and their tree structures."""
        return (self.layout, self.trees_key)


class Describer:
    """Builds CallDescriptions for one jitted function (fixed options; thread-safe)."""

    def __init__(
        self,
        static_argnums: Sequence[int],
        static_argnames: Sequence[str],
        arg_names: Sequence[str],
        use_jax: bool,
    ):
        self.static_argnums = tuple(static_argnums)
        self.static_argnames = frozenset(static_argnames)
        self.arg_names = tuple(arg_names)
        self.flatten = _flatten_jax if use_jax else _flatten_builtin
        self.context: Callable[[], Any] | None = None  # set by jit() from the compiler's hook
        #: names of the context's items, shaped as context() is (a str names a
        #: whole item, a tuple names a tuple item by item); None: by position.
        #: Set by jit() from the compiler's optional ``context_names`` (or a
        #: callable returning them, read at each explanation).
        self.context_names: Any = None

    def _name(self, i: int) -> str:
        return f"'{self.arg_names[i]}'" if i < len(self.arg_names) else f"args[{i}]"

    def __call__(self, args: tuple, kwargs: dict) -> CallDescription:
        leaves: list[tuple[str, str]] = []
        statics: list[tuple[str, str]] = []
        statics_key: list[tuple[str, Any, int]] = []
        trees: list[tuple[str, str]] = []
        trees_key: list[tuple[str, tuple]] = []

        def add_tree(name: str, skeleton: list[str]) -> None:
            trees.append((name, " ".join(skeleton)))
            trees_key.append((name, tuple(t.tree_key if isinstance(t, _TreeText) else t for t in skeleton)))

        def add_static(name: str, value: Any) -> None:
            statics.append((name, _safe_repr(value)))
            statics_key.append((name, _type_key(type(value)), hash(value)))

        n = len(args)
        for i, value in enumerate(args):
            if i in self.static_argnums or (i - n) in self.static_argnums:
                add_static(self._name(i), value)
                continue
            skeleton: list[str] = []
            self.flatten(value, self._name(i), leaves, skeleton)
            add_tree(self._name(i), skeleton)
        for key in sorted(kwargs):
            if key in self.static_argnames:
                add_static(f"'{key}'", kwargs[key])
                continue
            skeleton = []
            self.flatten(kwargs[key], f"'{key}'", leaves, skeleton)
            add_tree(f"'{key}'", skeleton)
        layout = ", ".join([self._name(i).strip("'") for i in range(n)] + [f"{key}=" for key in sorted(kwargs)])
        context = _context_key(self.context()) if self.context is not None else None
        return CallDescription(
            tuple(leaves), tuple(statics), tuple(trees), f"({layout})", context, tuple(statics_key), tuple(trees_key)
        )


def _context_text(key: Any) -> str:
    """A context value (as _context_key keys it) as explanations print it."""
    if isinstance(key, _ObjectKey):
        return key.text
    if type(key) is tuple:
        return _cut("(" + ", ".join(_context_text(v) for v in key) + ("," if len(key) == 1 else "") + ")")
    if type(key) is frozenset:
        return _cut("frozenset({" + ", ".join(sorted(_context_text(v) for v in key)) + "})")
    return _cut(_safe_repr(key))


def _context_differences(old: Any, new: Any, names: Any, label: str, out: list[str]) -> None:
    """Appends 'tracing context NAME: OLD -> NEW' for each item that differs,
    going into tuples of equal length, named by `names` (see
    Describer.context_names) or by position."""
    if old == new:
        return
    if isinstance(names, str):  # names this whole value
        label, names = f"tracing context {names}", None
    if type(old) is tuple and type(new) is tuple and len(old) == len(new):
        named = type(names) is tuple and len(names) == len(old)
        if named or names is None:
            for i, (a, b) in enumerate(zip(old, new)):
                _context_differences(a, b, names[i] if named else None, f"{label}[{i}]", out)
            return
    before, after = _context_text(old), _context_text(new)
    out.append(f"{label}: {before} -> {after}" + (" (unequal values that print the same)" if before == after else ""))


def _differences(old: CallDescription, new: CallDescription, context_names: Any = None) -> list[str]:
    out: list[str] = []
    if old.layout != new.layout:
        out.append(f"arguments passed as {old.layout} -> {new.layout}")
    old_trees, new_trees = dict(old.trees), dict(new.trees)
    for name in sorted(set(old_trees) | set(new_trees)):
        if old_trees.get(name) != new_trees.get(name):
            if name not in old_trees or name not in new_trees:
                out.append(f"argument {name}: {'added' if name not in old_trees else 'missing'}")
            else:
                out.append(f"argument {name}: tree structure {old_trees[name]} -> {new_trees[name]}")
    old_tree_keys, new_tree_keys = dict(old.trees_key), dict(new.trees_key)
    for name in sorted(set(old_trees) & set(new_trees)):
        if old_trees[name] == new_trees[name] and old_tree_keys.get(name) != new_tree_keys.get(name):
            out.append(f"argument {name}: tree structure {old_trees[name]} -> {new_trees[name]} "
                       "(unequal node data that prints the same)")
    old_leaves, new_leaves = dict(old.leaves), dict(new.leaves)
    for path in [p for p, _ in new.leaves]:
        if path in old_leaves and old_leaves[path] != new_leaves[path]:
            out.append(f"argument {path}: {old_leaves[path]} -> {new_leaves[path]}")
    old_statics, new_statics = dict(old.statics), dict(new.statics)
    old_keys = {k[0]: k[1:] for k in old.statics_key}
    new_keys = {k[0]: k[1:] for k in new.statics_key}
    for name in sorted(set(old_statics) | set(new_statics)):
        before, after = old_statics.get(name, "<absent>"), new_statics.get(name, "<absent>")
        if before != after:
            out.append(f"static {name}: {before} -> {after}")
        elif old_keys.get(name) != new_keys.get(name):
            out.append(f"static {name}: {before} -> {after} (unequal values with the same repr)")
    _context_differences(old.context, new.context, context_names, "tracing context", out)
    return out


_LEAF = re.compile(r"^(\w+)\[([^\]]*)\](\{weak\})?$")


def _leaf_distance(old: str, new: str) -> int:
    """How many of dtype, shape and weak type differ between two leaf descriptions (3 if not both arrays)."""
    a, b = _LEAF.match(old), _LEAF.match(new)
    if a is None or b is None:
        return 0 if old == new else 3
    return sum(x != y for x, y in zip(a.groups(), b.groups()))


def _distance(old: CallDescription, new: CallDescription) -> int:
    old_leaves = dict(old.leaves)
    return sum(_leaf_distance(old_leaves[path], leaf) for path, leaf in new.leaves if path in old_leaves)


def explain(cached: Iterable[CallDescription], new: CallDescription, context_names: Any = None) -> str | None:
    """How `new` differs from the closest of `cached`, or None if none cached.

    Closest means fewest tree-structure differences first (a different tree is
    a different kind of call), then fewest differences overall, then fewest
    differing dtypes, shapes and weak types among the leaves (so a weak-type
    change is explained against the same dtype and shape); ties go to the
    signature cached first.
    """
    best: list[str] | None = None
    best_rank: tuple[int, int, int] | None = None
    for old in cached:
        diffs = _differences(old, new, context_names)
        structural = (": tree structure ", "arguments passed as ")
        rank = (
            sum(any(t in d for t in structural) or d.endswith((": added", ": missing")) for d in diffs),
            len(diffs),
            _distance(old, new),
        )
        if best_rank is None or rank < best_rank:
            best, best_rank = diffs, rank
    if best is None:
        return None
    if best:
        return "; ".join(best)
    return "no difference ftjit can show in the arguments or the tracing context"


#: Descriptions remembered per unguarded function, for miss explanations.
_MAX_REMEMBERED = 4096
#: A miss is explained against at most this many remembered signatures: the
#: most recent ones of the same call structure (layout and tree structures),
#: or, when there are none, the most recent ones of any structure. So a miss
#: costs O(arguments), not O(remembered signatures).
_EXPLAIN_CANDIDATES = 16


class GuardState:
    """What the max_signatures guard and the miss explanations remember of one
    function's compiled signatures; shared by its wrappers with equal options
    (they share the cache's entries, so the limit counts those).

    Kept by the function's entries in the cache (C++, outside the GC's view)
    for as long as the function lives, whatever wrappers come and go; so it
    holds descriptions only (strings; static arguments and non-plain context
    values as weak references to their types and their hashes; pytree
    definitions as text and hashes), never the function, a wrapper or a
    user object.
    """

    __slots__ = ("lock", "seen", "running", "compiled", "warned", "by_structure", "recent")

    def __init__(self) -> None:
        # Taken with the thread attached (the GIL held on GIL builds); only
        # dict/set operations on the keys (strings, hashes, weak references)
        # run under it, never the compile, logging or a warning, and no
        # other lock is taken while it is held.
        self.lock = threading.Lock()
        self.seen: dict[tuple, CallDescription] = {}  # guarded by lock
        # Per remembered key: compiles of it now running, and whether one ever
        # succeeded. A failed compile forgets the key only as the last one
        # running with none succeeded (a clear can start a second compile of
        # a signature while the first still runs). Both guarded by lock.
        self.running: dict[tuple, int] = {}
        self.compiled: set[tuple] = set()
        self.warned = False  # guarded by lock
        # Explanation candidates (see _EXPLAIN_CANDIDATES), both guarded by
        # lock: per call structure, its newest remembered keys; and the newest
        # keys of any structure. Keys only: `seen` holds the descriptions.
        self.by_structure: dict[tuple, list[tuple]] = {}
        self.recent: list[tuple] = []

    def remember(self, key: tuple, desc: "CallDescription") -> None:
        """Adds `key` to `seen` and to the candidate index (lock held; `key` not in `seen`)."""
        self.seen[key] = desc
        bucket = self.by_structure.setdefault(desc.structure(), [])
        bucket.append(key)
        del bucket[:-_EXPLAIN_CANDIDATES]
        self.recent.append(key)
        del self.recent[:-_EXPLAIN_CANDIDATES]

    def forget(self, key: tuple) -> None:
        """Removes `key` from `seen` and the candidate index (lock held)."""
        desc = self.seen.pop(key, None)
        if desc is None:
            return
        structure = desc.structure()
        bucket = self.by_structure.get(structure, [])
        if key in bucket:
            bucket.remove(key)
            if not bucket:
                del self.by_structure[structure]
        if key in self.recent:
            self.recent.remove(key)

    def candidates(self, desc: "CallDescription") -> list["CallDescription"]:
        """What a miss of `desc` is explained against (lock held): at most
        _EXPLAIN_CANDIDATES remembered descriptions, oldest first."""
        keys = self.by_structure.get(desc.structure()) or self.recent
        return [self.seen[k] for k in keys if k in self.seen]

    def done(self, key: tuple) -> bool:
        """One compile of `key` ended (call with lock held); True if it was the last one running."""
        left = self.running[key] - 1
        if left:
            self.running[key] = left
        else:
            del self.running[key]
        return not left


class GuardedCompiler:
    """Wraps a compiler with miss explanations and the ``max_signatures`` guard.

    Thread-safe: the set of signatures seen is guarded by a lock, so concurrent
    misses at the limit admit exactly ``max_signatures`` distinct signatures.
    The compiler protocol's hooks are read from the inner compiler by jit().
    """

    #: the max_signatures warning's stacklevel: the frame that called the JitFunction
    warn_stacklevel = 2
    #: descriptions remembered at most (more when max_signatures is larger)
    max_remembered = _MAX_REMEMBERED

    def __init__(
        self,
        inner: Callable[..., Any],
        name: str,
        describe: Describer,
        max_signatures: int | None,
        on_excess: str,
        explain_misses: bool | None,
    ):
        self.inner = inner
        self.name = name
        self.describe = describe
        self.max_signatures = max_signatures
        self.on_excess = on_excess
        self.explain_misses = explain_misses
        self.state = GuardState()
        #: () -> the number of compiled signatures the cache holds now for
        #: these entries (set by jit(); None: unknown)
        self.ready_count: Callable[[], int] | None = None

    def share_state(self, state: GuardState) -> None:
        """Use `state` (the one every wrapper of this function and options
        shares, see JitFunction._shared_state) instead of this wrapper's own.
        Called by jit() before the function is handed out."""
        self.state = state

    # For tests and debugging: the remembered signatures and the warned flag.
    @property
    def _seen(self) -> dict[tuple, CallDescription]:
        return self.state.seen

    @property
    def _warned(self) -> bool:
        return self.state.warned

    @_warned.setter
    def _warned(self, value: bool) -> None:
        self.state.warned = value

    def _explaining(self) -> bool:
        if _compiling_ahead():
            return False
        return _explain_all if self.explain_misses is None else self.explain_misses

    def __call__(self, fun: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        explaining = self._explaining()
        guarded = self.max_signatures is not None
        if not guarded and self.explain_misses is False:
            return self.inner(fun, args, kwargs)
        # Otherwise every compile is described and remembered (a few strings per
        # signature, next to a compile), so that turning the global switch on
        # later explains misses against signatures compiled before it.
        try:
            desc = self.describe(args, kwargs)
            key = desc.key()
            hash(key)
        except Exception:  # noqa: BLE001 - describing must never fail the compile
            logger.debug("%s: could not describe a call's signature; compiling unguarded", self.name, exc_info=True)
            return self.inner(fun, args, kwargs)
        state = self.state  # read once: one lock guards what this call reads and writes
        # The cache's own count, exact (it compares by __eq__): the remembered
        # keys compare statics and aux data by hash, so unequal values with
        # equal hashes (-1 and -2) would otherwise count once.
        ready = self.ready_count() if guarded and self.ready_count is not None else 0
        tracked = False  # this call counted itself as a running compile of `key`
        warn_now = shown = False  # this call owns the once-only warning / has shown it
        # Everything from taking the lock on is inside the try: whatever is
        # raised (the limit, a warning turned into an error, a Ctrl-C at any
        # point, the compile) undoes what this call did, so a signature that
        # was not compiled does not stay counted.
        try:
            with state.lock:
                known = key in state.seen
                excess = guarded and (
                    (not known and len(state.seen) >= self.max_signatures)  # type: ignore[operator]
                    or ready >= self.max_signatures  # type: ignore[operator]
                )
                warn_now = excess and self.on_excess == "warn" and not state.warned
                if warn_now:
                    state.warned = True
                # An explanation is built only when it will be shown: logged,
                # or in the limit's warning or error. Known keys are explained
                # too when over the limit: the cache's exact count can exceed
                # it where the remembered keys collide.
                logging_it = explaining and miss_logger.isEnabledFor(logging.WARNING)
                wanted = (not known or excess) and (
                    logging_it or (excess and (warn_now or self.on_excess == "raise")))
                cached = state.candidates(desc) if wanted else []
                room = len(state.seen) < max(self.max_remembered, self.max_signatures or 0)
                if room and (not excess or self.on_excess == "warn") and not known:
                    state.remember(key, desc)
                if key in state.seen:
                    state.running[key] = state.running.get(key, 0) + 1
                    tracked = True
            why = None
            if cached:
                names = self.describe.context_names
                if callable(names):  # read when needed (see Describer.context_names)
                    names = names()
                why = explain(cached, desc, names)
            if logging_it and why is not None:
                miss_logger.warning("cache miss of %s: %s", self.name, why)
            if excess:
                raising = self.on_excess == "raise"
                message = (
                    f"{self.name}() {'would compile' if raising else 'is compiling'} a signature past "
                    f"max_signatures={self.max_signatures}"
                    + (f" (differs from the closest cached one by: {why})" if why else "")
                    + "; raise the limit or make the varying argument static/bucketed"
                )
                if raising:
                    raise RecompileLimitError(message)
                if warn_now:
                    warnings.warn(message, RuntimeWarning, stacklevel=self.warn_stacklevel)
                    shown = True
            executable = self.inner(fun, args, kwargs)
        except BaseException:
            with state.lock:
                if tracked and state.done(key) and key not in state.compiled:
                    state.forget(key)
                if warn_now and not shown:
                    state.warned = False  # not shown (raised, or interrupted first): the next excess warns
            raise
        if tracked:
            with state.lock:
                state.done(key)
                if key in state.seen:
                    state.compiled.add(key)
        return executable


# --- process-wide stats --------------------------------------------------------


class FunctionStats(NamedTuple):
    name: str
    hits: int
    misses: int
    compiles: int
    waits: int
    evictions: int
    size: int
    failures: int
    compile_seconds: float
    wait_seconds: float


@dataclasses.dataclass(frozen=True)
class Stats:
    """A snapshot over every live jitted function (see ``ftjit.stats()``)."""

    functions: tuple[FunctionStats, ...]  # sorted by compile time, largest first
    totals: FunctionStats

    def top(self, n: int = 10) -> tuple[FunctionStats, ...]:
        return self.functions[:n]

    def as_dict(self, top: int = 10) -> dict[str, Any]:
        return {"totals": self.totals._asdict(), "functions": [f._asdict() for f in self.top(top)]}

    def __str__(self) -> str:
        header = ("function", "hits", "misses", "compiles", "waits", "evict", "size", "fail", "compile s", "wait s")
        rows = [header]
        for f in (*self.top(10), self.totals):
            rows.append(
                (
                    f.name,
                    str(f.hits),
                    str(f.misses),
                    str(f.compiles),
                    str(f.waits),
                    str(f.evictions),
                    str(f.size),
                    str(f.failures),
                    f"{f.compile_seconds:.3f}",
                    f"{f.wait_seconds:.3f}",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = []
        for j, r in enumerate(rows):
            cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
            lines.append("  ".join(cells))
            if j == 0 or j == len(rows) - 2:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)


def stats() -> Stats:
    """Snapshot of every live jitted function's counters, with totals.

    One entry per (function, options) pair (wrappers of the same function
    share it). Each function's counters are read atomically; the whole is not a
    consistent cut across functions under concurrent calls.
    """
    funcs = [FunctionStats(name, *info) for name, info in _live_functions()]
    funcs.sort(key=lambda f: f.compile_seconds, reverse=True)
    total = FunctionStats(
        f"TOTAL ({len(funcs)} function{'' if len(funcs) == 1 else 's'})",
        *(sum(getattr(f, field) for f in funcs) for field in FunctionStats._fields[1:]),
    )
    return Stats(tuple(funcs), total)
