"""The JAX compiler's signature hooks: what the core keys a call on, as jax.jit does.

Every config that changes tracing is part of the signature (jaxlib's
trace_context(), plus the configs of jax.jit's own key it leaves out); a
call made while a JAX trace is active or while ``jax.disable_jit()`` is on
goes to jax.jit itself, uncached; a committed jax Array's placement is part
of its leaf signature; pytrees are flattened by JAX's registry, in C. Each
private API of JAX used here sits behind a feature check with a public
fallback (build_hooks(fast) builds them without each, to prove it).

Shared state and what guards it:

| _hooks | built once under _hooks_lock, then only read |

Lock order: _hooks_lock is taken before the import lock (building the hooks
imports jax) and never while holding any other lock of ftjit's.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import operator
import threading
import warnings
from typing import Any, Callable

import numpy as np

from ._hooks import ContextExtra, ContextHooks, ContextRequirement, RegistryFlatten

# The configs that change tracing, read through the public jax.config when
# jax's private trace_context() is missing (the ones this JAX lacks are
# skipped): every config of trace_context_names() that jax.config can read
# (tests check the list against the installed JAX), and a few older ones.
# jax_disable_jit must stay: the core defers to jax.jit when it is on. What
# jax.config cannot read (the mesh, axis-env, compute_on and xla_metadata
# context managers; user_context) the public fallback cannot key on.
PUBLIC_CONTEXT_NAMES = (
    "jax_enable_x64",
    "jax_default_device",
    "jax_disable_jit",
    "jax_numpy_dtype_promotion",
    "jax_numpy_rank_promotion",
    "jax_default_matmul_precision",
    "jax_explicit_x64_dtypes",
    "jax_debug_key_reuse",
    "jax_threefry_partitionable",
    "jax_softmax_custom_jvp",
    "jax_check_static_indices",
    "jax_use_shardy_partitioner",
    "jax_enable_custom_prng",
    "jax_default_prng_impl",
    "jax_optimization_level",
    "jax_memory_fitting_level",
    "jax_random_seed_offset",
    "jax_threefry_gpu_kernel_lowering",
    "jax_scan3",
    "jax_remat3",
    "jax_custom_vjp3",
    "jax_use_direct_linearize",
    "jax_use_simplified_jaxpr_constants",
    "jax_embedded_constants_max_bytes",
    "jax_remove_size_one_mesh_axis_from_type",
    "check_vma",
    "jax_hlo_source_file_canonicalization_regex",
    "jax_enable_pgle",
    "jax_pgle_profiling_runs",
    "jax_error_checking_behavior_nan",
    "jax_error_checking_behavior_divide",
    "jax_error_checking_behavior_oob",
    "jax_auto_pcast",
    "jax_allow_f16_reductions",
    "jax_use_emit_pipeline_primitive",
    "eager_constant_folding",
    "jax_no_execution",
    "jax_mutable_array_checks",
    "jax_xla_profile_version",
    "jax_high_dynamic_range_gumbel",
    "jax_ragged_dot_use_gpu_pallas_triton_lowering",
    "jax_pallas_enable_debug_checks",
    "jax_pallas_use_mosaic_gpu",
    # jax 0.12
    "jax_use_hlo_logistic_lowering",
    "jax_raise_on_ppermute_sort_diff",
    "jax_custom_jvp3",
    "jax_remat_barrier_no_cotangents",
    "jax_accurate_erf_inv",
    # jax 0.12.1
    "jax_random_normal_mode",
    "jax_legacy_random_uniform",
    "jax_tanh_sech_jvp",
    "jax_accurate_logistic",
    "jax_accurate_default_erfc",
    "jax_partitioning",
    # in jax.jit's key, not in trace_context() (JIT_KEY_EXTRA_CONFIGS_IF_PRESENT)
    "jax_pallas_auto_assign_collective_ids",
    "jax_pallas_auto_assign_collective_ids_limit",
)

# Configs in jax.jit's own cache key (jaxlib's JitConfigs) that trace_context()
# leaves out, so the core keys on them as extra context parts: the concrete
# mesh of jax.set_mesh (it places outputs and sharding constraints) and two
# compiler options; and, in the JAX releases that have them (0.11 on), the
# collective ids Pallas assigns. Names in jax._src.config.
JIT_KEY_EXTRA_CONFIGS = ("device_context", "optimization_level", "memory_fitting_level")
JIT_KEY_EXTRA_CONFIGS_IF_PRESENT = (
    "jax_pallas_auto_assign_collective_ids",  # jax 0.11
    "jax_pallas_auto_assign_collective_ids_limit",  # jax 0.11.2
)
# Where jax keeps them (device_context moved from config to mesh in jax 0.11).
_EXTRA_CONFIG_MODULES = ("jax._src.config", "jax._src.mesh")

# Configs in trace_context() that jax.jit's cache key leaves out, each with
# the first JAX release whose key holds it (None: none checked does), checked
# for every release from 0.10.2 to NEWEST_CHECKED_JAX (tests/test_jax_copies.py
# lists them against the running JAX). They are the context's unkeyed items
# (ContextHooks.unkeyed): a change of one of these alone selects the entry
# compiled before it, in every thread, exactly as with jax.jit: what is
# compiled keeps the value it was traced with. (jax_disable_jit is checked by
# jaxlib's call itself, and by the core's `requires`: ftjit then calls the
# function's jax.jit, which runs it eagerly.) A signature that misses for
# another reason compiles under their values then.
#
# Leaving out a config that jax.jit keys on would be the bug of issue 40's
# finding 2 (a program that depends on the thread), so a JAX newer than
# NEWEST_CHECKED_JAX leaves out none but jax_disable_jit: it keys on the rest,
# and recompiles where such a jax.jit might not.
TRACE_CONTEXT_NOT_IN_JIT_KEY: dict[str, tuple[int, ...] | None] = {
    "jax_disable_jit": None,
    "jax_high_dynamic_range_gumbel": (0, 12, 1),
    "jax_hlo_source_file_canonicalization_regex": None,
    "jax_mutable_array_checks": None,
}
NEWEST_CHECKED_JAX = (0, 12, 1)


def unkeyed_names(version: tuple[int, ...]) -> frozenset[str]:
    """The configs of TRACE_CONTEXT_NOT_IN_JIT_KEY that the key of jax.jit
    leaves out in JAX ``version`` (its release numbers, as jax.__version_info__)."""
    if version[:3] > NEWEST_CHECKED_JAX:
        return frozenset({"jax_disable_jit"})
    return frozenset(n for n, keyed_from in TRACE_CONTEXT_NOT_IN_JIT_KEY.items()
                     if keyed_from is None or version[:3] < keyed_from)


def _jax_version() -> tuple[int, ...]:
    """The running JAX's release numbers ("0.12.0.1" -> (0, 12, 0, 1); a
    development tail such as ".dev20261201" is dropped)."""
    import jax

    numbers = []
    for part in str(jax.__version__).split("."):
        digits = part[: len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        numbers.append(int(digits))
        if digits != part:
            break
    return tuple(numbers)


_hooks_lock = threading.Lock()
_hooks: dict[str, Any] | None = None  # guarded by _hooks_lock; built once


def _jax_hooks() -> dict[str, Any]:
    """The JAX-specific hooks the C++ core uses, built once (imports jax)."""
    global _hooks
    with _hooks_lock:
        if _hooks is None:
            _hooks = build_hooks()
        return _hooks


#: The fast paths build_hooks() may use, each behind its feature check:
#: "array_type" (the concrete jax Array class, for exact-type fast paths) and
#: four private APIs of jax: "context" (jaxlib's trace_context), "probe"
#: (jax._src.core.trace_state), "placement" (Array._committed/_sharding),
#: "aval" (dtype/shape/weak_type read from Array.aval), "registry" (which
#: namedtuple types are registered as custom pytree nodes).
FAST_PATHS = frozenset({"array_type", "context", "probe", "placement", "aval", "registry"})


def build_hooks(fast: frozenset[str] = FAST_PATHS) -> dict[str, Any]:
    """Builds the hooks, using the fast paths named in ``fast`` when their
    feature checks pass, and jax's public API otherwise (slower, same
    answers: tests build the hooks without each fast path to prove it).

    Safe to run inside a JAX trace (e.g. when the first ftjit.jit is created
    inside a jax.jit-traced function): nothing here depends on the trace
    active at the time.
    """
    import jax
    from jax import tree_util

    is_hijax = _hijax_check()
    token_type = _token_type()

    def pytree_flatten(obj: Any) -> tuple[Any, list[Any]] | bool | None:
        """One level of JAX's registry: (treedef, children); None for a leaf;
        False for a hijax value (a jax Box, a flax nnx hijax Variable), whose
        calls go to jax.jit (it abstracts such values with their current
        contents, which no signature of ftjit's can key)."""
        children, treedef = tree_util.tree_flatten(obj, is_leaf=lambda x: x is not obj)
        if treedef.num_nodes == 1 and treedef.num_leaves == 1:
            # Tokens (jax.lax.create_token()) are valid leaves without a
            # dtype: their calls go to jax.jit too.
            return False if is_hijax(obj) or (token_type is not None and type(obj) is token_type) else None
        return treedef, children

    array_type = concrete_array_type() if "array_type" in fast else None
    found = _private_context() if "context" in fast else None
    context, names = found if found is not None else _public_context()
    probe: tuple[Any, Any, Any] = (_private_trace_probe() if "probe" in fast else None) or _public_trace_probe()
    if probe[0] is None:
        # No way to see an active trace: closed-over tracers could not be told
        # from a top-level call, so every call goes through jax.jit.
        warnings.warn(
            "ftjit: this JAX has no API ftjit knows for detecting an active trace; every call of a "
            "function jitted with the JAX compiler goes through jax.jit (correct, not cached by ftjit)",
            RuntimeWarning,
            stacklevel=2,
        )
        probe = (_never_outside_a_trace, None, True)
    placement = ("placement" in fast and _private_placement_attrs(array_type)) or ("committed", "sharding")
    aval = array_type is not None and "aval" in fast and _has_aval(array_type)
    extras = (_private_context_extras() if "context" in fast else None) or _public_context_extras()

    probe_fn, probe_arg, probe_ok = probe
    unkeyed = unkeyed_names(_jax_version())
    committed_attr, sharding_attr = placement
    return {
        # Shaped as the core keys the context (its items, then the extras), for miss explanations.
        "context_names": _context_names_fn(names if found is None else None, tuple(_extra_name(e.arg) for e in extras)),
        # Read by the core on every call, so its fields are plain objects: no
        # Python code runs on a hit but context() and probe(probe_arg), both
        # C++ functions of jaxlib on the private fast path.
        "context_hooks": ContextHooks(
            context=context,
            probe=probe_fn,
            probe_arg=probe_arg,
            probe_ok=probe_ok,
            # Defer while jit is disabled (jax.jit then runs the function eagerly).
            requires=(ContextRequirement(names.index("jax_disable_jit"), False),),
            # Without the concrete class, its public base (a subclass check).
            committed_types=(array_type,) if array_type is not None else (jax.Array,)
            if isinstance(jax.Array, type) else (),
            committed_attr=committed_attr,
            sharding_attr=sharding_attr,
            extras=extras,
            spec_types=(jax.ShapeDtypeStruct,) if isinstance(jax.ShapeDtypeStruct, type) else (),
            # What jax.jit's key leaves out selects no entry here either: the
            # same program in every thread, until a miss for another reason.
            unkeyed=tuple(i for i, name in enumerate(names) if name in unkeyed),
        ),
        # With the registry's own one-level flatten (C++, called directly by
        # the core), a custom node costs what it costs jax.jit; the hook above
        # is the public fallback.
        "pytree_flatten": _pytree_hook(fast, pytree_flatten, is_hijax, token_type),
        "redo_types": _debug_nans_error(),
        "custom_namedtuple": (_private_custom_namedtuple() if "registry" in fast else None) or _every_namedtuple,
        "fallback_types": (jax.core.Tracer,),
        "plain_types": (array_type, np.ndarray) if array_type is not None else (np.ndarray,),
        "aval_types": (array_type,) if aval else (),
        # jaxlib's ArrayImpl.aval is a C++ getter over the array's own field.
        "aval_fields": (array_type,) if aval else (),
    }


def _context_names_fn(fixed: tuple[str, ...] | None, extra_names: tuple[str, ...]) -> Callable[[], Any]:
    """The names of the context's items, read when a miss is explained:
    jaxlib's trace context grows when a module defining more configs is
    imported (Pallas does), so its names are read afresh (``fixed``: the
    public fallback's, which do not change)."""

    def context_names() -> Any:
        if fixed is not None:
            names: Any = fixed
        else:
            from jax._src import config as jax_config

            read = jax_config.config_ext.trace_context_names
            names = tuple(read() if callable(read) else read)
        # Shaped as the core keys the context: its items, then the extras.
        return (*names, *extra_names)

    return context_names


def _extra_name(config: Any) -> str:
    """How an explanation names an extra context item (see JIT_KEY_EXTRA_CONFIGS)."""
    name = getattr(config, "name", None)
    return name if isinstance(name, str) else "jax.sharding.get_mesh()"


def _debug_nans_error() -> tuple[type[BaseException], ...]:
    """Feature check: the exception a compiled program raises when
    ``jax_debug_nans``/``jax_debug_infs`` finds an invalid value in its
    output (``jax._src.api_util.InternalFloatingPointError``, which jax.jit
    turns into a FloatingPointError naming the op). Without it, none: the
    executable's own error propagates."""
    try:
        from jax._src import api_util

        error = api_util.InternalFloatingPointError
        if isinstance(error, type) and issubclass(error, Exception) and not issubclass(error, FloatingPointError):
            return (error,)
    except Exception:  # noqa: BLE001
        pass
    return ()


def _every_namedtuple(_: type) -> bool:
    """Public fallback of _private_custom_namedtuple: every namedtuple goes
    through JAX's registry (pytree_flatten), which knows its registrations."""
    return True


def _private_custom_namedtuple() -> Callable[[type], bool] | None:
    """Feature check: ``jax._src.tree_util._registry`` (the pytree node types
    registered through jax.tree_util, builtins included): its C
    ``__contains__`` tells the core which namedtuple types JAX flattens
    with their registration instead of as namedtuples."""
    try:
        from collections import namedtuple

        from jax._src import tree_util as jax_tree_util

        registry = jax_tree_util._registry
        probe = namedtuple("probe", "a")
        if not (type(registry) is dict and tuple in registry and list in registry and probe not in registry):
            return None
        return registry.__contains__
    except Exception:  # noqa: BLE001 - a JAX without it: the public fallback
        return None




def _at_top_level(fn: Callable[[], Any]) -> Any:
    """``fn()`` run where JAX evaluates eagerly, whatever trace is active in
    this thread: in a fresh thread (JAX's trace state is per thread, and a new
    thread starts at the eval trace). Returns its result or raises its error.

    Only JAX's public behaviour is relied on: its own context managers for
    this changed meaning across releases (``take_current_trace()`` gave the
    eval trace up to jax 0.10 and no trace at all from 0.12)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box.append((False, exc))

    worker = threading.Thread(target=run, name="ftjit-feature-check", daemon=True)
    worker.start()
    worker.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def concrete_array_type() -> type | None:
    """The concrete class of jax Arrays (never a Tracer class), or None.

    Found by name (``jax._src.array.ArrayImpl``, behind this check), not by
    making an array: building the hooks happens when the first function is
    decorated, and nothing may touch a device before the first call (making
    an array starts the XLA backend, after which ``jax_num_cpu_devices``,
    ``jax.distributed.initialize()`` and XLA_FLAGS can no longer take effect).
    """
    import jax

    try:
        from jax._src import array as jax_array

        array_type = jax_array.ArrayImpl
    except Exception:  # noqa: BLE001 - a JAX without it: the slower generic path
        return None
    if not isinstance(array_type, type) or issubclass(array_type, jax.core.Tracer) or not issubclass(
            array_type, jax.Array):
        return None
    return array_type


def _private_context() -> tuple[Callable[[], Any], tuple[str, ...]] | None:
    """Feature check: jaxlib's trace_context() (C++: every config that changes
    tracing, thread-local overrides included) and the names of its items."""
    try:
        from jax._src import config as jax_config

        context = jax_config.trace_context
        names = jax_config.config_ext.trace_context_names
        names = tuple(names() if callable(names) else names)
        value = context()
        index = names.index("jax_disable_jit")
        import jax

        if not (
            isinstance(value, tuple)
            and len(value) == len(names)
            and type(value[index]) is bool
            and value[index] == bool(jax.config.jax_disable_jit)  # type: ignore[attr-defined]
        ):
            return None
        hash(value)
        return context, names
    except Exception:  # noqa: BLE001 - a JAX without it: the public fallback
        return None


def _private_context_extras() -> tuple[ContextExtra, ...] | None:
    """Feature check: the configs of JIT_KEY_EXTRA_CONFIGS as jaxlib Config
    objects, each read by the C++ getter of ``Config.value`` (one C call)."""
    try:
        from jax._src import config as jax_config

        base = jax_config.config_ext.Config
        fget = base.value.fget
        modules = []
        for module_name in _EXTRA_CONFIG_MODULES:
            try:
                modules.append(importlib.import_module(module_name))
            except ImportError:
                pass

        def find(name: str) -> Any:
            config = next((c for m in modules if isinstance(c := getattr(m, name, None), base)), None)
            return config if config is not None and fget(config) is config.value else None

        extras = [ContextExtra(fget, c) for c in map(find, JIT_KEY_EXTRA_CONFIGS) if c is not None]
        if len(extras) != len(JIT_KEY_EXTRA_CONFIGS):
            return None
        return tuple(extras) + tuple(ContextExtra(fget, c) for c in map(find, JIT_KEY_EXTRA_CONFIGS_IF_PRESENT)
                                     if c is not None)
    except Exception:  # noqa: BLE001 - a JAX without them: the public fallback
        return None


def _public_context_extras() -> tuple[ContextExtra, ...]:
    """The concrete mesh through the public ``jax.sharding.get_mesh()`` (the
    two compiler options are in PUBLIC_CONTEXT_NAMES). ``get_mesh`` refuses to
    run inside a trace, where the probe has already deferred the call; without
    it (an older JAX), no extra."""
    try:
        import jax

        get_mesh = jax.sharding.get_mesh
    except Exception:  # noqa: BLE001
        return ()
    if not callable(get_mesh):
        return ()
    # Not called here: inside a trace it raises, and the hooks are built once
    # per process, possibly by a jit() created inside a trace.

    def concrete_mesh(_: Any) -> Any:
        try:
            return get_mesh()
        except Exception:  # noqa: BLE001 - ValueError inside a trace (the call defers anyway); a JAX whose get_mesh fails otherwise: no mesh key, as before
            return None

    return (ContextExtra(concrete_mesh, None),)


def _public_context() -> tuple[Callable[[], Any], tuple[str, ...]]:
    """The configs of PUBLIC_CONTEXT_NAMES read through ``jax.config``: a
    partial of an ``operator.attrgetter`` (C code, no Python frame)."""
    import jax

    names = tuple(n for n in PUBLIC_CONTEXT_NAMES if _readable(jax.config, n))
    if len(names) < 2:  # attrgetter of one name returns the value, not a tuple
        raise RuntimeError(f"ftjit: this JAX lacks the public configs {PUBLIC_CONTEXT_NAMES}")
    return functools.partial(operator.attrgetter(*names), jax.config), names


def _readable(config: Any, name: str) -> bool:
    try:
        getattr(config, name)
        return True
    except Exception:  # noqa: BLE001
        return False


def _private_trace_probe() -> tuple[Callable[[Any], Any], Any, Any] | None:
    """Feature check: ``fget(trace_state) is eval_weakref`` unless a trace is active.

    ``jax._src.core.trace_state`` is the jaxlib config holding (a weak
    reference to) this thread's current trace; its ``value`` getter is C++,
    so the probe costs one C call on the hot path. Verified here both ways:
    the eval value at top level and a different one inside a trace.
    """
    try:
        import jax
        from jax._src import core

        state = core.trace_state
        fget = type(state).value.fget
        eval_ref = core.eval_trace._weakref
        at_top = _at_top_level(lambda: fget(state) is eval_ref)
        seen: list[bool] = []

        def body(x: Any) -> Any:
            seen.append(fget(state) is eval_ref)
            return x

        jax.make_jaxpr(body)(np.float32(0))
        if at_top and seen == [False]:
            return fget, state, eval_ref
    except Exception:  # noqa: BLE001 - a JAX without it: the public fallback
        pass
    return None


def _never_outside_a_trace(_: Any) -> bool:
    """The probe when none is found: always "maybe in a trace", so every call defers."""
    return False


def _public_trace_probe() -> tuple[Callable[[Any], Any] | None, Any, Any]:
    """``jax.extend.core.get_opaque_trace_state()`` compared with the eval
    trace's (public API, slower: a Python call and an __eq__ per call).

    Without it (a JAX that has neither this nor the private probe),
    build_hooks() makes every call defer to jax.jit.
    """
    try:
        from jax.extend import core as jex_core

        eval_state = _at_top_level(jex_core.get_opaque_trace_state)
    except Exception:  # noqa: BLE001
        return None, None, None

    def not_tracing(_: Any) -> bool:
        return jex_core.get_opaque_trace_state() == eval_state

    return not_tracing, None, True


def _private_placement_attrs(array_type: type | None) -> tuple[str, str] | None:
    """Feature check: jax Arrays' C++ ``_committed``/``_sharding`` properties
    (the public ``committed``/``sharding`` are Python properties over them),
    looked up on the class (no array is made: see concrete_array_type)."""
    if array_type is None:
        return None
    names = ("_committed", "_sharding", "committed", "sharding")
    if all(inspect.isdatadescriptor(inspect.getattr_static(array_type, n, None)) for n in names):
        return "_committed", "_sharding"
    return None


def _has_aval(array_type: type) -> bool:
    """Feature check: jax Arrays expose ``.aval`` (with plain dtype, shape and
    weak_type: jax's contract for an Array's abstract value), looked up on
    the class (no array is made: see concrete_array_type)."""
    return inspect.isdatadescriptor(inspect.getattr_static(array_type, "aval", None))



def _pytree_hook(fast: frozenset[str], public: Callable[[Any], Any], is_hijax: Callable[[Any], bool],
                 token_type: type | None) -> RegistryFlatten | Callable[[Any], Any]:
    """The core's pytree hook: with the "registry" fast path, a
    RegistryFlatten (JAX's ``default_registry.flatten_one_level``, which the
    core calls in C for each node that is not a builtin container, and a
    predicate for leaves that only jax.jit takes: hijax values and tokens);
    else the public Python hook ``public``."""
    if "registry" in fast:
        try:
            from jax import tree_util

            flatten_one_level = tree_util.default_registry.flatten_one_level
            if flatten_one_level(1.0) is None and flatten_one_level({"a": 1})[0] == (1,):
                def defer(leaf: Any) -> bool:
                    return is_hijax(leaf) or (token_type is not None and type(leaf) is token_type)

                return RegistryFlatten(flatten_one_level, defer)
        except Exception:  # noqa: BLE001 - a JAX without it: the public hook
            pass
    return public


def _token_type() -> type | None:
    """Feature check: the class of JAX tokens (``jax._src.core.Token``), or None."""
    try:
        from jax._src import core as jax_core

        token = jax_core.Token
        return token if isinstance(token, type) else None
    except Exception:  # noqa: BLE001
        return None


def _hijax_check() -> Callable[[Any], bool]:
    """Feature check: whether an object is a hijax value (its type registered
    in ``jax._src.core.pytype_aval_mappings`` with a hijax abstract type,
    ``jax._src.hijax.HiType``/``MutableHiType``). Never true without them."""
    try:
        from jax._src import core as jax_core
        from jax._src import hijax

        mappings = jax_core.pytype_aval_mappings
        hi_types = tuple(t for t in (getattr(hijax, "HiType", None), getattr(hijax, "MutableHiType", None))
                         if isinstance(t, type))
        if not isinstance(mappings, dict) or not hi_types:
            return lambda obj: False
    except Exception:  # noqa: BLE001 - a JAX without hijax
        return lambda obj: False

    def is_hijax(obj: Any) -> bool:
        to_aval = mappings.get(type(obj))
        if to_aval is None:
            return False
        try:
            return isinstance(to_aval(obj), hi_types)
        except Exception:  # noqa: BLE001 - not ours to judge: the call reports it
            return False

    return is_hijax


