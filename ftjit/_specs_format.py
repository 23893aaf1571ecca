"""The specs file's format: JSON that holds data only. ``ftjit.save_specs``
writes it (ftjit._specs) and ``ftjit.load_specs`` reads it
(ftjit._specs_read). Format ``"ftjit-specs"``, version 2; one saved
signature a line::

    {"format": "ftjit-specs", "version": 2, "versions": {"ftjit": "0.1.0", "jax": "0.10.2"},
     "functions": {
      "model:step": [
       {"signature": "step(float32[2,4], mode='train')", "args": [{"leaf": "array", "dtype": "float32",
        "shape": [2, 4], "weak_type": false, "placement": null}], "kwargs": {"mode": {"static": "train"}}}
      ]
     }}

A signature's arguments are trees, one JSON object each, with one of the
keys ``node``, ``leaf`` or ``static``:

- nodes: ``{"node": "none"}``; ``"tuple"`` and ``"list"`` with
  ``children``; ``"dict"`` with ``keys`` (values, below) and ``children``
  in that order; ``"namedtuple"`` with its ``type``; ``"registered"`` (a
  node of the compiler's registry: JAX's) with its ``type`` and its node
  ``data`` (a value);
- leaves: ``leaf`` (``"array"``, or the Python scalars ``"bool"``,
  ``"int"``, ``"float"``, ``"complex"``), ``dtype`` by name (numpy's, or
  one a loaded module registered with numpy, as ml_dtypes' bfloat16; null
  for scalars), ``shape``, ``weak_type``, and the ``placement`` of a
  committed array as the compiler's portable description (a value; JAX's:
  the tuple ``("single_device", platform, device id)``), else null;
- ``{"static": value}``: a static argument.

Values are what a data format holds exactly: ``null``, ``true``/``false``,
ints and strings as JSON has them, and tagged objects for the rest:
``{"float": float.hex(x)}`` (exact: nan, infinities, -0.0), ``{"bytes":
base64}``, ``{"tuple": [...]}``, ``{"list": [...]}``, ``{"enum":
"module:qualname", "name": member}``, and ``{"dataclass":
"module:qualname", "fields": {...}}`` for a class registered with
``register_static_dataclass``. Only those types, exactly: a subclass of int
or str, a numpy scalar, a namedtuple or a frozenset is not held. Classes are
named ``module:qualname`` and found only in modules already imported, by
dictionary lookups (``find_class``): reading a file never imports anything.
JSON is written with no float (``allow_nan=False`` holds trivially).

Here: the format's constants, the registry of static dataclasses, naming
classes and dtypes, writing a signature's record (``encode_entry``), and
comparing two records by the values' own equality (``same_record``), which
the save uses on what it wrote read back, and the reader on two readings.

Shared state: the classes registered with ``register_static_dataclass``
(``_static_dataclasses``), guarded by ``_registry_lock`` (a leaf: nothing
else is called under it); the dtypes ``find_dtype`` found
(``_dtypes_found``, racy on purpose: each store is of an equal value).
Everything else works on its own objects.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import re
import sys
import threading
import types
from typing import Any, TypeVar

import numpy as np

from ._signature import LEAF_KINDS, Leaf, Node, Signature, Static

__all__ = ["register_static_dataclass"]

FORMAT = "ftjit-specs"
VERSION = 2
#: The largest file read: a hostile or runaway file cannot make a start read without end.
MAX_BYTES = 64 * 1024 * 1024
#: How deep JSON arrays and objects may nest: a file cannot exhaust the stack.
#: A tree node is two levels (the node, its children), the file around a tree five.
MAX_NESTING = 200
#: The most digits an integer of the file has (CPython's default bound on int-str conversions): reading one
#: costs time that grows with the square of its digits, whatever the process's ``sys.set_int_max_str_digits``.
MAX_INT_DIGITS = 4300
#: The most bytes a saved spec's arrays may take on one device whose memory the compiler does not report
#: (CompilerHooks.device_memory; JAX's CPU): 1 TiB. Where it does, the device's memory is the bound.
MAX_SPEC_BYTES = 2**40

T = TypeVar("T", bound=type)

DTYPE_NAME = re.compile(r"[a-z][a-z0-9_]*")
MAX_DIM = 2**63 - 1  # the core keeps dims as signed 64-bit ints


class CannotHold(Exception):
    """Saving: why a signature cannot be written in this format."""


# --- classes: registered dataclasses, names ---------------------------------------

_registry_lock = threading.Lock()
_static_dataclasses: dict[type, tuple[str, ...]] = {}  # class -> its fields' names; under _registry_lock


def register_static_dataclass(cls: T) -> T:
    """Lets specs files hold static arguments that are instances of the
    dataclass ``cls``: written as its fields (values a specs file holds, such
    as str, int, float, enums, other registered dataclasses), rebuilt as
    ``cls(**fields)`` when read. Returns ``cls``, so it can decorate one,
    above ``@dataclasses.dataclass``::

        @ftjit.register_static_dataclass
        @dataclasses.dataclass(frozen=True)
        class Config:
            layers: int
            activation: str

    Meant for frozen dataclasses with ``eq`` (the default): a saved value
    must equal the one rebuilt from the file, with an equal hash, or the
    signature is left out at the save (``eq=False`` compares by identity, so
    a rebuilt one would never match a call). The class is named in the file
    by module and qualified name, and found when reading only if its module
    is already imported. Every field must be set by ``__init__``.

    Thread-safe: registering (again) from any thread at any time is safe;
    registration lasts for the process.
    """
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise TypeError(f"register_static_dataclass takes a dataclass (a class), got {cls!r}; as a decorator, "
                        "put it above @dataclasses.dataclass")
    fields = dataclasses.fields(cls)
    not_init = [f.name for f in fields if not f.init]
    if not_init:
        raise TypeError(f"register_static_dataclass: {cls.__qualname__}'s field(s) {', '.join(not_init)} are not "
                        "set by __init__ (init=False), so it cannot be rebuilt from a specs file")
    with _registry_lock:
        _static_dataclasses[cls] = tuple(f.name for f in fields)
    return cls


def registered_fields(cls: type) -> tuple[str, ...] | None:
    with _registry_lock:
        return _static_dataclasses.get(cls)


def find_class(ref: str) -> Any:
    """The object named ``module:qualname``, found through modules already
    imported and the namespaces of their classes (dictionary lookups: no
    import, no ``__getattr__``); None if there is none."""
    module_name, _, qualname = ref.partition(":")
    module = sys.modules.get(module_name)
    if not isinstance(module, types.ModuleType):
        return None
    namespace = object.__getattribute__(module, "__dict__")
    found: Any = None
    for part in qualname.split("."):
        if found is not None:
            if not isinstance(found, type):
                return None
            namespace = object.__getattribute__(found, "__dict__")  # its own: no metaclass __getattribute__
        found = namespace.get(part)
        if found is None:
            return None
    return found


def class_ref(cls: Any) -> str:
    """``module:qualname`` of ``cls``, checked to find ``cls`` again."""
    module, qualname = getattr(cls, "__module__", None), getattr(cls, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise CannotHold(f"the class {cls!r} has no module and qualified name to be found by")
    ref = f"{module}:{qualname}"
    if find_class(ref) is not cls:
        raise CannotHold(f"the class {module}.{qualname} cannot be found by its name where a specs file is read "
                         "(a class defined in a function, or not bound to that name in its module)")
    return ref


def valid_ref(ref: Any) -> bool:
    if not isinstance(ref, str):
        return False
    module, colon, qualname = ref.partition(":")
    return (colon == ":" and all(p.isidentifier() for p in module.split("."))
            and all(p.isidentifier() for p in qualname.split(".")))


def dtype_name(dtype: Any) -> str:
    """A dtype as the file names it (numpy's name), checked to name it again."""
    if isinstance(dtype, np.dtype):
        name = dtype.name
        if DTYPE_NAME.fullmatch(name) and find_dtype(name) == dtype:
            return name
    raise CannotHold(f"its dtype {dtype!r} cannot be named in a specs file")


def find_dtype(name: str) -> np.dtype | None:
    """The dtype of this name (numpy's, or one registered with numpy by a
    loaded module: ml_dtypes' bfloat16), if it is exactly that: no structured
    or object dtype, no alias."""
    found = _dtypes_found.get(name)
    if found is not None:
        return found
    try:
        dtype = np.dtype(name)
    except TypeError:
        return None
    if dtype.name != name or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        return None
    _dtypes_found[name] = dtype
    return dtype


#: Names find_dtype found, and their dtypes (never a name it did not find: a module imported later may register
#: it). Racy on purpose: a dict's item store is atomic, and every writer of a name writes an equal dtype.
_dtypes_found: dict[str, np.dtype] = {}


# --- writing ----------------------------------------------------------------------


def encode_entry(signature: str, record: Signature) -> dict[str, Any]:
    """A saved signature as JSON data: its readable form and its trees
    (placements already portable); CannotHold says what cannot be written."""
    kwargs = {}
    for name, tree in record.kwargs.items():
        if type(name) is not str:
            raise CannotHold(f"a keyword argument named {name!r}, not by a str")
        kwargs[name] = _encode_tree(tree, 0)
    return {"signature": signature, "args": [_encode_tree(a, 0) for a in record.args], "kwargs": kwargs}


def _encode_tree(tree: Any, depth: int) -> dict[str, Any]:
    if depth > MAX_NESTING:
        raise CannotHold(f"its arguments nest deeper than the {MAX_NESTING} levels of JSON a specs file may have")
    if isinstance(tree, Static):
        return {"static": encode_value(tree.value)}
    if isinstance(tree, Leaf):
        if tree.kind not in LEAF_KINDS:
            raise CannotHold(f"a leaf of kind {tree.kind!r}")
        if tree.kind == "array":
            dtype = dtype_name(tree.dtype)
        elif tree.dtype is None:
            dtype = None
        else:
            raise CannotHold(f"a {tree.kind} leaf with a dtype ({tree.dtype!r})")
        if not all(type(d) is int and 0 <= d <= MAX_DIM for d in tree.shape):
            raise CannotHold(f"the shape {tree.shape!r}")
        placement = None if tree.sharding is None else encode_value(tree.sharding)
        return {"leaf": tree.kind, "dtype": dtype, "shape": list(tree.shape), "weak_type": bool(tree.weak_type),
                "placement": placement}
    if not isinstance(tree, Node):
        raise CannotHold(f"an argument tree of type {type(tree).__name__}")
    children = [_encode_tree(c, depth + 1) for c in tree.children]
    if tree.kind == "none":
        return {"node": "none"}
    if tree.kind in ("tuple", "list"):
        return {"node": tree.kind, "children": children}
    if tree.kind == "dict":
        return {"node": "dict", "keys": [encode_value(k) for k in tree.key], "children": children}
    if tree.kind == "namedtuple":
        return {"node": "namedtuple", "type": class_ref(tree.key), "children": children}
    if tree.kind == "registered":
        node_type, data = tree.key
        return {"node": "registered", "type": class_ref(node_type), "data": encode_value(data), "children": children}
    raise CannotHold(f"a node of the compiler's pytree hook ({tree.key!r}), which a specs file cannot hold")


def encode_value(value: Any, depth: int = 0) -> Any:
    """A static value (or node data, a dict key, a portable placement) as
    JSON data; CannotHold for a value of a type the format does not hold."""
    if depth > MAX_NESTING:
        raise CannotHold(f"a static value nests deeper than the {MAX_NESTING} levels of JSON a specs file may have")
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        return {"float": value.hex()}
    if kind is bytes:
        return {"bytes": base64.b64encode(value).decode("ascii")}
    if kind is tuple or kind is list:
        return {kind.__name__: [encode_value(v, depth + 1) for v in value]}
    if isinstance(value, enum.Enum):
        return {"enum": class_ref(kind), "name": value.name}
    names = registered_fields(kind)
    if names is not None:
        return {"dataclass": class_ref(kind),
                "fields": {n: encode_value(getattr(value, n), depth + 1) for n in names}}
    raise CannotHold(f"a static value of type {kind.__module__}.{kind.__qualname__} ({shown(value)}), which a specs "
                     "file cannot hold (it holds None, bool, int, float, str, bytes, tuples and lists of them, "
                     "enums, and dataclasses registered with ftjit.register_static_dataclass)")


def shown(value: Any) -> str:
    """repr(value), at most 200 characters (and never an exception)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a report must not fail
        return f"<{type(value).__name__} object>"
    return text if len(text) <= 200 else text[:197] + "..."


def dumps(data: Any) -> str:
    """JSON text on one line, with no float a JSON parser could read
    otherwise (the format writes floats as float.hex strings)."""
    return json.dumps(data, allow_nan=False, ensure_ascii=True)


def dumps_file(versions: dict[str, str], functions: dict[str, list[str]]) -> str:
    """The file's text, from each function's entries as ``dumps`` wrote them:
    one saved signature a line (readable, and a diff shows which changed)."""
    blocks = []
    for key, entries in functions.items():
        body = "".join(f"\n   {e}," for e in entries).rstrip(",")
        blocks.append(f"\n  {dumps(key)}: [{body}{chr(10) + '  ' if entries else ''}]")
    return (f'{{"format": {dumps(FORMAT)}, "version": {VERSION}, "versions": {dumps(versions)},\n'
            f' "functions": {{{",".join(blocks)}{chr(10) + " " if functions else ""}}}}}\n')


# --- real equality ----------------------------------------------------------------


def same_record(a: Signature | None, b: Signature | None) -> str | None:
    """None if records ``a`` and ``b`` are the same signature by the values'
    own equality (``==`` and equal hashes; never their printed text), else
    what differs. Contexts are not compared (a file holds none)."""
    if a is None or b is None:
        return "a record is missing"
    if len(a.args) != len(b.args) or list(a.kwargs) != list(b.kwargs):
        return "the arguments differ"
    for x, y in zip((*a.args, *a.kwargs.values()), (*b.args, *b.kwargs.values())):
        why = _same_tree(x, y)
        if why is not None:
            return why
    return None


def _same_tree(a: Any, b: Any) -> str | None:
    if type(a) is not type(b):
        return f"{type(a).__name__} read back as {type(b).__name__}"
    if isinstance(a, Static):
        return _same_value(a.value, b.value, "the static value")
    if isinstance(a, Leaf):
        if (a.kind, a.shape, a.weak_type) != (b.kind, b.shape, b.weak_type) or not _equal(a.dtype, b.dtype):
            return f"the leaf {a[:4]} read back as {b[:4]}"
        return _same_value(a.sharding, b.sharding, "the placement")
    if a.kind != b.kind or len(a.children) != len(b.children):
        return f"a {a.kind} node read back as a {b.kind} node"
    if a.kind == "namedtuple" and a.key is not b.key:
        return f"the namedtuple {a.key!r} read back as {b.key!r}"
    if a.kind == "registered":
        if a.key[0] is not b.key[0]:
            return f"the node type {a.key[0]!r} read back as {b.key[0]!r}"
        why = _same_value(a.key[1], b.key[1], "the node data")
        if why is not None:
            return why
    if a.kind == "dict":
        if len(a.key) != len(b.key):
            return "a dict's keys differ"
        for x, y in zip(a.key, b.key):
            why = _same_value(x, y, "the dict key")
            if why is not None:
                return why
    for x, y in zip(a.children, b.children):
        why = _same_tree(x, y)
        if why is not None:
            return why
    return None


def _equal(x: Any, y: Any) -> bool:
    return x is y or bool(x == y)


def _same_value(x: Any, y: Any, what: str) -> str | None:
    """Whether the copy ``y`` of ``x`` is the same value: the same type,
    ``==``, and equal hashes (both unhashable, for a list)."""
    try:
        if type(x) is type(y) and bool(x == y) and _hash(x) == _hash(y):
            return None
    except Exception as exc:  # noqa: BLE001 - its __eq__ or __hash__ failed: not the same
        return (f"{what} {shown(x)} cannot be compared with its copy read back from a specs file "
                f"({type(exc).__name__}: {exc})")
    return (f"{what} {shown(x)} does not equal its copy read back from a specs file (by == and hash), so a spec of "
            "it would make a signature that no call has (a value that compares by identity, or nan, equals no copy)")


def _hash(x: Any) -> int | None:
    try:
        return hash(x)
    except TypeError:
        return None
