"""The sources' own conventions that age: comments that name a file name
one that exists, and #include blocks in the order the anchors use (own
header; C headers, Python.h first among them; C++ standard library; third
party; the project's own).

Read from the checkout (skipped where the sources are not beside the tests,
as in an installed wheel's test run)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _floors():
    """The floors of cpp/, lowest first, as cmake/floors.cmake (the build's one list) names them."""
    with open(os.path.join(ROOT, "cmake", "floors.cmake"), encoding="utf-8") as f:
        return tuple(re.search(r"set\(FTJIT_FLOORS ([a-z ]+)\)", f.read()).group(1).split())


FLOORS = _floors()


def _tracked():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return set(out.split())


def _sources():
    tracked = _tracked()
    files = [f for f in tracked if f.startswith(tuple(f"cpp/{d}/" for d in FLOORS)) and f.endswith((".h", ".cc"))]
    files += [f for f in tracked if f.startswith("ftjit/") and f.endswith(".py")]
    # A checkout whose ftjit/ was taken away, to test an installed wheel (docs/development.md): no sources here.
    if not files or not all(os.path.exists(os.path.join(ROOT, f)) for f in files):
        pytest.skip("the sources are not all beside the tests (a copy without ftjit/, testing an installed wheel)")
    return tracked, sorted(files)


# Files of other projects that comments may name.
EXTERNAL = {"Python.h", "absl/base/thread_annotations.h"}

_FILE_NAME = re.compile(r"(?<![\w/.])((?:[\w-]+/)*[\w-]+\.(?:h|cc|py|txt|cmake))\b")


def _comment_text(path, text):
    if path.endswith(".py"):
        # Comments, and every string (docstrings among them).
        return "\n".join(re.findall(r"#[^\n]*", text)) + "\n" + "\n".join(re.findall(r'"""(.*?)"""', text, re.S))
    return "\n".join(line for line in re.findall(r"//[^\n]*", text))


def test_every_file_a_comment_names_exists():
    tracked, files = _sources()
    basenames = {os.path.basename(f) for f in tracked}
    stale = []
    for path in files:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = _comment_text(path, f.read())
        for name in _FILE_NAME.findall(text):
            if name in EXTERNAL:
                continue
            if "/" in name:
                found = any(os.path.normpath(os.path.join(base, name)) in tracked for base in ("", "cpp"))
            else:
                found = name in basenames
            if not found:
                stale.append(f"{path}: {name}")
    assert stale == []


def _include_group(line, own):
    m = re.match(r'#include ([<"])([^>"]+)[>"]', line)
    if not m:
        return None
    kind, name = m.groups()
    if kind == '"':
        return 0 if name == own else 4
    if name.startswith("nanobind/"):
        return 3
    if name.endswith(".h"):
        return 1  # C headers: Python.h (first, as CPython asks), structmember.h, cxxabi.h
    return 2  # the C++ standard library


def test_includes_are_grouped_own_c_cxx_third_party_project():
    _, files = _sources()
    wrong = []
    for path in files:
        if not path.endswith((".h", ".cc")):
            continue
        own = path[len("cpp/"):].rsplit(".", 1)[0] + ".h" if path.endswith(".cc") else None
        groups, names = [], []
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            for line in f:
                if line.startswith("#include"):
                    group = _include_group(line, own)
                    groups.append(group)
                    names.append(line.split()[1])
        if groups != sorted(groups):
            wrong.append(f"{path}: {' '.join(names)}")
        c_headers = [n for g, n in zip(groups, names) if g == 1]
        if "<Python.h>" in c_headers and c_headers[0] != "<Python.h>":
            wrong.append(f"{path}: Python.h is not the first C header")
        project = [n for g, n in zip(groups, names) if g == 4]
        if project != sorted(project):
            wrong.append(f"{path}: project headers not in order: {' '.join(project)}")
    assert wrong == []


_STRING_LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def test_the_core_names_no_ftjit_module():
    """cpp/ is handed what it uses of ftjit's Python layer (ftjit's import
    calls _core._set_collaborators): no string literal of the C++ sources is
    an ftjit module's name or an attribute path in one ("ftjit.errors",
    "ftjit._jit.CacheInfo"), so none can be imported by name."""
    tracked, files = _sources()
    modules = {"ftjit." + f[len("ftjit/"):-len(".py")] for f in tracked
               if f.startswith("ftjit/") and f.endswith(".py") and f.count("/") == 1} - {"ftjit.__init__"}
    assert {"ftjit.errors", "ftjit._jit", "ftjit._explain"} <= modules
    named = []
    for path in files:
        if path.endswith((".h", ".cc")):
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                text = re.sub(r"//[^\n]*", "", f.read())
            for literal in _STRING_LITERAL.findall(text):
                dotted = re.fullmatch(r"ftjit(\.\w+)*", literal)
                if dotted and (literal == "ftjit" or ".".join(literal.split(".")[:2]) in modules):
                    named.append(f"{path}: {literal!r}")
    assert named == []
