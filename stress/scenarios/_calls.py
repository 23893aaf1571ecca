"""Call helpers shared by the scenarios: argument specs, exact result checks and an instrumented compiler."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import weakref
from typing import Any, Callable, Hashable, Optional

import numpy as np

#: hook(fun, args, kwargs, key): runs inside a compile after the sleep; may raise to fail the compile
CompileHook = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any], Hashable], None]


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """A dynamic argument's signature: a Python scalar type, or a numpy dtype and shape."""

    kind: str  #: "float", "int" or "array"
    dtype: str = ""
    shape: tuple[int, ...] = ()

    def make(self, value: int) -> Any:
        if self.kind == "float":
            return float(value)
        if self.kind == "int":
            return int(value)
        return np.full(self.shape, value, dtype=self.dtype)


#: A spread of signatures: both Python scalar types, and arrays differing in dtype or shape only.
ARG_SPECS = (
    ArgSpec("float"),
    ArgSpec("int"),
    ArgSpec("array", "float32", (3,)),
    ArgSpec("array", "float64", (3,)),
    ArgSpec("array", "float32", (2, 4)),
    ArgSpec("array", "int32", (5,)),
)


def signature_key(x: Any, *statics: Any) -> tuple[Any, ...]:
    """The signature of a call with dynamic ``x`` and these static values, as a compiler sees it."""
    if isinstance(x, np.ndarray):
        return ("array", str(x.dtype), x.shape) + statics
    return ("scalar", type(x).__name__) + statics


def mismatch(out: Any, expected: Any) -> Optional[str]:
    """None when ``out`` is exactly ``expected`` (same type; arrays: same dtype, shape and values)."""
    if isinstance(expected, np.ndarray):
        ok = isinstance(out, np.ndarray) and out.dtype == expected.dtype and np.array_equal(out, expected)
    else:
        ok = type(out) is type(expected) and out == expected
    return None if ok else f"got {out!r}, expected {expected!r}"


def weak_executable(fun: Callable[..., Any]) -> Callable[..., Any]:
    """An executable calling ``fun`` through a weak reference (the cache keeps executables alive until fun dies)."""
    ref = weakref.ref(fun)

    def executable(*args: Any, **kwargs: Any) -> Any:
        target = ref()
        if target is None:
            raise ReferenceError("executable called after its function died")
        return target(*args, **kwargs)

    return executable


class TrackingCompiler:
    """Counts compiles per key and flags a key whose compile is entered while it is already compiling."""

    def __init__(self, key_of: Callable[[Callable[..., Any], tuple[Any, ...]], Hashable], rng: random.Random,
                 sleep_s: tuple[float, float] = (0.0, 0.0), hook: Optional[CompileHook] = None) -> None:
        self._key_of = key_of
        self._rng = rng
        self._sleep_s = sleep_s
        self._hook = hook
        self._lock = threading.Lock()
        self._active: dict[Hashable, int] = {}
        self.per_key: dict[Hashable, int] = {}
        self.overlaps: list[Hashable] = []  #: keys entered while already compiling, once per overlapping entry
        self.max_active = 0

    @property
    def calls(self) -> int:
        with self._lock:
            return sum(self.per_key.values())

    @property
    def active(self) -> int:
        with self._lock:
            return sum(self._active.values())

    def __call__(self, fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
        key = self._key_of(fun, args)
        with self._lock:
            self.per_key[key] = self.per_key.get(key, 0) + 1
            if self._active.get(key, 0):
                self.overlaps.append(key)
            self._active[key] = self._active.get(key, 0) + 1
            self.max_active = max(self.max_active, sum(self._active.values()))
            delay = self._rng.uniform(*self._sleep_s)
        try:
            if delay > 0:
                time.sleep(delay)
            if self._hook is not None:
                self._hook(fun, args, kwargs, key)
        finally:
            with self._lock:
                self._active[key] -= 1
        return weak_executable(fun)
