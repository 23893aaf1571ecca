"""Restart without cold compiles: JitFunction.warmup_specs() turns the cached
signatures back into warm-up specs, and ftjit.save_specs/load_specs keep
them in a file across a restart.

Every test builds its own FunctionCache or fresh functions; the round trip
runs two fresh interpreters (the process that saves, and the restarted one
that loads), with the pytree classes in a module both can import.
"""

import os
import pickle
import subprocess
import sys
import textwrap
import threading

import pytest

import ftjit
from helpers import ContextCompiler, CountingCompiler, child_env, run_threads

jax = pytest.importorskip("jax")  # the default compiler (absent only in dev.sh tsan-ft)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

MODEL = textwrap.dedent(
    """
    import collections, dataclasses, functools
    import jax, jax.numpy as jnp
    import ftjit

    Adam = collections.namedtuple("Adam", "count mu nu")

    @functools.partial(jax.tree_util.register_dataclass, data_fields=["x", "y"], meta_fields=["tag"])
    @dataclasses.dataclass
    class Batch:
        x: object
        y: object
        tag: str

    @ftjit.jit(static_argnames="mode")
    def step(params, state, batch, *, mode="train"):
        return params["w"].sum() + state.count + batch.x.sum()

    def traffic():
        for n in (2, 3):
            for mode in ("train", "eval"):
                params = {"w": jnp.ones((n, 4)), "b": jnp.zeros(4)}
                state = Adam(jnp.zeros((), jnp.int32), params, params)
                yield (params, state, Batch(jnp.ones(n), jnp.ones(n), "v1")), {"mode": mode}
    """
)

SAVE = textwrap.dedent(
    """
    import sys, jax
    jax.config.update("jax_enable_x64", True)
    import model, ftjit
    for args, kwargs in model.traffic():
        model.step(*args, **kwargs)
    print("saved", ftjit.save_specs(sys.argv[1], model.step))
    print("cached", sorted(s.signature for s in model.step.signatures()))
    """
)

RESTART = textwrap.dedent(
    """
    import sys, jax
    jax.config.update("jax_enable_x64", True)
    import model, ftjit
    report = model.step.warmup(ftjit.load_specs(sys.argv[1]).for_function(model.step))
    print("ok", report.ok, len(report))
    print("cached", sorted(s.signature for s in model.step.signatures()))
    compiles = model.step.cache_info().compiles
    for args, kwargs in model.traffic():
        model.step(*args, **kwargs)
    print("compiles during traffic", model.step.cache_info().compiles - compiles)
    """
)


def _run(tmp_path, script, *args):
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", script, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)


@pytest.mark.thread_unsafe(reason="runs two interpreters in turn")
def test_round_trip_through_a_file_into_a_fresh_process_compiles_nothing_during_traffic(tmp_path):
    """Containers, a namedtuple optimizer state, a registered dataclass, a
    static keyword and jax_enable_x64 on: the restarted process warms up
    exactly the signatures the first one cached, and its traffic compiles
    nothing."""
    (tmp_path / "model.py").write_text(MODEL)
    path = str(tmp_path / "specs.pkl")
    first = _run(tmp_path, SAVE, path)
    assert first.returncode == 0, first.stderr
    saved_line, cached_line = first.stdout.splitlines()
    assert saved_line == "saved {'model:step': (4, ())}"
    assert "float64[2,4]" in cached_line  # jax_enable_x64 on: jnp.ones makes float64 arrays
    second = _run(tmp_path, RESTART, path)
    assert second.returncode == 0, second.stderr
    ok_line, restored_line, traffic_line = second.stdout.splitlines()
    assert ok_line == "ok True 4"
    assert restored_line == cached_line
    assert traffic_line == "compiles during traffic 0"


def test_warming_up_from_warmup_specs_makes_exactly_the_cached_signatures():
    import collections

    Pair = collections.namedtuple("Pair", "a b")

    def f(d, p, n, *, scale=1.0):
        return d["x"] * scale

    jf = ftjit.jit(f, static_argnums=2, cache=ftjit.FunctionCache())
    calls = [
        (({"x": jnp.ones(3), "y": [jnp.zeros(2), None]}, Pair(jnp.ones(3), 2.0), "a"), {}),
        (({"x": jnp.ones(5), "y": [jnp.zeros(2), None]}, Pair(jnp.ones(5), 2), "b"), {"scale": 3.0}),
        (({"x": jnp.ones((2, 2), jnp.int32), "y": [jnp.zeros(2), None]}, Pair(jnp.ones(1), True), "a"), {}),
    ]
    for args, kwargs in calls:
        jf(*args, **kwargs)
    before = [s.signature for s in jf.signatures()]
    specs = jf.warmup_specs()
    assert specs.left_out == ()
    assert [jf._signature_of(*s.args, **s.kwargs) for s in specs] == before  # newest first, exactly these
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for s in specs for leaf in jax.tree_util.tree_leaves(s.args[0]))
    jf.clear_cache()
    report = jf.warmup(specs)
    assert report.ok and [r.compiled for r in report] == [True, True, True]
    assert sorted(s.signature for s in jf.signatures()) == sorted(before)
    compiles = jf.cache_info().compiles
    for args, kwargs in calls:
        jf(*args, **kwargs)
    assert jf.cache_info().compiles == compiles == 3 + 3  # the first calls', the warm-up's, none since


def test_a_committed_array_s_placement_is_kept_in_its_spec_and_the_file(tmp_path):
    cpu = jax.devices("cpu")[0]
    jf = ftjit.jit(lambda x: x * 2, cache=ftjit.FunctionCache())
    jf(jax.device_put(jnp.ones(3), cpu))
    (spec,) = jf.warmup_specs()
    assert spec.args[0].sharding == jax.sharding.SingleDeviceSharding(cpu)
    path = tmp_path / "specs.pkl"
    assert ftjit.save_specs(path, jf) == {f"{jf.__module__}:{jf.__qualname__}": (1, ())}
    jf.clear_cache()
    report = jf.warmup(ftjit.load_specs(path).for_function(jf))
    assert report.ok and report[0].signature == f"{jf.__qualname__}(float32[3]@{cpu})"
    jf(jax.device_put(jnp.ones(3), cpu))
    assert jf.cache_info().compiles == 2 and jf.cache_info().hits == 1


def test_a_spec_that_cannot_be_rebuilt_is_left_out_and_said_why():
    """A static value that does not pickle, and a signature compiled under
    another context than this thread's now: left out, never changed."""
    comp = ContextCompiler()
    jf = ftjit.jit(lambda x, s: x, static_argnums=1, compiler=comp, cache=ftjit.FunctionCache())
    comp.cur = ("mode", "a")
    jf(1.0, 3)
    comp.cur = ("mode", "b")
    unpicklable = threading.Lock()  # hashable, does not pickle
    jf(1.0, unpicklable)
    jf(2.0, 4)
    specs = jf.warmup_specs()
    assert [jf._signature_of(*s.args) for s in specs] == [f"{jf.__qualname__}(float, 4)"]
    reasons = dict(specs.left_out)
    assert len(reasons) == 2
    assert reasons[f"{jf.__qualname__}(float, 3)"] == "it was compiled under another context than this thread's now"
    lock_sig = next(k for k in reasons if "lock" in k)
    assert reasons[lock_sig].startswith(f"the static value {unpicklable!r} does not pickle (TypeError: ")


def _saved_function(static=False):
    def g(x, y):
        return x + y

    jf = ftjit.jit(g, static_argnums=1 if static else None, cache=ftjit.FunctionCache())
    if not static:
        jf(jnp.ones(2), 1.0)
    return jf


@pytest.mark.parametrize("damage", ["corrupted", "truncated", "future version", "not a specs file", "missing"])
def test_a_file_that_cannot_be_used_is_one_report_line_and_the_start_goes_on(tmp_path, damage):
    jf = _saved_function()
    path = tmp_path / "specs.pkl"
    ftjit.save_specs(path, jf)
    data = path.read_bytes()
    if damage == "corrupted":
        path.write_bytes(b"\x80\x05garbage" + data[10:])
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "future version":
        payload = pickle.loads(data)
        payload["version"] = 99
        path.write_bytes(pickle.dumps(payload))
    elif damage == "not a specs file":
        path.write_bytes(pickle.dumps({"hello": "world"}))
    else:
        path.unlink()
    jf.clear_cache()
    compiles = jf.cache_info().compiles
    report = jf.warmup(ftjit.load_specs(path).for_function(jf))  # never raises
    assert len(report) == 1 and not report.ok
    (result,) = report
    assert result.signature == f"<specs file {path}>" and result.compiled is False
    if damage == "future version":
        assert str(result.error) == f"{path} is of format version 99; this ftjit reads version 1"
    elif damage == "not a specs file":
        assert str(result.error) == f"{path} is not an ftjit specs file"
    elif damage == "missing":
        assert isinstance(result.error, FileNotFoundError)
    assert jf.cache_info().compiles == compiles


def test_a_file_from_another_version_or_a_changed_function_is_a_report_line_per_spec(tmp_path):
    jf = _saved_function()
    path = tmp_path / "specs.pkl"
    ftjit.save_specs(path, jf)
    payload = pickle.loads(path.read_bytes())
    payload["versions"]["jax"] = "0.0.1"
    other_version = tmp_path / "old.pkl"
    other_version.write_bytes(pickle.dumps(payload))
    report = jf.warmup(ftjit.load_specs(other_version).for_function(jf))
    assert [r.signature for r in report] == [f"{jf.__qualname__}(float32[2], float)"]
    assert str(report[0].error) == (f"{other_version} was written by ftjit {ftjit.__version__}, jax 0.0.1; this is "
                                    f"ftjit {ftjit.__version__}, jax {jax.__version__}: save the specs again with "
                                    "this version")

    # The same function, changed: its second argument is now static.
    changed = _saved_function(static=True)
    report = changed.warmup(ftjit.load_specs(path).for_function(changed))
    assert len(report) == 1 and not report.ok
    assert str(report[0].error) == (f"the function changed: the saved spec makes {jf.__qualname__}(float32[2], 0.0), "
                                    f"saved as {jf.__qualname__}(float32[2], float)")


@pytest.mark.thread_unsafe(reason="two threads write one file")
def test_missing_ok_takes_a_missing_file_as_no_specs_and_a_damaged_one_still_as_an_error(tmp_path):
    jf = _saved_function()
    missing = ftjit.load_specs(tmp_path / "none.pkl", missing_ok=True)
    assert missing.error is None and missing.for_function(jf) == []
    assert jf.warmup(missing.for_function(jf)).ok
    damaged = tmp_path / "damaged.pkl"
    damaged.write_bytes(b"not a pickle")
    (broken,) = ftjit.load_specs(damaged, missing_ok=True).for_function(jf)
    assert isinstance(broken, ftjit.BrokenSpec) and broken.signature == f"<specs file {damaged}>"


def test_a_function_the_file_does_not_name_gets_no_specs(tmp_path):
    saved = _saved_function()
    path = tmp_path / "specs.pkl"
    ftjit.save_specs(path, saved)

    def renamed(x, y):  # the same code under another qualified name
        return x + y

    loaded = ftjit.load_specs(path)
    assert [type(s) for s in loaded.for_function(saved)] == [ftjit.SavedSpec]
    assert loaded.for_function(ftjit.jit(renamed)) == []


@pytest.mark.skipif(os.name != "posix", reason="file modes and umask are POSIX")
@pytest.mark.thread_unsafe(reason="sets the process's umask")
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_file_is_made_as_open_makes_one_under_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = tmp_path / "specs.pkl"
        ftjit.save_specs(path, _saved_function())
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


def test_concurrent_saves_leave_one_complete_file(tmp_path):
    first, second = _saved_function(), _saved_function()
    second(jnp.ones(4), 2.0)
    path = tmp_path / "specs.pkl"

    def save(i):
        for _ in range(20):
            ftjit.save_specs(path, first if i == 0 else second)

    run_threads(2, save)
    saved = ftjit.load_specs(path)
    assert saved.error is None
    specs = saved.for_function(first)
    assert len(specs) in (1, 2) and all(isinstance(s, ftjit.Spec) for s in specs)
    assert [p for p in os.listdir(tmp_path) if p != "specs.pkl"] == []  # no temporary file left behind


def test_a_custom_compiler_without_spec_hooks_gets_array_specs():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x, y: x, compiler=comp, cache=ftjit.FunctionCache())
    jf(np.ones((2, 3), np.float32), (1, 2.0))
    (spec,) = jf.warmup_specs()
    assert spec.args[0] == ftjit._specs.ArraySpec((2, 3), np.dtype(np.float32), False)
    assert spec.args[1] == (0, 0.0)
    jf.clear_cache()
    assert jf.warmup([spec]).ok and comp.calls == 2
    jf(np.ones((2, 3), np.float32), (5, 6.0))
    assert comp.calls == 2
