"""Restart without cold compiles: JitFunction.warmup_specs() turns the cached
signatures back into warm-up specs, and ftjit.save_specs/load_specs keep
them in a file across a restart.

The file is JSON that holds data only (ftjit/_specs_format.py): reading one
never runs code of its choosing (a planted pickle is refused by its format,
and runs nothing), refuses a file others could have written, and never
raises for what is in it: a damaged file is one error line for the whole
file, an entry this process cannot use (a class not loaded) one line for
that entry. Statics are kept only when they read back equal (== and hash),
so that identity-compared ones do not pile up across restarts.

Every test builds its own FunctionCache or fresh functions and its own
files (each thread of pytest-run-parallel has its own tmp_path); the round
trip runs two fresh interpreters (the process that saves, and the restarted
one that loads), with the pytree classes in a module both can import.
"""

import collections
import dataclasses
import enum
import json
import os
import pickle
import re
import stat
import subprocess
import sys
import textwrap
import threading

import pytest

import ftjit
from ftjit import _specs_format
from helpers import ContextCompiler, CountingCompiler, LogCapture, child_env, run_threads

jax = pytest.importorskip("jax")  # the default compiler (absent only in dev.sh tsan-ft)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

POSIX = os.name == "posix"
HERE = __name__  # this module's name as pytest imported it: classes below are found as HERE:Name

MODEL = textwrap.dedent(
    """
    import collections, dataclasses, enum, functools
    import jax, jax.numpy as jnp
    import ftjit

    Adam = collections.namedtuple("Adam", "count mu nu")

    @functools.partial(jax.tree_util.register_dataclass, data_fields=["x", "y"], meta_fields=["tag"])
    @dataclasses.dataclass
    class Batch:
        x: object
        y: object
        tag: str

    class Mode(enum.Enum):
        TRAIN = "train"
        EVAL = "eval"

    @ftjit.register_static_dataclass
    @dataclasses.dataclass(frozen=True)
    class Config:
        mode: Mode
        rate: float
        name: bytes

    @ftjit.jit(static_argnames="config")
    def step(params, state, batch, *, config):
        return params["w"].sum() + state.count + batch.x.sum()

    def traffic():
        for n in (2, 3):
            for mode, rate in ((Mode.TRAIN, 0.1), (Mode.EVAL, float("-inf"))):
                params = {"w": jnp.ones((n, 4)), "b": jnp.zeros(4)}
                state = Adam(jnp.zeros((), jnp.int32), params, params)
                yield (params, state, Batch(jnp.ones(n), jnp.ones(n), "v1")), {"config": Config(mode, rate, b"\\0x")}
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
    saved = ftjit.load_specs(sys.argv[1])
    print("error", saved.error)
    report = model.step.warmup(saved.for_function(model.step))
    print("ok", report.ok, len(report))
    print("cached", sorted(s.signature for s in model.step.signatures()))
    compiles = model.step.cache_info().compiles
    for args, kwargs in model.traffic():
        model.step(*args, **kwargs)
    print("compiles during traffic", model.step.cache_info().compiles - compiles)
    """
)


def _private(directory):
    """``directory``, writable by this user only, whatever the umask: load_specs refuses a file in a directory
    others can write (pytest-run-parallel makes each thread's tmp_path with mkdir's default mode, 0777 less the
    umask: group-writable under umask 002)."""
    os.chmod(directory, 0o700)
    return directory


def _written(path, data):
    """Writes a new file of ``data`` with mode 0600, as its owner (a new file gets 0666 less the umask, which
    under umask 002 is group-writable: refused). Files rewritten in place keep save_specs' 0644."""
    path.write_bytes(data)
    os.chmod(path, 0o600)


def _run(tmp_path, script, *args):
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", script, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)


@pytest.mark.thread_unsafe(reason="runs two interpreters in turn")
def test_round_trip_through_a_file_into_a_fresh_process_compiles_nothing_during_traffic(tmp_path):
    """Containers, a namedtuple optimizer state, a registered dataclass node,
    a static registered dataclass holding an enum, a float (-inf) and bytes,
    and jax_enable_x64 on: the restarted process warms up exactly the
    signatures the first one cached, and its traffic compiles nothing."""
    tmp_path = _private(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    path = str(tmp_path / "specs.json")
    first = _run(tmp_path, SAVE, path)
    assert first.returncode == 0, first.stderr
    saved_line, cached_line = first.stdout.splitlines()
    assert saved_line == "saved {'model:step': (4, ())}"
    assert "float64[2,4]" in cached_line  # jax_enable_x64 on: jnp.ones makes float64 arrays
    assert cached_line.count("config=Config(mode=<Mode.EVAL: 'eval'>, rate=-inf, name=b'") == 2
    data = json.loads(open(path).read())
    assert [data["format"], data["version"]] == ["ftjit-specs", 2]
    assert {"dataclass": "model:Config", "fields": {"mode": {"enum": "model:Mode", "name": "EVAL"},
                                                    "rate": {"float": "-inf"}, "name": {"bytes": "AHg="}}} in [
        e["kwargs"]["config"]["static"] for e in data["functions"]["model:step"]]
    second = _run(tmp_path, RESTART, path)
    assert second.returncode == 0, second.stderr
    error_line, ok_line, restored_line, traffic_line = second.stdout.splitlines()
    assert error_line == "error None"
    assert ok_line == "ok True 4"
    assert restored_line == cached_line
    assert traffic_line == "compiles during traffic 0"


def test_warming_up_from_warmup_specs_makes_exactly_the_cached_signatures():
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
    tmp_path = _private(tmp_path)
    cpu = jax.devices("cpu")[0]
    jf = ftjit.jit(lambda x: x * 2, cache=ftjit.FunctionCache())
    jf(jax.device_put(jnp.ones(3), cpu))
    (spec,) = jf.warmup_specs()
    assert spec.args[0].sharding == jax.sharding.SingleDeviceSharding(cpu)
    path = tmp_path / "specs.json"
    assert ftjit.save_specs(path, jf) == {f"{jf.__module__}:{jf.__qualname__}": (1, ())}
    (entry,) = json.loads(path.read_text())["functions"][f"{jf.__module__}:{jf.__qualname__}"]
    assert entry["args"][0]["placement"] == {"tuple": ["single_device", "cpu", cpu.id]}
    jf.clear_cache()
    report = jf.warmup(ftjit.load_specs(path).for_function(jf))
    assert report.ok and report[0].signature == f"{jf.__qualname__}(float32[3]@{cpu})"
    jf(jax.device_put(jnp.ones(3), cpu))
    assert jf.cache_info().compiles == 2 and jf.cache_info().hits == 1


def test_a_spec_that_cannot_be_rebuilt_is_left_out_and_said_why(tmp_path):
    """A signature compiled under another context than this thread's now is
    left out of warmup_specs, never changed. A static value a data format
    cannot hold (a lock) rebuilds in this process, but is left out of the
    file, with the reason."""
    tmp_path = _private(tmp_path)
    comp = ContextCompiler()
    jf = ftjit.jit(lambda x, s: x, static_argnums=1, compiler=comp, cache=ftjit.FunctionCache())
    comp.cur = ("mode", "a")
    jf(1.0, 3)
    comp.cur = ("mode", "b")
    lock = threading.Lock()  # hashable, by identity
    jf(1.0, lock)
    jf(2.0, 4)
    name = jf.__qualname__
    specs = jf.warmup_specs()
    assert [jf._signature_of(*s.args) for s in specs] == [f"{name}(float, 4)", f"{name}(float, {lock!r})"]
    assert specs.left_out == ((f"{name}(float, 3)", "it was compiled under another context than this thread's now"),)
    ((written, left_out),) = ftjit.save_specs(tmp_path / "specs.json", jf).values()
    assert written == 1
    assert left_out == (
        (f"{name}(float, {lock!r})",
         f"a static value of type _thread.lock ({lock!r}), which a specs file cannot hold (it holds None, bool, int, "
         "float, str, bytes, tuples and lists of them, enums, and dataclasses registered with "
         "ftjit.register_static_dataclass)"),
        (f"{name}(float, 3)", "it was compiled under another context than this thread's now"),
    )


def _saved_function(static=False):
    def g(x, y):
        return x + y

    jf = ftjit.jit(g, static_argnums=1 if static else None, cache=ftjit.FunctionCache())
    if not static:
        jf(jnp.ones(2), 1.0)
    return jf


def test_a_function_the_file_does_not_name_gets_no_specs(tmp_path):
    tmp_path = _private(tmp_path)
    saved = _saved_function()
    path = tmp_path / "specs.json"
    ftjit.save_specs(path, saved)

    def renamed(x, y):  # the same code under another qualified name
        return x + y

    loaded = ftjit.load_specs(path)
    assert [type(s) for s in loaded.for_function(saved)] == [ftjit.SavedSpec]
    assert loaded.for_function(ftjit.jit(renamed)) == []


@pytest.mark.thread_unsafe(reason="two threads write one file")
def test_missing_ok_takes_a_missing_file_as_no_specs_and_a_damaged_one_still_as_an_error(tmp_path):
    tmp_path = _private(tmp_path)
    jf = _saved_function()
    missing = ftjit.load_specs(tmp_path / "none.json", missing_ok=True)
    assert missing.error is None and missing.for_function(jf) == []
    assert jf.warmup(missing.for_function(jf)).ok
    damaged = tmp_path / "damaged.json"
    _written(damaged, b"not json")
    (broken,) = ftjit.load_specs(damaged, missing_ok=True).for_function(jf)
    assert isinstance(broken, ftjit.BrokenSpec) and broken.signature == f"<specs file {damaged}>"


@pytest.mark.skipif(not POSIX, reason="file modes and umask are POSIX")
@pytest.mark.thread_unsafe(reason="sets the process's umask")
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o000, 0o644), (0o002, 0o644)])
def test_the_file_is_never_made_writable_by_others_whatever_the_umask(tmp_path, umask, mode):
    tmp_path = _private(tmp_path)
    old = os.umask(umask)
    try:
        path = tmp_path / "specs.json"
        ftjit.save_specs(path, _saved_function())
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    assert ftjit.load_specs(path).error is None


def test_concurrent_saves_leave_one_complete_file(tmp_path):
    tmp_path = _private(tmp_path)
    first, second = _saved_function(), _saved_function()
    second(jnp.ones(4), 2.0)
    path = tmp_path / "specs.json"

    def save(i):
        for _ in range(20):
            ftjit.save_specs(path, first if i == 0 else second)

    run_threads(2, save)
    saved = ftjit.load_specs(path)
    assert saved.error is None
    specs = saved.for_function(first)
    assert len(specs) in (1, 2) and all(isinstance(s, ftjit.Spec) for s in specs)
    assert [p for p in os.listdir(tmp_path) if p != "specs.json"] == []  # no temporary file left behind


def test_a_custom_compiler_without_spec_hooks_gets_array_specs_and_a_file(tmp_path):
    tmp_path = _private(tmp_path)
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x, y: x, compiler=comp, cache=ftjit.FunctionCache())
    jf(np.ones((2, 3), np.float32), (1, 2.0))
    (spec,) = jf.warmup_specs()
    assert spec.args[0] == ftjit._specs.ArraySpec((2, 3), np.dtype(np.float32), False)
    assert spec.args[1] == (0, 0.0)
    path = tmp_path / "specs.json"
    assert ftjit.save_specs(path, jf) == {f"{jf.__module__}:{jf.__qualname__}": (1, ())}
    jf.clear_cache()
    assert jf.warmup(ftjit.load_specs(path).for_function(jf)).ok and comp.calls == 2
    jf(np.ones((2, 3), np.float32), (5, 6.0))
    assert comp.calls == 2


def test_every_leaf_kind_of_the_core_is_rebuilt_saved_and_read_back(tmp_path):
    """The core's leaf kinds (its exporter's names, kLeafKindNames) are the
    Python records' (ftjit._signature.LEAF_KINDS,
    which a specs file's reader checks against) and the ones warm-up specs
    rebuild ("array", then ftjit._specs._SCALARS): a kind added to the core
    alone fails here."""
    tmp_path = _private(tmp_path)
    kinds = ftjit._core._leaf_kinds()
    assert ftjit._signature.LEAF_KINDS == kinds
    assert ("array", *ftjit._specs._SCALARS) == kinds
    comp = CountingCompiler()
    jf = ftjit.jit(lambda *leaves: leaves[0], compiler=comp, cache=ftjit.FunctionCache())
    jf(np.ones(2, np.float32), *ftjit._specs._SCALARS.values())
    [record] = jf._signatures()
    assert tuple(leaf.kind for leaf in record.args) == kinds
    path = tmp_path / "specs.json"
    assert ftjit.save_specs(path, jf) == {f"{jf.__module__}:{jf.__qualname__}": (1, ())}
    jf.clear_cache()
    assert jf.warmup(ftjit.load_specs(path).for_function(jf)).ok and comp.calls == 2
    jf(np.zeros(2, np.float32), True, 3, 4.0, 5j)
    assert comp.calls == 2


def _nested(n, innermost):
    for _ in range(n):
        innermost = (innermost,)
    return innermost


def test_a_signature_nested_deeper_than_a_file_may_be_is_left_out(tmp_path):
    """Two JSON levels a tuple (the tagged value, its array; the node, its
    children): 120 deep is past 200 levels once written, 250 deep is past
    them while writing."""
    tmp_path = _private(tmp_path)
    statics = ftjit.jit(lambda x, s: x, static_argnums=1, cache=ftjit.FunctionCache())
    trees = ftjit.jit(lambda x: 0, cache=ftjit.FunctionCache())
    for n in (120, 250):
        statics(1.0, _nested(n, 1))
        trees(_nested(n, 1.0))
    summary = ftjit.save_specs(tmp_path / "specs.json", {"statics": statics, "trees": trees})
    written = "its arguments nest deeper than the 200 levels of JSON a specs file may have"
    assert {name: (n, [why for _, why in left_out]) for name, (n, left_out) in summary.items()} == {
        "statics": (0, ["a static value nests deeper than the 200 levels of JSON a specs file may have", written]),
        "trees": (0, [written, written]),
    }
    assert ftjit.load_specs(tmp_path / "specs.json").functions == {"statics": (), "trees": ()}


# --- the file runs no code, and is read only from its owner --------------------------------------------------------


class _Planted:
    """Pickles as a call of ``payload``: what a planted pickle would run when unpickled."""

    def __init__(self, *payload):
        self.payload = payload

    def __reduce__(self):
        return self.payload


@pytest.mark.parametrize("payload", ["marker", "exit"])
@pytest.mark.parametrize("protocol", [0, pickle.HIGHEST_PROTOCOL])
def test_a_planted_pickle_runs_nothing_and_is_refused_by_its_format(tmp_path, payload, protocol):
    tmp_path = _private(tmp_path)
    marker = tmp_path / "ran"
    if payload == "marker":
        planted = _Planted(exec, (f"open({str(marker)!r}, 'w').write('ran')",))
    else:
        planted = _Planted(os._exit, (7,))  # would end this process, pytest with it
    path = tmp_path / "specs.pkl"
    _written(path, pickle.dumps({"format": "ftjit-specs", "version": 1, "functions": planted}, protocol=protocol))
    saved = ftjit.load_specs(path)  # returns: the process is alive
    assert not marker.exists()
    jf = _saved_function()
    (broken,) = saved.for_function(jf)
    assert broken.signature == f"<specs file {path}>" and saved.error is broken.error
    assert type(saved.error) is ValueError
    head = f"{path} is not a specs file of this ftjit (format 'ftjit-specs' version 2): "
    tail = "; save the specs again with this version"
    if protocol == 0:  # no pickle header: text that is not JSON
        assert str(saved.error) == head + "it is not JSON (Expecting value: line 1 column 1 (char 0))" + tail
    else:
        assert str(saved.error) == head + ("it starts as a pickle does (ftjit wrote specs as pickles before format "
                                           "version 2; a pickle is never read: loading one can run any code)") + tail
    report = jf.warmup(saved.for_function(jf))
    assert len(report) == 1 and not report.ok and jf.cache_info().compiles == 1  # the start goes on
    assert not marker.exists()


def _good_file(tmp_path, name="specs.json"):
    jf = _saved_function()
    path = tmp_path / name
    ftjit.save_specs(path, jf)
    return jf, path


def _refused(jf, path, reason):
    """The file is refused for ``reason`` (PermissionError), and a warm-up from it is one error line."""
    saved = ftjit.load_specs(path)
    assert type(saved.error) is PermissionError
    assert str(saved.error) == f"{path} is not read: {reason}"
    compiles = jf.cache_info().compiles
    report = jf.warmup(saved.for_function(jf))
    assert [(r.signature, r.error) for r in report] == [(f"<specs file {path}>", saved.error)]
    assert jf.cache_info().compiles == compiles


@pytest.mark.skipif(not POSIX, reason="file modes are POSIX")
@pytest.mark.parametrize("mode, who", [(0o666, "group- and world-writable"), (0o664, "group-writable"),
                                       (0o646, "world-writable"), (0o620, "group-writable")])
def test_a_file_others_can_write_is_refused(tmp_path, mode, who):
    tmp_path = _private(tmp_path)
    jf, path = _good_file(tmp_path)
    os.chmod(path, mode)
    _refused(jf, path, f"it is {who} (mode {mode:04o}): others could have written it; chmod go-w {path}")
    os.chmod(path, 0o600)
    assert ftjit.load_specs(path).error is None


@pytest.mark.skipif(not POSIX, reason="owners are POSIX")
@pytest.mark.thread_unsafe(reason="may replace os.geteuid for the process")
def test_a_file_of_another_owner_is_refused(tmp_path, monkeypatch):
    tmp_path = _private(tmp_path)
    jf, path = _good_file(tmp_path)
    if os.geteuid() == 0:
        os.chown(path, 4242, -1)  # root can give it away
        me = 0
    else:
        me = 4242  # not the owner, and not root
        monkeypatch.setattr(os, "geteuid", lambda: me)
    _refused(jf, path, f"it is owned by uid {os.stat(path).st_uid}, not by this process's user (uid {me}) or root")


def _node(path, kind):
    """Makes a file system node of ``kind`` at ``path``: a directory, a FIFO, a socket (not listening: only
    its node), or a character device (the numbers of /dev/null, made here: root only)."""
    if kind == "a directory":
        os.mkdir(path)
    elif kind == "a FIFO":
        os.mkfifo(path)  # opening it to read would wait for a writer forever
    elif kind == "a socket":
        os.mknod(path, stat.S_IFSOCK | 0o600)  # opening it fails with ENXIO, "No such device or address"
    else:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return path


NODES = ["a directory", "a FIFO", "a socket",
         pytest.param("a character device", marks=pytest.mark.skipif(not POSIX or os.geteuid() != 0,
                                                                     reason="only root makes device nodes"))]


@pytest.mark.skipif(not POSIX, reason="symbolic links, FIFOs, sockets and devices are POSIX")
@pytest.mark.parametrize("kind", NODES)
def test_a_node_that_is_not_a_regular_file_is_refused_by_the_load_and_the_save_without_waiting(tmp_path, kind):
    # The save refused nothing before: it replaced the node with a file (run as root with --specs /dev/zero, the
    # server's stop replaced /dev/zero), and a socket was read as "[Errno 6] No such device or address".
    tmp_path = _private(tmp_path)
    jf = _saved_function()
    path = _node(tmp_path / "specs.json", kind)
    _refused(jf, path, f"it is {kind}, not a regular file")
    with pytest.raises(PermissionError, match=f"^{re.escape(str(path))} is not written: it is {kind}, not a regular "
                                              "file$"):
        ftjit.save_specs(path, jf)
    assert stat.S_IFMT(os.lstat(path).st_mode) == stat.S_IFMT(_node(tmp_path / "again", kind).stat().st_mode)
    assert sorted(os.listdir(tmp_path)) == ["again", "specs.json"]  # no temporary file left behind


@pytest.mark.skipif(not POSIX, reason="symbolic links are POSIX")
def test_a_symbolic_link_to_the_file_is_refused_by_the_load_and_the_save(tmp_path):
    tmp_path = _private(tmp_path)
    jf, path = _good_file(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    _refused(jf, link, "it is a symbolic link (a specs file is read only from the file itself: give its own path)")
    with pytest.raises(PermissionError, match=f"^{re.escape(str(link))} is not written: it is a symbolic link \\(a "
                                              "specs file is written only to the file itself: give its own path\\)$"):
        ftjit.save_specs(link, jf)
    assert link.is_symlink()


def _directory_refused(jf, path, directory, why):
    """Both the load and the save of ``path`` are refused for ``directory`` (``why``: what is wrong with it)."""
    reason = f"the directory {directory} is {why}"
    _refused(jf, path, reason)
    with pytest.raises(PermissionError, match=f"^{re.escape(f'{path} is not written: {reason}')}$"):
        ftjit.save_specs(path, jf)


@pytest.mark.skipif(not POSIX, reason="file modes are POSIX")
@pytest.mark.parametrize("mode, who", [(0o777, "group- and world-writable"), (0o775, "group-writable"),
                                       (0o757, "world-writable")])
@pytest.mark.parametrize("where", ["its own", "above it"])
def test_a_file_under_a_directory_others_can_write_is_refused_unless_it_is_sticky(tmp_path, mode, who, where):
    # As ssh's StrictModes: every directory up to /, not only the file's own (which was all that was checked).
    tmp_path = _private(tmp_path)
    shared = tmp_path / "shared"
    own = shared / "own" if where == "above it" else shared
    own.mkdir(parents=True, mode=0o700)
    jf, path = _good_file(own)
    os.chmod(shared, mode)
    _directory_refused(jf, path, shared, f"{who} (mode {mode:04o}) without the sticky bit: another user can replace "
                                         f"the file; chmod go-w {shared}")
    os.chmod(shared, 0o1000 | mode)  # as /tmp: others cannot replace a file they do not own
    assert ftjit.load_specs(path).error is None
    ftjit.save_specs(path, jf)


@pytest.mark.skipif(not POSIX, reason="symbolic links and file modes are POSIX")
def test_a_symbolic_link_among_the_directories_is_resolved_before_they_are_checked(tmp_path):
    # The link's own directory is private, and so is the one it points to, but that one is in a directory
    # others can write: they could rename it away and put their own in its place. The link was followed, and
    # the file read.
    tmp_path = _private(tmp_path)
    (tmp_path / "shared" / "real").mkdir(parents=True, mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "shared" / "real", target_is_directory=True)
    jf, path = _good_file(tmp_path / "link")
    os.chmod(tmp_path / "shared", 0o777)
    shared = tmp_path / "shared"
    _directory_refused(jf, path, shared, "group- and world-writable (mode 0777) without the sticky bit: another user "
                                         f"can replace the file; chmod go-w {shared}")
    os.chmod(tmp_path / "shared", 0o700)
    assert ftjit.load_specs(path).error is None


@pytest.mark.skipif(not POSIX or os.geteuid() != 0, reason="only root can give a directory to another user")
def test_a_file_under_a_directory_of_another_owner_is_refused(tmp_path):
    tmp_path = _private(tmp_path)
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    jf, path = _good_file(other)
    os.chown(other, 12345, -1)  # its owner can replace anything in it, whatever its mode
    _directory_refused(jf, path, other, "owned by uid 12345, not by this process's user (uid 0) or root: its owner "
                                        "can replace the file")
    os.chown(other, 0, -1)
    assert ftjit.load_specs(path).error is None


@pytest.mark.skipif(not POSIX, reason="file modes and owners are POSIX")
@pytest.mark.thread_unsafe(reason="may replace os.geteuid for the process")
def test_the_save_refuses_a_file_the_load_would_refuse(tmp_path, monkeypatch):
    # An existing file that others could have written, or of another owner, is not replaced either.
    tmp_path = _private(tmp_path)
    jf, path = _good_file(tmp_path)
    os.chmod(path, 0o664)
    written = f"{path} is not written: it is group-writable (mode 0664): others could have written it; chmod go-w " \
              f"{path}"
    with pytest.raises(PermissionError, match=f"^{re.escape(written)}$"):
        ftjit.save_specs(path, jf)
    os.chmod(path, 0o644)
    if os.geteuid() == 0:
        os.chown(path, 4242, -1)
        me = 0
    else:
        me = 4242
        monkeypatch.setattr(os, "geteuid", lambda: me)
    written = f"{path} is not written: it is owned by uid {os.stat(path).st_uid}, not by this process's user " \
              f"(uid {me}) or root"
    with pytest.raises(PermissionError, match=f"^{re.escape(written)}$"):
        ftjit.save_specs(path, jf)


@pytest.mark.skipif(not POSIX, reason="file modes are POSIX")
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o400, 0o644])
def test_the_save_keeps_the_mode_of_the_file_it_replaces(tmp_path, mode):
    # A 0600 file became 0644 (a new file's mode) at every save.
    tmp_path = _private(tmp_path)
    jf, path = _good_file(tmp_path)
    os.chmod(path, mode)
    inode = os.stat(path).st_ino
    ftjit.save_specs(path, jf)
    assert os.stat(path).st_ino != inode  # replaced (a new file renamed over it), not written in place
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    assert ftjit.load_specs(path).error is None


def test_a_save_into_a_missing_directory_names_the_file(tmp_path):
    # It named the temporary .ftjit-specs-* file it could not make.
    tmp_path = _private(tmp_path)
    path = tmp_path / "missing" / "specs.json"
    with pytest.raises(FileNotFoundError) as raised:
        ftjit.save_specs(path, _saved_function())
    assert raised.value.filename == str(path)
    assert str(raised.value) == f"[Errno 2] its directory {tmp_path}/missing does not exist: '{path}'"
    saved = ftjit.load_specs(path)
    assert type(saved.error) is FileNotFoundError and saved.error.filename == str(path)


class _BytesPath:
    def __init__(self, path):
        self.path = path

    def __fspath__(self):
        return os.fsencode(self.path)


@pytest.mark.parametrize("kind", ["bytes", "a path-like of bytes"])
def test_a_path_may_be_bytes_or_path_like_as_open_takes_it(tmp_path, kind):
    # A bytes path was refused as "the path must name a file".
    tmp_path = _private(tmp_path)
    jf = _saved_function()
    path = tmp_path / "specs.json"
    given = os.fsencode(path) if kind == "bytes" else _BytesPath(path)
    assert ftjit.save_specs(given, jf) == {f"{jf.__module__}:{jf.__qualname__}": (1, ())}
    saved = ftjit.load_specs(given)
    assert saved.error is None and saved.path == str(path)
    assert [type(s) for s in saved.for_function(jf)] == [ftjit.SavedSpec]
    for call in (lambda: ftjit.save_specs(3, jf), lambda: ftjit.load_specs(3)):
        with pytest.raises(TypeError, match="^expected str, bytes or os.PathLike object, not int$"):
            call()


# --- a damaged file never stops the start ------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "a b")


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@ftjit.register_static_dataclass
@dataclasses.dataclass(frozen=True)
class Options:
    color: Color
    rate: float
    tags: tuple


def _saved_then_edited(path, jf, edit):
    """Saves jf's specs to path, then rewrites the file with edit applied to its JSON."""
    ftjit.save_specs(path, jf)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def _pair_function():
    """A function whose saved file has both entry kinds the damage below
    edits: a dict, a namedtuple, array and scalar leaves, and statics."""

    def h(d, p, s):
        return d["x"] + p.a

    jf = ftjit.jit(h, static_argnums=2, cache=ftjit.FunctionCache())
    jf({"x": jnp.ones(2)}, Pair(jnp.ones(2), 1.0), "first")
    jf({"x": jnp.ones(3)}, Pair(jnp.ones(3), 1.0), Options(Color.RED, 0.5, (1, "a", None)))
    return jf


def _first(data):
    """The first entry (the newest: the Options one) of the only function."""
    (entries,) = data["functions"].values()
    return entries[0]


def _set(where, value):
    def edit(data):
        *path, last = where
        target = data
        for key in path:
            target = target[key] if not callable(key) else key(target)
        target[last] = value
    return edit


F = _first  # in paths: the first entry
ARG_D = [F, "args", 0]  # {"x": array}
ARG_P = [F, "args", 1]  # Pair(array, float)
ARG_S = [F, "args", 2]  # the static Options
AT_ENTRY = "['functions']['KEY'][0]"

#: (edit of the parsed file, where the file is damaged, what is wrong)
DAMAGE = {
    "versions not a dict": (_set(["versions"], ["0.1"]), "['versions']",
                            "an object of versions (strings) expected, found an array"),
    "versions not of str": (_set(["versions", "jax"], 10), "['versions']['jax']",
                            "a version string expected, found an integer"),
    "functions a list": (_set(["functions"], []), "['functions']",
                         "an object of functions (each a key and an array of saved signatures) expected, found an "
                         "array"),
    "functions None": (_set(["functions"], None), "['functions']",
                       "an object of functions (each a key and an array of saved signatures) expected, found null"),
    "entries not a list": (lambda d: d["functions"].update({k: {} for k in d["functions"]}), "['functions']['KEY']",
                           "an array of saved signatures expected, found an object"),
    "an entry not a dict": (lambda d: next(iter(d["functions"].values())).__setitem__(0, "h(...)"), AT_ENTRY,
                            "a saved signature (an object) expected, found a string"),
    "an entry without signature": (lambda d: _first(d).pop("signature"), AT_ENTRY,
                                   "the key 'signature' is missing"),
    "an entry with an extra key": (_set([F, "when"], 1), AT_ENTRY, "the key 'when' is not one of this format"),
    "a signature not a str": (_set([F, "signature"], ["h"]), AT_ENTRY + "['signature']",
                              "a string expected, found an array"),
    "args not a list": (_set([F, "args"], {}), AT_ENTRY + "['args']",
                        "an array of argument trees expected, found an object"),
    "kwargs not a dict": (_set([F, "kwargs"], []), AT_ENTRY + "['kwargs']",
                          "an object of keyword arguments expected, found an array"),
    "a tree not a dict": (_set([F, "args", 0], 3), AT_ENTRY + "['args'][0]",
                          "an argument tree (an object with \"node\", \"leaf\" or \"static\") expected, found an "
                          "integer"),
    "a tree of no kind": (_set([F, "args", 0], {"children": []}), AT_ENTRY + "['args'][0]",
                          "an argument tree (an object with \"node\", \"leaf\" or \"static\") expected, found an "
                          "object without them"),
    "an unknown node kind": (_set([*ARG_D, "node"], "set"), AT_ENTRY + "['args'][0]", "an unknown node kind 'set'"),
    "a node kind not a str": (_set([*ARG_D, "node"], ["dict"]), AT_ENTRY + "['args'][0]['node']",
                              "a node kind (a string) expected, found an array"),
    "a key the top level does not have": (_set(["written"], "today"), "the top level",
                                          "the key 'written' is not one of this format"),
    "a node without children": (lambda d: _first(d)["args"][0].pop("children"), AT_ENTRY + "['args'][0]",
                                "the key 'children' is missing"),
    "dict keys and children differ": (_set([*ARG_D, "keys"], ["x", "y"]), AT_ENTRY + "['args'][0]",
                                      "a dict node of 2 keys and 1 children"),
    "children not a list": (_set([*ARG_P, "children"], None), AT_ENTRY + "['args'][1]['children']",
                            "an array of children expected, found null"),
    "a class name that is no name": (_set([*ARG_P, "type"], "os.system"), AT_ENTRY + "['args'][1]['type']",
                                     "a class name module:qualname expected, found 'os.system'"),
    "an unknown leaf kind": (_set([*ARG_D, "children", 0, "leaf"], "tensor"),
                             AT_ENTRY + "['args'][0]['children'][0]", "an unknown leaf kind 'tensor'"),
    "a negative dim": (_set([*ARG_D, "children", 0, "shape", 0], -1),
                       AT_ENTRY + "['args'][0]['children'][0]['shape'][0]",
                       "a dim is an int from 0 to 2**63 - 1, found -1"),
    "a dim past int64": (_set([*ARG_D, "children", 0, "shape", 0], 2**63),
                         AT_ENTRY + "['args'][0]['children'][0]['shape'][0]",
                         "a dim is an int from 0 to 2**63 - 1, found 9223372036854775808"),
    "a dim not an int": (_set([*ARG_D, "children", 0, "shape", 0], "3"),
                         AT_ENTRY + "['args'][0]['children'][0]['shape'][0]",
                         "a dim is an int from 0 to 2**63 - 1, found '3'"),
    "a dim that is a bool": (_set([*ARG_D, "children", 0, "shape", 0], True),
                             AT_ENTRY + "['args'][0]['children'][0]['shape'][0]",
                             "a dim is an int from 0 to 2**63 - 1, found a boolean"),
    "a shape not a list": (_set([*ARG_D, "children", 0, "shape"], "3"),
                           AT_ENTRY + "['args'][0]['children'][0]['shape']",
                           "an array of dims expected, found a string"),
    "a dtype name that is no name": (_set([*ARG_D, "children", 0, "dtype"], "f4,f4"),
                                     AT_ENTRY + "['args'][0]['children'][0]['dtype']", "'f4,f4' is not a dtype name"),
    "a dtype not a str": (_set([*ARG_D, "children", 0, "dtype"], None),
                          AT_ENTRY + "['args'][0]['children'][0]['dtype']", "a dtype name expected, found null"),
    "a scalar leaf with a dtype": (_set([*ARG_P, "children", 1, "dtype"], "float32"),
                                   AT_ENTRY + "['args'][1]['children'][1]['dtype']",
                                   "a float leaf has no dtype, found a string"),
    "weak_type not a bool": (_set([*ARG_D, "children", 0, "weak_type"], 0),
                             AT_ENTRY + "['args'][0]['children'][0]['weak_type']",
                             "true or false expected, found an integer"),
    "a leaf without placement": (lambda d: _first(d)["args"][0]["children"][0].pop("placement"),
                                 AT_ENTRY + "['args'][0]['children'][0]", "the key 'placement' is missing"),
    "a static with a bare float": (_set([*ARG_S, "static", "fields", "rate"], 0.5),
                                   AT_ENTRY + "['args'][2]['static']['fields']['rate']",
                                   "a value expected, found the bare number 0.5 (floats are written as "
                                   "{\"float\": hex})"),
    "a float not as float.hex writes it": (_set([*ARG_S, "static", "fields", "rate"], {"float": "0.5"}),
                                           AT_ENTRY + "['args'][2]['static']['fields']['rate']['float']",
                                           "'0.5' is not a float as float.hex writes it"),
    "bytes not base64": (_set([*ARG_S, "static"], {"bytes": "#!"}), AT_ENTRY + "['args'][2]['static']['bytes']",
                         "not base64 text"),
    "a bare array value": (_set([*ARG_S, "static", "fields", "tags"], [1]),
                           AT_ENTRY + "['args'][2]['static']['fields']['tags']",
                           "a bare array (tuples are written {\"tuple\": [...]}, lists {\"list\": [...]})"),
    "an unknown tagged value": (_set([*ARG_S, "static"], {"set": [1]}), AT_ENTRY + "['args'][2]['static']",
                                "an object with the keys 'set' is not a value of this format"),
    "an enum without a name": (lambda d: _first(d)["args"][2]["static"]["fields"]["color"].pop("name"),
                               AT_ENTRY + "['args'][2]['static']['fields']['color']", "the key 'name' is missing"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_file_is_one_report_line_saying_where_and_the_start_goes_on(tmp_path, damage):
    tmp_path = _private(tmp_path)
    edit, where, what = DAMAGE[damage]
    jf = _pair_function()
    path = _saved_then_edited(tmp_path / "specs.json", jf, edit)
    key = f"{jf.__module__}:{jf.__qualname__}"
    saved = ftjit.load_specs(path)  # never raises
    assert type(saved.error) is ValueError
    assert str(saved.error) == f"{path} is damaged at {where.replace('KEY', key)}: {what}"
    jf.clear_cache()
    compiles = jf.cache_info().compiles
    report = jf.warmup(saved.for_function(jf))
    assert [(r.signature, r.error, r.compiled) for r in report] == [(f"<specs file {path}>", saved.error, False)]
    assert jf.cache_info().compiles == compiles


_HEAD = "is not a specs file of this ftjit (format 'ftjit-specs' version 2): "
_DEEP = "[" * 300 + "]" * 300

#: (the file's bytes from a good file's text, the error after the path)
NOT_SPECS = {
    "empty": (lambda text: b"", _HEAD + "it is not JSON (Expecting value: line 1 column 1 (char 0))"),
    "truncated": (lambda text: text[:200].encode(), None),  # json's words for where it ends: checked by pattern
    "not UTF-8": (lambda text: b"\xff" + text.encode(), _HEAD + "it is not UTF-8 text (invalid start byte at byte 0)"),
    "a JSON list": (lambda text: b"[]", _HEAD + "it has no \"format\": 'ftjit-specs'"),
    "another format": (lambda text: text.replace('"ftjit-specs"', '"other"').encode(),
                       _HEAD + "it has no \"format\": 'ftjit-specs'"),
    "format version 1": (lambda text: text.replace('"version": 2', '"version": 1').encode(),
                         _HEAD + "it is of format version 1"),
    "a future version": (lambda text: text.replace('"version": 2', '"version": 3').encode(),
                         _HEAD + "it is of format version 3"),
    "the version as a str": (lambda text: text.replace('"version": 2', '"version": "2"').encode(),
                             _HEAD + "its format version is not an int: '2'"),
    "the version as a float": (lambda text: text.replace('"version": 2', '"version": 2.0').encode(),
                               _HEAD + "its format version is not an int: the bare number 2.0 (floats are written as "
                               "{\"float\": hex})"),
    "nesting without end": (lambda text: b"[" * 100_000, _HEAD + "it nests arrays and objects more than 200 deep"),
    "nesting inside a good file": (lambda text: text.replace('"kwargs": {}', '"kwargs": {"k": %s}' % _DEEP).encode(),
                                   _HEAD + "it nests arrays and objects more than 200 deep"),
    "an int of too many digits": (lambda text: text.replace('"version": 2', '"version": ' + "9" * 5000).encode(),
                                  _HEAD + "its format version is not an int: an integer of 5000 digits (a specs file "
                                  "holds at most 4300)"),
    "NaN": (lambda text: text.replace('"weak_type": false', '"weak_type": NaN').encode(), "DAMAGED"),
    "a key twice": (lambda text: text.replace('"dtype": "float32"', '"dtype": "float32", "dtype": "int8"').encode(),
                    "DAMAGED"),
}


@pytest.mark.parametrize("case", sorted(NOT_SPECS))
def test_a_file_that_is_not_this_format_is_one_report_line(tmp_path, case):
    tmp_path = _private(tmp_path)
    make, expected = NOT_SPECS[case]
    jf, path = _good_file(tmp_path)
    path.write_bytes(make(path.read_text()))
    saved = ftjit.load_specs(path)
    assert type(saved.error) is ValueError
    message = str(saved.error)
    key = f"{jf.__module__}:{jf.__qualname__}"
    if case == "truncated":
        assert re.fullmatch(re.escape(f"{path} {_HEAD}it is not JSON (") + r"(Expecting|Unterminated) [^()]+ "
                            r"\(char \d+\)\); save the specs again with this version", message), message
    elif case == "NaN":
        assert message == (f"{path} is damaged at ['functions']['{key}'][0]['args'][0]['weak_type']: true or false "
                           "expected, found NaN, which is not JSON")
    elif case == "a key twice":
        assert message == (f"{path} is damaged at ['functions']['{key}'][0]['args'][0]: an argument tree (an object "
                           "with \"node\", \"leaf\" or \"static\") expected, found an object with the key 'dtype' "
                           "twice")
    else:
        assert message == f"{path} {expected}; save the specs again with this version"
    report = jf.warmup(saved.for_function(jf))
    assert [(r.signature, r.error) for r in report] == [(f"<specs file {path}>", saved.error)]


def _hostile(shape, size):
    """A file of ``size`` bytes of one shape that a parser must not take quadratic time or deep recursion on."""
    if shape == "an unclosed string":  # a pattern rescanning to the end from every quote took minutes
        return b'"' + b'\\"' * ((size - 1) // 2) + b"x" * ((size - 1) % 2)
    if shape == "nesting without end":
        return b"[" * size
    if shape == "a number without end":
        return b"1" * size
    if shape == "many keys":
        keys = b",".join(b'"%d":0' % i for i in range(size // 12))
        return b"{" + keys + b" " * (size - len(keys) - 2) + b"}"
    if shape == "brackets in a string":  # not nesting: they are text
        return b'{"format": "' + b"[" * (size - 14) + b'"}'
    raise AssertionError(shape)


#: shape -> the error after the path and _HEAD, when read at the size cap
HOSTILE = {
    "an unclosed string": "it is not JSON (Unterminated string starting at: line 1 column 1 (char 0))",
    "nesting without end": "it nests arrays and objects more than 200 deep",
    "a number without end": "it has no \"format\": 'ftjit-specs'",
    "many keys": "it has no \"format\": 'ftjit-specs'",
    "brackets in a string": "it has no \"format\": 'ftjit-specs'",
}


@pytest.mark.thread_unsafe(reason="each file is 64 MiB, and parsing one takes up to a GiB: 8 at once would not fit")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("digits_unlimited", [False, True], ids=["int-digits-default", "int-digits-unlimited"])
@pytest.mark.parametrize("shape", sorted(HOSTILE))
def test_a_hostile_file_at_the_size_cap_is_refused_in_linear_time(tmp_path, shape, digits_unlimited):
    """At the size cap, each shape is read (or refused) in seconds: the
    nesting is counted in one pass, and integers are bounded by the reader,
    also when the program lifted Python's bound on int conversions (which
    made a long number's conversion quadratic: 800 KB took 10 s)."""
    import time

    tmp_path = _private(tmp_path)
    path = tmp_path / "specs.json"
    _written(path, _hostile(shape, _specs_format.MAX_BYTES))
    assert os.path.getsize(path) == _specs_format.MAX_BYTES
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0 if digits_unlimited else limit)
    try:
        started = time.process_time()  # this process's CPU time: other work on the machine does not count
        saved = ftjit.load_specs(path)
        seconds = time.process_time() - started
    finally:
        sys.set_int_max_str_digits(limit)
    assert type(saved.error) is ValueError
    assert str(saved.error) == f"{path} {_HEAD}{HOSTILE[shape]}; save the specs again with this version"
    # A hang guard: the unclosed string took hours of CPU here (200 KB: 148 s), as did the number without end
    # with the digits unlimited (800 KB: 10 s); now about 1 s each, and many keys about 8 s (json's own parse).
    assert seconds < 60


@pytest.mark.parametrize("text, depth", [
    (b"", 0), (b"[]", 1), (b"[[{}]]", 3), (b'["[[[", {"a": "]]]"}]', 2), (b'["\\\\", [[]]]', 3),
    (b'["\\"[[", [[]]]', 3), (b'["\\\\\\"[[", [[]]]', 3), (b'"\\\\"[[', 2), (b'"\\', 0),
    (b'"a\\\\\\\\"[', 1), ("[\"\u00e9[\", \"\\u005b\"]".encode(), 1),
])  # fmt: skip
def test_nesting_counts_brackets_outside_strings_as_json_reads_them(text, depth):
    """Escaped quotes and backslashes (a run of backslashes pairs from its
    left), brackets in strings, escapes of brackets, UTF-8 text."""
    from ftjit._specs_read import nesting

    assert nesting(text) == depth
    chunk = ftjit._specs_read._CHUNK
    padded = b" " * (chunk - 3) + text  # the same text across a chunk's end
    assert nesting(padded) == depth


def test_a_file_too_large_is_refused_unread(tmp_path):
    tmp_path = _private(tmp_path)
    jf, path = _good_file(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(_specs_format.MAX_BYTES + 1)  # sparse: nothing of it is written
    saved = ftjit.load_specs(path)
    assert type(saved.error) is ValueError
    assert str(saved.error) == (f"{path} is not read: it is {_specs_format.MAX_BYTES + 1} bytes, more than the "
                                f"{_specs_format.MAX_BYTES} a specs file may have")
    assert [r.signature for r in jf.warmup(saved.for_function(jf))] == [f"<specs file {path}>"]


def test_a_missing_file_is_one_report_line(tmp_path):
    tmp_path = _private(tmp_path)
    jf = _saved_function()
    path = tmp_path / "none.json"
    saved = ftjit.load_specs(path)
    assert type(saved.error) is FileNotFoundError and saved.error.filename == str(path)
    (result,) = jf.warmup(saved.for_function(jf))
    assert result.signature == f"<specs file {path}>" and result.error is saved.error


#: (edit of the entry, the error of that entry alone)
UNUSABLE = {
    "a module not imported": (_set([*ARG_P, "type"], "no_such_module_here:Pair"),
                              "the class no_such_module_here:Pair is not loaded: its module is not imported "
                              "(load_specs never imports a module: import it first)"),
    "a class the module does not have": (_set([*ARG_P, "type"], f"{HERE}:Gone"),
                                         f"the class {HERE}:Gone is not loaded: its module has no such class "
                                         "(load_specs never imports a module: import it first)"),
    "a class that is not a namedtuple": (_set([*ARG_P, "type"], f"{HERE}:Options"),
                                         f"{HERE}:Options is not a namedtuple in this process"),
    "a dtype unknown here": (_set([*ARG_D, "children", 0, "dtype"], "float1024"),
                             f"the dtype float1024 is not known in this process (numpy {np.__version__})"),
    "an enum member gone": (_set([*ARG_S, "static", "fields", "color", "name"], "GREEN"),
                            f"the enum {HERE}:Color has no member 'GREEN' in this process"),
    "a dataclass not registered": (_set([*ARG_S, "static", "dataclass"], f"{HERE}:Unregistered"),
                                   f"{HERE}:Unregistered is not a dataclass registered with "
                                   "ftjit.register_static_dataclass in this process"),
    "a dataclass whose fields changed": (lambda d: _first(d)["args"][2]["static"]["fields"].pop("tags"),
                                         f"the dataclass {HERE}:Options has the fields color, rate, tags in this "
                                         "process, not color, rate as saved"),
    "a nan static": (_set([*ARG_S, "static"], {"float": "nan"}),
                     "the static value nan does not equal its copy read back from a specs file (by == and hash), so "
                     "a spec of it would make a signature that no call has (a value that compares by identity, or "
                     "nan, equals no copy)"),
}


@dataclasses.dataclass(frozen=True)
class Unregistered:
    color: Color
    rate: float
    tags: tuple


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_an_entry_this_process_cannot_use_is_its_own_report_line_and_the_rest_warms_up(tmp_path, case):
    tmp_path = _private(tmp_path)
    edit, reason = UNUSABLE[case]
    jf = _pair_function()
    path = _saved_then_edited(tmp_path / "specs.json", jf, edit)
    saved = ftjit.load_specs(path)
    assert saved.error is None
    newest, oldest = [s.signature for s in jf.signatures()]
    jf.clear_cache()
    specs = saved.for_function(jf)
    assert [type(s) for s in specs] == [ftjit.BrokenSpec, ftjit.SavedSpec]
    assert (specs[0].signature, type(specs[0].error), str(specs[0].error)) == (newest, ValueError, reason)
    report = jf.warmup(specs)
    assert [(r.signature, r.compiled, r.error is None) for r in report] == [
        (newest, False, False), (oldest, True, True)]
    assert jf.cache_info().compiles == 2 + 1


#: Text a file may hold in a saved signature or its versions: valid JSON, and shown as is it would split a
#: report line, clear the terminal, and (the lone surrogate) make print() raise UnicodeEncodeError.
HOSTILE_TEXT = "h(\n\x1b[2J\ud800\u202e)"
HOSTILE_SHOWN = "h(\\n\\x1b[2J\\ud800\\u202e)"


@pytest.mark.parametrize("where", ["signature", "versions"])
def test_text_from_a_file_is_escaped_in_the_report_one_line_per_entry(tmp_path, where):
    # print(report) raised UnicodeEncodeError (with the default flags too), before serving: the file was
    # never rewritten, and every restart crashed the same way.
    import io

    tmp_path = _private(tmp_path)
    jf = _pair_function()
    newest, oldest = [s.signature for s in jf.signatures()]

    def edit(data):
        if where == "versions":
            data["versions"]["jax"] = HOSTILE_TEXT
        else:
            _first(data)["signature"] = HOSTILE_TEXT
            _first(data)["args"][1]["type"] = "no_such_module_here:Pair"  # not usable: shown by its signature

    path = _saved_then_edited(tmp_path / "specs.json", jf, edit)
    saved = ftjit.load_specs(path)
    report = jf.warmup(saved.for_function(jf))
    text = str(report)
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    print(report, file=stream)  # raises on a character a strict UTF-8 stream cannot take
    stream.flush()
    assert stream.buffer.getvalue().decode("utf-8") == text + "\n"
    lines = text.splitlines()
    assert len(lines) == 2 + 2 + 1 and all(line.isprintable() for line in lines)  # header, rule, 2 rows, summary
    if where == "signature":
        assert lines[2].startswith(HOSTILE_SHOWN + " ")
        assert lines[2].endswith("  ValueError: the class no_such_module_here:Pair is not loaded: its module is not "
                                 "imported (load_specs never imports a module: import it first)")
        assert report.results[0].signature == HOSTILE_TEXT  # escaped where shown, not in the results
    else:
        assert [line.split("  ")[0] for line in lines[2:4]] == [newest, oldest]
        assert all(f"jax {HOSTILE_SHOWN}; this is" in line for line in lines[2:4])


def test_a_function_s_specs_are_read_up_to_its_max_signatures(tmp_path):
    # A 61.5 MB file of 90,000 entries made a start take 40 s and 770 MB, and print a 10.7 MB table; only
    # max_signatures of them could ever be warmed up.
    tmp_path = _private(tmp_path)
    comp = CountingCompiler()
    many = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    for n in range(1, 6):
        many(np.zeros(n, np.float32))
    path = tmp_path / "specs.json"
    ftjit.save_specs(path, {"f": many})
    saved = ftjit.load_specs(path)
    newest = [e.signature for e in saved.functions["f"]]
    few = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=2)
    with LogCapture(f"{path} holds") as log:  # this thread's file
        specs = saved.for_function(few, name="f")
    assert [type(s) for s in specs] == [ftjit.SavedSpec] * 2
    assert [few._signature_of(*s.args).replace("<lambda>", "") for s in specs] == [
        s.replace("<lambda>", "") for s in newest[:2]]
    assert log.messages() == [f"{path} holds 5 saved signatures of f, more than its max_signatures=2: only the "
                              "newest 2 are read"]
    assert len(saved.for_function(many, name="f")) == 5  # no max_signatures: all


ABSURD = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import ftjit

    traced = []

    def widen(x):
        traced.append(x.shape)
        return x.astype(jnp.float32)

    # The program's own spec: an int8[2**61] argument whose float32 result no 64-bit byte count holds.
    f = ftjit.jit(widen)
    print("program:", f.warmup([(jax.ShapeDtypeStruct((2**61,), np.int8),)]).results[0].error)

    # A file's spec: a saved shape edited to [2**56, 16], of a matmul whose result no 64-bit byte count holds
    # (serve.py --no-bucket-warmup --specs F aborted with one such shape).
    def project(x, w):
        traced.append(x.shape)
        return x @ w

    g = ftjit.jit(project)
    g(np.ones((4, 16), np.float32), np.ones((16, 64), np.float32))
    ftjit.save_specs(sys.argv[1], {"project": g})
    data = json.load(open(sys.argv[1]))
    data["functions"]["project"][0]["args"][0]["shape"] = [2**56, 16]
    open(sys.argv[1], "w").write(json.dumps(data))
    g.clear_cache()
    del traced[:]
    compiles = g.cache_info().compiles
    report = g.warmup(ftjit.load_specs(sys.argv[1]).for_function(g, name="project"))
    print("file:", report.results[0].error)
    print("traced:", traced, "compiles:", g.cache_info().compiles - compiles)
    """
)


@pytest.mark.thread_unsafe(reason="runs an interpreter")
def test_absurd_shapes_from_the_program_or_a_file_are_refused_and_the_process_lives(tmp_path):
    # Both aborted the process in XLA (SIGABRT, "overflow in static extent product"), the file's in every
    # start of a server warming it up.
    tmp_path = _private(tmp_path)
    done = _run(tmp_path, ABSURD, str(tmp_path / "specs.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "program: int8[2305843009213693952] (an argument) would take 2305843009213693952 bytes, more than the "
        "9007199254740992 (8 PiB) ftjit compiles a value of: not compiled (no device holds that much, and XLA aborts "
        "the process compiling larger ones). Is a dimension wrong?",
        "file: its arrays would take 4611686018427392000 bytes on the default device, more than the 1099511627776 "
        "(1 TiB) a saved spec may take where the device's memory is not known: not warmed up (a damaged file?)",
        "traced: [] compiles: 0",  # the file's spec was refused before anything was traced
    ]


class _MemoryCompiler(CountingCompiler):
    """A compiler whose default device holds ``memory`` bytes (CompilerHooks.device_memory), or an unknown
    amount (None)."""

    def __init__(self, memory):
        super().__init__()
        self.memory = memory

    def hooks(self, fun):
        return ftjit.CompilerHooks(device_memory=lambda placement: self.memory)


@pytest.mark.parametrize("memory", [4096, None])
def test_a_saved_spec_past_the_device_s_memory_is_refused_before_anything_is_traced(tmp_path, memory):
    tmp_path = _private(tmp_path)
    comp = _MemoryCompiler(memory)
    jf = ftjit.jit(lambda x, y: x, compiler=comp, cache=ftjit.FunctionCache())
    jf(np.ones((8, 16), np.float32), np.ones(16, np.int8))  # 512 + 16 bytes: fits
    path = tmp_path / "specs.json"
    ftjit.save_specs(path, {"f": jf})
    fits = ftjit.load_specs(path).for_function(jf, name="f")
    assert [type(s) for s in fits] == [ftjit.SavedSpec]
    data = json.loads(path.read_text())
    data["functions"]["f"][0]["args"][0]["shape"] = [8, 2**40 // 32]  # float32: 2**40 bytes, and 16 more
    _written(path, json.dumps(data).encode())
    (spec,) = ftjit.load_specs(path).for_function(jf, name="f")
    assert type(spec) is ftjit.BrokenSpec and type(spec.error) is ValueError
    if memory is None:
        assert str(spec.error) == ("its arrays would take 1099511627792 bytes on the default device, more than the "
                                   "1099511627776 (1 TiB) a saved spec may take where the device's memory is not "
                                   "known: not warmed up (a damaged file?)")
    else:
        assert str(spec.error) == ("its arrays would take 1099511627792 bytes on the default device, more than the "
                                   "4096 bytes of its memory: not warmed up (a damaged file, or one saved for a larger "
                                   "device?)")
    report = jf.warmup([spec])
    assert [(r.signature, r.error) for r in report] == [(spec.signature, spec.error)] and comp.calls == 1


def test_the_jax_compiler_reports_the_memory_jax_reports():
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    assert ftjit._jax._device_memory(None) == stats.get("bytes_limit")  # None on the CPU
    assert ftjit._jax._device_memory(jax.sharding.SingleDeviceSharding(device)) == stats.get("bytes_limit")


def test_a_file_from_another_version_or_a_changed_function_is_a_report_line_per_spec(tmp_path):
    tmp_path = _private(tmp_path)
    jf = _saved_function()
    path = tmp_path / "specs.json"
    ftjit.save_specs(path, jf)
    data = json.loads(path.read_text())
    data["versions"]["jax"] = "0.0.1"
    other_version = tmp_path / "old.json"
    _written(other_version, json.dumps(data).encode())
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
                                    f"saved as {jf.__qualname__}(float32[2], float) (Leaf read back as Static)")


# --- statics that compare by identity do not pile up ------------------------------------------------------------


class Tag:
    """Prints alike, equal only to itself (no __eq__): every restart would make another."""

    def __repr__(self):
        return "Tag()"


@ftjit.register_static_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class Opaque:
    """A registered dataclass that compares by identity (eq=False)."""

    n: int

    def __repr__(self):
        return "Opaque()"


def _tagged(x, s):
    return x


def test_statics_that_compare_by_identity_are_left_out_and_the_file_does_not_grow_across_restarts(tmp_path):
    tmp_path = _private(tmp_path)
    path = tmp_path / "specs.json"
    name = _tagged.__qualname__
    expected_left_out = (
        (f"{name}(float32[2], Opaque())",
         "the static value Opaque() does not equal its copy read back from a specs file (by == and hash), so a spec "
         "of it would make a signature that no call has (a value that compares by identity, or nan, equals no copy)"),
        (f"{name}(float32[2], Tag())",
         f"a static value of type {HERE}.Tag (Tag()), which a specs file cannot hold (it holds None, bool, int, "
         "float, str, bytes, tuples and lists of them, enums, and dataclasses registered with "
         "ftjit.register_static_dataclass)"),
    )
    files = []
    for restart in range(4):  # each round a process: load and warm up, traffic, save at the stop
        jf = ftjit.jit(_tagged, static_argnums=1, cache=ftjit.FunctionCache())
        report = jf.warmup(ftjit.load_specs(path, missing_ok=True).for_function(jf))
        assert [r.signature for r in report] == ([] if restart == 0 else [f"{name}(float32[2], 'fixed')"])
        assert report.ok
        jf(jnp.ones(2), "fixed")
        jf(jnp.ones(2), Tag())
        jf(jnp.ones(2), Opaque(1))
        info = jf.cache_info()  # "fixed" from the file when there is one; the identity-compared two, each time
        assert (info.compiles, info.hits) == (3, 1 if restart else 0)
        assert ftjit.save_specs(path, jf) == {f"{HERE}:{name}": (1, expected_left_out)}
        files.append(path.read_bytes())
    assert len(set(files)) == 1


def test_a_static_that_compares_by_identity_in_a_planted_entry_is_refused_at_load(tmp_path):
    """Written by hand (save_specs leaves it out): read twice, its two copies differ."""
    tmp_path = _private(tmp_path)
    jf = ftjit.jit(_tagged, static_argnums=1, cache=ftjit.FunctionCache())
    jf(jnp.ones(2), "fixed")
    path = tmp_path / "specs.json"
    ftjit.save_specs(path, jf)
    path.write_text(path.read_text().replace('{"static": "fixed"}',
                                             '{"static": {"dataclass": "%s:Opaque", "fields": {"n": 1}}}' % HERE))
    jf.clear_cache()
    (broken,) = ftjit.load_specs(path).for_function(jf)
    assert str(broken.error) == ("the static value Opaque() does not equal its copy read back from a specs file (by == "
                                 "and hash), so a spec of it would make a signature that no call has (a value that "
                                 "compares by identity, or nan, equals no copy)")
    assert not jf.warmup([broken]).ok and jf.cache_info().compiles == 1


# --- which function is which -----------------------------------------------------------------------------------


def _make_g(scale):
    def g(x):
        return x * scale

    return ftjit.jit(g, cache=ftjit.FunctionCache())


def test_two_functions_of_one_key_are_refused_and_a_dict_names_each(tmp_path):
    tmp_path = _private(tmp_path)
    g1, g2 = _make_g(1), _make_g(2)
    g1(jnp.ones(2))
    g2(jnp.ones(3))
    key = f"{HERE}:_make_g.<locals>.g"
    path = tmp_path / "specs.json"
    with pytest.raises(ValueError, match=re.escape(
            f"save_specs: {g1!r} and {g2!r} both have the key '{key}' (module:qualname), so a file could keep only "
            "one of them: pass a dict {name: function} to name each")):
        ftjit.save_specs(path, [g1, g2])
    assert not path.exists()
    assert ftjit.save_specs(path, [g1, g1]) == {key: (1, ())}  # one function twice is one
    assert ftjit.save_specs(path, {"g1": g1, "g2": g2}) == {"g1": (1, ()), "g2": (1, ())}
    saved = ftjit.load_specs(path)
    assert list(saved.functions) == ["g1", "g2"] and saved.for_function(g1) == []  # not under its own key
    g1.clear_cache()
    g2.clear_cache()
    assert [r.signature for r in g1.warmup(saved.for_function(g1, name="g1"))] == ["_make_g.<locals>.g(float32[2])"]
    assert [r.signature for r in g2.warmup(saved.for_function(g2, name="g2"))] == ["_make_g.<locals>.g(float32[3])"]
    assert (g1.cache_info().compiles, g2.cache_info().compiles) == (2, 2)


@pytest.mark.parametrize("what, message", [
    ("a str", "save_specs takes a function of ftjit.jit, a list or tuple of them, or a dict {name: function}, got "
              "'model:step' (a str)"),
    ("None", "save_specs takes a function of ftjit.jit, a list or tuple of them, or a dict {name: function}, got None "
             "(a NoneType)"),
    ("an iterator", r"save_specs takes a function of ftjit.jit, a list or tuple of them, or a dict {name: function}, "
                    r"got <list_iterator object at 0x[0-9a-f]+> \(a list_iterator\)"),
    ("jax.jit", r"save_specs takes a function of ftjit.jit, a list or tuple of them, or a dict {name: function}, got "
                r".* \(a jaxlib[.\w]*PjitFunction\)"),
    ("a list holding jax.jit", r"save_specs \(item 1\) takes functions of ftjit.jit, got .*PjitFunction\)"),
    ("a dict holding a lambda", r"save_specs \(the function named 'f'\) takes functions of ftjit.jit, got <function "
                                r".*<lambda> at 0x[0-9a-f]+> \(a function\)"),
    ("a dict of int keys", r"save_specs: a dict's keys name the functions in the file \(str\), got 1"),
])
def test_save_specs_of_something_else_than_jitted_functions_is_a_type_error(tmp_path, what, message):
    tmp_path = _private(tmp_path)
    jitted = _saved_function()
    given = {"a str": "model:step", "None": None, "an iterator": iter([jitted]), "jax.jit": jax.jit(lambda x: x),
             "a list holding jax.jit": [jitted, jax.jit(lambda x: x)], "a dict holding a lambda": {"f": lambda x: x},
             "a dict of int keys": {1: jitted}}[what]
    path = tmp_path / "specs.json"
    with pytest.raises(TypeError, match="^" + (re.escape(message) if what in ("a str", "None") else message) + "$"):
        ftjit.save_specs(path, given)
    assert not path.exists()


def test_an_empty_path_is_a_value_error_and_writes_nothing(tmp_path, monkeypatch):
    tmp_path = _private(tmp_path)
    jf = _saved_function()
    with pytest.raises(ValueError, match=r"^save_specs: the path is empty: give the specs file's path$"):
        ftjit.save_specs("", jf)
    with pytest.raises(ValueError, match=r"^load_specs: the path is empty: give the specs file's path$"):
        ftjit.load_specs(b"")
    assert os.listdir(tmp_path) == []


def test_for_function_of_something_else_is_a_type_error(tmp_path):
    tmp_path = _private(tmp_path)
    _, path = _good_file(tmp_path)
    saved = ftjit.load_specs(path)
    with pytest.raises(TypeError, match=r"^SavedSpecs.for_function takes functions of ftjit.jit, got None \(a "
                                        r"NoneType\)$"):
        saved.for_function(None)
    with pytest.raises(TypeError, match=r"^SavedSpecs.for_function: name must be a str \(a key given to save_specs\), "
                                        r"got 3$"):
        saved.for_function(_saved_function(), name=3)


# --- what a file holds ------------------------------------------------------------------------------------------


def _holds(value):
    return _specs_format.encode_value(value)


def test_values_are_written_exactly_and_tagged():
    assert _holds(None) is None and _holds(True) is True and _holds(2**80) == 2**80 and _holds("é") == "é"
    assert [_holds(x) for x in (0.1, -0.0, float("inf"), float("nan"))] == [
        {"float": "0x1.999999999999ap-4"}, {"float": "-0x0.0p+0"}, {"float": "inf"}, {"float": "nan"}]
    assert _holds((b"\x00", [1, ()])) == {"tuple": [{"bytes": "AA=="}, {"list": [1, {"tuple": []}]}]}
    assert _holds(Color.BLUE) == {"enum": f"{HERE}:Color", "name": "BLUE"}
    assert _holds(Options(Color.RED, 1.5, ("a",))) == {"dataclass": f"{HERE}:Options", "fields": {
        "color": {"enum": f"{HERE}:Color", "name": "RED"}, "rate": {"float": "0x1.8000000000000p+0"},
        "tags": {"tuple": ["a"]}}}
    not_held = [(np.float32(1), "numpy.float32"), (Pair(1, 2), f"{HERE}.Pair"), (frozenset(), "builtins.frozenset"),
                (Unregistered(Color.RED, 1.0, ()), f"{HERE}.Unregistered")]
    for value, kind in not_held:
        with pytest.raises(_specs_format.CannotHold, match=f"^a static value of type {re.escape(kind)} "):
            _holds(value)


def test_a_class_defined_in_a_function_cannot_be_named():
    Local = enum.Enum("Local", "A")  # its qualname names no attribute of this module
    with pytest.raises(_specs_format.CannotHold, match=re.escape(
            f"the class {HERE}.Local cannot be found by its name where a specs file is read (a class defined in a "
            "function, or not bound to that name in its module)")):
        _holds(Local.A)


def test_register_static_dataclass_takes_dataclasses_that_init_sets():
    with pytest.raises(TypeError, match=r"^register_static_dataclass takes a dataclass \(a class\), got <class "
                                        r"'.*Tag'>; as a decorator, put it above @dataclasses.dataclass$"):
        ftjit.register_static_dataclass(Tag)
    with pytest.raises(TypeError, match=r"^register_static_dataclass takes a dataclass \(a class\), got "):
        ftjit.register_static_dataclass(Options(Color.RED, 1.0, ()))

    @dataclasses.dataclass(frozen=True)
    class Derived:
        n: int
        twice: int = dataclasses.field(init=False, default=0)

    with pytest.raises(TypeError, match=r"^register_static_dataclass: .*Derived's field\(s\) twice are not set by "
                                        r"__init__ \(init=False\), so it cannot be rebuilt from a specs file$"):
        ftjit.register_static_dataclass(Derived)
    assert ftjit.register_static_dataclass(Options) is Options  # again: the same class back
