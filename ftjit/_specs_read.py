"""Reading a specs file (ftjit._specs_format describes the format):
strictly, into typed records, running no code of the file's choosing.

``read`` checks the whole file once, into ``Contents`` (the versions that
wrote it, each function's ``SavedEntry`` records, and each saved signature
as the records of ftjit._signature), and sorts what is wrong into two
kinds:

- the file is not this format, or is damaged: anything ``save_specs``
  never writes (truncated JSON, a key missing or extra, a wrong type, a
  negative dim, an unknown node kind, a dtype name that is no name, a float
  written as a bare number, a key twice, nesting deeper than
  ``MAX_NESTING``): ``NotSpecs`` or ``Damaged`` (where, and what), one
  error for the whole file;
- an entry does not fit this process: a class not loaded here, or changed;
  a dataclass not registered; an enum member gone; a dtype unknown here; a
  value not equal to itself read a second time (it compares by identity,
  or is nan): that entry's ``error``, and the rest of the file is used.

The JSON is parsed only after its nesting was counted without recursion,
with no NaN, Infinity or bare float, no key twice, and no integer of more
than ``MAX_INT_DIGITS`` digits: reading takes time linear in the file's
size, whatever it holds (an unclosed string, nesting without end, a number
without end, many keys), and a file at the size cap is read or refused in
seconds. Classes are found
only in modules already imported (``find_class``: dictionary lookups).
What runs of the process's own code: the ``__init__`` of dataclasses
registered with ``register_static_dataclass``, and ``__eq__``/``__hash__``
of the values read.

Shared state: none (each read works on its own objects).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import json
import sys
from typing import Any, Callable

import numpy as np

from ._signature import Leaf, Node, Signature, Static
from ._specs_format import (
    DTYPE_NAME,
    FORMAT,
    LEAF_KINDS,
    MAX_DIM,
    MAX_INT_DIGITS,
    MAX_NESTING,
    VERSION,
    find_class,
    find_dtype,
    registered_fields,
    same_record,
    shown,
    valid_ref,
)

__all__ = ["Contents", "SavedEntry", "NotSpecs", "Damaged", "read", "read_record", "parse", "nesting"]


class NotSpecs(Exception):
    """Reading: the file is not a specs file of this format and version."""


class Damaged(Exception):
    """Reading: the file is of this format but not as save_specs writes it.
    ``path``: where, innermost key first (``where`` writes it outermost first)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what
        self.path: list[Any] = []

    def at(self, *keys: Any) -> Damaged:
        """This error, at ``keys`` (innermost first) below where it is raised."""
        self.path.extend(keys)
        return self

    @property
    def where(self) -> str:
        return "".join(f"[{shown(key)}]" for key in reversed(self.path)) or "the top level"


@dataclasses.dataclass(frozen=True)
class SavedEntry:
    """One saved signature, read: its readable form, and its record (the
    signature's trees, placements in their portable form) or why this
    process cannot use it."""

    signature: str
    record: Signature | None
    error: Exception | None


@dataclasses.dataclass(frozen=True)
class Contents:
    """A specs file, read and checked: the versions that wrote it, and each
    function's saved signatures (by key), in the file's order (newest first)."""

    versions: dict[str, str]
    functions: dict[str, tuple[SavedEntry, ...]]


class _Marker:
    """What the strict parser puts where JSON has something the format never
    writes (the checks below say where it is)."""

    def __init__(self, what: str):
        self.what = what


def _pairs(pairs: list[tuple[str, Any]]) -> Any:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                return _Marker(f"an object with the key {shown(key)} twice")
            seen.add(key)
    return out


def _bare_float(text: str) -> Any:
    return _Marker(f"the bare number {text[:40]} (floats are written as {{\"float\": hex}})")


def _constant(text: str) -> Any:
    return _Marker(f"{text}, which is not JSON")


def nesting(data: bytes) -> int:
    """How deep arrays and objects nest in the JSON ``data`` (UTF-8), counted
    before parsing, so that parsing cannot exhaust the stack: without
    recursion, and in time linear in its size whatever it holds (no pattern
    that rescans: an unclosed string is one pass, as any other text).

    Brackets inside strings do not count. Escapes go first: a run of
    backslashes pairs from its left, and what remains of it escapes the
    byte after it, so that every quote left opens or closes a string
    (json's own reading of a valid prefix, the only part a parser reaches:
    UTF-8 never puts these ASCII bytes inside a multi-byte character).
    Then, a chunk at a time, the text between quotes is dropped and the
    brackets outside are summed as steps of +1 and -1."""
    text = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    depth = deepest = 0
    inside = False  # whether the chunk starts inside a string
    for start in range(0, len(text), _CHUNK):
        parts = text[start:start + _CHUNK].split(b'"')
        outside = b"".join(parts[1::2] if inside else parts[0::2])
        if len(parts) % 2 == 0:  # an odd number of quotes: the next chunk starts on the other side
            inside = not inside
        steps = np.frombuffer(outside.translate(_STEPS, _NOT_BRACKETS), dtype=np.int8)
        if steps.size:
            levels = np.cumsum(steps, dtype=np.int64)
            deepest = max(deepest, depth + int(levels.max()))
            depth += int(levels[-1])
            if deepest > MAX_NESTING:
                break
    return deepest


_CHUNK = 1 << 20
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
#: [ and { a step in (+1), ] and } a step out (-1, as int8).
_STEPS = bytes(1 if b in b"[{" else 255 if b in b"]}" else 0 for b in range(256))


def _int(text: str) -> Any:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        return _Marker(f"an integer of {digits} digits (a specs file holds at most {MAX_INT_DIGITS})")
    return int(text)


def parse(text: str) -> Any:
    """Strict JSON: no NaN or Infinity, no bare floats, no repeated keys,
    no integer of more than MAX_INT_DIGITS digits (each becomes a marker the
    checks refuse, with where it is). Linear in the text's size once
    ``nesting`` bounded its depth: json's scanner is, and an integer's
    conversion is bounded here whatever ``sys.set_int_max_str_digits`` says."""
    return json.loads(text, object_pairs_hook=_pairs, parse_float=_bare_float, parse_constant=_constant,
                      parse_int=_int)


def read(data: bytes) -> Contents:
    """A specs file's bytes, checked whole: NotSpecs (not this format and
    version), Damaged (where and what), or the contents."""
    if data[:1] == b"\x80":
        raise NotSpecs("it starts as a pickle does (ftjit wrote specs as pickles before format version 2; a "
                       "pickle is never read: loading one can run any code)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotSpecs(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    depth = nesting(data)
    if depth > MAX_NESTING:
        raise NotSpecs(f"it nests arrays and objects more than {MAX_NESTING} deep")
    try:
        top = parse(text)
    except ValueError as exc:  # JSONDecodeError, or an int of more digits than Python converts
        raise NotSpecs(f"it is not JSON ({exc})") from None
    if not isinstance(top, dict) or top.get("format") != FORMAT:
        raise NotSpecs(f"it has no \"format\": {FORMAT!r}")
    version = top.get("version")
    if type(version) is not int:
        raise NotSpecs(f"its format version is not an int: {_found(version)}")
    if version != VERSION:
        raise NotSpecs(f"it is of format version {version}")
    _keys(top, ("format", "version", "versions", "functions"))
    versions = _at("versions", _versions, top["versions"])
    functions = _at("functions", _functions, top["functions"])
    return Contents(versions, functions)


def _at(key: Any, check: Callable[..., Any], *args: Any) -> Any:
    """``check(*args)``, whose Damaged gets ``key`` on its path."""
    try:
        return check(*args)
    except Damaged as exc:
        exc.path.append(key)
        raise


def _type_name(value: Any) -> str:
    if isinstance(value, _Marker):
        return value.what
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            type(None): "null"}.get(type(value), type(value).__name__)


def _found(value: Any) -> str:
    """What was found, for a message: a string or an int as it is, else its kind."""
    return shown(value) if type(value) in (str, int) else _type_name(value)


def _expect(value: Any, kind: type, what: str) -> Any:
    if type(value) is not kind:
        raise Damaged(f"{what} expected, found {_type_name(value)}")
    return value


def _keys(obj: dict[str, Any], required: tuple[str, ...]) -> None:
    missing = [k for k in required if k not in obj]
    if missing:
        raise Damaged(f"the key {missing[0]!r} is missing")
    extra = [k for k in obj if k not in required]
    if extra:
        raise Damaged(f"the key {shown(extra[0])} is not one of this format")


def _versions(value: Any) -> dict[str, str]:
    _expect(value, dict, "an object of versions (strings)")
    for key, version in value.items():
        _at(key, _expect, version, str, "a version string")
    return dict(value)


def _functions(value: Any) -> dict[str, tuple[SavedEntry, ...]]:
    _expect(value, dict, "an object of functions (each a key and an array of saved signatures)")
    out = {}
    for key, entries in value.items():
        _at(key, _expect, entries, list, "an array of saved signatures")
        out[key] = tuple(_at(key, _at, i, _entry, e) for i, e in enumerate(entries))
    return out


def _entry(value: Any) -> SavedEntry:
    _expect(value, dict, "a saved signature (an object)")
    _keys(value, ("signature", "args", "kwargs"))
    signature = _at("signature", _expect, value["signature"], str, "a string")
    reader = _Reader()
    record, unusable = read_record(value, reader)
    if unusable is not None:
        return SavedEntry(signature, None, ValueError(unusable))
    # Read twice, two sets of objects: a value that does not equal its own
    # copy (it compares by identity, or is nan) would make a signature no call
    # matches. Only where the entry holds a value that may: a float, an enum
    # or a dataclass (_Reader.exact).
    if not reader.exact:
        why = same_record(record, read_record(value)[0])
        if why is not None:
            return SavedEntry(signature, None, ValueError(why))
    return SavedEntry(signature, record, None)


def read_record(entry: dict[str, Any], reader: _Reader | None = None) -> tuple[Signature | None, str | None]:
    """An entry's trees as a Signature record (context None), or None and
    the first thing this process cannot rebuild (the rest of the entry is
    still checked). Damaged (raised) for anything save_specs never writes."""
    reader = _Reader() if reader is None else reader
    args = tuple(_at("args", reader.trees, entry["args"]))
    kwargs_obj = _at("kwargs", _expect, entry["kwargs"], dict, "an object of keyword arguments")
    kwargs = {k: _at("kwargs", _at, k, reader.tree, v) for k, v in kwargs_obj.items()}
    if reader.unusable is not None:
        return None, reader.unusable
    return Signature(args, kwargs, None), None


#: The most keys of one dict node that may share a hash value. Python's int hash is not randomised (keys
#: ``k * (2**61 - 1)`` all hash alike), and a dict of n keys of one hash takes time that grows with n squared
#: to build: 40,000 of them took 51 s. Keys of real dicts share a hash by chance alone, a few at most.
MAX_SAME_HASH = 8


def _crowded_hash(keys: tuple[Any, ...]) -> str | None:
    """Why a dict of ``keys`` is not built (more than MAX_SAME_HASH of them share a hash value, or one is
    unhashable), else None. Linear: the hash values are counted in a dict keyed by them, ints whose hashes are
    the values themselves, so no two of them collide there."""
    counts: dict[int, int] = {}
    for key in keys:
        try:
            h = hash(key)
        except TypeError:
            return f"the dict key {shown(key)} is unhashable"
        n = counts.get(h, 0) + 1
        if n > MAX_SAME_HASH:
            return (f"a dict node has more than {MAX_SAME_HASH} keys of one hash value ({h}): it is not built, as "
                    "building it takes time that grows with the square of their number (a crafted file?)")
        counts[h] = n
    return None


class _Reader:
    """Reads trees and values (read_record); ``unusable``: the first thing
    this process cannot rebuild. Recursive: ``read`` counted the nesting
    (at most MAX_NESTING) before anything was parsed."""

    def __init__(self) -> None:
        self.unusable: str | None = None
        #: No value read may differ from a copy of it read again: none is a
        #: float (nan equals no copy), an enum or a dataclass (whose __eq__
        #: may compare by identity, or be anything).
        self.exact = True

    def cannot(self, why: str) -> None:
        if self.unusable is None:
            self.unusable = why

    def trees(self, value: Any) -> list[Any]:
        _expect(value, list, "an array of argument trees")
        return [_at(i, self.tree, v) for i, v in enumerate(value)]

    def tree(self, value: Any) -> Any:
        _expect(value, dict, "an argument tree (an object with \"node\", \"leaf\" or \"static\")")
        if "static" in value:
            _keys(value, ("static",))
            return Static(_at("static", self.value, value["static"]))
        if "leaf" in value:
            return self.leaf(value)
        if "node" not in value:
            raise Damaged("an argument tree (an object with \"node\", \"leaf\" or \"static\") expected, found an "
                          "object without them")
        kind = value["node"]
        if type(kind) is not str:
            raise Damaged(f"a node kind (a string) expected, found {_type_name(kind)}").at("node")
        fields = {"none": (), "tuple": ("children",), "list": ("children",), "dict": ("keys", "children"),
                  "namedtuple": ("type", "children"), "registered": ("type", "data", "children")}.get(kind)
        if fields is None:
            raise Damaged(f"an unknown node kind {shown(kind)}")
        _keys(value, ("node", *fields))
        children: tuple[Any, ...] = ()
        if "children" in value:
            items = _at("children", _expect, value["children"], list, "an array of children")
            children = tuple(_at("children", _at, i, self.tree, c) for i, c in enumerate(items))
        key: Any = None
        if kind == "dict":
            keys = _at("keys", _expect, value["keys"], list, "an array of keys")
            key = tuple(_at("keys", _at, i, self.value, k) for i, k in enumerate(keys))
            if len(key) != len(children):
                raise Damaged(f"a dict node of {len(key)} keys and {len(children)} children")
            crowded = _crowded_hash(key)
            if crowded is not None:
                self.cannot(crowded)
        elif kind == "namedtuple":
            key = _at("type", self.cls, value["type"], "namedtuple")
        elif kind == "registered":
            node_type = _at("type", self.cls, value["type"], "registered")
            key = (node_type, _at("data", self.value, value["data"]))
        return Node(kind, key, children)

    def leaf(self, value: dict[str, Any]) -> Leaf:
        _keys(value, ("leaf", "dtype", "shape", "weak_type", "placement"))
        kind = value["leaf"]
        if kind not in LEAF_KINDS:
            raise Damaged(f"an unknown leaf kind {shown(kind)}")
        dtype: Any = None
        if kind == "array":
            name = _at("dtype", _expect, value["dtype"], str, "a dtype name")
            if not DTYPE_NAME.fullmatch(name):
                raise Damaged(f"{shown(name)} is not a dtype name").at("dtype")
            dtype = find_dtype(name)
            if dtype is None:
                self.cannot(f"the dtype {name} is not known in this process (numpy {np.__version__})")
        elif value["dtype"] is not None:
            raise Damaged(f"a {kind} leaf has no dtype, found {_type_name(value['dtype'])}").at("dtype")
        dims = _at("shape", _expect, value["shape"], list, "an array of dims")
        for i, d in enumerate(dims):
            if type(d) is not int or not 0 <= d <= MAX_DIM:
                raise Damaged(f"a dim is an int from 0 to 2**63 - 1, found {_found(d)}").at(i, "shape")
        if kind != "array" and dims:
            raise Damaged(f"a {kind} leaf has no shape, found {len(dims)} dims").at("shape")
        weak_type = _at("weak_type", _expect, value["weak_type"], bool, "true or false")
        placement = value["placement"]
        if placement is not None:
            if kind != "array":
                raise Damaged(f"a {kind} leaf has no placement").at("placement")
            placement = _at("placement", self.value, placement)
        return Leaf(kind, dtype, tuple(dims), weak_type, placement)

    def cls(self, ref: Any, kind: str) -> Any:
        if not valid_ref(ref):
            raise Damaged(f"a class name module:qualname expected, found {_found(ref)}")
        found = find_class(ref)
        if found is None:
            module = ref.partition(":")[0]
            where = "is not imported" if module not in sys.modules else "has no such class"
            self.cannot(f"the class {ref} is not loaded: its module {where} (load_specs never imports a module: "
                         "import it first)")
            return None
        if not isinstance(found, type):
            ok, what = False, "a class"
        elif kind == "namedtuple":
            ok = issubclass(found, tuple) and isinstance(getattr(found, "_fields", None), tuple)
            what = "a namedtuple"
        elif kind == "enum":
            ok, what = issubclass(found, enum.Enum), "an enum"
        elif kind == "dataclass":
            ok, what = registered_fields(found) is not None, "a dataclass registered with ftjit.register_static_dataclass"
        else:  # a node type of the compiler's registry: the compiler's spec_node checks it
            ok, what = True, "a class"
        if not ok:
            self.cannot(f"{ref} is not {what} in this process")
            return None
        return found

    def value(self, value: Any) -> Any:
        if value is None or type(value) in (bool, int, str):
            return value
        if type(value) is list:
            raise Damaged("a bare array (tuples are written {\"tuple\": [...]}, lists {\"list\": [...]})")
        _expect(value, dict, "a value")
        if len(value) == 1:
            ((tag, inner),) = value.items()
            if tag == "float":
                text = _at("float", _expect, inner, str, "a float as float.hex writes it")
                try:
                    number = float.fromhex(text)
                except (ValueError, OverflowError):
                    number = None
                if number is None or number.hex() != text:
                    raise Damaged(f"{shown(text)} is not a float as float.hex writes it").at("float")
                self.exact = False
                return number
            if tag == "bytes":
                text = _at("bytes", _expect, inner, str, "base64 text")
                try:
                    return base64.b64decode(text.encode("ascii"), validate=True)
                except (ValueError, binascii.Error):
                    raise Damaged("not base64 text").at("bytes") from None
            if tag in ("tuple", "list"):
                items = _at(tag, _expect, inner, list, "an array of values")
                values = [_at(tag, _at, i, self.value, v) for i, v in enumerate(items)]
                return tuple(values) if tag == "tuple" else values
        if "enum" in value:
            self.exact = False
            _keys(value, ("enum", "name"))
            cls = _at("enum", self.cls, value["enum"], "enum")
            name = _at("name", _expect, value["name"], str, "a member's name")
            if cls is None:
                return None
            member = cls.__members__.get(name)
            if member is None:
                self.cannot(f"the enum {value['enum']} has no member {shown(name)} in this process")
            return member
        if "dataclass" in value:
            self.exact = False
            _keys(value, ("dataclass", "fields"))
            cls = _at("dataclass", self.cls, value["dataclass"], "dataclass")
            fields_obj = _at("fields", _expect, value["fields"], dict, "an object of fields")
            fields = {k: _at("fields", _at, k, self.value, v) for k, v in fields_obj.items()}
            if cls is None or self.unusable is not None:
                return None
            names = registered_fields(cls) or ()
            if set(names) != set(fields):
                self.cannot(f"the dataclass {value['dataclass']} has the fields {', '.join(names) or 'none'} in this "
                             f"process, not {', '.join(fields) or 'none'} as saved")
                return None
            try:
                return cls(**fields)
            except Exception as exc:  # noqa: BLE001 - its __init__: reported for this entry
                self.cannot(f"the dataclass {value['dataclass']} could not be rebuilt from its fields "
                             f"({type(exc).__name__}: {exc})")
                return None
        keys = [shown(k) for k in list(value)[:4]] + (["..."] if len(value) > 4 else [])
        raise Damaged(f"an object with the keys {', '.join(keys)} is not a value of this format")
