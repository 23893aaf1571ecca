"""Static types: what a type checker (mypy) sees of ``@ftjit.jit`` functions.

The package ships ``py.typed`` and the generated ``_core.pyi``; ``jit(f)`` is a
``JitFunction[P, R]`` that keeps ``f``'s parameters and result and has the
documented methods. Checked by running mypy on small user programs against
the installed package's files (copied, as a wheel would lay them out).
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import ftjit
import ftjit._core
from helpers import child_env, require_module

GOOD = """
    import ftjit

    def plain(x: float) -> float:
        return x

    @ftjit.jit(static_argnums=1)
    def scale(x: float, n: int) -> float:
        return x * n

    p = ftjit.jit(plain)
    reveal_type(p)
    reveal_type(p(1.0))
    reveal_type(scale)
    y: float = scale(2.0, 3)
    info: ftjit.CacheInfo = p.cache_info()
    hits: int = info.hits
    sigs: list[ftjit.SignatureInfo] = p.signatures()
    report: ftjit.WarmupReport = p.warmup([(1.0,)], workers=2)
    done: bool = p.precompile(2.0)
    jf: ftjit.JitFunction[[float], float] = p
    p.clear_cache()
"""

BAD = """
    import ftjit

    def plain(x: float) -> float:
        return x

    p = ftjit.jit(plain)
    s: str = p(1.0)
    p.precompile("a")
    p.cache_inf()
"""


def _mypy(tmp_path, source: str | None) -> list[str]:
    """mypy's error and note lines for `source` (as user.py), ftjit's own files
    silenced; with source None, mypy's lines for the ftjit package itself."""
    require_module("mypy", "tests/test_typing.py runs it on small programs")
    pkg = tmp_path / "pkg" / "ftjit"
    pkg.mkdir(parents=True)
    src = os.path.dirname(ftjit.__file__)
    for name in os.listdir(src):
        if name.endswith(".py") or name == "py.typed":
            shutil.copy(os.path.join(src, name), pkg / name)
    stub = os.path.join(os.path.dirname(ftjit._core.__file__), "_core.pyi")
    shutil.copy(stub, pkg / "_core.pyi")
    (tmp_path / "mypy.ini").write_text(textwrap.dedent(f"""
        [mypy]
        mypy_path = {tmp_path / "pkg"}
        cache_dir = {tmp_path / "cache"}
        [mypy-ftjit.*]
        follow_imports = silent
        [mypy-jax.*,jaxlib.*]
        follow_imports = skip
    """))
    if source is None:
        (tmp_path / "mypy.ini").write_text((tmp_path / "mypy.ini").read_text().replace(
            "[mypy-ftjit.*]\nfollow_imports = silent\n", ""))
        target = ["-p", "ftjit"]
    else:
        (tmp_path / "user.py").write_text(textwrap.dedent(source))
        target = ["user.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--no-error-summary",
         "--hide-error-context", *target],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, env=child_env({"MYPYPATH": str(tmp_path / "pkg")}),
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    if source is None:
        return proc.stdout.splitlines()
    return [line for line in proc.stdout.splitlines() if line.startswith("user.py:")]


def _normalised(lines: list[str]) -> list[str]:
    """mypy versions differ in spelling (``builtins.float`` vs ``float``)."""
    return [line.replace("builtins.", "") for line in lines]


def _error_codes(lines: list[str]) -> list[tuple[int, str]]:
    """(line, error code) of each error: stable across mypy versions, unlike the wording."""
    out = []
    for line in lines:
        match = re.fullmatch(r"user\.py:(\d+): error: .*  \[([a-z-]+)\]", line)
        assert match, line
        out.append((int(match.group(1)), match.group(2)))
    return out


@pytest.mark.thread_unsafe(reason="runs mypy in a subprocess (seconds each): 8 at once would overload 2 cores")
def test_a_jitted_function_keeps_its_signature_and_has_typed_methods(tmp_path):
    assert _normalised(_mypy(tmp_path, GOOD)) == [
        'user.py:12: note: Revealed type is "ftjit._core.JitFunction[[x: float], float]"',
        'user.py:13: note: Revealed type is "float"',
        'user.py:14: note: Revealed type is "ftjit._core.JitFunction[[x: float, n: int], float]"',
    ]


@pytest.mark.thread_unsafe(reason="runs mypy in a subprocess (seconds each): 8 at once would overload 2 cores")
def test_type_checkers_catch_misuse_of_a_jitted_function(tmp_path):
    lines = _mypy(tmp_path, BAD)
    # A str result, a str argument where float is declared, a misspelt method.
    assert _error_codes(lines) == [(8, "assignment"), (9, "arg-type"), (10, "attr-defined")], lines
    assert '"JitFunction[[float], float]" has no attribute "cache_inf"' in lines[2]


@pytest.mark.thread_unsafe(reason="runs mypy in a subprocess (seconds each): 8 at once would overload 2 cores")
def test_the_package_itself_type_checks(tmp_path):
    # ftjit's sources against its own stub (jax not followed: its types are
    # jax's business); the stub declares the private core functions too.
    assert _mypy(tmp_path, None) == []


def test_jit_overloads_list_exactly_the_keywords_of_its_definition():
    """jit()'s keywords are defined once, by its def (the partial of its
    decorator form and the pickled options are built from that); the two
    overloads a type checker reads must list the same names and types."""
    import inspect
    from typing import get_overloads

    from ftjit import _jit

    def keywords(fn):
        return [
            (p.name, p.annotation)
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD)
        ]

    overloads = get_overloads(_jit.jit)
    assert len(overloads) == 2
    for overload in overloads:
        assert keywords(overload) == keywords(_jit.jit)
    assert _jit._KEYWORDS == {name for name, _ in keywords(_jit.jit)} - {"jax_options"}
