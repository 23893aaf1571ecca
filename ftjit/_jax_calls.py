"""How the JAX compiler's compiled programs are called: ``executable_for``
(the ``CompilerHooks.executable_for`` of ftjit._jax), with the leaves
ftjit flattened where JAX's own flatten gives exactly those (flatten once),
through jaxlib's C++ call of the program: one per thread
(``ThreadExecutables``) where this JAX's private API passes a feature check
(``_copies_work``, once per process), else one shared (``fast_callable``).

Shared state and what guards it:

| FAST_PATH, FLAT_CALLS, THREAD_COPIES | switches tests and the bench set; read at each compile |
| _copy_parts_cache, | written once (a benign race: every writer writes equal values) |
|   _thread_calls_cache |                                                              |

Lock order: takes no lock.
"""

from __future__ import annotations

from typing import Any, Callable

from ._hooks import ThreadExecutables

__all__ = ["fast_callable", "executable_for", "thread_call", "FAST_PATH", "FLAT_CALLS", "THREAD_COPIES",
           "THREAD_CALLS"]

# Whether fast_callable() may use Compiled's private C++ callable. Tests turn
# it off to prove the public fallback gives the same answers.
FAST_PATH = True
# Whether executables take the leaves ftjit flattened (flatten once), where
# JAX's own leaves of the arguments are exactly those. Tests and the bench
# turn it off to compare with calling the compiled program with the arguments.
FLAT_CALLS = True
# Whether executables are ThreadExecutables: jaxlib's C++ call of the program
# made once per thread, checking JAX's configs itself (see _copies). Tests
# and the bench turn it off to compare with one call object shared by all.
THREAD_COPIES = True
# Whether functions get CompilerHooks.thread_call: one jaxlib C++ call of the
# whole function per thread, the first level of its calls (one dispatch per
# hit). Read at jit(). Tests and the bench turn it off to compare.
THREAD_CALLS = True


def fast_callable(compiled: Any) -> Callable[..., Any]:
    """The fastest callable equivalent to ``compiled`` (a ``jax.stages.Compiled``).

    Uses the C++ callable that ``Compiled.__call__`` builds lazily, when this
    JAX version has it; otherwise the public ``Compiled`` object itself.
    """
    if FAST_PATH:
        try:
            call = compiled._executable.create_cpp_call(compiled._params)
        except Exception:  # a JAX without this private API: degrade, never fail
            call = None
        if call is not None and callable(call):
            return call
    return compiled


def executable_for(compiled: Any, args: tuple, kwargs: dict, leaves: tuple
                   ) -> tuple[Callable[..., Any], bool] | ThreadExecutables:
    """The JAX compiler's ``CompilerHooks.executable_for``: what each call of
    a compiled signature calls. A ``jax.stages.Compiled`` is called with the
    call's leaves when it can be (``_flat_params``), else with the arguments,
    through jaxlib's C++ call of the program: one per thread
    (``ThreadExecutables``, see ``_copies``) where this JAX allows, else one
    shared (``fast_callable``); anything else (the function's jax.jit, for a
    hijax program) is called with the arguments as it is."""
    from jax import stages

    if not isinstance(compiled, stages.Compiled):
        return compiled, False
    if FAST_PATH:
        flat_params = _flat_params(compiled, args, kwargs, leaves) if FLAT_CALLS else None
        params = flat_params if flat_params is not None else getattr(compiled, "_params", None)
        if THREAD_COPIES and params is not None:
            copies = _copies(compiled, params, flat_params is not None)
            if copies is not None:
                return copies
        if flat_params is not None:
            flat = _flat_call(compiled, flat_params)
            if flat is not None:
                return flat, True
    return fast_callable(compiled), False


def _flat_params(compiled: Any, args: tuple, kwargs: dict, leaves: tuple) -> Any:
    """``compiled``'s call parameters for a call of ``leaves`` alone: the
    input tree of that many flat leaves (everything else JAX keyed at
    compile time is per leaf: donation, shardings, pruned arguments). None,
    so that calls keep their arguments, when JAX's leaves of ``(args,
    kwargs)`` (the flatten ``Compiled.call`` does) are not exactly
    ``leaves``, one by one, or not the compiled program's input tree; when
    the program has hijax inputs or outputs; or when this JAX lacks the
    private API (``Compiled._params``, ``tree_util.tracing_registry``)."""
    try:
        from jax._src import tree_util as jax_tree_util

        registry = jax_tree_util.tracing_registry
        params = compiled._params
        if params.is_high:
            return None
        jax_leaves, tree = registry.flatten((args, kwargs))
        if tree != params.in_tree or len(jax_leaves) != len(leaves) or any(
                a is not b for a, b in zip(jax_leaves, leaves)):
            return None
        return params._replace(in_tree=registry.flatten((tuple(leaves), {}))[1])
    except Exception:  # noqa: BLE001 - a JAX without this private API: the arguments, as before
        return None


def _flat_call(compiled: Any, flat_params: Any) -> Callable[..., Any] | None:
    """``compiled`` as one callable of the flat leaves of ``flat_params``:
    jaxlib's C++ call of the program (``_executable.create_cpp_call``), or,
    for a program with ordered effects or host callbacks, JAX's own Python
    call. None without the private API."""
    try:
        from jax._src import stages as jax_stages

        call = compiled._executable.create_cpp_call(flat_params)
        if call is None:
            compiled_call = jax_stages.Compiled.call

            def call(*flat: Any) -> Any:
                return compiled_call(flat_params, *flat)[0]

        return call if callable(call) else None
    except Exception:  # noqa: BLE001 - a JAX without this private API: the arguments, as before
        return None


def _copies(compiled: Any, params: Any, takes_leaves: bool) -> ThreadExecutables | None:
    """``compiled`` as ``ThreadExecutables``: each copy is a jaxlib C++ call
    object of the program (``_jax.pjit``, as ``create_cpp_call`` makes it),
    with the core's miss as its cache miss and the core's eager callback as
    its function: it checks JAX's configs itself on every call (jax.jit's own
    cache key: JitConfigs), caches what ``own_miss`` (JAX's own miss of the
    program: it runs it, and returns what the C++ call caches) gave in the
    program's context, and sends every other context to the core. None where
    the program has ordered effects or host callbacks (JAX runs those in
    Python), or where this JAX's private API is not the one checked by
    ``_copies_work`` (once per process, at the first compile)."""
    try:
        template = compiled._executable.create_cpp_call(params)
        if template is None or not callable(template):
            return None
        parts = _copy_parts()
        if parts is None:
            return None
        own_miss = template._cache_miss
        name = getattr(getattr(compiled._executable, "unsafe_call", None), "name", None) or "jit"
    except Exception:  # noqa: BLE001 - a JAX without this private API: one shared call, as before
        return None
    pjit, keys, registry, shard_arg = parts

    def make(miss: Callable[..., Any], eager: Callable[..., Any]) -> Callable[..., Any]:
        return pjit(name, eager, miss, [], [], keys, registry, shard_arg)

    return ThreadExecutables(make, own_miss, takes_leaves)


_copy_parts_cache: list[Any] = []  # [parts or None], written once (a benign race: every writer writes equal parts)


def _copy_parts() -> tuple[Any, Any, Any, Any] | None:
    """(``_jax.pjit``, the global cache key, the dispatch registry, the
    shard-argument fallback) that jaxlib's C++ call objects are made of,
    when this JAX has them and they behave as ``_copies`` needs (checked
    once: ``_copies_work``); else None, said once by a RuntimeWarning."""
    if not _copy_parts_cache:
        parts = None
        why = ""
        try:
            from jax._src import tree_util as jax_tree_util
            from jax._src.interpreters import pxla
            from jax._src.lib import _jax as jaxlib_jax

            parts = (jaxlib_jax.pjit, pxla.JitGlobalCppCacheKeys(), jax_tree_util.dispatch_registry,
                     pxla.cc_shard_arg)
            why = _copies_work(parts)
        except Exception as error:  # noqa: BLE001 - a JAX without them
            why = f"{type(error).__name__}: {error}"
        if why:
            parts = None
            import warnings

            warnings.warn(
                "ftjit: this JAX's per-thread call objects (jaxlib's pjit) failed ftjit's check, so every "
                "thread calls one shared call object per compiled signature (correct, but threads then wait "
                f"on its lock instead of scaling): {why}", RuntimeWarning, stacklevel=2)
        _copy_parts_cache.append(parts)
    return _copy_parts_cache[0]


def _copies_work(parts: tuple[Any, Any, Any, Any]) -> str:
    """Feature check, on a program of its own: a copy made of ``parts``
    calls the miss at its first call and returns the miss's outputs, serves
    the next call without it, calls the miss again under another config
    (jax.enable_x64, thread-local), and calls ``eager`` under
    jax.disable_jit(). Its argument is already on the device, and it runs
    under ``jax.transfer_guard("allow")``: a guard the program set cannot
    refuse it. "" when it passes, else what failed."""
    import jax
    import numpy as np

    from ._jax import jax_jit

    pjit, keys, registry, shard_arg = parts
    with jax.transfer_guard("allow"):
        x = jax.device_put(np.float32(1))
        compiled = jax_jit()(lambda v: v + 1).lower(x).compile()
        template = compiled._executable.create_cpp_call(compiled._params)
        if template is None:
            return "Compiled._executable.create_cpp_call gave no C++ call"
        own_miss = template._cache_miss
        seen: list[str] = []

        def miss(*args: Any, **kwargs: Any) -> Any:
            seen.append("miss")
            return own_miss(*args, **kwargs)

        def eager(*args: Any, **kwargs: Any) -> Any:
            seen.append("eager")
            return "eager"

        copy = pjit("ftjit-check", eager, miss, [], [], keys, registry, shard_arg)
        if not (float(copy(x)) == 2.0 and float(copy(x)) == 2.0 and seen == ["miss"]):
            return f"a call object's first two calls did not miss once and hit once (seen: {seen})"
        with jax.enable_x64(not jax.config.jax_enable_x64):  # type: ignore[attr-defined]
            seen.append("x64")
            miss_seen = len(seen)
            try:
                copy(x)
            except Exception:  # noqa: BLE001 - the program under x64: only the miss matters here
                pass
            if seen[miss_seen:] != ["miss"]:
                return f"a call object did not miss under another config (seen: {seen})"
        with jax.disable_jit():
            if copy(x) != "eager":
                return "a call object did not call its eager callback under jax.disable_jit()"
    return ""


def thread_call(name: str) -> Callable[..., Any] | None:
    """The JAX compiler's ``CompilerHooks.thread_call`` for a function named
    ``name``: ``make(miss, eager, static_argnums, static_argnames,
    capacity)``, a jaxlib C++ call of the whole function (``_jax.pjit``, as
    jax.jit makes it, with a cache of its own of at most ``capacity``
    signatures) whose miss is the core's; or None, from
    ``make``, where the copies fail their check or this JAX's call objects
    fail ``_thread_calls_work`` (both checked once per process, at the first
    call: decorating touches no device), and every call takes the store's
    path. None, at once, where the switches turn it off."""
    if not (FAST_PATH and THREAD_COPIES and THREAD_CALLS):
        return None

    def make(miss: Callable[..., Any], eager: Callable[..., Any], static_argnums: tuple, static_argnames: tuple,
             capacity: int) -> Callable[..., Any] | None:
        parts = _copy_parts()
        if parts is None or not _thread_calls_checked(parts):
            return None
        pjit, keys, registry, shard_arg = parts
        from jax._src.lib import _jax as jaxlib_jax

        return pjit(name, eager, miss, list(static_argnums), list(static_argnames), keys, registry, shard_arg,
                    jaxlib_jax.PjitFunctionCache(capacity=capacity))

    return make


_thread_calls_cache: list[bool] = []  # [passed], written once (a benign race: every writer writes the same)


def _thread_calls_checked(parts: tuple[Any, Any, Any, Any]) -> bool:
    if not _thread_calls_cache:
        try:
            why = _thread_calls_work(parts)
        except Exception as error:  # noqa: BLE001 - a JAX whose call objects differ
            why = f"{type(error).__name__}: {error}"
        if why:
            import warnings

            warnings.warn(
                "ftjit: this JAX's call objects (jaxlib's pjit) failed ftjit's check of a function's call object "
                f"per thread, so every call takes ftjit's own path (correct, a little slower): {why}",
                RuntimeWarning, stacklevel=3)
        _thread_calls_cache.append(not why)
    return _thread_calls_cache[0]


def _thread_calls_work(parts: tuple[Any, Any, Any, Any]) -> str:
    """Feature check, on a program of its own, of what a thread's call object
    of a whole function needs beyond ``_copies_work``: static arguments
    (by position and by name) are part of its key; a miss whose result says
    ``drop`` leaves nothing cached (the next equal call misses again); a
    kept one serves the next equal call without the miss; its cache keeps
    ``capacity`` signatures at most. "" when it
    passes, else what failed."""
    import jax
    import numpy as np

    from ._jax import jax_jit

    from jax._src.lib import _jax as jaxlib_jax

    pjit, keys, registry, shard_arg = parts
    with jax.transfer_guard("allow"):
        x = jax.device_put(np.float32(1))
        compiled = jax_jit()(lambda v, n: v + n, static_argnums=1).lower(x, 2).compile()
        template = compiled._executable.create_cpp_call(compiled._params)
        if template is None:
            return "Compiled._executable.create_cpp_call gave no C++ call"
        own_miss = template._cache_miss
        seen: list[Any] = []

        def miss(v: Any, n: Any) -> Any:
            seen.append(n)
            out = own_miss(v)
            return out if n == 2 else (out[0], None, True)

        def eager(*args: Any, **kwargs: Any) -> Any:
            return "eager"

        call = pjit("ftjit-check", eager, miss, [1], ["n"], keys, registry, shard_arg,
                    jaxlib_jax.PjitFunctionCache(capacity=1))
        results = [float(call(x, 2)), float(call(x, 2)), float(call(x, 3)), float(call(x, 3)), float(call(x, n=2)),
                   float(call(x, n=2))]
        if results != [3.0] * 6 or seen != [2, 3, 3, 2]:
            return f"static arguments and drops did not key and miss as expected (misses: {seen}, results: {results})"
        # A cache of one signature: (x, n=2) took the place of (x, 2).
        call(x, 2)
        if seen != [2, 3, 3, 2, 2]:
            return f"a call object's cache did not keep to its capacity (misses: {seen})"
    return ""
