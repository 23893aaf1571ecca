"""Miss explanations and the max_signatures message: a diff over the
signatures the core gives (ftjit._signature).

When a call misses and the function explains its misses (or is past its
``max_signatures``), the core calls ``on_miss`` with the new signature and
the cached ones it is to be compared with (the newest of the same call
structure, else the newest of any: at most 16, so a miss costs
O(arguments), not O(cached signatures)). Each is described (leaves by
path, statics by name, tree structures, how the arguments were passed, the
context) and the closest cached one is diffed against the new one. The
core owns the count and the once-only warning (the core's Guard), and the
text of leaves, trees and statics: its printer's, which it put on the
records (``Signature.texts``), so they read as ``signatures()`` prints
them. This module compares the records' fields, picks the closest
signature and logs the differences.

Shared state: none (each call works on its own arguments).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterable, Sequence

from ._hooks import CompilerHooks
from ._signature import Leaf, Signature, Static

#: Miss explanations, at WARNING: asked for explicitly (explain_misses=True,
#: set_explain_misses, FTJIT_EXPLAIN_MISSES=1), they show with Python's
#: default logging setup (stderr), as jax's explain_cache_misses do. A
#: logger of their own, so that they can be routed or silenced apart.
miss_logger = logging.getLogger("ftjit.misses")


def _safe_repr(x: Any) -> str:
    """repr(x), or a placeholder when its __repr__ raises: describing a call
    must never fail the compile it describes."""
    try:
        return repr(x)
    except Exception:  # noqa: BLE001
        return f"<{type(x).__name__} object (repr failed)>"


def _hash_key(value: Any) -> Any:
    """A value as a description keys it: (type, hash), or its repr when it
    has no hash. Never __eq__ (it may run anything)."""
    try:
        return (type(value), hash(value))
    except Exception:  # noqa: BLE001
        return (type(value), _safe_repr(value))


# --- describing a signature ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CallDescription:
    """A call's signature as comparable parts: leaves by path, statics by name,
    tree structures by argument. Every text is the core printer's
    (``Signature.texts``: as ``signatures()`` prints it); what is compared is
    the records' fields, by (type, hash) where a field is an object."""

    #: (path, text) of each dynamic leaf
    leaves: tuple[tuple[str, str], ...]
    statics: tuple[tuple[str, str], ...]
    #: (argument, its tree printed with each leaf as "*")
    trees: tuple[tuple[str, str], ...]
    #: how the call passed its arguments: ("f(x, y=)" style), so f(a) and f(x=a) differ
    layout: str = ""
    #: the compiler's tracing context (e.g. jax config) when the call was made
    context: Any = None
    #: statics by (name, type, hash): equal statics whose reprs differ are one
    statics_key: tuple = ()
    #: trees with their node keys by (type, hash): node data that prints the same
    #: but is unequal tells
    trees_key: tuple = ()
    #: (path, the leaf's fields as _leaf_key keys them) of each dynamic leaf
    leaves_key: tuple = ()


def _leaf_key(leaf: Leaf) -> tuple:
    """The fields of a Leaf record that make its signature: kind, dtype,
    shape, weak type and placement, the objects (dtype, placement) by
    (type, hash)."""
    return (leaf.kind, _hash_key(leaf.dtype), leaf.shape, leaf.weak_type, _hash_key(leaf.sharding))


def _walk(tree: Any, path: str, paths: list, leaves: list, keys: list) -> None:
    """The path and fields of each leaf, and the node keys, in preorder (the
    order the core prints the leaves in). Paths as JAX names key paths:
    ``x['a']``, ``x[0]``, ``x.field`` of a namedtuple."""
    if isinstance(tree, Leaf):
        keys.append("*")
        paths.append(path)
        leaves.append(_leaf_key(tree))
        return
    kind, key, children = tree
    if kind == "dict":
        keys.append(("dict", tuple(_hash_key(k) for k in key)))
        child_paths = [f"{path}[{_safe_repr(k)}]" for k in key]
    elif kind == "namedtuple":
        keys.append(("namedtuple", key))
        child_paths = [f"{path}.{name}" for name in key._fields]
    else:
        keys.append((kind, _hash_key(key) if kind in ("custom", "registered") else None, len(children)))
        child_paths = [f"{path}[{i}]" for i in range(len(children))]
    for child, child_path in zip(children, child_paths):
        _walk(child, child_path, paths, leaves, keys)


def describe(sig: Signature, arg_names: Sequence[str]) -> CallDescription:
    """The description of one signature (a record the core made: its texts
    printed placements through ``CompilerHooks.placement_label``)."""
    leaves: list[tuple[str, str]] = []
    leaves_key: list[tuple[str, tuple]] = []
    statics: list[tuple[str, str]] = []
    statics_key: list[tuple[str, Any]] = []
    trees: list[tuple[str, str]] = []
    trees_key: list[tuple[str, tuple]] = []
    labels = [f"'{arg_names[i]}'" if i < len(arg_names) else f"args[{i}]" for i in range(len(sig.args))]
    named = list(zip(labels, sig.args)) + [(f"'{k}'", v) for k, v in sig.kwargs.items()]
    for (label, tree), (text, leaf_texts) in zip(named, sig.texts, strict=True):
        if isinstance(tree, Static):
            statics.append((label, text))
            statics_key.append((label, _hash_key(tree.value)))
            continue
        paths: list[str] = []
        fields: list[tuple] = []
        keys: list[Any] = []
        _walk(tree, label, paths, fields, keys)
        leaves.extend(zip(paths, leaf_texts, strict=True))  # both in preorder
        leaves_key.extend(zip(paths, fields))
        trees.append((label, text))
        trees_key.append((label, tuple(keys)))
    layout = ", ".join([label.strip("'") for label in labels] + [f"{k}=" for k in sig.kwargs])
    return CallDescription(tuple(leaves), tuple(statics), tuple(trees), f"({layout})", _context_key(sig.context),
                           tuple(statics_key), tuple(trees_key), tuple(leaves_key))


def _context_key(value: Any) -> Any:
    """The compiler's context as a description keys it: plain values as they
    are, other objects by (type, hash) with their repr for explanations."""
    if value is None or type(value) in (bool, int, float, complex, str, bytes):  # exact: not an IntEnum member
        return value
    if type(value) is tuple:
        return tuple(_context_key(v) for v in value)
    if type(value) is frozenset:
        return frozenset(_context_key(v) for v in value)
    return _ObjectKey(_hash_key(value), _cut(_safe_repr(value)))


class _ObjectKey:
    """A context value that is not a plain value: equal by (type, hash), never
    by __eq__; its repr (cut to _MAX_CONTEXT_TEXT characters) is what
    explanations print."""

    __slots__ = ("key", "text")

    def __init__(self, key: Any, text: str):
        self.key, self.text = key, text

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _ObjectKey):
            return NotImplemented
        return self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return self.text


#: A context value in an explanation is cut to this many characters.
_MAX_CONTEXT_TEXT = 80


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_CONTEXT_TEXT else text[: _MAX_CONTEXT_TEXT - 3] + "..."


# --- comparing two descriptions --------------------------------------------------


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
    going into tuples of equal length, named by `names` (shaped as the
    context is: a str names a whole value, a tuple names a tuple item by
    item) or by position."""
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
    old_leaf_keys = dict(old.leaves_key)
    for path, key in new.leaves_key:
        if path in old_leaf_keys and old_leaf_keys[path] != key:
            before, after = old_leaves[path], new_leaves[path]
            out.append(f"argument {path}: {before} -> {after}"
                       + (" (unequal leaves that print the same)" if before == after else ""))
    old_statics, new_statics = dict(old.statics), dict(new.statics)
    old_keys, new_keys = dict(old.statics_key), dict(new.statics_key)
    for name in sorted(set(old_statics) | set(new_statics)):
        before, after = old_statics.get(name, "<absent>"), new_statics.get(name, "<absent>")
        if before != after:
            out.append(f"static {name}: {before} -> {after}")
        elif old_keys.get(name) != new_keys.get(name):
            out.append(f"static {name}: {before} -> {after} (unequal values with the same repr)")
    _context_differences(old.context, new.context, context_names, "tracing context", out)
    return out


def _distance(old: CallDescription, new: CallDescription) -> int:
    """How many leaf fields (_leaf_key's) differ between the leaves of one path."""
    old_leaves = dict(old.leaves_key)
    return sum(sum(a != b for a, b in zip(old_leaves[path], key)) for path, key in new.leaves_key
               if path in old_leaves)


def explain(cached: Iterable[CallDescription], new: CallDescription, context_names: Any = None) -> str | None:
    """How `new` differs from the closest of `cached`, or None if none cached.

    Closest means fewest tree-structure differences first (a different tree is
    a different kind of call), then fewest differences overall, then fewest
    differing leaf fields (kind, dtype, shape, weak type, placement: so a
    weak-type change is explained against the same dtype and shape); ties go
    to the signature cached first.
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


# --- the core's call at a miss -----------------------------------------------------


def on_miss(
    name: str,
    arg_names: Sequence[str],
    hooks: CompilerHooks,
    cached: Sequence[Signature],
    new: Signature,
    log: bool,
    limit: int,
    raising: bool,
) -> str | None:
    """Called by the core in the thread about to compile ``new``: logs why it
    missed (``log``; WARNING on "ftjit.misses", if that logger shows it) and,
    past ``limit`` (-1: not past it), returns the max_signatures message the
    core warns or raises with. ``cached``: the candidates, oldest first."""
    logging_it = log and miss_logger.isEnabledFor(logging.WARNING)
    if not logging_it and limit < 0:
        return None
    why = None
    if cached:
        try:
            names = hooks.context_names
            if callable(names):  # read when needed (see CompilerHooks.context_names)
                names = names()
            why = explain([describe(s, arg_names) for s in cached], describe(new, arg_names), names)
        except Exception:  # noqa: BLE001 - explaining must never fail the compile it explains
            logging.getLogger("ftjit").debug("%s: could not explain a miss", name, exc_info=True)
    if logging_it and why is not None:
        miss_logger.warning("cache miss of %s: %s", name, why)
    if limit < 0:
        return None
    return (
        f"{name}() {'would compile' if raising else 'is compiling'} a signature past max_signatures={limit}"
        + (f" (differs from the closest cached one by: {why})" if why else "")
        + "; raise the limit or make the varying argument static/bucketed"
    )
