"""ftjit.batched with JAX: 64 threads with exact results (jax Arrays and numpy rows), shapes and statics
batched apart, the warm-up of every size, a call inside a trace, stats. The protocol itself:
tests/test_batched.py.

Thread tests start on a Barrier (helpers.run_threads), join with a timeout and re-raise worker exceptions.
"""

import gc

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
        return jnp.tanh(x @ w1) @ w2

    return mlp


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
            np.testing.assert_allclose(np.asarray(row), want[i], rtol=1e-6)
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
