"""API surface of ftjit: the decorator, JitFunction's wrapper attributes,
descriptor binding, the compiler protocol, pickling, GC support and errors."""

import functools
import gc
import inspect
import pickle
import threading
import warnings
import weakref

import numpy as np
import pytest

import ftjit
import ftjit.errors
from helpers import CountingCompiler, gc_collect_until, wait_for


# --------------------------------------------------------------------------
# Module-level objects for the pickle tests (pickled by reference).

_pickle_lock = threading.Lock()
_pickle_compiled = []  # (args, kwargs) of every compile by `pickle_compiler`


def pickle_compiler(fun, args, kwargs):
    with _pickle_lock:
        _pickle_compiled.append((args, kwargs))
    ref = weakref.ref(fun)
    return lambda *a, **k: ref()(*a, **k)


def scale(x, tag, *, mode="mul"):
    """Multiply or add."""
    return x * 2 if mode == "mul" else x + 2


class Tag:
    """A hashable static argument with identity equality: a fresh one is
    always a new signature, whatever else ran in this process."""


def _compiled_with(tag):
    with _pickle_lock:
        return sum(1 for args, kwargs in _pickle_compiled
                   if any(a is tag for a in args) or any(v is tag for v in kwargs.values()))


# --------------------------------------------------------------------------
# The decorator


def test_jit_direct_call_returns_jit_function():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()

    def f(x):
        return x + 1

    jf = ftjit.jit(f, compiler=comp, cache=cache)
    assert isinstance(jf, ftjit.JitFunction)
    assert jf(1.0) == 2.0
    assert comp.calls == 1


def test_jit_decorator_factory():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()

    @ftjit.jit(static_argnums=1, compiler=comp, cache=cache)
    def f(x, n):
        return x * n

    assert isinstance(f, ftjit.JitFunction)
    assert f(2.0, 3) == 6.0
    assert f(2.0, 4) == 8.0  # n is static: a new signature
    assert comp.calls == 2


def test_jit_bare_decorator():
    # Bare @ftjit.jit uses the default compiler, which is not tested here:
    # only decorate, and call under disable_jit() (which bypasses the compiler).
    pytest.importorskip("jax")  # decorating creates jax.jit (absent only in the TSAN run, dev.sh tsan-ft)
    @ftjit.jit
    def f(x):
        return x + 1

    assert isinstance(f, ftjit.JitFunction)
    with ftjit.disable_jit():
        assert f(1) == 2


def test_jit_factory_without_function_returns_decorator():
    comp = CountingCompiler()
    deco = ftjit.jit(compiler=comp, cache=ftjit.FunctionCache())
    assert callable(deco)
    assert not isinstance(deco, ftjit.JitFunction)

    def f(x):
        return -x

    jf = deco(f)
    assert isinstance(jf, ftjit.JitFunction)
    assert jf(3.0) == -3.0
    assert comp.calls == 1


def test_compiler_protocol_full_arguments():
    # compiler(fun, args, kwargs) once per signature with the call's full
    # arguments; the executable gets the full arguments of every call.
    cache = ftjit.FunctionCache()
    comp = CountingCompiler(record=True)

    def f(x, n, *, k):
        return x * n + k

    jf = ftjit.jit(f, static_argnums=1, compiler=comp, cache=cache)
    assert jf(1.0, 2, k=3.0) == 5.0
    assert jf(5.0, 2, k=7.0) == 17.0
    assert comp.calls == 1
    assert len(comp.seen) == 1
    args, kwargs = comp.seen[0]
    assert type(args) is tuple and args == (1.0, 2)
    assert type(kwargs) is dict and kwargs == {"k": 3.0}
    assert comp.exec_seen == [((1.0, 2), {"k": 3.0}), ((5.0, 2), {"k": 7.0})]


def test_compiler_receives_original_function():
    cache = ftjit.FunctionCache()
    got = []

    def compiler(fun, args, kwargs):
        got.append(fun)
        return lambda *a, **k: "exe"

    def f(x):
        return x

    jf = ftjit.jit(f, compiler=compiler, cache=cache)
    assert jf(1.0) == "exe"
    assert jf(2.0) == "exe"
    assert got == [f]
    assert got[0] is f


def test_executable_result_is_returned_unchanged():
    cache = ftjit.FunctionCache()
    sentinel = object()
    jf = ftjit.jit(lambda x: None, compiler=lambda fun, a, k: (lambda *a, **k: sentinel),
                   cache=cache)
    assert jf(1.0) is sentinel


# --------------------------------------------------------------------------
# Wrapper attributes


def _documented(x, y: int = 2, *args, z, w=3, **kw) -> float:
    """Some documentation."""
    return x


def test_wrapper_attributes():
    jf = ftjit.jit(_documented, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    assert jf.__wrapped__ is _documented
    assert jf.__name__ == "_documented"
    assert jf.__qualname__ == _documented.__qualname__
    assert jf.__doc__ == "Some documentation."
    assert jf.__module__ == _documented.__module__ == __name__


def test_wrapper_attributes_of_local_function():
    def inner(x):
        """Inner doc."""
        return x

    jf = ftjit.jit(inner, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    assert jf.__name__ == "inner"
    assert jf.__qualname__ == "test_wrapper_attributes_of_local_function.<locals>.inner"
    assert jf.__doc__ == "Inner doc."
    assert jf.__wrapped__ is inner


def test_signature_matches_wrapped():
    jf = ftjit.jit(_documented, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    assert inspect.signature(jf) == inspect.signature(_documented)
    assert str(inspect.signature(jf)) == str(inspect.signature(_documented))
    assert jf.__signature__ == inspect.signature(_documented)
    # Not derived through __wrapped__ alone: it survives its removal.
    del jf.__wrapped__
    assert inspect.signature(jf) == inspect.signature(_documented)


def test_repr_names_function():
    def my_special_function(x):
        return x

    jf = ftjit.jit(my_special_function, compiler=CountingCompiler(),
                   cache=ftjit.FunctionCache())
    assert "my_special_function" in repr(jf)


def test_dict_attribute_and_setattr():
    jf = ftjit.jit(_documented, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    assert isinstance(jf.__dict__, dict)
    jf.custom = 123
    assert jf.custom == 123
    assert jf.__dict__["custom"] == 123
    del jf.custom
    assert not hasattr(jf, "custom")


def test_dict_copied_from_wrapped_like_functools_wraps():
    def f(x):
        return x

    f.marker = "marked"
    jf = ftjit.jit(f, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    assert jf.marker == "marked"
    assert jf.__dict__["marker"] == "marked"


def test_functools_wraps_of_jit_function():
    jf = ftjit.jit(_documented, compiler=CountingCompiler(), cache=ftjit.FunctionCache())

    @functools.wraps(jf)
    def outer(*a, **k):
        return jf(*a, **k)

    assert outer.__name__ == "_documented"
    assert outer.__wrapped__ is jf


# --------------------------------------------------------------------------
# Descriptor


def test_method_binding():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()

    class A:
        def __init__(self, k):
            self.k = k

        @ftjit.jit(static_argnums=0, compiler=comp, cache=cache)
        def add(self, x):
            return x + self.k

    raw = A.__dict__["add"]
    assert isinstance(raw, ftjit.JitFunction)
    assert A.add is raw  # class access returns the function itself, like a def
    a, b = A(10.0), A(20.0)
    bound = a.add
    assert bound.__self__ is a
    assert bound.__func__ is raw
    assert a.add(1.0) == 11.0
    assert a.add(2.0) == 12.0  # same instance, same signature
    assert comp.calls == 1
    assert b.add(1.0) == 21.0  # self is static: a new signature
    assert comp.calls == 2
    assert A.add(a, 3.0) == 13.0
    assert comp.calls == 2


def test_method_binding_static_self_by_name():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler(record=True)

    class B:
        @ftjit.jit(static_argnames="self", compiler=comp, cache=cache)
        def twice(self, x):
            return 2 * x

    b = B()
    assert b.twice(4.0) == 8.0
    assert b.twice(5.0) == 10.0
    assert comp.calls == 1
    args, kwargs = comp.seen[0]
    assert args[0] is b and args[1] == 4.0 and kwargs == {}


def test_staticmethod_wrapping():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()

    class C:
        sm = staticmethod(ftjit.jit(lambda x: x * 3, compiler=comp, cache=cache))

    assert C.sm(2.0) == 6.0
    assert C().sm(3.0) == 9.0
    assert comp.calls == 1


# --------------------------------------------------------------------------
# Pickle


def test_pickle_roundtrip_rejits_with_same_options():
    jf = ftjit.jit(scale, static_argnums=1, static_argnames="mode", compiler=pickle_compiler)
    restored = pickle.loads(pickle.dumps(jf))
    assert isinstance(restored, ftjit.JitFunction)
    assert restored.__wrapped__ is scale
    assert restored.__name__ == "scale"

    # The same compiler: a fresh Tag is a new signature, so it must compile,
    # through pickle_compiler.
    tag = Tag()
    assert restored(3.0, tag) == 6.0
    assert _compiled_with(tag) == 1
    assert restored(4.0, tag) == 8.0
    assert _compiled_with(tag) == 1

    # The same static_argnums: an unhashable value at position 1 is rejected.
    with pytest.raises(ftjit.errors.UnhashableStaticArgumentError):
        restored(1.0, [1])
    # The same static_argnames: 'mode' is static (a str would be an invalid leaf).
    tag2 = Tag()
    assert restored(3.0, tag2, mode="add") == 5.0
    assert _compiled_with(tag2) == 1


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_protocols(protocol):
    jf = ftjit.jit(scale, static_argnums=(1,), compiler=pickle_compiler)
    restored = pickle.loads(pickle.dumps(jf, protocol=protocol))
    tag = Tag()
    assert restored(1.5, tag) == 3.0
    assert _compiled_with(tag) == 1


def test_pickled_copies_share_entries_with_original_in_default_cache():
    # Same fun, same options, same (default) cache: the restored wrapper's
    # first call of a signature the original compiled is a hit.
    jf = ftjit.jit(scale, static_argnums=1, compiler=pickle_compiler)
    tag = Tag()
    assert jf(2.0, tag) == 4.0
    restored = pickle.loads(pickle.dumps(jf))
    assert restored(5.0, tag) == 10.0
    assert _compiled_with(tag) == 1
    info = restored.cache_info()
    assert info.hits >= 1


# --------------------------------------------------------------------------
# GC support


def _make_cycle_via_dict(cache, comp):
    def f(x):
        return x + 1

    jf = ftjit.jit(f, compiler=comp, cache=cache)
    assert jf(1.0) == 2.0
    jf.self_ref = jf  # jf -> jf.__dict__ -> jf
    return weakref.ref(jf), weakref.ref(f)


def _make_cycle_via_closure(cache, comp):
    def outer():
        @ftjit.jit(compiler=comp, cache=cache)
        def f(x):
            return f  # f's closure cell refers to the JitFunction
        return f

    jf = outer()
    assert jf(1.0) is jf
    return weakref.ref(jf), weakref.ref(jf.__wrapped__)


@pytest.mark.parametrize("make", [_make_cycle_via_dict, _make_cycle_via_closure],
                         ids=["dict", "closure"])
def test_jit_function_in_reference_cycle_is_collected(make):
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    jf_ref, fun_ref = make(cache, comp)
    assert comp.calls == 1
    assert gc_collect_until(lambda: jf_ref() is None and fun_ref() is None), \
        "a JitFunction in a reference cycle was not collected"
    assert gc_collect_until(lambda: cache.size() == 0)


def test_jit_function_is_weakrefable():
    jf = ftjit.jit(_documented, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    r = weakref.ref(jf)
    assert r() is jf


def test_jit_function_without_cycle_dies_immediately_after_del():
    cache = ftjit.FunctionCache()

    def f(x):
        return x

    jf = ftjit.jit(f, compiler=CountingCompiler(), cache=cache)
    jf(1.0)  # a compiled entry too
    r = weakref.ref(jf)
    del jf
    # Reference counting alone frees it: no collection, so a reference
    # cycle through the JitFunction (its state, its __dict__) fails here.
    assert r() is None


# --------------------------------------------------------------------------
# Errors


def test_unhashable_static_argument_error_is_caught_as_type_and_value_error():
    def f(x, n):
        return x

    jf = ftjit.jit(f, static_argnums=1, compiler=CountingCompiler(),
                   cache=ftjit.FunctionCache())
    msg = (r"^static argument 1 \('n'\) of \S+<locals>\.f\(\) is not hashable \(type dict\)\. Non-hashable static "
           r"arguments are not supported")
    for exc_type in (TypeError, ValueError, ftjit.UnhashableStaticArgumentError):
        with pytest.raises(exc_type, match=msg) as info:
            jf(1.0, {"unhashable": 1})
        assert type(info.value) is ftjit.UnhashableStaticArgumentError


def test_unsupported_argument_error_is_type_error():
    jf = ftjit.jit(lambda x: x, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    with pytest.raises(TypeError, match=r"^argument 'x' \(positional argument 0\) of \S+<locals>\.<lambda>\(\) is of "
                       r"type str, which is not a valid argument type") as info:
        jf("a string")
    assert type(info.value) is ftjit.UnsupportedArgumentError
    with pytest.raises(ftjit.UnsupportedArgumentError, match=r"is of type object, which is not a valid .* "
                       r"mark the argument static with static_argnums or static_argnames\.$"):
        jf(object())


def test_errors_do_not_compile():
    comp = CountingCompiler()

    def f(x, n):
        return x

    jf = ftjit.jit(f, static_argnums=1, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(ftjit.UnhashableStaticArgumentError, match=r"\(type list\)"):
        jf(1.0, [])
    with pytest.raises(ftjit.UnsupportedArgumentError, match=r"^argument 'x' .* is of type str"):
        jf("x", 1)
    assert comp.calls == 0
    assert jf.cache_info().size == 0


def test_wrong_arity_call_raises_type_error_from_function():
    # The wrapped function's own TypeError for a bad call reaches the caller.
    comp = CountingCompiler()

    def f(x):
        return x

    jf = ftjit.jit(f, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(TypeError, match=r"^\S+<locals>\.f\(\) takes 1 positional argument but 2 were given$") as info:
        jf(1.0, 2.0)
    assert type(info.value) is TypeError  # Python's own, not ftjit's UnsupportedArgumentError
    assert comp.calls == 1


def test_cache_info_snapshot_attributes():
    jf = ftjit.jit(lambda x: x, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    info = jf.cache_info()
    for attr in ("hits", "misses", "compiles", "waits", "evictions", "size"):
        assert getattr(info, attr) == 0, attr
    jf(1.0)
    # A snapshot: taken before the call, it does not change.
    assert info.misses == 0 and info.size == 0
    after = jf.cache_info()
    assert (after.hits, after.misses, after.compiles, after.waits, after.evictions,
            after.size) == (0, 1, 1, 0, 0, 1)


def test_jit_function_type_is_exported():
    assert isinstance(ftjit.JitFunction, type)
    jf = ftjit.jit(lambda x: x, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    assert type(jf) is ftjit.JitFunction


def test_many_jit_functions_do_not_leak():
    # Creating and dropping many JitFunctions does not leak them.
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    refs = []
    for i in range(50):
        def f(x, i=i):
            return x + i
        jf = ftjit.jit(f, compiler=comp, cache=cache)
        assert jf(1.0) == 1.0 + i
        refs.append(weakref.ref(jf))
        refs.append(weakref.ref(f))
    del f, jf
    assert gc_collect_until(lambda: all(r() is None for r in refs))
    assert gc_collect_until(lambda: cache.size() == 0)
    gc.collect()


def _with_context(context):
    """A counting compiler whose hooks give the core this context hook."""

    class Compiler(CountingCompiler):
        def hooks(self, fun):
            return ftjit.CompilerHooks(context=context)

    return Compiler()


@pytest.mark.parametrize("hooks, message", [
    (ftjit.ContextHooks(probe=3), "CompilerHooks.context.probe must be callable or None, got 3"),
    (ftjit.ContextHooks(context="ctx"), "CompilerHooks.context.context must be callable or None, got 'ctx'"),
    (ftjit.ContextHooks(committed_types=(int, 3), committed_attr="a", sharding_attr="b"),
     "CompilerHooks.context.committed_types must be a tuple of types, got (<class 'int'>, 3)"),
    (ftjit.ContextHooks(committed_types=(int,), sharding_attr="b"),
     "CompilerHooks.context.committed_attr must be a str with committed_types, got None"),
    (ftjit.ContextHooks(committed_types=(int,), committed_attr=b"a", sharding_attr="b"),
     "CompilerHooks.context.committed_attr must be a str or None, got b'a'"),
    (ftjit.ContextHooks(context=tuple, requires=((0, False),)),
     "CompilerHooks.context.requires[0] must be an ftjit.ContextRequirement(position, value), got (0, False)"),
    (ftjit.ContextHooks(context=tuple, requires=(ftjit.ContextRequirement(-1, False),)),
     "CompilerHooks.context.requires[0].position must be an int >= 0, got -1"),
    (ftjit.ContextHooks(requires=(ftjit.ContextRequirement(0, False),)),
     "CompilerHooks.context.requires must be empty without a context, got (ContextRequirement(position=0, "
     "value=False),)"),
    (ftjit.ContextHooks(context=tuple, extras="not a tuple"),
     "CompilerHooks.context.extras must be a tuple of at most 8 ftjit.ContextExtra(getter, arg), got "
     "'not a tuple'"),
    (ftjit.ContextHooks(context=tuple, extras=((len, ()),)),
     "CompilerHooks.context.extras[0] must be an ftjit.ContextExtra(getter, arg), got (<built-in function len>, ())"),
    (ftjit.ContextHooks(context=tuple, extras=None),
     "CompilerHooks.context.extras must be a tuple of at most 8 ftjit.ContextExtra(getter, arg), got None"),
    (ftjit.ContextHooks(context=tuple, extras=(ftjit.ContextExtra(1, 2),)),
     "CompilerHooks.context.extras[0].getter must be callable, got 1"),
    (ftjit.ContextHooks(context=tuple, extras=tuple(ftjit.ContextExtra(len, ()) for _ in range(9))),
     "CompilerHooks.context.extras must be a tuple of at most 8 ftjit.ContextExtra(getter, arg), got "
     + repr(tuple(ftjit.ContextExtra(len, ()) for _ in range(9)))),
    (ftjit.ContextHooks(spec_types=[dict, "x"]), "CompilerHooks.context.spec_types must be a tuple of types, "
                                                 "got [<class 'dict'>, 'x']"),
])
def test_a_wrong_context_hooks_field_is_a_typeerror_naming_it_at_decoration(hooks, message):
    # Read once, when the function is jitted, by field name: never on a call.
    with pytest.raises(TypeError) as info:
        ftjit.jit(lambda x: x, compiler=_with_context(hooks), cache=ftjit.FunctionCache())
    assert str(info.value) == message


@pytest.mark.parametrize("field, value, message", [
    ("fallback", 3, "CompilerHooks.fallback must be callable or None, got 3"),
    ("custom_namedtuple", 3, "CompilerHooks.custom_namedtuple must be callable or None, got 3"),
    ("custom_namedtuple", len, "CompilerHooks.custom_namedtuple needs pytree_flatten"),
    ("placement_label", "x", "CompilerHooks.placement_label must be callable or None, got 'x'"),
    ("executable_for", 3, "CompilerHooks.executable_for must be callable or None, got 3"),
    ("lower", 1, "CompilerHooks.lower must be callable or None, got 1"),
    ("spec_node", 2, "CompilerHooks.spec_node must be callable or None, got 2"),
    ("restore_placement", 2, "CompilerHooks.restore_placement must be callable or None, got 2"),
    ("pytree_flatten", 3, "CompilerHooks.pytree_flatten must be a callable or an ftjit.RegistryFlatten, got 3"),
    ("context", 3, "CompilerHooks.context must be a callable () -> hashable or an ftjit.ContextHooks, got 3"),
    ("fallback_types", 3, "CompilerHooks.fallback_types must be a sequence of types, got 3"),
    ("plain_types", [int, 3], "CompilerHooks.plain_types must hold types, got 3"),
    ("aval_types", "ab", "CompilerHooks.aval_types must hold types, got 'a'"),
    ("aval_fields", (int,), "CompilerHooks.aval_fields must hold only types of aval_types, got <class 'int'>"),
    ("redo_types", (ValueError, int), "CompilerHooks.redo_types must hold exception types, got <class 'int'>"),
    ("strip_static", 1, "CompilerHooks.strip_static must be a bool, got 1"),
    ("jax_style_errors", None, "CompilerHooks.jax_style_errors must be a bool, got None"),
    ("context_in_executable", "yes", "CompilerHooks.context_in_executable must be a bool, got 'yes'"),
    ("context_in_executable", True,
     "CompilerHooks.context_in_executable needs executable_for (whose ThreadExecutables check the context)"),
])
def test_a_wrong_compiler_hooks_field_is_one_typeerror_when_made_and_at_jit(field, value, message):
    """One check, the core's reader: CompilerHooks() runs it when made, and
    jit() again on what it reads (a frozen dataclass can still be changed
    with object.__setattr__), in the same words."""
    with pytest.raises(TypeError) as made:
        ftjit.CompilerHooks(**{field: value})
    assert str(made.value) == message
    hooks = ftjit.CompilerHooks()
    object.__setattr__(hooks, field, value)

    class Compiler(CountingCompiler):
        def hooks(self, fun):
            return hooks

    with pytest.raises(TypeError) as read:
        ftjit.jit(lambda x: x, compiler=Compiler(), cache=ftjit.FunctionCache())
    assert str(read.value) == message


def test_compiler_hooks_keep_sequences_of_types_as_tuples():
    hooks = ftjit.CompilerHooks(fallback_types=[int], plain_types=iter([float]), redo_types={ValueError})
    assert (hooks.fallback_types, hooks.plain_types, hooks.aval_types, hooks.redo_types) == (
        (int,), (float,), (), (ValueError,))


def test_a_context_that_is_neither_callable_nor_context_hooks_is_refused_by_compiler_hooks():
    with pytest.raises(TypeError) as info:
        ftjit.CompilerHooks(context=(lambda: 1, None))
    assert str(info.value).startswith("CompilerHooks.context must be a callable () -> hashable or an "
                                      "ftjit.ContextHooks, got (<function ")


def test_context_hooks_with_a_context_alone_key_on_it():
    # context() folded into the signature; no probe, requires or placement.
    comp = _with_context(ftjit.ContextHooks(context=lambda: ("ctx",)))
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())
    assert jf(1.0) == 2.0 and jf(2.0) == 3.0
    assert comp.calls == 1


def test_context_hooks_read_once_at_jit_whatever_the_record_becomes():
    # The core keeps its own references to what it read: a record changed
    # afterwards (a frozen dataclass can be, through object.__setattr__)
    # changes nothing, and frees nothing the core still uses.
    state = {"ctx": "a"}
    hooks = ftjit.ContextHooks(context=lambda: state["ctx"])
    comp = _with_context(hooks)
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())
    object.__setattr__(hooks, "context", lambda: "other")
    import gc

    gc.collect()
    assert jf(1.0) == 2.0
    state["ctx"] = "b"
    assert jf(1.0) == 2.0
    assert comp.calls == 2


def test_context_hooks_requires_defers_the_call_to_the_fallback():
    state = {"ctx": ("on", False)}
    fallen = []

    class Compiler(CountingCompiler):
        def hooks(self, fun):
            return ftjit.CompilerHooks(context=ftjit.ContextHooks(
                context=lambda: state["ctx"], requires=(ftjit.ContextRequirement(1, False),)),
                fallback=lambda x: fallen.append(x) or -x)

    comp = Compiler()
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())
    assert jf(1.0) == 2.0
    state["ctx"] = ("on", True)
    assert jf(1.0) == -1.0
    assert (comp.calls, fallen) == (1, [1.0])
    state["ctx"] = "not a tuple"
    with pytest.raises(TypeError) as info:
        jf(1.0)
    assert str(info.value) == "CompilerHooks.context.requires needs context() to return a tuple, got a str"


def test_context_hooks_extras_are_keyed_with_the_context():
    # ContextHooks.extras: read on every call and keyed with context() (JAX
    # uses them for configs of jax.jit's key that trace_context() leaves out).
    mode = {"level": "O0"}

    comp = _with_context(ftjit.ContextHooks(context=lambda: ("ctx",),
                                            extras=(ftjit.ContextExtra(lambda d: d["level"], mode),)))
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())
    assert jf(1.0) == 2.0 and jf(2.0) == 3.0
    mode["level"] = "O1"
    assert jf(1.0) == 2.0
    mode["level"] = "O" + "0"  # an equal, distinct str: equal keys hit
    assert jf(1.0) == 2.0
    assert comp.calls == 2
    info = jf.cache_info()
    assert (info.hits, info.misses) == (2, 2)


@pytest.mark.parametrize("flatten, message", [
    (ftjit.RegistryFlatten(3, lambda leaf: False),
     "CompilerHooks.pytree_flatten.flatten_one_level must be callable, got 3"),
    (ftjit.RegistryFlatten(lambda obj: None, None), "CompilerHooks.pytree_flatten.defer_leaf must be callable, got None"),
])
def test_a_wrong_registry_flatten_field_is_a_typeerror_naming_it_at_decoration(flatten, message):
    class Compiler(CountingCompiler):
        def hooks(self, fun):
            return ftjit.CompilerHooks(pytree_flatten=flatten)

    with pytest.raises(TypeError) as info:
        ftjit.jit(lambda x: x, compiler=Compiler(), cache=ftjit.FunctionCache())
    assert str(info.value) == message


def test_registry_flatten_is_called_for_each_node_and_keys_it_by_type_and_data():
    class Pair:
        def __init__(self, a, b, tag):
            self.a, self.b, self.tag = a, b, tag

    def flatten_one_level(obj):
        return ((obj.a, obj.b), obj.tag) if type(obj) is Pair else None

    class Compiler(CountingCompiler):
        def hooks(self, fun):
            return ftjit.CompilerHooks(pytree_flatten=ftjit.RegistryFlatten(flatten_one_level, lambda leaf: False))

    comp = Compiler()
    jf = ftjit.jit(lambda p: p, compiler=comp, cache=ftjit.FunctionCache())
    jf(Pair(1.0, 2.0, "t"))
    jf(Pair(3.0, 4.0, "t"))
    jf(Pair(3.0, 4.0, "u"))
    assert comp.calls == 2
    assert sorted(s.signature.split(".<locals>.")[-1] for s in jf.signatures()) == [
        "<lambda>(PyTreeDef(CustomNode(Pair[t], [*, *]))(float, float))",
        "<lambda>(PyTreeDef(CustomNode(Pair[u], [*, *]))(float, float))",
    ]


def test_method_hooks_are_read_once_at_jit():
    # lower/trace/eval_shape/clear_cache: read into the function's state when
    # it is jitted (JitState::method_hooks), not looked up on every call.
    seen = []

    class Compiler(CountingCompiler):
        def hooks(self, fun):
            return ftjit.CompilerHooks(lower=lambda *a, **k: ("lowered", a, k),
                                       clear_cache=lambda: seen.append("cleared"))

    comp = Compiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    object.__setattr__(jf._hooks, "lower", None)
    object.__setattr__(jf._hooks, "clear_cache", None)
    assert jf.lower(1.0, y=2) == ("lowered", (1.0,), {"y": 2})
    jf.clear_cache()
    assert seen == ["cleared"]
    with pytest.raises(TypeError) as info:
        jf.trace(1.0)
    assert str(info.value) == ("trace() needs a compiler with a 'trace' hook, as the JAX compiler has; the "
                               "compiler of test_method_hooks_are_read_once_at_jit.<locals>.<lambda>() has none")


def test_jit_function_cannot_be_instantiated_directly():
    # Only ftjit.jit() builds one; a state-less instance used to crash on repr().
    with pytest.raises(TypeError, match=r"^cannot create 'ftjit\._core\.JitFunction' instances$"):
        ftjit.JitFunction()
    with pytest.raises(TypeError, match=r"is not safe, use ftjit\._core\.JitFunction\.__new__\(\)$"):
        object.__new__(ftjit.JitFunction)


# --------------------------------------------------------------------------
# Static options are checked against the signature whatever the compiler


def _two(x, y):
    return x


@pytest.mark.parametrize("kwargs, message", [
    ({"static_argnums": 2}, r"^ftjit\.jit: _two\(\) has static_argnums=\(2,\), but only accepts 2 positional arguments\.$"),
    ({"static_argnums": (0, -3)},
     r"^ftjit\.jit: _two\(\) has static_argnums=\(0, -3\), but only accepts 2 positional arguments\.$"),
    ({"static_argnames": "q"}, r"^ftjit\.jit: _two\(\) has invalid argnames \['q'\] in static_argnames: it does not "
                               r"take these arguments by keyword\.$"),
])
def test_custom_compiler_static_options_out_of_the_signature_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ftjit.jit(_two, compiler=CountingCompiler(), cache=ftjit.FunctionCache(), **kwargs)


def test_custom_compiler_static_options_in_range_and_varargs_are_accepted():
    comp = CountingCompiler()
    jf = ftjit.jit(_two, static_argnums=-1, compiler=comp, cache=ftjit.FunctionCache())
    assert jf(1.0, "static") == 1.0 and comp.calls == 1

    def var(*args, **kwargs):
        return args[0]

    jv = ftjit.jit(var, static_argnums=5, static_argnames="anything", compiler=comp, cache=ftjit.FunctionCache())
    assert jv(2.0) == 2.0


def test_numpy_integer_static_argnums_with_a_custom_compiler():
    comp = CountingCompiler()
    jf = ftjit.jit(_two, static_argnums=np.int64(1), compiler=comp, cache=ftjit.FunctionCache())
    assert jf(1.0, "a") == 1.0 and jf(1.0, "b") == 1.0
    assert comp.calls == 2
    with pytest.raises(TypeError, match=r"^static_argnums must contain only int values, got True$"):
        ftjit.jit(_two, static_argnums=[True], compiler=comp)


def test_a_compiler_returning_a_non_callable_is_a_failed_compile():
    jf = ftjit.jit(_two, compiler=lambda fun, args, kwargs: 42, cache=ftjit.FunctionCache())
    for _ in range(2):
        with pytest.raises(TypeError, match=r"^the compiler of _two\(\) returned an object of type int, which is not "
                                            r"callable: compiler\(fun, args, kwargs\) must return the executable"):
            jf(1.0, 2.0)
    info = jf.cache_info()
    assert (info.compiles, info.failures, info.size) == (0, 2, 0)


def test_copies_of_a_jitted_function_are_itself():
    import copy

    cache = ftjit.FunctionCache(7)
    jf = ftjit.jit(_two, compiler=CountingCompiler(), cache=cache)
    jf.note = "kept"
    assert copy.copy(jf) is jf
    assert copy.deepcopy(jf) is jf
    assert copy.deepcopy({"f": [jf]})["f"][0] is jf


def test_methods_are_named_as_called():
    jf = ftjit.jit(_two, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    for name in ("lower", "trace", "eval_shape", "precompile", "clear_cache", "signatures", "warmup"):
        method = getattr(jf, name)
        assert (method.__name__, method.__qualname__) == (name, f"JitFunction.{name}")
    # nanobind parses the methods' arguments, and says so in its words: the
    # method, its one signature, and what it was given (the wrong keyword).
    with pytest.raises(TypeError) as info:
        jf.warmup([], worker=2)
    assert str(info.value) == (
        "warmup(): incompatible function arguments. The following argument types are supported:\n"
        "    1. warmup(self, specs: collections.abc.Iterable[typing.Any], workers: int = 1, strict: bool = False, "
        "progress: bool | typing.TextIO | None = None) -> WarmupReport\n\n"
        "Invoked with types: ftjit._core.JitFunction, list, kwargs = { worker: int }")
    with pytest.raises(TypeError) as info:
        ftjit.JitFunction.cache_info(_two)  # not a JitFunction: refused before the body reads its state
    assert str(info.value) == (
        "cache_info(): incompatible function arguments. The following argument types are supported:\n"
        "    1. cache_info(self) -> CacheInfo\n\n"
        "Invoked with types: function")


def test_pickle_keeps_the_statics_meant_when_given_as_an_iterator():
    pytest.importorskip("jax")  # the default compiler (absent only in dev.sh tsan-ft)
    jf = ftjit.jit(_two, static_argnums=iter([1]))
    assert jf._signature_of(1.0, "s") == "_two(float, 's')"
    back = pickle.loads(pickle.dumps(jf))
    assert back._signature_of(1.0, "s") == "_two(float, 's')"
    with pytest.raises(ftjit.UnhashableStaticArgumentError, match=r"^static argument 1 \('y'\) of _two\(\) is not hashable"):
        back(1.0, [3])


def test_the_package_exports_exactly_its_all():
    public = sorted(n for n in vars(ftjit) if not n.startswith("_"))
    assert public == sorted(ftjit.__all__)


def _posonly(x, /, **kw):
    return x


def _varargs(x, *args):
    return x


@pytest.mark.parametrize("fun, name", [(_posonly, "x"), (_varargs, "args")])
def test_custom_compiler_static_argnames_that_cannot_be_keywords_are_value_errors(fun, name):
    # As jax.jit: positional-only parameters and *args cannot be static by name.
    with pytest.raises(ValueError, match=rf"^ftjit\.jit: {fun.__name__}\(\) has invalid argnames \['{name}'\] in "
                                         r"static_argnames: these are positional-only\.$"):
        ftjit.jit(fun, static_argnames=name, compiler=CountingCompiler())


def test_static_options_given_as_iterators_are_read_once():
    pytest.importorskip("jax")  # the pickled copy uses the default compiler (absent only in dev.sh tsan-ft)
    comp = CountingCompiler()
    dec = ftjit.jit(static_argnums=iter([1]), compiler=comp, cache=ftjit.FunctionCache())
    first, second = dec(lambda x, n: x), dec(lambda x, n: x)
    # The factory's second use sees the statics too (the iterator was not used up).
    assert first._signature_of(1.0, 3).endswith("(float, 3)")
    assert second._signature_of(1.0, 3).endswith("(float, 3)")
    names = ftjit.jit(_two, static_argnames=(n for n in ["y"]), compiler=comp, cache=ftjit.FunctionCache())
    assert names._signature_of(1.0, 3) == "_two(float, 3)"
    assert pickle.loads(pickle.dumps(ftjit.jit(_two, static_argnames=(n for n in ["y"]))))._signature_of(1.0, 3) == \
        "_two(float, 3)"


def test_compile_timeout_takes_numpy_numbers_and_huge_values():
    for timeout in (np.int64(3), np.float32(2.5), 10**400, float("inf")):
        jf = ftjit.jit(_two, compile_timeout=timeout, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
        assert jf(1.0, 2.0) == 1.0, timeout
    with pytest.raises(TypeError, match=r"^compile_timeout must be a number of seconds or None, got np\.True_$"):
        ftjit.jit(_two, compile_timeout=np.True_, compiler=CountingCompiler())


def test_an_infinite_compile_timeout_waits_for_the_compile():
    """compile_timeout=inf (or beyond ~30 years) means wait forever: the
    deadline must not overflow into 'already passed' for a waiting thread."""
    release = threading.Event()

    def hold(fun, args, kwargs):
        assert release.wait(30)

    for timeout in (float("inf"), 5e9, 10**400):
        release.clear()
        comp = CountingCompiler(on_compile=hold)
        jf = ftjit.jit(_two, compile_timeout=timeout, compiler=comp, cache=ftjit.FunctionCache())
        out = []
        compiling = threading.Thread(target=lambda: out.append(jf(1.0, 2.0)))
        waiting = threading.Thread(target=lambda: out.append(jf(1.0, 2.0)))
        compiling.start()
        assert wait_for(lambda: comp.calls >= 1, 10)
        waiting.start()
        assert wait_for(lambda: jf.cache_info().waits == 1, 10)
        release.set()
        for t in (compiling, waiting):
            t.join(30)
            assert not t.is_alive()
        assert out == [1.0, 1.0], timeout
        info = jf.cache_info()
        assert (comp.calls, info.compiles, info.waits, info.failures) == (1, 1, 1, 0)


def test_static_argnums_out_of_c_int_range_is_a_value_error_naming_it():
    for bad in (2**31, -(2**31) - 1, [0, 2**40]):
        with pytest.raises(ValueError, match=r"^static_argnums must hold argument positions \(ints between -2\*\*31 "
                                             r"and 2\*\*31 - 1\), got -?\d+$"):
            ftjit.jit(lambda *xs: xs, static_argnums=bad, compiler=CountingCompiler())


def test_a_function_cache_subclass_that_skipped_super_init_is_a_type_error_saying_so():
    class MyCache(ftjit.FunctionCache):
        def __init__(self, capacity):
            self.wanted = capacity  # forgot super().__init__(capacity)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanobind warns of the uninitialised instance
        with pytest.raises(TypeError, match=r"^cache is a .*MyCache \(a FunctionCache subclass\) whose __init__ did "
                                            r"not call super\(\)\.__init__\(\): it has no cache to use\. Call "
                                            r"super\(\)\.__init__\(capacity\) in its __init__\.$"):
            ftjit.jit(lambda x: x, compiler=CountingCompiler(), cache=MyCache(8))

    class GoodCache(ftjit.FunctionCache):
        def __init__(self, capacity):
            super().__init__(capacity)
            self.wanted = capacity

    jf = ftjit.jit(lambda x: x, compiler=CountingCompiler(), cache=GoodCache(8))
    assert jf(2.0) == 2.0 and jf._cache.capacity() == 8


def _plain_compiler(fun, args, kwargs):
    return fun


def test_the_decorated_form_pickles_by_reference_as_lru_cache_does():
    """@ftjit.jit on a module-level function: the module's name for it is the
    jitted function itself, so it pickles by name (jax.jit cannot: pickle
    finds the name bound to another object than the one it was given)."""
    import helpers

    data = pickle.dumps(helpers.decorated_double)
    assert b"decorated_double" in data and len(data) < 100  # a reference, not the options
    assert pickle.loads(data) is helpers.decorated_double
    assert helpers.decorated_double(2.0) == 4.0
    # Not reachable by its name (a wrapper of a module-level function): by value, rebuilt.
    jf = ftjit.jit(_two, compiler=_plain_compiler)
    back = pickle.loads(pickle.dumps(jf))
    assert back is not jf and back.__wrapped__ is _two and back(1.0, 2.0) == 1.0
