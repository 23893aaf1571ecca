"""Where a hit's time goes, at one thread: ``python -m bench --stages``.

A hit of ``ftjit.jit`` (the JAX compiler) is one call into the thread's
jaxlib call object of the whole function (``CompilerHooks.thread_call``:
one dispatch), timed whole. A call on the store's path (a re-entrant one,
a non-builtin static; timed here with ``ftjit._jax_calls.THREAD_CALLS``
off) runs four stages:

1. ftjit's signature (the core's Build),
2. its probe of the store (FindReady and Release),
3. its invoke: the thread's slot, the in-flight count, the copy's frame,
4. jaxlib's call object (the thread's copy), which parses the leaves again,
   builds its own signature, probes its own cache, and executes.

Stages 1 and 2 are timed inside the core (``JitFunction._hit_stage_ns``: a
loop of Builds, then a loop of Builds and probes, in C++, no Python between
runs). The copy is made here as ftjit makes it (``ftjit._jax_calls``) and
called with the same leaves; the execute is the compiled program's
``execute_sharded`` and output handlers, called from Python (so it includes
two Python method calls). Stage 3 and jaxlib's own dispatch are what is left:
ftjit's whole call less stages 1, 2 and the copy; the copy less the execute.
``jax.jit``'s whole call is timed beside them, and every Python-timed row is
interleaved with the others, in many short timings (a shared machine's slow
stretches then hit few of them), in a worker thread, its median printed
less timeit's loop overhead.

Stages 1 and 2 run hot there, back to back; in a real call the execute
runs between two of them and cools the caches they read. What that adds
lands in stage 3's row (a difference), which is therefore an upper bound
on the invoke alone.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import timeit
from typing import Any, Callable, Sequence

from .timing import in_thread


@dataclasses.dataclass(frozen=True)
class StageRow:
    """One function and arguments: every stage's median ns per call."""

    label: str
    signature_ns: float
    probe_ns: float
    copy_ns: float  #: jaxlib's call object alone (its dispatch and the execute)
    execute_ns: float
    ftjit_ns: float  #: ftjit.jit's whole call: one dispatch, through the thread's call object
    jax_ns: float
    store_ns: float  #: ftjit.jit's whole call on the store's path (the four stages)

    @property
    def invoke_ns(self) -> float:
        return self.store_ns - self.signature_ns - self.probe_ns - self.copy_ns

    @property
    def jaxlib_dispatch_ns(self) -> float:
        return self.copy_ns - self.execute_ns


def _sides(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, dict[str, timeit.Timer]]:
    """ftjit.jit of ``fn``, and timers of ``fn(*args)`` through ftjit.jit, jax.jit, the copy ftjit calls (made
    as ftjit makes it) and the execute: each a statement of literal-free names, as bench's other rows."""
    import jax

    import ftjit
    from ftjit import _jax_calls

    ft = ftjit.jit(fn, cache=ftjit.FunctionCache(capacity=4))
    was = _jax_calls.THREAD_CALLS
    _jax_calls.THREAD_CALLS = False
    try:
        store = ftjit.jit(fn, cache=ftjit.FunctionCache(capacity=4))
    finally:
        _jax_calls.THREAD_CALLS = was
    jx = jax.jit(fn)
    ft(*args), store(*args), jx(*args)  # compiled: every timed call is a hit
    found = ft._batch_key(*args)
    if found is None:
        raise RuntimeError("bench --stages: the arguments take the fallback path")
    leaves = found[1]
    compiled = jx.lower(*args).compile()
    params = _jax_calls._flat_params(compiled, args, {}, leaves)
    copies = _jax_calls._copies(compiled, params if params is not None else compiled._params, params is not None)
    if copies is None:
        raise RuntimeError("bench --stages: this JAX has no per-thread call objects for ftjit to invoke")
    copy = copies.make(copies.own_miss, lambda *a, **k: None)
    copy_args = tuple(leaves) if copies.takes_leaves else args
    copy(*copy_args)  # its first call misses (the compiled program's own miss): the timed ones hit
    unsafe = compiled._executable.unsafe_call

    def timer(stmt: str, **names: Any) -> timeit.Timer:
        return timeit.Timer(stmt, globals=names)

    def call(name: str, f: Any, call_args: tuple[Any, ...]) -> timeit.Timer:
        arg_names = {f"a{i}": a for i, a in enumerate(call_args)}
        return timer(f"{name}({', '.join(arg_names)})", **{name: f}, **arg_names)

    return store, {
        "ftjit": call("ft", ft, args),
        "store": call("store", store, args),
        "jax": call("jx", jx, args),
        "copy": call("copy", copy, copy_args),
        # The leaves the program kept (JAX prunes unused ones), jax Arrays on the device already: JAX's input
        # handler would pass them on as they are.
        "execute": timer("run(leaves).consume_with_handlers(handlers)", run=unsafe.xla_executable.execute_sharded,
                         leaves=[leaves[i] for i in sorted(unsafe.kept_var_idx)],
                         handlers=unsafe.out_handler.handlers),
    }


def _timed(ft: Any, timers: dict[str, timeit.Timer], args: tuple[Any, ...], number: int, rounds: int,
           on_round: Callable[[int, int], None] | None) -> dict[str, float]:
    """Median ns per call of every timer, interleaved (the order rotates each round), less timeit's loop; and
    the core's own timings of ``ft``'s signature and probe (``ft``: the function on the store's path)."""
    empty = timeit.Timer("pass")
    samples: dict[str, list[float]] = {name: [] for name in (*timers, "signature", "probe", "loop")}
    names = list(timers)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                samples[name].append(timers[name].timeit(number) / number * 1e9)
            samples["loop"].append(empty.timeit(number) / number * 1e9)
            build, probe = ft._hit_stage_ns(number, *args)
            samples["signature"].append(build)
            samples["probe"].append(probe)
            if on_round is not None:
                on_round(r + 1, rounds)
    finally:
        if gc_was_enabled:
            gc.enable()
    loop = statistics.median(samples["loop"])
    out = {name: statistics.median(samples[name]) - loop for name in timers}
    out["signature"] = statistics.median(samples["signature"])
    out["probe"] = statistics.median(samples["probe"])
    return out


def stage_rows(number: int, rounds: int, on_round: Callable[[int, int], None] | None = None) -> list[StageRow]:
    """The stage table's rows: x+y of two f32[4] jax Arrays, and a dict of 8 (one function each)."""
    import jax.numpy as jnp

    x = jnp.arange(4, dtype=jnp.float32)

    def add(a: Any, b: Any) -> Any:
        return a + b

    def first_of_dict(d: dict[str, Any]) -> Any:
        return d["k0"]

    cases = [("x+y, 2 f32[4] jax Arrays", add, (x, x)),
             ("dict of 8 f32[4] jax Arrays", first_of_dict, ({f"k{i}": x for i in range(8)},))]
    rows = []
    for label, fn, args in cases:
        def run(fn: Callable[..., Any] = fn, args: tuple[Any, ...] = args) -> dict[str, float]:
            ft, timers = _sides(fn, args)
            return _timed(ft, timers, args, number, rounds, on_round)

        t = in_thread("worker", run)
        rows.append(StageRow(label, t["signature"], t["probe"], t["copy"], t["execute"], t["ftjit"], t["jax"],
                             t["store"]))
    return rows


def format_stages(rows: Sequence[StageRow]) -> str:
    """One table per row: each stage's ns and share of ftjit's whole call, then the wholes and their ratio."""
    out = []
    for r in rows:
        lines = [
            ("ftjit: signature (core Build)", r.signature_ns, "timed in the core"),
            ("ftjit: probe (FindReady + Release)", r.probe_ns, "timed in the core"),
            ("ftjit: invoke (slot, in flight, copy frame, call entry)", r.invoke_ns, "store's path - the rest"),
            ("jaxlib's call: its own parse, signature and probe", r.jaxlib_dispatch_ns, "copy - execute"),
            ("execute (execute_sharded + output handlers)", r.execute_ns, "timed from Python"),
        ]
        width = max(len(name) for name, _, _ in lines) + 2
        out.append(f"{r.label}: ns per hit at one thread, by stage (of the store's path)")
        out.append(f"{'stage'.ljust(width)}{'ns':>8}  {'of store':>8}  how")
        for name, ns, how in lines:
            out.append(f"{name.ljust(width)}{ns:8.0f}  {ns / r.store_ns:8.1%}  {how}")
        out.append(f"{'ftjit.jit on the store path, whole call'.ljust(width)}{r.store_ns:8.0f}")
        out.append(f"{'jaxlib call object alone (the copy ftjit invokes)'.ljust(width)}{r.copy_ns:8.0f}  "
                   f"{r.copy_ns / r.store_ns:8.1%}")
        out.append(f"{'ftjit.jit, whole call (one dispatch)'.ljust(width)}{r.ftjit_ns:8.0f}")
        out.append(f"{'jax.jit, whole call'.ljust(width)}{r.jax_ns:8.0f}")
        out.append(f"ftjit.jit / jax.jit = {r.ftjit_ns / r.jax_ns:.3f}x (one dispatch); on the store's path "
                   f"{r.store_ns / r.jax_ns:.3f}x, its own stages (signature, probe, invoke) = "
                   f"{r.store_ns - r.copy_ns:.0f} ns; jax.jit's dispatch (jax.jit - execute) = "
                   f"{r.jax_ns - r.execute_ns:.0f} ns, the copy's = {r.jaxlib_dispatch_ns:.0f} ns")
        out.append("")
    return "\n".join(out).rstrip()
