"""The compiler protocol: ``compile(fun, args, kwargs) -> executable``, and
``CompilerHooks``, everything else a compiler may tell ftjit.

A compiler is a callable ``compiler(fun, args, kwargs) -> executable``. It
may also have:

* a method ``hooks(fun) -> CompilerHooks``: its hooks for one function
  (the JAX compiler's: the signature's JAX context, how JAX flattens
  pytrees, jax.jit's own path for calls ftjit must not cache, ``lower``...);
* or, for the simple case, a ``context()`` method (its value is read on
  every call and is part of the signature) and a ``context_names``
  attribute (how miss explanations name the context's items).

``jit()`` reads them once, here (``hooks_of``). Every field is checked by
one checker, the core's reader (``_core._check_hooks``): when a
``CompilerHooks`` is made, and again when ``jit()`` reads it; a wrong one is
a ``TypeError`` naming it (``CompilerHooks.fallback must be callable or
None, got 3``), at decoration, never a surprise at the first call. A hook
made of several parts is a named record (``ContextHooks``,
``RegistryFlatten``), which the core reads by field name, once, at
``jit()``.

Shared state: none (the records are immutable).
"""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Callable, ClassVar, Hashable, NamedTuple

from ._core import _check_hooks

__all__ = ["CompilerHooks", "ContextHooks", "ContextExtra", "ContextRequirement", "RegistryFlatten",
           "ThreadExecutables", "hooks_of"]


class ContextRequirement(NamedTuple):
    """``ContextHooks.requires``: the call defers (goes to
    ``CompilerHooks.fallback``, uncached) unless the item at ``position`` of
    ``context()`` is ``value`` (identity). JAX: jax_disable_jit is False."""

    position: int
    value: Any


class ContextExtra(NamedTuple):
    """``ContextHooks.extras``: ``getter(arg)``, read on every call right after
    ``context()`` and keyed with it (JAX: configs of jax.jit's own key that
    jaxlib's ``trace_context()`` leaves out, read by the C++ getter of
    ``Config.value``: one C call each)."""

    getter: Callable[[Any], Hashable]
    arg: Any


@dataclasses.dataclass(frozen=True)
class ContextHooks:
    """``CompilerHooks.context`` for a compiler that needs more than a
    ``context()``: what the core reads of the compiler's state on every call,
    and which leaves' placements it keys on (the JAX compiler's).

    The core reads every field once, at ``jit()``, by name; a wrong one is a
    TypeError naming it (``CompilerHooks.context.probe must be callable or
    None, got 3``). On a call, only ``context()``, ``probe(probe_arg)`` and
    the extras' getters run (JAX: C++ functions of jaxlib, on its fast path).
    Every field is optional.
    """

    #: ``() -> hashable``: part of the signature, as ``CompilerHooks.context``
    #: alone would be. None: no context (placements may still be keyed).
    context: Callable[[], Hashable] | None = None
    #: ``probe(probe_arg) is probe_ok`` (identity) unless the call must defer:
    #: checked first, before the arguments are looked at (JAX: a trace is
    #: active in this thread, so closed-over tracers could reach a cached
    #: compile). None: never defers.
    probe: Callable[[Any], Any] | None = None
    probe_arg: Any = None
    probe_ok: Any = None
    #: Items ``context()`` must hold for the call to be cached (a tuple
    #: context; at most 8). Needs ``context``.
    requires: tuple[ContextRequirement, ...] = ()
    #: Array types (subclasses included) whose placement counts: when
    #: ``getattr(leaf, committed_attr)`` is true, ``getattr(leaf,
    #: sharding_attr)`` is part of the leaf's signature (hashed, compared with
    #: ``__eq__``), as jax.jit keys a committed array. Both names are needed
    #: with types.
    committed_types: tuple[type, ...] = ()
    committed_attr: str | None = None
    sharding_attr: str | None = None
    #: Context parts read after ``context()`` (at most 8; needs ``context``):
    #: the signature's context is then ``context()``'s items (or its value)
    #: followed by each extra's value, one tuple.
    extras: tuple[ContextExtra, ...] = ()
    #: Exact types of argument specs (jax.ShapeDtypeStruct) whose ``sharding``,
    #: when not None, is keyed as a committed array's placement, so that
    #: ``precompile`` of a sharded spec makes the entry its arrays hit.
    spec_types: tuple[type, ...] = ()
    #: Positions of ``context()``'s items (a tuple context; needs ``context``)
    #: that select no entry: read (``requires`` may name one), but left out
    #: of the signature, so that a change of one alone reuses what was
    #: compiled before it, in every thread (JAX: the configs of its trace
    #: context that jax.jit's own key leaves out). A call that misses for
    #: another reason compiles under their values then.
    unkeyed: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class RegistryFlatten:
    """``CompilerHooks.pytree_flatten`` for a compiler whose pytree registry
    flattens one level in C (JAX's ``default_registry.flatten_one_level``):
    the core calls it directly for each node that is not a builtin container,
    and keys the node on ``(type(obj), node data)``.

    Read once, at ``jit()``, by name; a wrong field is a TypeError naming it.
    """

    #: ``obj -> None`` (a leaf) or ``(children, node data)``.
    flatten_one_level: Callable[[Any], Any]
    #: ``leaf -> bool``: true when a leaf that is no array must take
    #: ``CompilerHooks.fallback`` (JAX: a hijax value, a token); asked only
    #: before such a leaf is reported unsupported.
    defer_leaf: Callable[[Any], bool]


class ThreadExecutables(NamedTuple):
    """What ``CompilerHooks.executable_for`` may return instead of
    ``(executable, takes_leaves)``: executables that the core makes one per
    thread, and that check the compiler's context themselves (jaxlib's C++
    call of a compiled program checks JAX's configs, as jax.jit's does).

    ``make(miss, eager) -> executable`` makes one. The core calls it lazily,
    in the thread that will use it: one per thread index and signature (any
    number of threads), kept in that index's slot of the signature's entry,
    so that one function's calls in many threads share no lock and no
    reference count. A copy goes with its entry (an eviction,
    ``clear_cache()``), not with its thread: the next thread that takes the
    index (the lowest free) calls it, instead of paying a new copy's first
    call; so the copies of a signature are at most the most threads alive at
    once (docs/design.md, "Memory bound"). A forked child keeps none but the
    forking thread's. The executable must call ``miss(*args, **kwargs)`` with its own
    arguments for every call it cannot serve from what it cached (a context
    it has not seen: its first call, a config changed), and return the
    outputs of the ``(outputs, cache_data, drop)`` it gets back, caching
    ``cache_data`` under that context unless ``drop``; and it must return
    ``eager(*args, **kwargs)`` instead of running while the compiler's
    eager mode is on (``jax.disable_jit()``).

    ``own_miss(*args, **kwargs) -> (outputs, cache_data, drop)`` runs the
    compiled program: the core's ``miss`` returns it for the signature's own
    context, and for any other context resolves (or compiles) that
    context's signature and returns its outputs with ``drop``.
    ``takes_leaves``: as in ``executable_for``'s pair.
    """

    make: Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]
    own_miss: Callable[..., Any]
    takes_leaves: bool


@dataclasses.dataclass(frozen=True)
class CompilerHooks:
    """What a compiler tells ftjit beyond ``compile(fun, args, kwargs)``.

    Every field is optional. Immutable; checked when made, by the core's
    reader (the check ``jit()`` runs again).
    """

    #: ``() -> hashable``: read on every call, part of the signature (state
    #: outside the arguments that changes what the compiler makes: a mode, a
    #: precision). Or a ``ContextHooks``: the context plus a probe that defers
    #: a call, required items, committed placements (the JAX compiler's).
    context: ContextHooks | Callable[[], Hashable] | None = None
    #: How miss explanations name the context's items: shaped as ``context()``
    #: is (a str names a whole item, a tuple names a tuple item by item), or a
    #: callable returning that, read when an explanation is written.
    context_names: Any = None
    #: How pytree nodes other than tuple/list/dict/None/namedtuple flatten:
    #: ``obj -> None`` (a leaf), ``False`` (only the compiler can take it:
    #: the call goes to ``fallback``), or ``(node_key, children)``. Or a
    #: ``RegistryFlatten``: a registry the core calls in C (JAX's).
    pytree_flatten: RegistryFlatten | Callable[[Any], Any] | None = None
    #: ``type -> bool``: whether a namedtuple type is registered as a custom
    #: node of ``pytree_flatten``'s registry (flattened by it, not as a tuple).
    custom_namedtuple: Callable[[type], bool] | None = None
    #: Called as the function itself for calls that must not be cached (an
    #: argument of ``fallback_types``, an active trace) and after an
    #: executable raised one of ``redo_types``.
    fallback: Callable[..., Any] | None = None
    #: Leaves of these types send the call to ``fallback`` (JAX tracers).
    fallback_types: tuple[type, ...] = ()
    #: Exact array types that are never in ``fallback_types`` (a fast path).
    plain_types: tuple[type, ...] = ()
    #: Exact array types whose dtype, shape and weak type are read from ``.aval``.
    aval_types: tuple[type, ...] = ()
    #: Of ``aval_types``, those whose ``aval`` is a plain property that only
    #: returns an object the instance holds in one slot of its fixed layout
    #: (jax Arrays: a C++ getter over a field; never a getter that computes,
    #: memoises or chooses its value). The core then finds that slot (eight
    #: getter calls whose result sat there, and nowhere else in the instance)
    #: and reads it instead of calling: in place on a GIL build; on a
    #: free-threaded one, compared with the avals the thread read lately,
    #: the getter still called for a new one. ``JitFunction._avals_read_in_place()``
    #: says which types it found the slot of.
    aval_fields: tuple[type, ...] = ()
    #: Exceptions of an executable after which the call is made again
    #: through ``fallback`` (JAX: a NaN found under jax_debug_nans).
    redo_types: tuple[type[BaseException], ...] = ()
    #: Executables take the dynamic arguments only (statics stripped).
    strip_static: bool = False
    #: ``(compiled, args, kwargs, leaves) -> (executable, takes_leaves)``,
    #: asked once per compiled signature with what the compiler returned,
    #: the dynamic arguments and the call's leaves as ftjit flattened them
    #: (the positional arguments, then the keyword ones sorted by name, each
    #: depth-first: dict values by sorted key, a node's children in
    #: ``pytree_flatten``'s order; statics left out): the executable every
    #: call of that signature then calls, with that call's leaves alone when
    #: ``takes_leaves`` (the arguments are flattened once, by ftjit), else
    #: with its arguments. The JAX compiler's: jaxlib's C++ call of the
    #: compiled program, rebuilt for flat leaves when JAX's own leaves of
    #: the arguments are exactly these.
    #: It may instead return ``ThreadExecutables`` (see there).
    executable_for: Callable[[Any, tuple, dict, tuple], tuple[Callable[..., Any], bool] | ThreadExecutables] | None = None
    #: The executables check the context themselves: every call is keyed on
    #: its arguments alone until one misses, and only then is ``context``
    #: read (with its probe and ``requires``) and the signature completed.
    #: Executables that are not ``ThreadExecutables`` are checked by the core
    #: (it reads the context for them), so each call checks the context
    #: once, in the executable or in the core. Needs ``executable_for``.
    context_in_executable: bool = False
    #: ``(miss, eager, static_argnums, static_argnames, capacity) -> call
    #: object``: one call object of the whole function per thread, which
    #: keys and caches signatures itself (``capacity`` at most: the
    #: function's ``max_signatures``, else its cache's capacity) and is
    #: called with a call's own arguments;
    #: then a hit is one call into it, and the store is its second level.
    #: It calls ``miss(*args, **kwargs)`` for a call it holds nothing for,
    #: which returns ``(outputs, cache data or None, drop)`` (from the
    #: entry's ``ThreadExecutables.own_miss``), and ``eager`` as
    #: ``ThreadExecutables`` copies do; ``make`` may return None (this
    #: thread's calls then take the store's path). The JAX compiler's: jaxlib's C++
    #: call (``_jax.pjit``) with jax.jit's static positions and names. Needs
    #: ``context_in_executable``; the core calls it lazily in the thread
    #: that will use it, replaces it after ``clear_cache()``, and leaves a
    #: function with negative ``static_argnums`` on the store's path
    #: (docs/design.md, "One dispatch per hit").
    thread_call: Callable[[Callable[..., Any], Callable[..., Any], tuple, tuple, int],
                          Callable[..., Any] | None] | None = None
    #: Errors in jax.jit's words (a static argument's failing ``__eq__``).
    jax_style_errors: bool = False
    #: The fields that JitFunction's methods of the same names call: the core
    #: reads each once, at ``jit()`` (``JitState::method_hooks``).
    METHOD_HOOKS: ClassVar[tuple[str, ...]] = ("lower", "trace", "eval_shape", "clear_cache")
    #: ``(*args, **kwargs) -> object`` for ``JitFunction.lower``,
    #: ``.trace`` and ``.eval_shape`` (the JAX compiler's: jax.jit's own).
    lower: Callable[..., Any] | None = None
    trace: Callable[..., Any] | None = None
    eval_shape: Callable[..., Any] | None = None
    #: ``() -> None``, run first by ``JitFunction.clear_cache()``: the
    #: compiler's own caches of this function (JAX: its trace caches).
    clear_cache: Callable[[], Any] | None = None
    #: ``sharding -> str``: how a committed placement prints in signatures.
    placement_label: Callable[[Any], str] | None = None
    #: Rebuilding cached signatures as warm-up specs (``warmup_specs``,
    #: ``save_specs``): ``spec_leaf(leaf)`` makes an array spec from an
    #: ftjit._signature.Leaf (JAX: a jax.ShapeDtypeStruct; without it, an
    #: ftjit._specs.ArraySpec); ``spec_node((type, node data), children)``
    #: rebuilds a node of the compiler's registry.
    spec_leaf: Callable[[Any], Any] | None = None
    spec_node: Callable[[Any, list], Any] | None = None
    #: A placement as a specs file holds it (a value of the file's format:
    #: None, bool, int, float, str, bytes, tuples and lists of them; None:
    #: it cannot be saved), and back (``restore_placement`` gets that value
    #: as read from a file, which may be anything of those: it raises for
    #: one it does not know, and the spec is reported, not warmed up).
    portable_placement: Callable[[Any], Any] | None = None
    restore_placement: Callable[[Any], Any] | None = None
    #: ``placement -> int | None``: the bytes of memory of the device a
    #: restored placement is on (None: the default device), or None where
    #: unknown (JAX: ``memory_stats()``'s ``bytes_limit``). A spec read from
    #: a file whose arrays take more on one device (or, where unknown, more
    #: than ftjit._specs_format.MAX_SPEC_BYTES) is refused before anything
    #: is traced.
    device_memory: Callable[[Any], int | None] | None = None
    #: The fields only ftjit's Python layer calls (warm-up specs, specs
    #: files): the core checks them with the rest (callable or None).
    PYTHON_HOOKS: ClassVar[tuple[str, ...]] = ("spec_leaf", "spec_node", "portable_placement", "restore_placement",
                                               "device_memory")

    def __post_init__(self) -> None:
        # Sequences of types are kept as tuples (a frozen record's); what is no
        # sequence is left for the check to name.
        for name in ("fallback_types", "plain_types", "aval_types", "aval_fields", "redo_types"):
            value = getattr(self, name)
            if type(value) is not tuple and isinstance(value, collections.abc.Iterable):
                object.__setattr__(self, name, tuple(value))
        # The one check of every field: the core's reader, which jit() runs
        # again on what it keeps; a wrong field is a TypeError naming it.
        _check_hooks(self)


def hooks_of(compiler: Any, fun: Callable[..., Any]) -> CompilerHooks:
    """The hooks of ``compiler`` for ``fun`` (see the module docstring);
    a TypeError names the hook that is wrong."""
    make = getattr(compiler, "hooks", None)
    if make is None:
        return CompilerHooks(context=getattr(compiler, "context", None),
                             context_names=getattr(compiler, "context_names", None))
    if not callable(make):
        raise TypeError(f"the compiler's 'hooks' must be a method hooks(fun) -> ftjit.CompilerHooks, got {make!r}")
    hooks = make(fun)
    if not isinstance(hooks, CompilerHooks):
        raise TypeError(f"{compiler!r}.hooks(fun) must return an ftjit.CompilerHooks, got {hooks!r}")
    return hooks
