"""A cached call signature as the core gives it (``JitFunction._signatures()``):
its arguments as trees of ``Node``, ``Leaf`` and ``Static``, its context, and
each argument's printed texts.

The core builds these from its own signature (its ExportSignature): they
are the one description of a signature, read by miss explanations
(ftjit._explain) and by ``warmup_specs`` (ftjit._specs). Nothing here
flattens or prints arguments or decides what a signature holds.

Shared state: none (immutable records).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._core import _leaf_kinds

__all__ = ["LEAF_KINDS", "Leaf", "Node", "Static", "Signature"]

#: Every ``Leaf.kind``, as the core names them (its ``kLeafKindNames``):
#: "array", then the Python scalars.
LEAF_KINDS: tuple[str, ...] = _leaf_kinds()


class Leaf(NamedTuple):
    """One dynamic leaf: an array (dtype, shape, weak type, and the placement
    of a committed one) or a Python scalar (kind "bool", "int", "float",
    "complex": weak-typed, no dtype or shape)."""

    kind: str  #: one of LEAF_KINDS: "array", or a Python scalar's type name
    dtype: Any  #: the array's dtype object (None for Python scalars)
    shape: tuple[int, ...]
    weak_type: bool
    sharding: Any  #: a committed array's placement (the object keyed), else None


class Node(NamedTuple):
    """A pytree node. ``kind`` and what ``key`` holds:

    - "none" (no key, no children), "tuple", "list";
    - "dict": the keys, sorted (children in that order);
    - "namedtuple": its type;
    - "registered": ``(type, node data)`` from the compiler's registry (JAX's);
    - "custom": the node key the compiler's pytree hook gave.
    """

    kind: str
    key: Any
    children: tuple[Any, ...]


class Static(NamedTuple):
    """A static argument's value (part of the signature by hash and equality)."""

    value: Any


class Signature(NamedTuple):
    """A call's signature: positional arguments, keyword arguments (sorted by
    name) and the compiler's context (None without one); and how the core
    prints each argument."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    context: Any
    #: Per argument (``args``, then ``kwargs``' values): its tree as
    #: ``signatures()`` prints it but with each leaf shown as "*" (a static:
    #: its repr), and each leaf's own text, in preorder ("float32[2]",
    #: "int"). Printed by the core when it made the record (miss explanations
    #: show them); () in a record it did not make (a specs file's). Not part
    #: of what ``same_record`` compares: the values' own equality.
    texts: tuple[tuple[str, tuple[str, ...]], ...] = ()
