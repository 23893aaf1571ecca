"""The package as a newcomer meets it: an unbuilt source tree says how to
build it, and the import graph has no circle through ftjit/__init__.py."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

import ftjit
from helpers import child_env, parse_python

PACKAGE = pathlib.Path(ftjit.__file__).resolve().parent


def _import_in(cwd: pathlib.Path) -> subprocess.CompletedProcess:
    # -I -S: no PYTHONPATH, no site-packages (so not the editable install's
    # finder, which maps ftjit to the built tree wherever one runs): the
    # copy in cwd is the ftjit found. Its core is imported before anything else.
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", "import sys; sys.path.insert(0, ''); import ftjit"],
        cwd=cwd, capture_output=True, text=True, timeout=120, env=child_env(),
    )


def _copy_sources(to: pathlib.Path) -> None:
    (to / "ftjit").mkdir()
    for py in PACKAGE.glob("*.py"):
        shutil.copy(py, to / "ftjit" / py.name)


def test_unbuilt_source_tree_says_how_to_build(tmp_path):
    """The in-tree ftjit/ without its C++ core, first on sys.path (as with
    `python -m stress` from the repository root): one ImportError that names
    `bash dev.sh build`, the project's .venv and `pip install <root>`; not
    "cannot import name '_core' from partially initialized module"."""
    _copy_sources(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'ftjit'\n")
    (tmp_path / "dev.sh").write_text("")
    done = _import_in(tmp_path)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ftjit's C++ core (ftjit._core) is not built for "), done.stderr
    assert f"This ftjit is the source tree at {tmp_path.resolve()}" in last
    assert "`bash dev.sh build`, then run with `.venv/bin/python`" in last
    assert f"-m pip install {tmp_path.resolve()}`" in last
    assert "partially initialized" not in done.stderr  # the misleading cause is not chained


def test_source_tree_shadowing_an_installed_ftjit_says_to_run_from_outside(tmp_path):
    """Run from inside the source tree with ftjit installed elsewhere on
    sys.path: the source tree's ftjit/ (no core) is found first. The real
    fix is to run from outside the tree, and the message says that first,
    naming both places."""
    tree, site = tmp_path / "tree", tmp_path / "site"
    tree.mkdir()
    site.mkdir()
    _copy_sources(tree)
    _copy_sources(site)
    (tree / "pyproject.toml").write_text("[project]\nname = 'ftjit'\n")
    (tree / "dev.sh").write_text("")
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = ['', {str(site)!r}]; import ftjit"],
        cwd=tree, capture_output=True, text=True, timeout=120, env=child_env(),
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ftjit's C++ core (ftjit._core) is not built for "), done.stderr
    assert f"this ftjit is not the installed one: run from outside the source tree at {tree.resolve()}" in last
    assert f"instead of the ftjit installed at {(site / 'ftjit').resolve()}" in last


def test_installed_package_missing_its_core_says_reinstall(tmp_path):
    """Outside a source tree (no pyproject.toml beside it), a missing core
    means a broken install: the message says to reinstall."""
    _copy_sources(tmp_path)
    done = _import_in(tmp_path)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ftjit's C++ core (ftjit._core) is missing from "), done.stderr
    assert "reinstall ftjit from where it came from (ftjit is not on PyPI)" in last


def _package_level_imports(path: pathlib.Path) -> list[str]:
    """Imports in `path` that go through the package's __init__ rather
    than naming a submodule: `from . import x`, `import ftjit`, `from ftjit import x`."""
    found = []
    tree = parse_python(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if (node.level == 1 and node.module is None) or (node.level == 0 and node.module == "ftjit"):
                found.append(f"{path.name}:{node.lineno}: from {'.' * node.level}{node.module or ''} import ...")
        elif isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno}: import {a.name}" for a in node.names if a.name == "ftjit"]
    return found


@pytest.mark.parametrize("module", sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"))
def test_no_module_imports_from_the_package_init(module):
    """Only ftjit/__init__.py imports the package's modules; they import
    names from each other's modules, never from the package (a circle)."""
    assert _package_level_imports(PACKAGE / module) == []


def test_the_import_check_finds_package_level_imports(tmp_path):
    """The check above can fail: it finds each form of a package-level import."""
    bad = tmp_path / "bad.py"
    bad.write_text("from . import _core\nimport ftjit\nfrom ftjit import jit\nfrom ._core import x\n")
    assert _package_level_imports(bad) == [
        "bad.py:1: from . import ...",
        "bad.py:2: import ftjit",
        "bad.py:3: from ftjit import ...",
    ]


# --- the core's collaborators ------------------------------------------------------

def test_the_core_is_handed_its_collaborators_once():
    """ftjit's import hands the core every collaborator it names
    (_core._set_collaborators); a call naming an unknown one, or missing
    some, or a second hand-off is refused, and what was handed stays."""
    with pytest.raises(TypeError) as unknown:
        ftjit._core._set_collaborators(CacheInfo=1, bogus=2)
    assert str(unknown.value) == "_set_collaborators: no collaborator is named bogus"
    with pytest.raises(TypeError) as missing:
        ftjit._core._set_collaborators(CacheInfo=1)
    names = ["RecursiveCompileError", "CompileCycleError", "CompileTimeoutError", "RecompileLimitError",
             "UnhashableStaticArgumentError", "UnsupportedArgumentError", "ContextHooks", "RegistryFlatten", "Leaf",
             "Node", "Static", "Signature", "CacheInfo", "SignatureInfo", "rebuild", "jit_globals", "warmup",
             "warmup_specs", "on_compile", "on_wait", "on_miss", "copy", "partial"]
    assert str(missing.value) == "_set_collaborators: missing " + ", ".join(n for n in names if n != "CacheInfo")
    with pytest.raises(RuntimeError) as again:
        ftjit._core._set_collaborators(**{name: None for name in names})
    assert str(again.value) == ("_set_collaborators: ftjit's core was handed its collaborators already (by ftjit's "
                                "import); they are fixed for the process's life")
    assert type(ftjit.FunctionCache().size()) is int
    assert type(ftjit.jit(lambda x: x, cache=ftjit.FunctionCache()).cache_info()) is ftjit.CacheInfo


def test_the_core_used_before_the_hand_off_raises_runtime_error(tmp_path):
    """The extension loaded on its own, without ftjit's import (as the stub
    generator loads it): what needs a collaborator raises RuntimeError
    saying so, never a crash."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import _core\n"
        "class Hooks: pytree_flatten = staticmethod(lambda obj: None)\n"
        "try: _core._make_jit_function(len, len, Hooks(), _core.FunctionCache(), (), (), (), 'f', (), {})\n"
        "except RuntimeError as e: print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(pathlib.Path(ftjit._core.__file__).parent)],
                          capture_output=True, text=True, timeout=120, env=child_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ("ftjit's core has not been handed its collaborators (RegistryFlatten is one): `import ftjit` "
                           "hands them over, and ftjit._core cannot be used without it\n")
