"""What a specs file (or a program's own spec) may ask of a start, bounded: a third hostile pass (issue 44).

Each case here once stalled, crashed or flooded a server's start from ``--specs``: an empty array whose
dimensions overflow once XLA reorders them (SIGABRT on every restart), a dict node of int keys that all share
one hash (a rebuild quadratic in their number), a rank in the thousands (minutes of compile), a signature of
megabytes padded into every row of the report, a file of more saved signatures than a start should compile,
and two small ones (a placement written as text, a save into a folder it cannot write). Each now refuses what
it must with one report line, and the rest of the file warms up.

Files are private to the test (tests/test_specs.py's ``_private``); the cases that would abort the process or
change its limits run in a child interpreter.
"""

import json
import os
import textwrap

import pytest

import ftjit
from helpers import CountingCompiler, LogCapture
from test_specs import _private, _run, _written

jax = pytest.importorskip("jax")  # the default compiler (absent only in dev.sh tsan-ft)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

EMPTY_BUT_HUGE = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import ftjit

    # The program's own specs: an empty argument whose nonzero dimensions overflow (XLA moved [0, 2**62, 4] to
    # [2**62, 4, 0] and aborted), and an empty intermediate of the same kind from an argument that fits.
    f = ftjit.jit(lambda x: jnp.transpose(x, (1, 2, 0)))
    print("argument:", f.warmup([(jax.ShapeDtypeStruct((0, 2**62, 4), np.float32),)]).results[0].error)
    g = ftjit.jit(lambda x: jnp.broadcast_to(x[:, :, None], (0, 2**31, 2**31)))
    print("intermediate:", g.warmup([(jax.ShapeDtypeStruct((0, 2**31), np.float32),)]).results[0].error)

    # A file's spec: serve.py's first layer, with x saved as float32[2**60, 1, 0, 16] (x @ w1 + b1 broadcasts
    # to [2**60, 8, 0, 64]): serve.py --no-bucket-warmup --specs F died with rc 134 on every start.
    def layer(x, w, b):
        return x @ w + b

    h = ftjit.jit(layer)
    h(np.ones((2, 16), np.float32), np.ones((16, 8), np.float32), np.ones(8, np.float32))
    ftjit.save_specs(sys.argv[1], {"layer": h})
    data = json.load(open(sys.argv[1]))
    data["functions"]["layer"][0]["args"][0]["shape"] = [2**60, 1, 0, 16]
    open(sys.argv[1], "w").write(json.dumps(data))
    h.clear_cache()
    compiles = h.cache_info().compiles
    report = h.warmup(ftjit.load_specs(sys.argv[1]).for_function(h, name="layer"))
    print("file:", report.results[0].error)
    print("compiles:", h.cache_info().compiles - compiles, "lines:", len(str(report).splitlines()))
    """
)


def test_an_empty_array_whose_nonzero_dims_overflow_is_refused_and_the_process_lives(tmp_path):
    tmp_path = _private(tmp_path)
    done = _run(tmp_path, EMPTY_BUT_HUGE, str(tmp_path / "specs.json"))
    assert done.returncode == 0, done.stdout + done.stderr  # at 1506bfc: -6 (SIGABRT)
    nonzero = ("whose size in bytes counting its nonzero dimensions alone (XLA multiplies them in any order) does "
               "not fit in a signed 64-bit integer: no array can have it (XLA would abort the process compiling "
               "it). Is a dimension wrong?")
    assert done.stdout.splitlines() == [
        f"argument: Argument 'x' has the shape float32[0,4611686018427387904,4], {nonzero}",
        "intermediate: float32[0,2147483648,2147483648] (the result of broadcast_in_dim) is empty, but its nonzero "
        "dimensions would take 18446744073709551616 bytes, more than the 9007199254740992 (8 PiB) ftjit compiles a "
        "value of: not compiled (no device holds that much, and XLA aborts the process compiling larger ones). Is a "
        "dimension wrong?",
        f"file: Argument 'x' has the shape float32[1152921504606846976,1,0,16], {nonzero}",
        "compiles: 0 lines: 4",  # one report line (header, rule, the spec, the summary)
    ]


def _one_entry_file(tmp_path, jf, name, edit):
    """A specs file of ``jf``'s cached signatures under ``name``, its first entry passed through ``edit``."""
    path = tmp_path / "specs.json"
    ftjit.save_specs(path, {name: jf})
    data = json.loads(path.read_text())
    edit(data["functions"][name][0])
    _written(path, json.dumps(data).encode())
    return path


@pytest.mark.timeout(120)
def test_a_rank_past_64_is_refused_before_anything_compiles(tmp_path):
    """A file's leaf of rank 6,000 took 247 s to compile in serve.py's warm-up (at 1506bfc), and was written
    back at the stop; a program's own spec of rank 65 is refused the same way."""
    tmp_path = _private(tmp_path)
    jf = ftjit.jit(lambda x, w: x @ w, cache=ftjit.FunctionCache())
    jf(np.ones((2, 16), np.float32), np.ones((16, 8), np.float32))
    path = _one_entry_file(tmp_path, jf, "f", lambda e: e["args"][0].update(shape=[1] * 5999 + [16]))
    jf.clear_cache()
    compiled = jf.cache_info().compiles
    report = jf.warmup(ftjit.load_specs(path).for_function(jf, name="f"))
    (result,) = report.results
    assert type(result.error) is ValueError
    assert str(result.error) == ("Argument 'x' has rank 6000, more than the 64 an array of a spec may have (numpy's "
                                 "own limit; XLA takes minutes to compile such ranks). Is its shape wrong?")
    with pytest.raises(ValueError, match=r"^Argument 'x' has rank 65, more than the 64 "):
        jf.precompile(jax.ShapeDtypeStruct((1,) * 65, np.float32), jax.ShapeDtypeStruct((1, 1), np.float32))
    g = ftjit.jit(lambda x: x.reshape((1,) * 70), cache=ftjit.FunctionCache())  # an intermediate of rank 70
    with pytest.raises(ValueError, match=r"^a value of rank 70 \(the result of reshape\), more than the 64 ftjit "
                                         r"compiles \(numpy's own limit; XLA takes minutes to compile such ranks\): "
                                         r"not compiled\. Is a shape wrong\?"):
        g.precompile(jax.ShapeDtypeStruct((1,), np.float32))
    assert jf.cache_info().compiles - compiled == g.cache_info().compiles == 0
    assert ftjit._core.MAX_SPEC_RANK == 64


@pytest.mark.timeout(60)  # quadratic, 60,000 keys took minutes (40,000: 51 s at 1506bfc)
def test_dict_keys_that_share_one_hash_are_refused_in_linear_time(tmp_path):
    tmp_path = _private(tmp_path)
    comp = CountingCompiler()
    jf = ftjit.jit(lambda d: d, compiler=comp, cache=ftjit.FunctionCache())
    jf({1: None, 2: None})
    jf({1: None})

    def collide(entry):  # Python's int hash is not randomised: every k * (2**61 - 1) hashes to 0
        (tree,) = entry["args"]
        tree["keys"] = [k * (2**61 - 1) for k in range(1, 60_001)]
        tree["children"] = [{"node": "none"}] * 60_000

    path = _one_entry_file(tmp_path, jf, "f", collide)
    specs = ftjit.load_specs(path).for_function(jf, name="f")
    assert [type(s) for s in specs] == [ftjit.BrokenSpec, ftjit.SavedSpec]  # the rest of the file warms up
    assert str(specs[0].error) == (
        "a dict node has more than 8 keys of one hash value (0): it is not built, as building it takes time that "
        "grows with the square of their number (a crafted file?)")
    # A few keys of one hash (as real dicts may have by chance) are kept.
    path = _one_entry_file(tmp_path, jf, "f", lambda e: e["args"][0].update(
        keys=[k * (2**61 - 1) for k in range(1, 9)], children=[{"node": "none"}] * 8))
    (spec, _) = ftjit.load_specs(path).for_function(jf, name="f")
    assert type(spec) is ftjit.SavedSpec and len(spec.args[0]) == 8


def test_a_megabyte_signature_does_not_grow_the_report_or_stats(tmp_path):
    """A 20 MB signature from a file made WarmupReport's text 2,040M characters (every row padded to it) and
    serve.py's /stats 60 MB a request; a version string of a file was quoted in every entry's error."""
    tmp_path = _private(tmp_path)
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    for n in range(1, 4):
        jf(np.zeros(n, np.float32))
    huge = "f(" + "x" * 2_000_000 + ")"

    def edit(entry):
        entry["signature"] = huge
        entry["args"][0]["dtype"] = "no_such_dtype"  # unusable: shown by its (huge) signature

    path = _one_entry_file(tmp_path, jf, "f", edit)
    report = jf.warmup(ftjit.load_specs(path).for_function(jf, name="f"))
    text = str(report)
    lines = text.splitlines()
    assert len(lines) == 2 + 3 + 1
    assert max(len(line) for line in lines) <= 2 * ftjit._warmup.MAX_TEXT + 20
    signature, outcome = report.results[0].shown()
    assert signature == huge[:960] + "... (1999043 more characters)" and len(signature) <= ftjit._warmup.MAX_TEXT
    assert outcome == f"ValueError: the dtype no_such_dtype is not known in this process (numpy {np.__version__})"
    assert report.results[0].signature == huge  # cut where shown, not in the results

    data = json.loads(path.read_text())
    data["versions"]["jax"] = "v" * 1_000_000
    _written(path, json.dumps(data).encode())
    report = jf.warmup(ftjit.load_specs(path).for_function(jf, name="f"))
    assert len(report) == 3 and all(len(str(r.error)) < 3 * ftjit._warmup.MAX_TEXT for r in report)
    assert len(str(report)) <= (len(report) + 3) * (2 * ftjit._warmup.MAX_TEXT + 20)  # rows, header, rule, summary


def test_a_function_without_max_signatures_reads_at_most_1000_saved_specs(tmp_path):
    """With max_signatures=None (the default) for_function returned every entry: 400 entries compiled in 39 s
    and 635 MB at a start. Now the newest MAX_SAVED_SPECS (1000), and a warning says how many more there are."""
    tmp_path = _private(tmp_path)
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(capacity=2000))
    for n in range(1, 1006):
        jf(np.zeros(n, np.int8))
    path = tmp_path / "specs.json"
    ftjit.save_specs(path, {"f": jf})
    saved = ftjit.load_specs(path)
    assert len(saved.functions["f"]) == 1005
    with LogCapture(f"{path} holds") as log:
        specs = saved.for_function(jf, name="f")
    assert ftjit._specs.MAX_SAVED_SPECS == 1000
    assert len(specs) == 1000 and all(type(s) is ftjit.SavedSpec for s in specs)
    assert [s.args[0].shape for s in specs[:2]] == [(1005,), (1004,)]  # the newest first
    assert log.messages() == [f"{path} holds 1005 saved signatures of f, more than the 1000 read of a function "
                              "without max_signatures: only the newest 1000 are read (give it max_signatures to "
                              "read more)"]
    more = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=1005)
    assert len(saved.for_function(more, name="f")) == 1005  # asked for: as many as it may compile


@pytest.mark.parametrize("placement, shown", [
    ("cpu:0", "'cpu:0'"), ({"tuple": ["single_device", "cpu"]}, "('single_device', 'cpu')"),
    ({"tuple": ["single_device", "cpu", "0"]}, "('single_device', 'cpu', '0')"),
])  # fmt: skip
def test_a_placement_of_another_form_is_a_clear_report_line(tmp_path, placement, shown):
    """A placement written as "cpu:0" gave ``ValueError: too many values to unpack``."""
    tmp_path = _private(tmp_path)
    jf = ftjit.jit(lambda x: x + 1, cache=ftjit.FunctionCache())
    jf(jax.device_put(jnp.ones(2), jax.devices("cpu")[0]))
    path = _one_entry_file(tmp_path, jf, "f", lambda e: e["args"][0].update(placement=placement))
    (spec,) = ftjit.load_specs(path).for_function(jf, name="f")
    assert type(spec) is ftjit.BrokenSpec and type(spec.error) is ValueError
    assert str(spec.error) == (f"unknown placement {shown}: a placement is (\"single_device\", platform, device "
                               "id), as save_specs writes it")


NO_FILES_LEFT = textwrap.dedent(
    """
    import os, resource, sys
    import numpy as np
    import ftjit

    jf = ftjit.jit(lambda x: x, compiler=lambda fun, args, kwargs: fun)
    jf(np.zeros(2))
    target = os.path.join(sys.argv[1], "specs.json")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor: none free above it once limited
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        ftjit.save_specs(target, jf)
    except OSError as exc:
        print(type(exc).__name__, exc.errno, exc.filename == target, exc.strerror.endswith(
            f"(making a temporary file in {sys.argv[1]} to replace it atomically)"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(sorted(os.listdir(sys.argv[1])))
    """
)


def test_a_save_that_cannot_make_its_temporary_file_names_the_file_asked_for(tmp_path):
    """A save into a read-only folder (here: no descriptor left, which root cannot bypass as it does a folder's
    mode) named the temporary ``.ftjit-specs-*`` file, not the target."""
    tmp_path = _private(tmp_path)
    done = _run(tmp_path, NO_FILES_LEFT, os.path.realpath(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["OSError 24 True True", "[]"]
