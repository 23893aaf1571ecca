"""The default compiler: traces, lowers and compiles with JAX (XLA).

ftjit keeps its own cache, compile-once and recursion handling; JAX does the
tracing and compiling, once per signature. The hot path calls the C++
callable inside ``jax.stages.Compiled`` when this JAX exposes it (a private
API, behind a feature check) and the public ``Compiled`` otherwise.

The signature hooks it gives the core (ftjit._jax_hooks) follow
jax.jit; here: the compiler (JaxCompiler, bound to one function as
BoundJaxCompiler), the CompilerHooks it hands ftjit.jit, the checks of a
traced program's values, and the one-time integration with JAX (hidden
frames, jax.clear_caches()). How a compiled program is called:
ftjit._jax_calls.

Shared state and what guards it:

| _jax_jit    | JAX's own jit, looked up once; a racing second lookup writes   |
|             | the same object (benign)                                       |
| resolves_negative_static_argnums | functools.cache: computed once        |
| JaxCompiler | immutable after construction                                   |

Lock order: none of its own (the hooks' lock: ftjit._jax_hooks._hooks_lock).
"""

from __future__ import annotations

import functools
import importlib
import math
import os
from typing import Any, Callable, NamedTuple

from ._hooks import CompilerHooks
from ._jax_calls import executable_for, thread_call
from ._jax_hooks import _jax_hooks
from ._specs_format import shown

__all__ = ["JaxCompiler", "placement_label"]

_jax_jit: Callable[..., Any] | None = None  # written once (a benign race: every writer writes the same)


def jax_jit() -> Callable[..., Any]:
    """JAX's own ``jit``, looked up once, where JAX defines it.

    A program may rebind ``jax.jit = ftjit.jit`` (the usual way to make a
    library use ftjit); reading ``jax.jit`` at decoration would then make
    ftjit call itself forever.
    """
    global _jax_jit
    found = _jax_jit
    if found is None:
        import jax

        try:
            from jax._src import api as jax_api

            found = jax_api.jit
        except Exception:  # noqa: BLE001 - a JAX that defines it elsewhere
            found = jax.jit
        if getattr(found, "__module__", "").split(".")[0] == "ftjit":
            raise RuntimeError("ftjit: cannot find JAX's own jit (jax.jit is ftjit.jit, and jax._src.api.jit "
                               "is missing): rebind jax.jit after ftjit has been used once, or not at all")
        _jax_jit = found
    return found


@functools.cache
def resolves_negative_static_argnums() -> bool:
    """Whether the installed jax.jit takes a negative ``static_argnums`` entry
    as a position among the function's positional parameters (jax >= 0.12:
    -1 of ``f(x, scale=2.0)`` is ``scale``) rather than counted from the end
    of each call's positional arguments (up to 0.11). Feature check through
    ``jax._src.api_util.resolve_argnums``; by version where that is missing."""
    import inspect

    import jax

    try:
        from jax._src import api_util

        def probe(a: Any, b: Any = None) -> None:
            return None

        nums = api_util.resolve_argnums(probe, inspect.signature(probe), None, None, (-1,), None)[2]
        return tuple(nums) == (1,)
    except Exception:  # noqa: BLE001 - a JAX without it: decide by version
        parts = []
        for part in jax.__version__.split(".")[:2]:
            digits = "".join(ch for ch in part if ch.isdigit())
            parts.append(int(digits or 0))
        return tuple(parts) >= (0, 12)


class _ThroughJaxJit:
    """What a compiler does with ``self.jax_jit(fun)`` (the function's
    ``jax.jit``): compile a signature, lower it, or serve an uncached call."""

    __slots__ = ()

    def jax_jit(self, fun: Callable[..., Any]) -> Any:
        raise NotImplementedError

    def __call__(self, fun: Callable[..., Any], args: tuple, kwargs: dict) -> Callable[..., Any]:
        jitted = self.jax_jit(fun)
        traced = jitted.trace(*args, **kwargs)
        _check_values(traced)  # before XLA sees it: a value too large aborts the process compiling it
        if _is_high(traced):
            # A program with hijax state (a jax Box, flax nnx hijax Variables
            # closed over): its lowering needs jax.jit's call path (which
            # turns that state into plain arrays at each call; the ahead-of-
            # time path cannot in jax 0.10), so the executable is the jax.jit
            # itself, which compiles it once in its own cache.
            return jitted
        # Called through executable_for (the hooks below).
        return traced.lower().compile()

    def hooks(self, fun: Callable[..., Any]) -> CompilerHooks:
        """The compiler protocol's hooks for ``fun`` (ftjit/_hooks.py): jax.jit's
        signature (every config that changes tracing, committed placements),
        JAX's pytree registry, and ``fun``'s jax.jit for the calls ftjit must
        not cache (a JAX trace is active, or jax.disable_jit()) and for
        ``lower``, ``trace`` and ``eval_shape``."""
        jitted = self.jax_jit(fun)
        hooks = _jax_hooks()
        return CompilerHooks(
            context=hooks["context_hooks"],
            # Executables are jaxlib's C++ calls, which check JAX's configs
            # themselves (ThreadExecutables, or the function's jax.jit for a
            # hijax program); for any other the core reads the context.
            context_in_executable=True,
            context_names=hooks["context_names"],
            pytree_flatten=hooks["pytree_flatten"],
            custom_namedtuple=hooks["custom_namedtuple"],
            fallback=jitted,
            fallback_types=hooks["fallback_types"],
            plain_types=hooks["plain_types"],
            aval_types=hooks["aval_types"],
            aval_fields=hooks["aval_fields"],
            redo_types=hooks["redo_types"],
            strip_static=True,
            jax_style_errors=True,
            lower=jitted.lower,
            trace=jitted.trace,
            eval_shape=jitted.eval_shape,
            clear_cache=self._clear_cache_hook(),
            placement_label=placement_label,
            executable_for=executable_for,
            thread_call=thread_call(_name_str(fun)),
            spec_leaf=_spec_leaf,
            spec_node=_spec_node,
            portable_placement=_portable_placement,
            restore_placement=_restore_placement,
            device_memory=_device_memory,
        )

    def _clear_cache_hook(self) -> Callable[[], None] | None:
        return None


def _name_str(fun: Any) -> str:
    """``fun``'s ``__name__`` where it is a str (jaxlib's call objects name
    themselves with it in profiles), else "jit"."""
    name = getattr(fun, "__name__", None)
    return name if isinstance(name, str) and name else "jit"


def placement_label(sharding: Any) -> str:
    """The JAX compiler's ``CompilerHooks.placement_label``: how a committed
    array's placement prints in signatures and miss explanations: the device
    ('cpu:1') of a single-device sharding, else str(sharding) (repr when
    str raises: printing a signature must not fail what it describes)."""
    devices = getattr(sharding, "_device_assignment", None)
    if type(sharding).__name__ == "SingleDeviceSharding" and devices and len(devices) == 1:
        return _safe_str(devices[0])
    return _safe_str(sharding)


def _safe_str(x: Any) -> str:
    try:
        return str(x)
    except Exception:  # noqa: BLE001
        try:
            return repr(x)
        except Exception:  # noqa: BLE001
            return f"<{type(x).__name__} object (repr failed)>"


def _spec_leaf(leaf: Any) -> Any:
    """An array leaf of a cached signature as jax.ShapeDtypeStruct: its
    dtype, shape and weak type, and its placement when it was committed
    (precompile keys a sharded spec as a committed array of that sharding)."""
    import jax

    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=leaf.weak_type, sharding=leaf.sharding)


def _spec_node(key: tuple[type, Any], children: list) -> Any:
    """A node of JAX's registry rebuilt from its (type, node data) and
    children (feature check: jaxlib's PyTreeDef.from_node_data_and_children)."""
    from jax import tree_util

    make = getattr(tree_util.PyTreeDef, "from_node_data_and_children", None)
    if make is None:
        raise TypeError("this JAX cannot rebuild a pytree node from its node data")
    leaf = tree_util.tree_structure(0)
    return tree_util.tree_unflatten(make(tree_util.default_registry, key, [leaf] * len(children)), children)


def _portable_placement(sharding: Any) -> Any:
    """A single-device placement as ("single_device", platform, device id),
    which a specs file holds (devices it does not); None for any other
    placement."""
    import jax

    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        (device,) = sharding.device_set
        return ("single_device", device.platform, device.id)
    return None


def _restore_placement(portable: Any) -> Any:
    """A placement of ``_portable_placement`` back, on this process's devices.
    Only on the default backend's platform or the CPU, which are running
    anyway: a specs file naming another platform ("tpu" on a machine that
    has one but serves from another) must not make the loading process start
    that backend."""
    import jax

    if not (type(portable) is tuple and len(portable) == 3 and portable[0] == "single_device"
            and type(portable[1]) is str and type(portable[2]) is int):
        raise ValueError(f"unknown placement {shown(portable)}: a placement is (\"single_device\", platform, "
                         "device id), as save_specs writes it")
    _, platform, device_id = portable
    running = {"cpu", jax.default_backend()}
    if platform not in running:
        raise ValueError(f"a placement on {platform!r}, which this process does not run (it runs "
                         f"{', '.join(sorted(running))}): warm it up where it was saved")
    for device in jax.devices(platform):
        if device.id == device_id:
            return jax.sharding.SingleDeviceSharding(device)
    raise ValueError(f"no {platform} device {device_id} here (devices: {jax.devices(platform)})")


def _device_memory(sharding: Any) -> int | None:
    """The bytes of memory of the device of a single-device placement (None:
    the default device), as JAX reports it (``memory_stats()``'s
    ``bytes_limit``); None where it does not (the CPU)."""
    import jax

    device = jax.devices()[0] if sharding is None else next(iter(sharding.device_set))
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - a backend without memory stats
        return None
    limit = stats.get("bytes_limit") if isinstance(stats, dict) else None
    return limit if type(limit) is int and limit > 0 else None


#: The most bytes one value of a program (an argument, a result or an
#: intermediate) may take: far more than any device holds, and far less than
#: what makes XLA abort the process compiling it (SIGABRT: on the CPU, a value
#: of 2**63 bytes, "overflow in static extent product"; on a TPU v5e, from
#: about 2**56, a failed check of its tiling). Below it, XLA compiles the
#: program or raises its own error (a TPU's "Ran out of memory ... HBM").
#: An empty value is held to it too, its nonzero dimensions alone counted:
#: XLA multiplies dimensions in whatever order it lays them out, so
#: f32[0, 2**62, 4] moved to [2**62, 4, 0] aborts it as well.
MAX_VALUE_BYTES = 2**53


def _check_values(traced: Any) -> None:
    """ValueError, naming it, if a value of the traced program takes more than
    MAX_VALUE_BYTES (an empty one: its nonzero dimensions' product, in bytes)
    or has a rank above the core's MAX_SPEC_RANK: its arguments, results and
    every intermediate, in nested programs too (a loop's body, a cond's
    branches). Linear in the program's size; nothing to check where the
    trace has no jaxpr."""
    from ._core import MAX_SPEC_RANK

    closed = getattr(traced, "jaxpr", None)
    top = getattr(closed, "jaxpr", None)
    if top is None or not hasattr(top, "eqns"):
        return
    todo = [top]
    seen: set[int] = set()
    while todo:
        jaxpr = todo.pop()
        if id(jaxpr) in seen:
            continue
        seen.add(id(jaxpr))
        for what, var in [*(("an argument", v) for v in (*jaxpr.constvars, *jaxpr.invars)),
                          *((eqn, v) for eqn in jaxpr.eqns for v in eqn.outvars)]:
            aval: Any = getattr(var, "aval", None)
            shape, itemsize = getattr(aval, "shape", None), getattr(getattr(aval, "dtype", None), "itemsize", None)
            if type(itemsize) is not int or not isinstance(shape, tuple) or not all(type(d) is int for d in shape):
                continue
            empty = 0 in shape
            size = math.prod(d for d in shape if d) * itemsize
            if size <= MAX_VALUE_BYTES and len(shape) <= MAX_SPEC_RANK:
                continue
            if not isinstance(what, str):
                result = jaxpr is top and any(var is out for out in top.outvars)
                what = f"{'the result' if result else 'a value'} of {what.primitive}"
            if len(shape) > MAX_SPEC_RANK:
                raise ValueError(f"a value of rank {len(shape)} ({what}), more than the {MAX_SPEC_RANK} ftjit "
                                 "compiles (numpy's own limit; XLA takes minutes to compile such ranks): not "
                                 "compiled. Is a shape wrong?")
            text = aval.str_short()
            took = (f"is empty, but its nonzero dimensions would take {size} bytes" if empty else
                    f"would take {size} bytes")
            raise ValueError(f"{text} ({what}) {took}, more than the {MAX_VALUE_BYTES} (8 PiB) ftjit compiles a "
                             "value of: not compiled (no device holds that much, and XLA aborts the process "
                             "compiling larger ones). Is a dimension wrong?")
        for eqn in jaxpr.eqns:
            for param in eqn.params.values():
                for sub in param if isinstance(param, (tuple, list)) else (param,):
                    sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                    if hasattr(sub, "eqns") and hasattr(sub, "invars"):
                        todo.append(sub)


def _is_high(traced: Any) -> bool:
    """Whether a ``jax.stages.Traced`` program uses hijax types (feature
    check: the jaxpr's ``is_high``, absent before hijax existed)."""
    jaxpr = getattr(getattr(traced, "jaxpr", None), "jaxpr", None)
    return bool(getattr(jaxpr, "is_high", False))


def _freeze(value: Any) -> Any:
    """A hashable stand-in equal for equal option values (containers by value, in order where they have one)."""
    if isinstance(value, (list, tuple)):
        return (type(value) is list, tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((_freeze(k), _freeze(v)) for k, v in value.items()), key=repr)))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(_freeze(v) for v in value))
    return value


class JaxCompiler(_ThroughJaxJit):
    """``compiler(fun, args, kwargs) -> executable`` backed by ``jax.jit``.

    Equal (and hashing equal) for equal options, so that two ``ftjit.jit``
    wrappers of one function share compiled entries. Executables take the
    dynamic arguments only (``strip_static``: the core strips the statics),
    and a static argument's failing ``__eq__`` raises jax.jit's ValueError
    (``jax_style_errors``): see ``hooks``.
    """

    __slots__ = ("static_argnums", "static_argnames", "jit_options")

    def __init__(
        self,
        static_argnums: tuple[int, ...] = (),
        static_argnames: tuple[str, ...] = (),
        jit_options: tuple[tuple[str, Any], ...] = (),
    ):
        self.static_argnums = tuple(static_argnums)
        self.static_argnames = tuple(static_argnames)
        self.jit_options = tuple(jit_options)

    # -- the compiler protocol --------------------------------------------
    def jit_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the ``jax.jit`` this compiler stands for."""
        return {"static_argnums": self.static_argnums, "static_argnames": self.static_argnames, **dict(self.jit_options)}

    def jax_jit(self, fun: Callable[..., Any]) -> Any:
        return jax_jit()(fun, **self.jit_kwargs())

    def bind(self, fun: Callable[..., Any], jitted: Any) -> BoundJaxCompiler:
        """This compiler for ``fun`` only, compiling through ``jitted`` (its ``jax.jit``)."""
        return BoundJaxCompiler(self, fun, jitted)


    # -- identity ----------------------------------------------------------
    def _key(self) -> tuple:
        # Lists, dicts and sets in the options (donate_argnums=[0],
        # compiler_options={...}) compare by value, so that equal options
        # hash equal and wrappers share entries.
        return (self.static_argnums, self.static_argnames, _freeze(self.jit_options))

    def __eq__(self, other: object) -> bool:
        # A subclass may compile differently and carry state (a counter):
        # its instances are equal only to themselves (unless it says
        # otherwise), never to a plain JaxCompiler, whose entries it must
        # not share. Plain ones are equal by options.
        if type(self) is not JaxCompiler:
            return other is self
        return type(other) is JaxCompiler and other._key() == self._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        if type(self) is not JaxCompiler:
            return object.__hash__(self)
        return hash((JaxCompiler, self._key()))

    def __repr__(self) -> str:
        return (
            f"JaxCompiler(static_argnums={self.static_argnums}, static_argnames={self.static_argnames}, "
            f"jit_options={dict(self.jit_options)})"
        )


class BoundJaxCompiler(_ThroughJaxJit):
    """A JaxCompiler bound to one function and to that function's one ``jax.jit``.

    ``jax.jit`` validates its options and warns (e.g. the DeprecationWarning
    for ``device=``/``backend=``) when it is created. ftjit.jit creates it
    once, at decoration as jax.jit users do, and compiles, lowers, traces and
    falls back through that same object, so warnings come once, as with
    jax.jit. Thread-safe: jax.jit objects are.
    """

    __slots__ = ("compiler", "fun", "jitted")

    def __init__(self, compiler: JaxCompiler, fun: Callable[..., Any], jitted: Any):
        self.compiler = compiler
        self.fun = fun
        self.jitted = jitted

    def jax_jit(self, fun: Callable[..., Any]) -> Any:
        return self.jitted if fun is self.fun else self.compiler.jax_jit(fun)

    def _clear_cache_hook(self) -> Callable[[], None] | None:
        return self.clear_cache

    def clear_cache(self) -> None:
        """What ``clear_cache()`` of the function's jax.jit clears: its own
        executables, and jax's trace caches for the function, so that the
        next compile traces it again (and sees changed globals), as after
        jax.jit's ``clear_cache()``. Thread-safe."""
        clear = getattr(self.jitted, "clear_cache", None)
        if callable(clear):
            clear()

    def __repr__(self) -> str:
        return f"{self.compiler!r} bound to {self.fun!r}"


# --- living inside JAX: hidden frames, jax.clear_caches() -------------------------


class JaxIntegration(NamedTuple):
    """What ``integrate()`` could hook into this JAX (each a private API of
    jax, behind a feature check; missing ones leave ftjit working, less
    invisible)."""

    #: jax's traceback-filtering boundary (``jax._src.traceback_util.api_boundary``), or the identity
    api_boundary: Callable[[Any], Any]
    #: ftjit's frames hidden from the tracebacks jax filters
    traceback_exclusion: bool
    #: ftjit's frames skipped in the source locations jax records in programs
    source_info_exclusion: bool
    #: registered with jax, so that ``jax.clear_caches()`` calls ftjit's
    #: ``clear_caches``; None if not. jax holds it weakly: keep this record.
    clear_caches_hook: ClearCachesHook | None


class ClearCachesHook:
    """Registered in jax's cache registry (``jax._src.util.register_cache``),
    which ``jax.clear_caches()`` walks, calling ``cache_clear()``: so it also
    drops every ftjit entry, as it drops every jax.jit entry. The registry
    holds its caches weakly: ftjit keeps the JaxIntegration that holds it.
    """

    __slots__ = ("clear", "__weakref__")

    def __init__(self, clear: Callable[[], None]):
        self.clear = clear

    def cache_clear(self) -> None:
        self.clear()

    def cache_info(self) -> None:
        return None

    def cache_keys(self) -> list[Any]:
        return []

    def __repr__(self) -> str:
        return "<ftjit caches>"


def _identity(fun: Any) -> Any:
    return fun


def integrate(
    package_dir: str, clear_caches: Callable[[], None], jax_modules: dict[str, Any] | None = None
) -> JaxIntegration:
    """Makes ftjit's machinery as invisible to JAX users as jax.jit's own.

    - ftjit's frames (every file under ``package_dir``) are excluded, like
      jax's, from the tracebacks jax filters (``traceback_util``) and from
      the source locations jax writes into programs (``source_info_util``);
    - ``api_boundary`` is jax's traceback boundary, for ftjit's topmost
      frames (a boundary filters the frames below it, so it must be ftjit's,
      not jax.jit's, for ftjit's frames to go);
    - ``jax.clear_caches()`` calls ``clear_caches`` (through jax's cache registry).

    Call once per process (each call registers again). ``jax_modules``
    stands in for jax's private modules (keys "traceback_util",
    "source_info_util", "util"; a missing key or attribute is a JAX without
    that API): tests use it for the fallbacks.
    """
    if jax_modules is None:
        jax_modules = {}
        for name in ("traceback_util", "source_info_util", "util"):
            try:
                jax_modules[name] = importlib.import_module(f"jax._src.{name}")
            except Exception:  # noqa: BLE001 - a JAX without it: that fallback
                pass
    tb_util = jax_modules.get("traceback_util")
    si_util = jax_modules.get("source_info_util")
    util = jax_modules.get("util")

    boundary = getattr(tb_util, "api_boundary", None)
    boundary = boundary if callable(boundary) else _identity
    traceback_exclusion = _try(getattr(tb_util, "register_exclusion", None), package_dir)
    # source_info_util matches path prefixes as text: the separator keeps
    # .../ftjit from matching a sibling .../ftjit_extras.
    source_info_exclusion = _try(getattr(si_util, "register_exclusion", None), package_dir.rstrip("/\\") + os.sep)
    hook = ClearCachesHook(clear_caches)
    registered = _try(getattr(util, "register_cache", None), hook, "ftjit.clear_caches")
    return JaxIntegration(boundary, traceback_exclusion, source_info_exclusion, hook if registered else None)


def _try(register: Any, *args: Any) -> bool:
    if not callable(register):
        return False
    try:
        register(*args)
    except Exception:  # noqa: BLE001 - a JAX whose API changed: the fallback
        return False
    return True
