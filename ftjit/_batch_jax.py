"""How ``ftjit.batched`` runs a batch with JAX: examples stacked along a new leading axis, padded, and one call
of ``jax.vmap(fn)`` compiled by ``ftjit.jit`` (once per size); each caller's row split off in the same program
(jax Arrays) or from one host copy (``to_host``).

Shared state: none of its own (two JitFunctions, which are thread-safe). No locks.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ._jit import jit
from ._warmup import Spec, WarmupReport

__all__ = ["JaxBatches", "stack_rows"]


def stack_rows(rows: Sequence[Any]) -> Any:
    """One leaf's examples stacked along a new leading axis: on the host (numpy) when every row is there,
    else on the device (jax.numpy)."""
    if all(isinstance(r, (np.ndarray, np.generic, int, float, complex, bool)) for r in rows):
        return np.stack([np.asarray(r) for r in rows])
    import jax.numpy as jnp

    return jnp.stack(rows)


class JaxBatches:
    """``one``: ``ftjit.jit(fn)``, for calls alone (and the batch key); ``many``: ``ftjit.jit`` of the batched
    program, with the same statics."""

    def __init__(self, fn: Callable[..., Any], sizes: Sequence[int], to_host: bool, static_argnums: tuple,
                 static_argnames: tuple, jit_options: dict) -> None:
        self.fn = fn
        self.sizes = tuple(sizes)
        self.to_host = to_host
        self.static_argnums = frozenset(static_argnums)
        self.static_argnames = frozenset(static_argnames)
        options = dict(jit_options, static_argnums=static_argnums, static_argnames=static_argnames)
        self.one = jit(fn, **options)
        self.many = jit(self._program(), **options)

    # -- the program ----------------------------------------------------------------------------------------
    def _program(self) -> Callable[..., Any]:
        fn, statics_n, statics_s, split = self.fn, self.static_argnums, self.static_argnames, not self.to_host

        def batch_of(*args: Any, **kwargs: Any) -> Any:
            import jax

            dyn_pos = [i for i in range(len(args)) if i not in statics_n]
            dyn_kw = {k: v for k, v in kwargs.items() if k not in statics_s}
            static_kw = {k: v for k, v in kwargs.items() if k in statics_s}

            def one(dyn: list, dyn_named: dict) -> Any:
                full = list(args)
                for i, value in zip(dyn_pos, dyn):
                    full[i] = value
                return fn(*full, **dyn_named, **static_kw)

            out = jax.vmap(one)([args[i] for i in dyn_pos], dyn_kw)
            if not split:
                return out
            n = jax.tree_util.tree_leaves(([args[i] for i in dyn_pos], dyn_kw))[0].shape[0]
            # Each row its own output: one call splits the batch, not one slice per caller.
            return tuple(jax.tree_util.tree_map(lambda o, r=r: o[r], out) for r in range(n))

        batch_of.__name__ = f"batched_{getattr(fn, '__name__', 'fn')}"
        batch_of.__qualname__ = batch_of.__name__
        return batch_of

    # -- a call alone, a batch -------------------------------------------------------------------------------
    def alone(self, args: tuple, kwargs: dict) -> Any:
        """One example by itself, as a batch's row would be returned: on the host with ``to_host``, else
        jax Arrays, ready (the call ends when its result is: the next batch starts then)."""
        import jax

        out = self.one(*args, **kwargs)
        if isinstance(out, jax.Array):  # the common case, one array: no tree walk
            return np.asarray(out) if self.to_host else out.block_until_ready()
        if self.to_host:
            return jax.tree_util.tree_map(np.asarray, out)
        return jax.block_until_ready(out)

    def _stacked(self, examples: Sequence[tuple[tuple, dict]], size: int) -> tuple[tuple, dict]:
        """The examples' arguments stacked (padded to ``size`` with the first example's rows, which no caller
        sees); statics as the first example has them (equal in every example of a batch)."""
        import jax

        args0, kwargs0 = examples[0]
        if len(args0) == 1 and not kwargs0 and not self.static_argnums and type(args0[0]) is np.ndarray:
            # The common case, one array per example: stacked at once (no tree walk per example).
            rows = [args[0] for args, _ in examples]
            if all(type(r) is np.ndarray for r in rows):
                return (np.stack(rows + rows[:1] * (size - len(rows))),), {}
        dyn = [([a for i, a in enumerate(args) if i not in self.static_argnums],
                {k: v for k, v in kwargs.items() if k not in self.static_argnames}) for args, kwargs in examples]
        dyn += [dyn[0]] * (size - len(dyn))
        stacked_dyn, stacked_kw = jax.tree_util.tree_map(lambda *rows: stack_rows(rows), *dyn)
        args, it = [], iter(stacked_dyn)
        for i, a in enumerate(args0):
            args.append(a if i in self.static_argnums else next(it))
        kwargs = {k: (v if k in self.static_argnames else stacked_kw[k]) for k, v in kwargs0.items()}
        return tuple(args), kwargs

    def batch(self, examples: Sequence[tuple[tuple, dict]], size: int) -> list[Any]:
        """Runs one batch: each example's result, in order (the padding rows' never leave)."""
        import jax

        args, kwargs = self._stacked(examples, size)
        out = self.many(*args, **kwargs)
        n = len(examples)
        if self.to_host:
            # One copy to the host for the whole batch, then each caller's row (a view of it).
            leaves, tree = jax.tree_util.tree_flatten(out)
            host = [np.asarray(leaf) for leaf in leaves]
            if tree.num_leaves == 1 and tree.num_nodes == 1:  # one array: its rows
                return list(host[0][:n])
            return [tree.unflatten([leaf[r] for leaf in host]) for r in range(n)]
        rows = list(out[:n])
        jax.block_until_ready(rows)  # the batch ends when its results are ready: the next starts then
        return rows

    # -- warming up ------------------------------------------------------------------------------------------
    def warmup(self, specs: Iterable[Any], workers: int, strict: bool, progress: Any) -> WarmupReport:
        """The example's signature, and the batch program at every size, for each spec (see warmup)."""
        start = time.perf_counter()
        items = [Spec.of(s) for s in specs]
        batched: list[Spec] = []
        for spec in items:
            if not isinstance(spec, Spec):  # a BrokenSpec: reported by the example's own warm-up below
                continue
            for size in self.sizes[1:] if self.sizes[0] == 1 else self.sizes:
                batched.append(self._batched_spec(spec, size))
        first = self.one.warmup(items, workers=workers, strict=strict, progress=progress)
        second = self.many.warmup(batched, workers=workers, strict=strict, progress=progress)
        return WarmupReport(first.results + second.results, time.perf_counter() - start, workers)

    def _batched_spec(self, spec: Spec, size: int) -> Spec:
        """``spec``'s arguments as a batch of ``size`` would pass them: each dynamic leaf stacked (a
        ShapeDtypeStruct with a leading axis; a concrete leaf as the stacking makes it)."""
        import jax

        def stacked(leaf: Any) -> Any:
            if isinstance(leaf, jax.ShapeDtypeStruct):
                return jax.ShapeDtypeStruct((size, *leaf.shape), leaf.dtype, weak_type=leaf.weak_type)
            made = stack_rows([leaf] * size)
            return jax.ShapeDtypeStruct(made.shape, made.dtype)

        args = tuple(a if i in self.static_argnums else jax.tree_util.tree_map(stacked, a)
                     for i, a in enumerate(spec.args))
        kwargs = {k: (v if k in self.static_argnames else jax.tree_util.tree_map(stacked, v))
                  for k, v in spec.kwargs.items()}
        return dataclasses.replace(spec, args=args, kwargs=kwargs)
