"""Miss explanations (explain_misses=True, or ftjit.set_explain_misses(True)):
a cache miss logs, at WARNING on the "ftjit.misses" logger, what differs from
the closest cached signature: shapes, dtypes and weak types, statics, paths
and structure in pytrees, placements (labelled as signatures() labels them),
and the tracing context (JAX configs, a custom compiler's context).

Explanations are a diff over the signatures the core gives
(ftjit/_signature.py, ftjit/_explain.py): nothing re-flattens the arguments.

Every test builds its own FunctionCache and fresh functions. Functions whose
names show up in process-wide places (logs, stats()) get a unique name per
test run (helpers.unique_name), so parallel copies of a test never see each
other's records. Thread tests start on a Barrier (helpers.run_threads), join
with a timeout and re-raise worker exceptions.
"""

import collections
import logging
import re
import subprocess
import sys

import numpy as np
import pytest

import ftjit
import ftjit._explain  # noqa: F401 - tested directly below
from helpers import (
    ContextCompiler,
    CountingCompiler,
    LogCapture,
    child_env,
    explanations,
    fresh1,
    meta_dataclass,
    named,
    run_script,
    run_threads,
    unique_name,
    z,
)

pytestmark = pytest.mark.timeout(120)

INFO = logging.INFO
WARNING = logging.WARNING


# --- when explanations are logged, and where ----------------------------------


def test_explanations_show_with_default_logging():
    """explain_misses=True is a request to see them: with logging never
    configured (a fresh interpreter), they reach stderr; the logger is
    "ftjit.misses", at WARNING."""
    code = """
import logging, ftjit
seen = []
class Spy(logging.Handler):
    def emit(self, record):
        seen.append((record.name, record.levelname))
f = ftjit.jit(lambda x: x, compiler=lambda fun, a, k: fun, explain_misses=True)
f(1)
f(1.5)
logging.getLogger("ftjit.misses").addHandler(Spy())
f(1j)
print(seen)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env())
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["cache miss of <lambda>: argument 'x': int -> float"]
    assert done.stdout.strip() == str([("ftjit.misses", "WARNING")])


def test_explain_off_by_default_and_explicit_false():
    fun, name = fresh1("explain_off")
    jf = ftjit.jit(fun, compiler=CountingCompiler(), cache=ftjit.FunctionCache(), explain_misses=False)
    with LogCapture(name) as cap:
        jf(z(1))
        jf(z(2))
    assert explanations(cap, name) == []
    assert len(cap.messages(INFO)) == 2  # the compiles are still logged


@pytest.mark.thread_unsafe(reason="flips the process-wide ftjit.set_explain_misses switch")
def test_global_explain_switch():
    saved = ftjit._observe.explain_misses_enabled()
    try:
        ftjit.set_explain_misses(np.True_)  # numpy bools are bools too
        assert ftjit._observe.explain_misses_enabled() is True
        fun, name = fresh1("explain_global")
        jf = ftjit.jit(fun, compiler=CountingCompiler(), cache=ftjit.FunctionCache())  # None: follows switch
        fun2, name2 = fresh1("explain_forced_off")
        jf2 = ftjit.jit(fun2, compiler=CountingCompiler(), cache=ftjit.FunctionCache(), explain_misses=False)
        with LogCapture(name) as cap, LogCapture(name2) as cap2:
            jf(z(1))
            assert explanations(cap, name) == []
            jf(z(2))
            assert explanations(cap, name) == ["argument 'x': float32[1] -> float32[2]"]
            jf2(z(1))
            jf2(z(2))
            assert explanations(cap2, name2) == []
            assert len(cap2.messages(INFO)) == 2
            ftjit.set_explain_misses(False)  # read at each miss
            jf(z(3))
            assert len(explanations(cap, name)) == 1
            assert (len(cap.messages(INFO)), len(cap.messages(WARNING))) == (3, 1)  # 3 compiles, 1 explanation
    finally:
        ftjit.set_explain_misses(saved)


@pytest.mark.thread_unsafe(reason="flips the process-wide ftjit.set_explain_misses switch")
def test_global_explain_switch_turned_on_later_explains_existing_signatures():
    """A function that compiled signatures while the switch was off already has
    compiled signatures: once the switch is on, its next miss is explained."""
    saved = ftjit._observe.explain_misses_enabled()
    try:
        ftjit.set_explain_misses(False)
        fun, name = fresh1("explain_later")
        jf = ftjit.jit(fun, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
        with LogCapture(name) as cap:
            jf(z(1))
            jf(z(2))
            assert explanations(cap, name) == []
            ftjit.set_explain_misses(True)
            jf(z(3))
            got = explanations(cap, name)
            assert len(got) == 1, got
            assert re.fullmatch(r"argument 'x': float32\[[12]\] -> float32\[3\]", got[0]), got
    finally:
        ftjit.set_explain_misses(saved)


def test_set_explain_misses_rejects_a_non_bool():
    before = ftjit._observe.explain_misses_enabled()
    with pytest.raises(TypeError, match=r"^set_explain_misses expects a bool, got 'no'$"):
        ftjit.set_explain_misses("no")
    assert ftjit._observe.explain_misses_enabled() is before


def test_invalid_explain_misses_option():
    with pytest.raises(TypeError, match=r"^explain_misses must be a bool or None, got 'yes'$"):
        ftjit.jit(lambda x: x, compiler=CountingCompiler(), cache=ftjit.FunctionCache(), explain_misses="yes")


def test_warmup_and_precompile_are_not_explained_as_misses():
    """Compiles asked for ahead of traffic are no misses to explain; a real
    miss afterwards is explained against what they compiled."""
    name = unique_name("explain_ahead")

    def fun(x):
        return x

    named(fun, name)
    comp = CountingCompiler()
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        report = jf.warmup([(z(1),), (z(2),), (z(4),)], workers=2)
        assert report.ok
        assert jf.precompile(z(8)) is True
        assert explanations(cap, name) == []
        jf(z(4, dtype=np.int32))  # closest to the warmed-up float32[4]: same shape
        assert explanations(cap, name) == ["argument 'x': float32[4] -> int32[4]"]
    assert comp.calls == 5


def test_explain_concurrent_misses_one_per_signature():
    n = 8
    fun, name = fresh1("explain_threads")
    comp = CountingCompiler(delay=0.05)
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        jf(z(1))
        run_threads(n, lambda i: jf(z(i + 2)))
    got = explanations(cap, name)
    assert len(got) == n, got
    pat = re.compile(r"^argument 'x': float32\[(\d+)\] -> float32\[(\d+)\]$")
    pairs = [pat.match(g) for g in got]
    assert all(pairs), got
    new = sorted(int(m[2]) for m in pairs)
    assert new == list(range(2, n + 2))
    for m in pairs:
        assert int(m[1]) != int(m[2]) and 1 <= int(m[1]) <= n + 1
    assert comp.calls == n + 1


# --- what differs: arguments, statics, pytrees, against the closest signature ---


def test_explain_shape_dtype_static_tree_changes():
    name = unique_name("explain")

    def fun(x, n):
        return x

    named(fun, name)
    jf = ftjit.jit(fun, static_argnames="n", compiler=CountingCompiler(), cache=ftjit.FunctionCache(),
                   explain_misses=True)
    with LogCapture(name) as cap:
        jf(z(8), n=3)
        assert explanations(cap, name) == []  # never on the very first compile
        assert len(cap.messages(INFO)) == 1
        jf(z(8), n=3)  # a hit: nothing
        assert len(cap.messages(INFO)) == 1
        jf(z(16), n=3)
        assert explanations(cap, name) == ["argument 'x': float32[8] -> float32[16]"]
        jf(z(8), n=4)
        assert explanations(cap, name)[-1] == "static 'n': 3 -> 4"
        jf(z(8, dtype=np.int32), n=3)
        assert explanations(cap, name)[-1] == "argument 'x': float32[8] -> int32[8]"
        jf((z(8),), n=3)
        last = explanations(cap, name)[-1]
        assert last.startswith("argument 'x': tree structure "), last
        assert "->" in last
        jf(z(8), n=3)  # cached: no explanation
    assert len(explanations(cap, name)) == 4


def test_explain_names_path_inside_pytree():
    name = unique_name("explain_tree")

    def fun(x):
        return x

    named(fun, name)
    jf = ftjit.jit(fun, compiler=CountingCompiler(), cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        jf({"a": z(2), "b": 1.0})
        jf({"a": z(5), "b": 1.0})
        jf({"a": z(5), "b": 1})
    assert explanations(cap, name) == [
        "argument 'x'['a']: float32[2] -> float32[5]",
        "argument 'x'['b']: float -> int",
    ]


def test_explain_compares_with_the_closest_signature():
    """With a plain array and {'a': float32[2]} cached, a call with
    {'a': float32[5]} is closest to the dict one (same structure, one leaf
    differs): the explanation must name that leaf, not a tree-structure change
    against the unrelated array signature."""
    name = unique_name("explain_closest")

    def fun(x):
        return x

    named(fun, name)
    jf = ftjit.jit(fun, compiler=CountingCompiler(), cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        jf(z(8))
        jf({"a": z(2)})
        jf({"a": z(5)})
    got = explanations(cap, name)
    assert len(got) == 2
    assert got[0].startswith("argument 'x': tree structure ")
    assert got[1] == "argument 'x'['a']: float32[2] -> float32[5]"


@pytest.mark.thread_unsafe(reason="counts calls of a module-level function it patches")
def test_a_miss_is_explained_against_a_bounded_number_of_signatures(monkeypatch):
    """A miss costs O(arguments), not O(cached signatures): it is compared
    with at most 16 of them (the core's kExplainCandidates: the newest of its
    own call structure), and not at all when no explanation will be shown."""
    import ftjit._explain as explain

    candidates = 16
    compared = []
    real = explain._differences
    monkeypatch.setattr(explain, "_differences", lambda old, new, names=None: compared.append(1) or real(old, new, names))
    name = unique_name("explain_bounded")

    def fun(x, n):
        return x

    named(fun, name)
    quiet = ftjit.jit(fun, static_argnums=1, compiler=CountingCompiler(), cache=ftjit.FunctionCache(),
                      explain_misses=None)  # follows the global switch, off here
    for n in range(300):
        quiet(1.0, n)
    assert compared == []  # nothing was going to be shown: nothing explained
    loud = ftjit.jit(fun, static_argnums=1, compiler=CountingCompiler(), cache=ftjit.FunctionCache(),
                     explain_misses=True)
    with LogCapture(name) as cap:
        for n in range(300):
            loud(1.0, n)
        loud({"a": 1.0}, 0)  # a new structure: compared with the newest of any structure
    assert len(compared) == sum(min(n, candidates) for n in range(300)) + candidates
    got = explanations(cap, name)
    assert got[0] == "static 'n': 0 -> 1"
    assert got[-2] == "static 'n': 283 -> 299"  # all 16 candidates differ by n alone: the oldest of them wins
    assert got[-1] == "argument 'x': tree structure * -> {'a': *}; static 'n': 284 -> 0"


def test_explain_weak_type_changes_exactly():
    """JAX compiler: a Python float, a numpy float32 scalar, and weak vs
    strong float32[] jax arrays are four signatures; each miss names the
    closest one (a weak-type flip is explained against the same dtype/shape)."""
    import jax  # noqa: F401
    import jax.numpy as jnp

    fun, name = fresh1("explain_weak", body=lambda x: x * 2)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        jf(1.0)
        jf(np.float32(1.0))
        jf(jnp.asarray(2.0))  # weak-typed float32[]
        jf(jnp.float32(3.0))  # strong float32[]: the same signature as np.float32
        jf(jnp.asarray(np.float32(4.0)))  # strong too
    assert explanations(cap, name) == [
        "argument 'x': float -> float32[]",
        "argument 'x': float32[] -> float32[]{weak}",
    ]
    assert jnp.asarray(2.0).weak_type and not jnp.float32(3.0).weak_type
    assert sorted(s.signature for s in jf.signatures()) == sorted(
        [f"{name}(float)", f"{name}(float32[])", f"{name}(float32[]{{weak}})"]
    )
    assert jf.cache_info().compiles == 3


def test_explain_weak_type_flip_is_explained_against_the_same_dtype_and_shape():
    """Cached int32[2] first, then float32[2]: a weak float32[2] differs from
    each by one leaf, but from float32[2] only in its weak type, so that is the
    explanation (not the first-cached int32[2])."""
    import jax  # noqa: F401
    import jax.numpy as jnp

    fun, name = fresh1("explain_weak_flip", body=lambda x: x + 1)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache(), explain_misses=True)
    weak = jnp.broadcast_to(jnp.asarray(1.0), (2,))
    assert weak.weak_type and weak.dtype == jnp.float32
    with LogCapture(name) as cap:
        jf(jnp.zeros((2,), jnp.int32))
        jf(jnp.zeros((2,), jnp.float32))
        out = jf(weak)
    assert out.weak_type and out.tolist() == [2.0, 2.0]
    assert explanations(cap, name) == [
        "argument 'x': int32[2] -> float32[2]",
        "argument 'x': float32[2] -> float32[2]{weak}",
    ]


# --- placement labels (signatures() and explanations print them alike) --------


def test_the_jax_placement_label_names_the_device_of_a_single_device_sharding_else_the_str():
    class SingleDeviceSharding:
        def __init__(self, devices):
            self._device_assignment = devices

        def __repr__(self):
            return f"SDS({len(self._device_assignment)})"

    class Device:
        def __str__(self):
            return "gpu:3"

    class BadDevice:
        def __str__(self):
            raise RuntimeError("no str")

        def __repr__(self):
            return "BadDevice()"

    class BadSharding:
        def __repr__(self):
            raise RuntimeError("no repr")

    class StrSharding:
        def __str__(self):
            return "mesh(2)"

    import ftjit._jax

    label = ftjit._jax.placement_label
    assert label(SingleDeviceSharding((Device(),))) == "gpu:3"
    assert label(SingleDeviceSharding((BadDevice(),))) == "BadDevice()"
    assert label(SingleDeviceSharding((Device(), Device()))) == "SDS(2)"
    assert label(SingleDeviceSharding(())) == "SDS(0)"
    assert label(BadSharding()) == "<BadSharding object (repr failed)>"
    assert label(StrSharding()) == "mesh(2)"
    assert label("dev0") == "dev0"


def test_explain_names_the_placement_of_a_precompiled_sharded_spec():
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    fun, name = fresh1("explain_spec", body=lambda x: x * 2)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        # The CPU device by name: 'cpu:0' on every machine, the default backend's device or not.
        jf.precompile(jax.ShapeDtypeStruct((4,), jnp.float32, sharding=SingleDeviceSharding(jax.devices("cpu")[0])))
        jf(np.ones(4, np.float32))
    assert explanations(cap, name) == ["argument 'x': float32[4]@cpu:0 -> float32[4]"]


class _Placed:
    """A duck-typed array of a JAX-free compiler: dtype, shape, and a
    placement (``where``) that counts when ``placed``."""

    def __init__(self, dtype, n, where=None):
        self.dtype, self.shape = np.dtype(dtype), (n,)
        self.placed, self.where = where is not None, where


class _PlacedCompiler(CountingCompiler):
    def hooks(self, fun):
        return ftjit.CompilerHooks(
            context=ftjit.ContextHooks(committed_types=(_Placed,), committed_attr="placed", sharding_attr="where"),
            placement_label=lambda where: f"dev{where}")


def test_a_placement_change_is_explained_against_the_same_leaf_placed_elsewhere():
    """The closest signature is scored on the leaves' fields (kind, dtype,
    shape, weak type, placement): float32[8]@dev1 is one field away from
    float32[8]@dev0 and two from int32[8], cached first; placements print
    through the compiler's placement_label, as in signatures()."""
    fun, name = fresh1("explain_placed", body=lambda x: x)
    jf = ftjit.jit(fun, compiler=_PlacedCompiler(), cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        jf(_Placed(np.int32, 8))
        jf(_Placed(np.float32, 8, where=0))
        jf(_Placed(np.float32, 8, where=1))
    assert explanations(cap, name) == [
        "argument 'x': int32[8] -> float32[8]@dev0",
        "argument 'x': float32[8]@dev0 -> float32[8]@dev1",
    ]
    assert sorted(s.signature for s in jf.signatures()) == sorted(
        [f"{name}(int32[8])", f"{name}(float32[8]@dev0)", f"{name}(float32[8]@dev1)"])


def test_unequal_placements_that_print_the_same_are_named_so():
    class Where:
        def __init__(self, k):
            self.k = k

        def __eq__(self, other):
            return isinstance(other, Where) and other.k == self.k

        def __hash__(self):
            return hash(self.k)

        def __str__(self):
            return "somewhere"

    fun, name = fresh1("explain_placed_alike", body=lambda x: x)
    comp = _PlacedCompiler()
    comp.hooks = lambda fun: ftjit.CompilerHooks(context=ftjit.ContextHooks(
        committed_types=(_Placed,), committed_attr="placed", sharding_attr="where"))
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        jf(_Placed(np.float32, 8, where=Where(0)))
        jf(_Placed(np.float32, 8, where=Where(1)))
    assert explanations(cap, name) == [
        "argument 'x': float32[8]@somewhere -> float32[8]@somewhere (unequal leaves that print the same)"]


PLACEMENT_CHANGE = """
    import logging, jax, numpy as np, ftjit
    seen = []
    class Spy(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage().split(": ", 1)[1])
    logging.getLogger("ftjit.misses").addHandler(Spy())
    f = ftjit.jit(lambda x: x, explain_misses=True)
    cpu0, cpu1 = jax.devices("cpu")
    f(np.zeros(8, np.int32))
    f(jax.device_put(np.zeros(8, np.float32), cpu0))
    f(jax.device_put(np.zeros(8, np.float32), cpu1))
    print("|".join(seen))
"""


@pytest.mark.thread_unsafe(reason="spawns an interpreter; slow to repeat 8x")
def test_explain_names_the_placement_change_of_a_committed_jax_array():
    """JAX compiler, two CPU devices: a committed array moved from cpu:0 to
    cpu:1 is explained against float32[8]@cpu:0 (one field differs), not
    against the int32[8] cached first (two differ)."""
    out = run_script(PLACEMENT_CHANGE, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert out.split("|") == [
        "argument 'x': int32[8] -> float32[8]@cpu:0",
        "argument 'x': float32[8]@cpu:0 -> float32[8]@cpu:1",
    ]


def test_exported_records_carry_the_core_printers_texts():
    """Each record the core exports carries, per argument (positional, then
    keyword), its tree as signatures() prints it with each leaf as "*" (a
    static: its repr) and each leaf's own text: the printer's, which
    explanations show. same_record (the values' own equality) ignores them."""
    Point = collections.namedtuple("Point", "x y")
    name = unique_name("explain_texts")

    def fun(a, n, *, k):
        return a

    jf = ftjit.jit(named(fun, name), static_argnames="n", compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    jf({"b": [z(2), 1.0], "a": (Point(True, 1j), None)}, n="s", k=z(3, 0, dtype=np.int8))
    [record] = jf._signatures()
    [info] = jf.signatures()
    assert list(record.kwargs) == ["k", "n"]
    assert record.texts == (
        ("{'a': (Point(*, *), None), 'b': [*, *]}", ("bool", "complex", "float32[2]", "float")),
        ("*", ("int8[3,0]",)),
        ("'s'", ()),
    )
    assert info.signature == (f"{name}({{'a': (Point(bool, complex), None), 'b': [float32[2], float]}}, "
                              "k=int8[3,0], n='s')")
    assert ftjit._specs_format.same_record(record, record._replace(texts=())) is None


def test_exported_texts_print_placements_through_the_compilers_placement_label():
    jf = ftjit.jit(lambda x: x, compiler=_PlacedCompiler(), cache=ftjit.FunctionCache())
    jf((_Placed(np.int8, 3, where="here"), _Placed(np.int8, 3)))
    [record] = jf._signatures()
    assert record.texts == (("(*, *)", ("int8[3]@devhere", "int8[3]")),)
    assert jf._signature_record_of((_Placed(np.int8, 3, where="here"), _Placed(np.int8, 3))) == record


# --- what changed in the tracing context --------------------------------------


def test_explain_names_the_jax_config_that_changed():
    """A miss caused by a JAX config names the config item and both values,
    against the closest cached signature (fewest items differing)."""
    import jax

    fun, name = fresh1("explain_config", body=lambda x: x * 2)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        jf(np.float32(1.0))
        with jax.enable_x64(True):  # thread-local: other tests' threads keep x64 off
            jf(np.float32(1.0))
        with jax.numpy_rank_promotion("raise"):
            jf(np.float32(1.0))
    assert explanations(cap, name) == [
        "tracing context jax_enable_x64: False -> True",
        "tracing context jax_numpy_rank_promotion: 'allow' -> 'raise'",
    ]
    assert jf.cache_info().compiles == 3


def test_explain_names_the_context_item_of_the_public_fallback(monkeypatch):
    """With jax's public API only (no private trace_context), the items are
    the public configs, named alike."""
    import jax

    monkeypatch.setattr(ftjit._jax_hooks, "_hooks", ftjit._jax_hooks.build_hooks(frozenset()))
    fun, name = fresh1("explain_public", body=lambda x: x * 2)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        jf(np.float32(1.0))
        with jax.enable_x64(True):
            jf(np.float32(1.0))
    assert explanations(cap, name) == ["tracing context jax_enable_x64: False -> True"]


class _NamedContextCompiler(ContextCompiler):
    context_names = ("mode", ("a", "b"), "level")


class _SameRepr:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, _SameRepr) and other.v == self.v

    def __hash__(self):
        return hash(self.v)

    def __repr__(self):
        return "SameRepr"


@pytest.mark.parametrize("named_items", [False, True], ids=["by_position", "by_name"])
def test_explain_names_custom_compiler_context_items(named_items):
    """A custom compiler's context: items are named by its ``context_names``
    (nested like the context) or else by position; a value that is not a plain
    value prints by its repr, and unequal values that print alike say so."""
    comp = _NamedContextCompiler() if named_items else ContextCompiler()
    fun, name = fresh1("explain_custom_context")
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        comp.cur = ("train", (1, 2), _SameRepr(1))
        jf(1.0)
        comp.cur = ("eval", (1, 3), _SameRepr(1))
        jf(1.0)
        comp.cur = ("train", (1, 2), _SameRepr(2))
        jf(1.0)
        comp.cur = "not a tuple"
        jf(1.0)
    if named_items:
        first = ["tracing context mode: 'train' -> 'eval'", "tracing context b: 2 -> 3"]
        second = ["tracing context level: SameRepr -> SameRepr (unequal values that print the same)"]
    else:
        first = ["tracing context[0]: 'train' -> 'eval'", "tracing context[1][1]: 2 -> 3"]
        second = ["tracing context[2]: SameRepr -> SameRepr (unequal values that print the same)"]
    assert explanations(cap, name) == [
        "; ".join(first),
        "; ".join(second),
        "tracing context: ('train', (1, 2), SameRepr) -> 'not a tuple'",
    ]
    assert jf.cache_info().compiles == 4


class _WholeContextNamed(ContextCompiler):
    context_names = "mode"


def test_explain_context_names_may_name_the_whole_context():
    comp = _WholeContextNamed()
    fun, name = fresh1("explain_whole_context")
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        comp.cur = "train"
        jf(1.0)
        comp.cur = "eval"
        jf(1.0)
    assert explanations(cap, name) == ["tracing context mode: 'train' -> 'eval'"]


def test_explain_cuts_long_context_values():
    comp = ContextCompiler()
    fun, name = fresh1("explain_long_context")
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        comp.cur = "a" * 200
        jf(1.0)
        comp.cur = "b" * 200
        jf(1.0)
    assert explanations(cap, name) == [f"tracing context: '{'a' * 76}... -> '{'b' * 76}..."]


# --- what the core keys on, named ---------------------------------------------


# Pytree node data that differs but prints alike is a tree difference, as the core keys it
def test_explain_unequal_pytree_node_data_that_prints_the_same():
    """Aux data that differs but prints alike is named as a tree difference,
    not blamed on the tracing context."""
    Layer = meta_dataclass()
    fun, name = fresh1("explain_aux", body=lambda l: l.w * 2)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache(), explain_misses=True)
    with LogCapture(name) as cap:
        jf(Layer(np.float32(1), _SameRepr(1)))
        jf(Layer(np.float32(1), _SameRepr(2)))
    [why] = explanations(cap, name)
    tree = "PyTreeDef(CustomNode(Layer[(SameRepr,)], [*]))(*)"
    assert why == f"argument 'x': tree structure {tree} -> {tree} (unequal node data that prints the same)"
    assert jf.cache_info().compiles == 2
