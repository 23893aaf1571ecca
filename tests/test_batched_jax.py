"""ftjit.batched with JAX: 64 threads with exact results (jax Arrays and numpy rows), shapes and statics
batched apart, the warm-up of every size, a call inside a trace, stats. The protocol itself:
tests/test_batched.py.

Thread tests start on a Barrier (helpers.run_threads), join with a timeout and re-raise worker exceptions.
"""

import gc
import threading
import warnings

import numpy as np
import pytest

import ftjit
from helpers import run_threads

pytestmark = pytest.mark.timeout(120)

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402


def _mlp():
    w1 = np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 100
    w2 = np.arange(8 * 4, dtype=np.float32).reshape(8, 4) / 10

    def mlp(x):
        # float32 products on every backend: a TPU's default passes bfloat16, whose rounding differs between a
        # batch's shape and one example's (docs/behaviour.md, "Batching").
        with jax.default_matmul_precision("highest"):
            return jnp.tanh(x @ w1) @ w2

    return mlp


#: How far a batched row may be from a lone call's: float32 products are ordered alike on the CPU; an
#: accelerator may order a batch's sums otherwise, at float32 precision still.
RTOL = 1e-6 if jax.default_backend() == "cpu" else 1e-5


@pytest.mark.thread_unsafe(reason="runs 64 threads of its own and compiles every batch size: 8 copies at once are "
                                  "512 threads and eight times the compiles, a minute of CI for nothing more")
@pytest.mark.parametrize("to_host", [False, True])
def test_64_threads_get_exact_results(to_host):
    mlp = _mlp()
    predict = ftjit.batched(mlp, max_batch=64, to_host=to_host, cache=ftjit.FunctionCache())
    xs = [np.full(16, i / 64, np.float32) for i in range(64)]
    want = [np.asarray(jax.jit(mlp)(x)) for x in xs]

    def work(i):
        return [predict(xs[i]) for _ in range(10)]

    out = run_threads(64, work, timeout=120)
    for i, rows in enumerate(out):
        for row in rows:
            assert isinstance(row, np.ndarray) if to_host else isinstance(row, jax.Array)
            np.testing.assert_allclose(np.asarray(row), want[i], rtol=RTOL)
    info = predict.batch_info()
    assert info.calls == 640 and info.alone + sum(n * c for n, c in info.sizes) == 640
    assert info.failed_batches == info.timeouts == 0


def test_shapes_and_statics_are_batched_apart():
    def scale(x, k):
        return x * k

    predict = ftjit.batched(scale, static_argnums=1, max_wait=0.005, cache=ftjit.FunctionCache())

    def work(i):
        x = np.full(8 if i % 2 else 4, i, np.float32)
        k = 2 if i % 4 < 2 else 3
        return [np.asarray(predict(x, k)).tolist() for _ in range(5)]

    out = run_threads(16, work, timeout=120)
    for i, rows in enumerate(out):
        assert rows == [[i * (2 if i % 4 < 2 else 3)] * (8 if i % 2 else 4)] * 5
    # Every batch program compiled has one shape and one static: never a mix.
    for sig in predict._runner.many.signatures():
        assert ("float32[" in sig.signature) and (", 2)" in sig.signature or ", 3)" in sig.signature)


def test_warmup_compiles_every_size_and_traffic_compiles_nothing():
    mlp = _mlp()
    predict = ftjit.batched(mlp, max_batch=16, cache=ftjit.FunctionCache())
    report = predict.warmup([(jax.ShapeDtypeStruct((16,), jnp.float32),)])
    assert report.ok and len(report) == 1 + 4  # the example's signature, then sizes 2, 4, 8, 16
    one, many = predict._runner.one.cache_info(), predict._runner.many.cache_info()
    assert (one.compiles, many.compiles) == (1, 4)

    def work(i):
        return [np.asarray(predict(np.full(16, i, np.float32))) for _ in range(10)]

    run_threads(32, work, timeout=120)
    assert (predict._runner.one.cache_info().compiles, predict._runner.many.cache_info().compiles) == (1, 4)


def test_a_call_inside_a_trace_is_not_batched():
    predict = ftjit.batched(lambda x: x + 1, cache=ftjit.FunctionCache())
    out = jax.jit(lambda y: predict(y) * 2)(jnp.arange(3.0))
    assert np.asarray(out).tolist() == [2.0, 4.0, 6.0]
    assert predict.batch_info().fallback == 1


def test_stats_and_batch_info_name_the_function():
    def classify(x):
        return x.sum()

    predict = ftjit.batched(classify, cache=ftjit.FunctionCache())
    predict(np.ones(3, np.float32))
    info = predict.batch_info()
    assert info.name == "classify" and info.calls == 1
    assert any(b.name == "classify" and b.calls == 1 for b in ftjit.stats().batched)
    gc.collect()


# --- issue 45: every caller gets what a lone call gives --------------------------------------------------------


def _lone_and_batched(fn, examples, threads=None, **options):
    """Each example called by its own thread of ``threads`` (all of them at once, on a Barrier), through one
    ``ftjit.batched(fn)`` with a long max_wait (so that they batch), and alone through ``ftjit.jit(fn)`` (what a
    lone call of the batched function runs): (batched outcomes, lone outcomes, the batched function), an outcome
    being the result or the exception."""
    predict = ftjit.batched(fn, max_wait=0.05, to_host=False, cache=ftjit.FunctionCache(), **options)

    def outcome(call):
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - compared below
            return error

    alone = ftjit.jit(fn, cache=ftjit.FunctionCache(), **{k: v for k, v in options.items() if k.startswith("static")})
    lone = [outcome(lambda ex=ex: alone(*ex)) for ex in examples]
    batched = run_threads(threads or len(examples), lambda i: outcome(lambda: predict(*examples[i])), timeout=120)
    return batched, lone, predict


def _same_outcome(got, want):
    if isinstance(want, Exception):
        assert (type(got), str(got)) == (type(want), str(want))
        return
    assert not isinstance(got, Exception), got
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert isinstance(g, jax.Array) and g.dtype == w.dtype and g.weak_type == w.weak_type and g.shape == w.shape
        assert np.array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.thread_unsafe(reason="runs its own threads; 8 copies at once on a GIL build can leave every call "
                                   "alone, which is not what it tests")
def test_python_scalars_keep_their_weak_type_in_a_batch():
    """Finding 1: stacked Python scalars lost their weak type: bf16 x * 1.5 gave float32, int8(100) * 3 gave
    int32 300 (alone: int8 44), and int8 + 2**40 wrapped silently (alone: OverflowError). Now each caller's
    dtype, weak type, value and error are the lone call's."""
    bf = [(jnp.full(4, i, jnp.bfloat16), 1.5 + i) for i in range(16)]
    batched, lone, predict = _lone_and_batched(lambda x, s: x * s, bf)
    for got, want in zip(batched, lone):
        _same_outcome(got, want)
        assert got.dtype == jnp.bfloat16
    assert predict.batch_info().batches >= 1
    ints = [(np.full(3, 100, np.int8), 3)] * 8 + [(np.full(3, 1, np.int8), 2**40)] + [(np.full(3, 7, np.int8), 1)] * 7
    batched, lone, predict = _lone_and_batched(lambda x, k: x * k, ints)
    assert isinstance(lone[8], OverflowError)
    for got, want in zip(batched, lone):
        _same_outcome(got, want)
    assert np.asarray(batched[0]).tolist() == [44, 44, 44]  # int8 wraps 300, as alone
    info = predict.batch_info()
    # The call holding 2**40 fails alone (once: batched or not), and so does its batch, if it was in one.
    assert info.calls == 16 and info.failed_batches == 1 + (info.retried > 0)


@pytest.mark.thread_unsafe(reason="runs its own threads")
@pytest.mark.parametrize("statics, call", [
    (dict(static_argnames="n"), lambda x, i: (x, 2 + i % 2)),
    (dict(static_argnums=1), lambda x, i: ((x,), dict(n=2 + i % 2))),
    (dict(static_argnums=(-1,)), lambda x, i: (x, 2 + i % 2)),
], ids=["argnames-by-position", "argnums-by-name", "negative-argnums"])  # fmt: skip
def test_statics_by_name_or_position_batch_as_jax_jit_takes_them(statics, call):
    """Finding 2: static_argnames=("n",) called as f(x, 2), static_argnums=1 as f(x, n=2) failed on every call;
    static_argnums=(-1,) failed in 126 of 128 concurrent calls. Statics are now resolved by the core, as jax.jit
    resolves them, for the batch too."""

    def power(x, n):  # n must be static: a Python loop bound
        out = x
        for _ in range(n - 1):
            out = out * x
        return out

    predict = ftjit.batched(power, max_wait=0.05, cache=ftjit.FunctionCache(), **statics)

    def work(i):
        made = call(np.full(4, i % 5, np.float32), i)
        args, kwargs = made if isinstance(made[-1], dict) else (made, {})
        return np.asarray(predict(*args, **kwargs)).tolist(), 2 + i % 2

    out = run_threads(128, work, timeout=120)
    for i, (got, n) in enumerate(out):
        assert got == [float((i % 5) ** n)] * 4
    info = predict.batch_info()
    assert info.calls == 128 and info.failed_batches == 0 and info.batches >= 1


@pytest.mark.thread_unsafe(reason="runs its own threads")
def test_a_function_without_array_arguments_runs_per_call():
    """Finding 3: a function with no argument, or statics only, failed 93 of 96 concurrent calls (vmap of no
    array). Such calls run alone."""
    none = ftjit.batched(lambda: jnp.arange(3) * 2, cache=ftjit.FunctionCache())
    statics = ftjit.batched(lambda n: jnp.arange(n), static_argnums=0, cache=ftjit.FunctionCache())
    out = run_threads(96, lambda i: (np.asarray(none()).tolist(), np.asarray(statics(i % 3 + 1)).tolist()),
                      timeout=120)
    assert out == [([0, 2, 4], list(range(i % 3 + 1))) for i in range(96)]
    for info in (none.batch_info(), statics.batch_info()):
        assert (info.calls, info.alone, info.batches, info.failed_batches) == (96, 96, 0, 0)


@pytest.mark.parametrize("to_host", [True, False])
def test_scalar_outputs_are_0d_arrays_batched_as_alone(to_host):
    """Finding 8: a scalar output was an np.float32 row batched but a 0-d array alone."""
    predict = ftjit.batched(lambda x: x.sum(), max_wait=0.05, to_host=to_host, cache=ftjit.FunctionCache())
    out = run_threads(16, lambda i: predict(np.full(3, i, np.float32)), timeout=120)
    alone = predict(np.full(3, 1, np.float32))
    kind = np.ndarray if to_host else jax.Array
    assert type(alone) is type(out[0]) and isinstance(alone, kind) and alone.shape == () and alone.dtype == np.float32
    assert all(isinstance(r, kind) and r.shape == () and float(r) == 3.0 * i for i, r in enumerate(out))
    assert predict.batch_info().batches >= 1


@pytest.mark.thread_unsafe(reason="runs its own threads; warns once per process")
def test_a_function_vmap_cannot_take_runs_per_call_with_a_warning():
    """Finding 8: functions vmap refuses (here pure_callback without vmap_method) worked alone and failed in 198 of
    200 concurrent calls. The batched program's compile fails once; its signature then runs per call, said by a
    RuntimeWarning."""

    def host(x):
        return jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    predict = ftjit.batched(host, max_wait=0.05, cache=ftjit.FunctionCache())
    with pytest.warns(RuntimeWarning, match=r"ftjit\.batched\(host\): its batched program cannot be compiled .*; "
                                            r"its calls run one at a time"):
        out = run_threads(64, lambda i: [np.asarray(predict(np.full(2, i, np.float32))).tolist() for _ in range(3)],
                          timeout=120)
    assert out == [[[2.0 * i] * 2] * 3 for i in range(64)]
    info = predict.batch_info()
    # Up to two batches of a signature run at once: a second may have started, and waited for the first's compile,
    # before the first learned it fails (its waiters get the same error; the failed compile ran once).
    assert info.calls == 192 and info.batches == 0 and 1 <= info.failed_batches <= 2 and info.compiles == 1


@pytest.mark.thread_unsafe(reason="runs its own threads")
def test_queues_go_when_idle_and_after_clear_cache():
    """Finding 7: 3,000 distinct statics with a cache of 16 left 3,000 queues, still there after clear_cache()."""
    predict = ftjit.batched(lambda x, k: x + k, static_argnums=1, max_wait=0.002,
                            cache=ftjit.FunctionCache(capacity=16))
    run_threads(8, lambda i: [predict(np.ones(2, np.float32), 8 * j + i) for j in range(40)], timeout=300)
    assert predict._queues == {}
    assert predict.batch_info().calls == 320
    predict.clear_cache()
    assert predict._runner._plans == {} and predict._runner.per_call == {}


# --- issue 51: the third pass --------------------------------------------------------------------------------


@pytest.mark.thread_unsafe(reason="runs its own threads")
def test_equal_statics_of_other_types_get_their_own_program():
    """Finding 1: statics that compare equal but differ in type (1, 1.0, True; 3 and np.int32(3)) shared one
    batched program: 14 of 24 callers got another static's dtype. A batch's plan keys them as ftjit.jit does,
    by type and value."""

    def fill(x, n):  # x is only what the batch stacks
        return jnp.full(3, n)

    statics = [1, 1.0, True] * 8
    examples = [(np.zeros(2, np.float32), n) for n in statics]
    for _ in range(3):
        batched, lone, predict = _lone_and_batched(fill, examples, static_argnums=1)
        for got, want in zip(batched, lone):
            _same_outcome(got, want)
    assert {str(g.dtype) for g in batched} == {"int32", "float32", "bool"}
    assert predict.batch_info().batches >= 1
    mixed = [(np.full(3, 100, np.int8), 3), (np.full(3, 100, np.int8), np.int32(3))] * 8
    for _ in range(3):
        batched, lone, predict = _lone_and_batched(lambda x, k: x * k, mixed, static_argnums=1)
        for got, want in zip(batched, lone):
            _same_outcome(got, want)
    assert [np.asarray(g).tolist() for g in batched[:2]] == [[44] * 3, [300] * 3]
    assert predict.batch_info().batches >= 1


def test_each_request_effects_run_once():
    """Finding 4: with an io_callback per request, padding rows ran the first example's callback again (9 to 14
    times for 9 callers, sizes=(1, 16)), and a failed batch's retry ran the clean ones a second time. A function
    whose program has effects runs each call alone."""
    from jax.experimental import io_callback

    seen, lock = [], threading.Lock()

    def audit(v):
        with lock:
            seen.append(int(v))
        return np.int32(0)

    def f(x):
        io_callback(audit, jax.ShapeDtypeStruct((), jnp.int32), x[0].astype(jnp.int32))
        return x * 2

    predict = ftjit.batched(f, max_wait=0.05, sizes=(1, 16), max_batch=16, cache=ftjit.FunctionCache())
    for round_ in range(3):
        seen.clear()
        out = run_threads(9, lambda i: np.asarray(predict(np.full(2, i, np.float32))).tolist(), timeout=120)
        assert out == [[2.0 * i] * 2 for i in range(9)]
        jax.effects_barrier()
        assert sorted(seen) == list(range(9)), (round_, sorted(seen))
    info = predict.batch_info()
    assert info.batches == 0 and info.padded_rows == 0 and info.calls == 27


def test_a_kept_result_holds_its_own_row_not_the_batch():
    """Finding 5: with to_host, each caller's row was a view of the batch's host array: a kept 4 MiB row held a
    64 MiB base. Each row is now copied out: it owns its memory, the size of its row."""

    def held(row):  # the bytes of the largest numpy array the row keeps alive (a view keeps its base)
        base = row
        while isinstance(base.base, np.ndarray):
            base = base.base
        return base.nbytes

    predict = ftjit.batched(lambda x: x * 2, max_wait=0.05, cache=ftjit.FunctionCache())
    out = run_threads(16, lambda i: predict(np.full((256, 64), i, np.float32)), timeout=120)
    for i, row in enumerate(out):
        assert isinstance(row, np.ndarray) and row.shape == (256, 64) and held(row) == row.nbytes == 256 * 64 * 4
        assert np.array_equal(row, np.full((256, 64), 2.0 * i, np.float32))
    tree = ftjit.batched(lambda x: {"a": x, "b": x.sum()}, max_wait=0.05, cache=ftjit.FunctionCache())
    out = run_threads(16, lambda i: tree(np.full(8, i, np.float32)), timeout=120)
    for i, row in enumerate(out):
        assert held(row["a"]) == 32 and held(row["b"]) == 4 and float(row["b"]) == 8.0 * i
    assert predict.batch_info().batches >= 1 and tree.batch_info().batches >= 1


#: How far a batched row of tanh(x @ W), W 512x256, may be from a lone call's: XLA's CPU kernels sum in an order
#: that depends on the batch's size (here up to 1e-6 apart, 209 of 256 elements differing at sizes 2 to 32); an
#: accelerator's differ more (float32 products asked for: "highest" precision).
NUMERIC_ATOL = 1e-5 if jax.default_backend() == "cpu" else 1e-4


def _wide_mlp():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 256), dtype=np.float32) / 20
    xs = [rng.standard_normal(512, dtype=np.float32) for _ in range(32)]

    def layer(x):
        with jax.default_matmul_precision("highest"):
            return jnp.tanh(x @ w)

    return layer, xs


@pytest.mark.thread_unsafe(reason="runs its own threads")
def test_a_batched_row_is_the_lone_call_to_the_kernels_rounding():
    """Finding 6: the docs said a batched row equals a lone call's on the CPU; with a 512x256 matrix 31 rows in
    32 differed (1.7e-5 at most), and one example's answer changed with its batch's size. What is exact: dtype,
    weak type and shape; values agree to the kernel's rounding (NUMERIC_ATOL)."""
    layer, xs = _wide_mlp()
    lone = [np.asarray(jax.jit(layer)(x)) for x in xs]
    predict = ftjit.batched(layer, max_wait=0.05, cache=ftjit.FunctionCache())
    for _ in range(3):
        out = run_threads(32, lambda i: predict(xs[i]), timeout=120)
        for got, want in zip(out, lone):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=0, atol=NUMERIC_ATOL)
    assert predict.batch_info().batches >= 1


def test_one_size_makes_a_batched_row_independent_of_its_companions():
    """With a single size, every batch runs one program (padded to that size): one example's row comes out bit
    for bit the same whatever other examples it was batched with. A call that runs alone still runs the
    one-example program: at most two answers for one example, the batch's and the lone call's."""
    layer, xs = _wide_mlp()
    predict = ftjit.batched(layer, max_wait=0.05, max_batch=8, sizes=(8,), cache=ftjit.FunctionCache())
    answers = set()
    for r in range(6):
        out = run_threads(8, lambda i: predict(xs[0] if i == 0 else xs[(i + 5 * r) % 31 + 1]), timeout=120)
        answers.add(out[0].tobytes())
    assert len(answers) <= 2, len(answers)
    assert predict.batch_info().batches >= 1


class _Scaler:
    def __init__(self, k):
        self.k = k

    @ftjit.batched(static_argnums=0, max_wait=0.05)
    def scale(self, x):
        return x * self.k


def test_a_batched_method_binds_self():
    """Finding 7: @ftjit.batched on a method did not bind self: m.scale(x) passed x as self (an
    UnhashableStaticArgumentError here), where jax.jit and ftjit.jit bind it."""
    m, n = _Scaler(3.0), _Scaler(5.0)
    assert np.asarray(m.scale(np.ones(2, np.float32))).tolist() == [3.0, 3.0]
    out = run_threads(16, lambda i: np.asarray((m if i % 2 else n).scale(np.full(2, i, np.float32))).tolist(),
                      timeout=120)
    assert out == [[i * (3.0 if i % 2 else 5.0)] * 2 for i in range(16)]
    assert isinstance(_Scaler.scale, ftjit.BatchedFunction)


def test_typed_prng_key_outputs_pass_through_to_host():
    """Finding 7: a typed PRNG key output failed with the default to_host, lone or batched (numpy has no form for
    it), while ftjit.jit returns it. A leaf with no host form stays a jax Array, as ftjit.jit gives it."""

    def keys(x):
        return {"key": jax.random.fold_in(jax.random.key(0), x[0].astype(jnp.uint32)), "y": x * 2}

    predict = ftjit.batched(keys, max_wait=0.05, cache=ftjit.FunctionCache())
    alone = ftjit.jit(keys, cache=ftjit.FunctionCache())
    for _ in range(2):
        out = run_threads(16, lambda i: predict(np.full(2, i, np.int32)), timeout=120)
        for i, got in enumerate(out):
            want = alone(np.full(2, i, np.int32))
            assert isinstance(got["key"], jax.Array) and got["key"].dtype == want["key"].dtype
            assert np.array_equal(jax.random.key_data(got["key"]), jax.random.key_data(want["key"]))
            assert isinstance(got["y"], np.ndarray) and got["y"].tolist() == [2 * i] * 2
    assert predict.batch_info().batches >= 1


@pytest.mark.thread_unsafe(reason="runs its own threads; patches the runner's bound")
def test_signatures_run_per_call_are_bounded(monkeypatch):
    """Finding 3: ``per_call`` (the signatures whose calls run alone) grew by one entry per static (400 for 400)
    until clear_cache(). It keeps at most _MAX_PLANS, here patched to 4."""
    from ftjit import _batch_jax

    monkeypatch.setattr(_batch_jax, "_MAX_PLANS", 4)

    def f(x, k):  # vmap refuses pure_callback without vmap_method: each signature's calls run alone
        return jax.pure_callback(lambda v: np.asarray(v) * k, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    predict = ftjit.batched(f, static_argnums=1, max_wait=0.05, cache=ftjit.FunctionCache())
    learned = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "its batched program cannot be compiled", said once
        for k in range(10):
            before = predict.batch_info().failed_batches
            out = run_threads(6, lambda i: np.asarray(predict(np.full(2, i, np.float32), k)).tolist(), timeout=120)
            assert out == [[float(i * k)] * 2 for i in range(6)]
            learned += predict.batch_info().failed_batches > before
            assert len(predict._runner.per_call) <= 4
    assert learned >= 3  # signatures that reached a batch were learned as per call (past 4, the oldest forgotten)
    assert predict._queues == {}


def test_jax_array_rows_of_list_outputs_are_each_callers_own():
    """A review of issue 51's split found that with to_host=False a list in the output was taken for the rows'
    container: caller 0 got [a_0, a_1] and caller 1 [b_0, b_1]. Each caller gets its own row of every leaf."""
    predict = ftjit.batched(lambda x: [x, {"twice": [x * 2]}], max_wait=0.05, to_host=False,
                            cache=ftjit.FunctionCache())
    for _ in range(3):
        out = run_threads(8, lambda i: predict(np.full(2, i, np.float32)), timeout=120)
        for i, got in enumerate(out):
            assert isinstance(got, list) and len(got) == 2
            assert np.asarray(got[0]).tolist() == [float(i)] * 2
            assert np.asarray(got[1]["twice"][0]).tolist() == [2.0 * i] * 2
    assert predict.batch_info().batches >= 1
