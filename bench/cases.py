"""Benchmark cases: an ftjit call vs an anchor (a reference doing comparable work), with a target where one is set."""

from __future__ import annotations

import dataclasses
import functools
import sysconfig
from typing import Any, Callable, Optional

import ftjit

#: A free-threaded interpreter runs this: some targets are set for that build only.
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of a comparison: a label, the callable and the exact arguments it is called with."""

    label: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]

    def statement(self) -> tuple[str, dict[str, Any]]:
        """A timeit statement calling ``fn`` with literal-free positional args, and its globals."""
        names = [f"a{i}" for i in range(len(self.args))]
        namespace: dict[str, Any] = {"fn": self.fn, **dict(zip(names, self.args))}
        return f"fn({', '.join(names)})", namespace


@dataclasses.dataclass(frozen=True)
class Case:
    """A row of the table: ftjit vs anchor.

    PASS when ftjit/anchor <= target. A row whose target is None has none
    set: it is reported ("report"), never PASS or MISS.
    """

    name: str
    ftjit: Side
    anchor: Side
    target: Optional[float]
    note: str = ""
    scale: float = 1.0  # fraction of the run's `number` calls per timing (slow cases use fewer)
    splits: int = 1  # each timing as this many shorter pairs (more pairs for the median ratio)
    unit: str = "ns"  # how the table shows this row's per-call times: "ns" or "ms" (stored in ns either way)


def identity_compiler(fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
    """Executable = the function itself: measures pure dispatch. (Holds ``fun`` strongly; fine in a benchmark.)"""
    return fun


def _jit(fun: Callable[..., Any], **options: Any) -> Any:
    return ftjit.jit(fun, compiler=identity_compiler, cache=ftjit.FunctionCache(capacity=16), **options)


def two_floats() -> Case:
    def f(x: float, y: float) -> float:
        return x

    args = (1.5, 2.5)
    target, why = (1.5, "the free-threaded build's") if FREE_THREADED else (4.0, "the GIL build's")
    return Case("2 float args", Side("ftjit.jit", _jit(f), args),
                Side("lru_cache", functools.lru_cache(maxsize=None)(f), args), target=target,
                note=f"the core alone (a compiler that returns the function itself) against functools.lru_cache; "
                     f"target {target:g} is {why}")


def static_int_and_float() -> Case:
    def g(n: int, x: float) -> float:
        return x

    args = (3, 1.5)
    return Case("static int + float", Side("ftjit.jit", _jit(g, static_argnums=0), args),
                Side("lru_cache", functools.lru_cache(maxsize=None)(g), args), target=None)


def dict_of_8_floats() -> Case:
    def h(d: dict[str, float]) -> dict[str, float]:
        return d

    @functools.lru_cache(maxsize=None)
    def h_items(items: tuple[tuple[str, float], ...]) -> tuple[tuple[str, float], ...]:
        return items

    def h_lru(d: dict[str, float]) -> tuple[tuple[str, float], ...]:
        # A dict is not hashable: key the cache on its sorted items, as a
        # caller of lru_cache would (ftjit also walks the keys in sorted order).
        return h_items(tuple(sorted(d.items())))

    leaves = {f"k{i}": float(i) + 0.5 for i in range(8)}
    return Case("dict of 8 floats", Side("ftjit.jit", _jit(h), (leaves,)),
                Side("lru_cache(items)", h_lru, (leaves,)), target=None,
                note="both sides get the same dict: the anchor keys functools.lru_cache on "
                     "tuple(sorted(d.items()))")


def _add(x: Any, y: Any) -> Any:
    return x + y


def _sum_dict(d: dict[str, Any]) -> Any:
    total = d["k0"]
    for key in sorted(d)[1:]:
        total = total + d[key]
    return total


def jax_cases() -> list[Case]:
    """ftjit.jit (default JAX compiler) vs jax.jit on the same function and arguments."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    x = jnp.arange(4, dtype=jnp.float32)
    xn = np.arange(4, dtype=np.float32)
    tree = {f"k{i}": jnp.full((4,), float(i), dtype=jnp.float32) for i in range(8)}
    def cache() -> ftjit.FunctionCache:  # one per row: each row's compile count is its own
        return ftjit.FunctionCache(capacity=16)

    target, why = (1.00, "the free-threaded build's") if FREE_THREADED else (1.15, "the GIL build's")
    return [
        Case("jax: x+y, 2 f32[4] jax Arrays", Side("ftjit.jit", ftjit.jit(_add, cache=cache()), (x, x)),
             Side("jax.jit", jax.jit(_add), (x, x)), target=target, scale=0.1, splits=10,
             note=f"the default (JAX) compiler against jax.jit on the same function; target {target:g} is {why}"),
        Case("jax: x+y, 2 f32[4] numpy arrays", Side("ftjit.jit", ftjit.jit(_add, cache=cache()), (xn, xn)),
             Side("jax.jit", jax.jit(_add), (xn, xn)), target=None, scale=0.1, splits=10),
        Case("jax: dict pytree, 8 f32[4] leaves", Side("ftjit.jit", ftjit.jit(_sum_dict, cache=cache()), (tree,)),
             Side("jax.jit", jax.jit(_sum_dict), (tree,)), target=None, scale=0.1, splits=10),
    ]


def argument_kind_cases() -> list[Case]:
    """ftjit.jit vs jax.jit by argument kind: statics, Python scalars, containers and custom pytree nodes."""
    import collections
    import dataclasses as dc

    import jax
    import jax.numpy as jnp

    x = jnp.arange(4, dtype=jnp.float32)

    class Config:
        """A static argument of a user's own class (hash and eq by value)."""

        def __init__(self, depth: int) -> None:
            self.depth = depth

        def __hash__(self) -> int:
            return hash(self.depth)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Config) and other.depth == self.depth

    # optax.adam's state: (ScaleByAdamState(count, mu, nu), EmptyState()) over a dict of parameters.
    ScaleByAdamState = collections.namedtuple("ScaleByAdamState", "count mu nu")
    EmptyState = collections.namedtuple("EmptyState", "")
    params = {f"w{i}": jnp.full((4,), float(i), jnp.float32) for i in range(4)}
    adam = (ScaleByAdamState(jnp.zeros((), jnp.int32), params, params), EmptyState())

    @jax.tree_util.register_dataclass
    @dc.dataclass
    class Batch:
        x: Any
        y: Any
        w: Any
        steps: int = dc.field(default=3, metadata={"static": True})

    @jax.tree_util.register_pytree_with_keys_class
    class Linear:
        """A module-like custom node (equinox.Module, flax structs flatten alike): 4 array children."""

        def __init__(self, *leaves: Any) -> None:
            self.leaves = leaves

        def tree_flatten_with_keys(self) -> Any:
            return tuple((jax.tree_util.GetAttrKey(f"p{i}"), v) for i, v in enumerate(self.leaves)), None

        @classmethod
        def tree_unflatten(cls, aux: Any, children: Any) -> "Linear":
            return cls(*children)

    def first(a: Any, *rest: Any, **kw: Any) -> Any:
        return a

    def head(tree: Any) -> Any:
        return jax.tree_util.tree_leaves(tree)[0]

    def pair(label: str, fn: Callable[..., Any], args: tuple[Any, ...], **options: Any) -> Case:
        return Case(f"jax: {label}", Side("ftjit.jit", ftjit.jit(fn, cache=ftjit.FunctionCache(16), **options), args),
                    Side("jax.jit", jax.jit(fn, **options), args), target=None, scale=0.1, splits=10)

    def keyword(a: Any, mode: str = "train") -> Any:
        return a

    kw_case = Case("jax: static str keyword", Side("ftjit.jit", _KwCall(ftjit.jit(keyword, static_argnames="mode",
                                                                                   cache=ftjit.FunctionCache(16))), (x,)),
                   Side("jax.jit", _KwCall(jax.jit(keyword, static_argnames="mode")), (x,)), target=None, scale=0.1,
                   splits=10, note="calls f(x, mode='train') with mode static")
    containers = 1.10
    return [
        kw_case,
        pair("static int", first, (x, 3), static_argnums=1),
        pair("Python float", first, (x, 2.5)),
        pair("static custom object", first, (x, Config(2)), static_argnums=1),
        dataclasses.replace(pair("dict of 8 arrays", head, ({f"k{i}": x for i in range(8)},)), target=containers,
                            note=f"containers of arrays: target {containers:g} x jax.jit"),
        dataclasses.replace(pair("optax adam state", head, (adam,)), target=containers,
                            note=f"containers of arrays: target {containers:g} x jax.jit"),
        dataclasses.replace(pair("register_dataclass node", head, (Batch(x, x, x),)), target=1.0,
                            note="custom pytree nodes: flattened through JAX's registry in C++, target 1 x jax.jit"),
        dataclasses.replace(pair("custom node (module-like)", head, (Linear(x, x, x, x),)), target=1.0,
                            note="custom pytree nodes: flattened through JAX's registry in C++, target 1 x jax.jit"),
    ]


class _KwCall:
    """fn(a, mode='train'): a keyword call, timed as the positional cases are."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.cache_info = getattr(fn, "cache_info", None)

    def __call__(self, a: Any) -> Any:
        return self.fn(a, mode="train")


def default_cases(with_jax: bool = True) -> list[Case]:
    """The benchmark rows, in table order."""
    cases = [two_floats(), static_int_and_float(), dict_of_8_floats()]
    if with_jax:
        cases += jax_cases() + argument_kind_cases()
    return cases
