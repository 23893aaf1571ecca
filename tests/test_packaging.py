"""The package ships typed stubs and declares what it supports."""

import pathlib
import sys

import ftjit
import ftjit._core
import pytest


def test_core_stub_is_installed_and_typed():
    stub = pathlib.Path(ftjit._core.__file__).with_name("_core.pyi")
    text = stub.read_text()
    assert "class FunctionCache:" in text
    assert "def __init__(self, capacity: int = 4096) -> None" in text
    assert "class JitFunction(Generic[_P, _R]):" in text
    assert "def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R" in text
    assert "def precompile(self, *args: _P.args, **kwargs: _P.kwargs) -> bool" in text
    assert "def cache_info(self) -> CacheInfo" in text
    assert "def clear_caches() -> None" in text


def test_py_typed_marker_ships():
    assert pathlib.Path(ftjit.__file__).with_name("py.typed").exists()


def test_gil_stays_disabled_on_free_threaded_builds():
    # On a free-threaded interpreter, importing the extension (FREE_THREADED in
    # nanobind_add_module, i.e. the Py_mod_gil slot) must not re-enable the GIL.
    import sysconfig

    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip("not a free-threaded interpreter")
    assert sys._is_gil_enabled() is False


def test_the_extension_imports_without_numpy_as_the_stub_generator_imports_it(tmp_path):
    # The build generates _core.pyi by importing the extension on its own (as
    # `_core`) in the build environment, which has no numpy when pip builds
    # in isolation (pip wheel ., an sdist install): its init must not need it.
    import subprocess

    from helpers import child_env

    script = (
        "import sys; sys.modules['numpy'] = None; sys.path.insert(0, sys.argv[1]); "
        "import _core; print(sorted(n for n in ('JitFunction', 'FunctionCache') if hasattr(_core, n)))"
    )
    core_dir = str(pathlib.Path(ftjit._core.__file__).parent)
    proc = subprocess.run([sys.executable, "-c", script, core_dir], capture_output=True, text=True, timeout=120,
                          env=child_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['FunctionCache', 'JitFunction']"
