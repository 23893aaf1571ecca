"""How ``ftjit.batched`` runs a batch with JAX: each leaf's examples stacked along a new leading axis into one
buffer, padded to the batch's size, and one call of ``jax.vmap(fn)`` compiled by ``ftjit.jit`` (once per size and
signature); each caller takes its own row from one host copy (``to_host``) or from the rows the program split.

A batch answers as lone calls would: a signature's *plan* (``_Plan``, made once from the core's record of the first
example's signature) says which arguments are static, by position or by name as the core resolved them (so as
``jax.jit`` does), the tree of the others, and which leaves are weak-typed: those are stacked as their lone call's
dtype would be (a Python float as float32 without x64, an int as int32, out of range raising as it would alone) and
marked weak again inside the program, so that ``x * 1.5`` keeps ``x``'s dtype. A signature without leaves, one whose
plan cannot be made, and one whose batched program cannot be compiled (``jax.vmap`` refuses ordered effects and
``pure_callback`` without ``vmap_method``: said once by a warning) run each call alone.

Shared state: the plans (``_plans``, a dict: a racing second maker stores an equal plan, benign) and the signatures
run per call (``per_call``, a dict used as a set, likewise), both cleared by ``clear``; ``_warned`` (whether the
warning was given: written at most a few times, benign). No locks: the two JitFunctions are thread-safe.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ._jit import jit
from ._signature import Leaf, Static
from ._warmup import Spec, WarmupReport

__all__ = ["JaxBatches"]

#: ftjit.jit options that name the user function's own arguments: they do not apply to the batched program.
_PER_ARGUMENT = frozenset({"static_argnums", "static_argnames", "donate_argnums", "donate_argnames",
                           "in_shardings", "out_shardings"})
#: The most plans kept (one per signature seen in a batch); past it they are made again.
_MAX_PLANS = 1024
#: The dtype a Python scalar of each kind has in a lone call (canonicalized by JAX's config when stacked).
_SCALAR_TYPES = {"bool": np.bool_, "int": np.int64, "float": np.float64, "complex": np.complex128}


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How the examples of one signature become one call of the batched program: a static argument of that program
    (hashed and compared by value), so that one compile serves every batch of the signature and size."""

    statics: tuple[tuple[int, Any], ...]  #: (position, value) of each static positional argument
    static_kwargs: tuple[tuple[str, Any], ...]  #: (name, value) of each static keyword argument
    #: The type of each static value (positional, then keyword): a plan is keyed as ``ftjit.jit`` keys statics, by
    #: type and value, so that 1, 1.0 and True (equal, with one hash) make three programs, as alone.
    static_types: tuple[type, ...]
    nargs: int  #: positional arguments of a call
    treedef: Any  #: JAX's tree of (dynamic positional arguments, dynamic keyword arguments)
    weak: tuple[bool, ...]  #: per leaf: weak-typed (marked weak again inside the program)
    scalars: tuple[str | None, ...]  #: per leaf: a Python scalar's kind (stacked to its dtype), else None
    _hash: int = dataclasses.field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Hashed once: a batch's call of the program hashes its static plan each time.
        fields = (self.statics, self.static_kwargs, self.static_types, self.nargs, self.treedef, self.weak,
                  self.scalars)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    def call(self, fn: Callable[..., Any], leaves: Sequence[Any]) -> Any:
        """``fn`` of one example, rebuilt from its leaves and the statics."""
        import jax

        dyn, dyn_kwargs = jax.tree_util.tree_unflatten(self.treedef, leaves)
        args, it = [], iter(dyn)
        statics = dict(self.statics)
        for i in range(self.nargs):
            args.append(statics[i] if i in statics else next(it))
        return fn(*args, **dyn_kwargs, **dict(self.static_kwargs))


def _preorder_leaves(tree: Any) -> Iterable[Leaf]:
    if isinstance(tree, Leaf):
        yield tree
    elif not isinstance(tree, Static):
        for child in tree.children:
            yield from _preorder_leaves(child)


@functools.cache
def _mark_weak() -> Callable[[Any], Any] | None:
    """JAX's conversion that marks an array weak-typed (a private API, feature-checked once, on shapes alone), or
    None: a signature with weak leaves then runs its calls alone."""
    try:
        import jax
        import jax.numpy as jnp
        from jax._src.lax import lax as lax_internal

        convert = lax_internal._convert_element_type
        probe = jax.eval_shape(lambda x: convert(x, x.dtype, weak_type=True), jax.ShapeDtypeStruct((1,), jnp.float32))
        if not probe.weak_type:
            return None
        return lambda x: convert(x, x.dtype, weak_type=True)
    except Exception:  # noqa: BLE001 - a JAX without it
        return None


class JaxBatches:
    """``one``: ``ftjit.jit(fn)``, for calls alone (and the batch key); ``many``: ``ftjit.jit`` of the batched
    program, whose first argument is the signature's plan (static)."""

    def __init__(self, fn: Callable[..., Any], sizes: Sequence[int], to_host: bool, static_argnums: Any,
                 static_argnames: Any, jit_options: dict) -> None:
        self.fn = fn
        self.sizes = tuple(sizes)
        self.to_host = to_host
        self.one = jit(fn, **dict(jit_options, static_argnums=static_argnums, static_argnames=static_argnames))
        options = {k: v for k, v in jit_options.items() if k not in _PER_ARGUMENT}
        if options.get("max_signatures") is not None:  # a program per size for each of the example's signatures
            options["max_signatures"] = options["max_signatures"] * len(self.sizes)
        self.many = jit(self._program(), static_argnums=0, **options)
        self._plans: dict[Any, _Plan | None] = {}
        self.per_call: dict[Any, None] = {}  #: signatures whose calls run alone (the runner's side of a set)
        self._warned = False

    def _program(self) -> Callable[..., Any]:
        fn, split = self.fn, not self.to_host

        def batch_of(plan: _Plan, *leaves: Any) -> Any:
            import jax

            if any(plan.weak):
                mark_weak = _mark_weak()
                assert mark_weak is not None  # a plan with weak leaves is made only with it
                leaves = tuple(mark_weak(x) if w else x for x, w in zip(leaves, plan.weak))
            out = jax.vmap(lambda *ls: plan.call(fn, ls))(*leaves)
            if not split:
                return out
            # Each row its own output: one call splits the batch, not one slice per caller. One split per leaf
            # (lax.split): XLA compiles it faster than a slice per row (256 rows: 1.4 s against 1.9 s here).
            n = leaves[0].shape[0]
            flat, treedef = jax.tree_util.tree_flatten(out)
            cols = [[p.reshape(p.shape[1:]) for p in jax.lax.split(o, [1] * n)] for o in flat]
            return tuple(jax.tree_util.tree_unflatten(treedef, [col[r] for col in cols]) for r in range(n))

        batch_of.__name__ = batch_of.__qualname__ = f"batched_{getattr(fn, '__name__', 'fn')}"
        return batch_of

    # -- the plan of a signature ----------------------------------------------------------------------------
    def plan(self, key: Any, args: tuple, kwargs: dict, leaves: Sequence[Any]) -> _Plan | None:
        """The plan of the signature ``key`` of a call of ``args``, ``kwargs`` (whose leaves the core flattened
        are ``leaves``), made once; None when its calls cannot be batched (they then run alone)."""
        if key in self._plans:
            return self._plans[key]
        made = self._make_plan(args, kwargs, leaves)
        if len(self._plans) >= _MAX_PLANS:
            self._plans.clear()
        self._plans[key] = made
        return made

    def _make_plan(self, args: tuple, kwargs: dict, core_leaves: Sequence[Any] | None = None) -> _Plan | None:
        """The plan of a call of ``args``, ``kwargs`` (None: its calls cannot be batched). ``core_leaves``: the
        leaves the core flattened of that call, which must be JAX's, one by one (the program rebuilds the call
        from JAX's tree of them); None for a warm-up's specs, whose leaves the core does not keep."""
        import jax

        record = self.one._signature_record_of(*args, **kwargs)
        if record is None:
            return None
        statics = tuple((i, args[i]) for i, t in enumerate(record.args) if isinstance(t, Static))
        static_kwargs = tuple((k, kwargs[k]) for k, t in record.kwargs.items() if isinstance(t, Static))
        static_at = dict(statics)
        dyn = tuple(a for i, a in enumerate(args) if i not in static_at)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in dict(static_kwargs)}
        leaves, treedef = jax.tree_util.tree_flatten((dyn, dyn_kwargs))
        records = [leaf for tree in (*record.args, *record.kwargs.values()) for leaf in _preorder_leaves(tree)]
        if not leaves or len(records) != len(leaves):
            return None
        if core_leaves is not None and (len(core_leaves) != len(leaves)
                                        or any(a is not b for a, b in zip(core_leaves, leaves))):
            return None
        weak = tuple(bool(r.weak_type) for r in records)
        if any(weak) and _mark_weak() is None:
            return None
        scalars = tuple(r.kind if r.kind in _SCALAR_TYPES else None for r in records)
        types = tuple(type(v) for _, v in statics) + tuple(type(v) for _, v in static_kwargs)
        plan = _Plan(statics, static_kwargs, types, len(args), treedef, weak, scalars)
        if self._has_effects(plan, leaves):
            return None
        return plan

    def _has_effects(self, plan: _Plan, leaves: Sequence[Any]) -> bool:
        """Whether one example's program has effects (``io_callback``, ``jax.debug.print``, ordered effects): its
        calls then run alone, so that each request's effects run once. A batch would run them for its padding
        rows too, and again for the clean examples of a batch that failed and ran again example by example.
        Traced once per signature (the plan is kept); a trace that fails says nothing here (the batch then
        fails as the call alone would, and runs example by example)."""
        import jax

        try:
            return bool(jax.make_jaxpr(lambda *ls: plan.call(self.fn, ls))(*leaves).effects)
        except Exception:  # noqa: BLE001 - the call alone raises it, to its own caller
            return False

    # -- a call alone, a batch --------------------------------------------------------------------------------
    def alone(self, args: tuple, kwargs: dict) -> Any:
        """One example by itself, as a batch's row would be returned: on the host with ``to_host``, else
        jax Arrays, ready (the call ends when its result is: the next batch starts then)."""
        import jax

        out = self.one(*args, **kwargs)
        if isinstance(out, jax.Array):  # the common case, one array: no tree walk
            return _host(out) if self.to_host else out.block_until_ready()
        if self.to_host:
            return jax.tree_util.tree_map(_host, out)
        return jax.block_until_ready(out)

    def fallback(self, args: tuple, kwargs: dict) -> Any:
        """The compiler's fallback (a JAX trace active, tracers among the arguments): ``one``, as it is."""
        return self.one(*args, **kwargs)

    def batch(self, key: Any, args: tuple, kwargs: dict, columns: list, size: int) -> Any:
        """Runs one batch of the signature ``key`` (``args``, ``kwargs``: its first example's; ``columns``: each
        leaf of every example, padded here to ``size``); its output, whose rows ``row`` gives. Raises when the
        batch fails (every example then runs alone)."""
        import jax

        plan = self.plan(key, args, kwargs, [col[0] for col in columns])
        if plan is None:
            self._run_alone_from_now(key)
            raise _NotBatched(f"{getattr(self.fn, '__name__', 'fn')}: this signature's calls cannot be batched")
        stacked = [_stack(col, size, kind) for col, kind in zip(columns, plan.scalars)]
        try:
            out = self.many(plan, *stacked)
        except Exception:
            self._check_compiles(key, plan, stacked)
            raise
        if self.to_host:
            # One copy to the host for the whole batch; each caller then copies its row out of it.
            return _host(out) if isinstance(out, jax.Array) else jax.tree_util.tree_map(_host, out)
        return jax.block_until_ready(out)  # the batch ends when its results are ready: the next starts then

    def _check_compiles(self, key: Any, plan: _Plan, stacked: list) -> None:
        """After a batch failed: if its program cannot even be compiled (``jax.vmap`` refuses the function), this
        signature's calls run alone from now on, and a warning says so once."""
        try:
            self.many.precompile(plan, *stacked)
        except Exception as error:  # noqa: BLE001 - the reason, said once
            self._run_alone_from_now(key)
            if not self._warned:
                self._warned = True
                warnings.warn(f"ftjit.batched({getattr(self.fn, '__name__', 'fn')}): its batched program cannot be "
                              f"compiled ({type(error).__name__}: {error}); its calls run one at a time",
                              RuntimeWarning, stacklevel=2)

    def _run_alone_from_now(self, key: Any) -> None:
        """The signature ``key``'s calls run alone from now on: remembered for at most _MAX_PLANS signatures (past
        them the set starts again, and a forgotten signature's next batch finds it out again)."""
        if len(self.per_call) >= _MAX_PLANS:
            self.per_call.clear()
        self.per_call[key] = None

    def row(self, out: Any, i: int) -> Any:
        """Example ``i``'s result of a batch's output (in its caller's own thread): with ``to_host``, a copy of
        its row, so that a result kept holds its own row's memory, not the whole batch's (a 0-d array for a
        scalar, as alone); a leaf with no host form (a typed PRNG key) stays a jax Array, sliced on the device."""
        import jax

        if not self.to_host:
            return out[i]
        if isinstance(out, np.ndarray):  # one array: no tree walk
            return out[i, ...].copy()
        return jax.tree_util.tree_map(lambda o: o[i, ...].copy() if isinstance(o, np.ndarray) else o[i], out)

    def clear(self) -> None:
        """Drops the compiled programs, the plans and the signatures run alone."""
        self.one.clear_cache()
        self.many.clear_cache()
        self._plans.clear()
        self.per_call.clear()

    # -- warming up ------------------------------------------------------------------------------------------
    def warmup(self, specs: Iterable[Any], workers: int, strict: bool, progress: Any) -> WarmupReport:
        """The example's signature, and the batch program at every size, for each spec (see warmup)."""
        start = time.perf_counter()
        items = [Spec.of(s) for s in specs]
        batched: list[Spec] = []
        for spec in items:
            if not isinstance(spec, Spec):  # a BrokenSpec: reported by the example's own warm-up below
                continue
            plan = self._make_plan(spec.args, spec.kwargs) if self._specs_ok(spec) else None
            if plan is None:
                continue  # its calls run alone: no batched program to compile
            for size in self.sizes[1:] if self.sizes[0] == 1 else self.sizes:
                batched.append(Spec((plan, *self._stacked_specs(spec, plan, size)), {}))
        first = self.one.warmup(items, workers=workers, strict=strict, progress=progress)
        second = self.many.warmup(batched, workers=workers, strict=strict, progress=progress)
        return WarmupReport(first.results + second.results, time.perf_counter() - start, workers)

    def _specs_ok(self, spec: Spec) -> bool:
        try:
            return self.one._signature_record_of(*spec.args, **spec.kwargs) is not None
        except Exception:  # noqa: BLE001 - reported by the example's own warm-up
            return False

    @staticmethod
    def _stacked_specs(spec: Spec, plan: _Plan, size: int) -> list[Any]:
        """Each leaf of ``spec`` as a batch of ``size`` passes it: a ShapeDtypeStruct with a leading axis, strong
        (the program marks weak leaves again), of the dtype the stacking gives."""
        import jax

        statics = dict(plan.statics)
        dyn = tuple(a for i, a in enumerate(spec.args) if i not in statics)
        dyn_kwargs = {k: v for k, v in spec.kwargs.items() if k not in dict(plan.static_kwargs)}
        out = []
        for leaf, kind in zip(jax.tree_util.tree_leaves((dyn, dyn_kwargs)), plan.scalars):
            if kind is not None:
                out.append(jax.ShapeDtypeStruct((size,), jax.dtypes.canonicalize_dtype(_SCALAR_TYPES[kind])))
            else:
                out.append(jax.ShapeDtypeStruct((size, *leaf.shape), leaf.dtype,
                                                sharding=getattr(leaf, "sharding", None)))
        return out


def _host(x: Any) -> Any:
    """A jax Array as numpy, on the host; one whose dtype has no numpy form (a typed PRNG key: JAX's extended
    dtypes) stays a jax Array, ready, as ``ftjit.jit`` returns it."""
    dtype = getattr(x, "dtype", None)  # (a Python scalar, under disable_jit, has none)
    if dtype is None or isinstance(dtype, np.dtype):  # the common case: numpy has the dtype
        return np.asarray(x)
    import jax

    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
        return x.block_until_ready()
    return np.asarray(x)


class _NotBatched(Exception):
    """A batch of a signature whose calls run alone: its members run alone (the C++ queue retries them)."""


def _stack(column: list, size: int, scalar: str | None) -> Any:
    """One leaf of every example of a batch, stacked along a new leading axis and padded to ``size`` with the
    first example's: one buffer, each example written once (numpy), or one device concatenation (jax Arrays);
    Python scalars as the dtype a lone call gives them (JAX's config: float32 without x64; an int out of that
    dtype's range raises OverflowError, as it does alone)."""
    n = len(column)
    if scalar is not None:
        import jax

        out = np.empty(size, jax.dtypes.canonicalize_dtype(_SCALAR_TYPES[scalar]))
        out[:n] = column
        out[n:] = out[0]
        return out
    first = column[0]
    if all(type(x) is np.ndarray for x in column):
        out = np.empty((size, *first.shape), first.dtype)
        np.stack(column, out=out[:n])
        out[n:] = out[0]
        return out
    import jax.numpy as jnp

    return jnp.stack(column + column[:1] * (size - n))
