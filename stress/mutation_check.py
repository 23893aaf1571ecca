"""Mutation check of the stress suite (manual, not run by CI): break ftjit on purpose, the scenario must fail.

    .venv/bin/python -m stress.mutation_check        # ~3 minutes on 2 cores

In a temporary copy of the working tree (your checkout and .venv are not touched), for each mutation: patch
one line of cpp/, rebuild _core there with CMake, run its scenario (``--quick --seed 1``) against that build
and require exit code 1 with the expected violation in the summary. An unmutated build runs first and must
pass. Exit status 0 when every mutation was caught.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

_LINES_SHOWN = 6  #: summary lines (notes, violations) shown per mutation


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    scenario: str
    expect: str  #: a line fragment the failing summary must contain


MUTATIONS = (
    Mutation(
        "compile-once latch: a waiter compiles too",
        "cpp/jit/wait.cc",
        "    if (found.inserted) return {std::move(found.entry), true, false, nullptr};\n",
        "    if (found.inserted || (found.entry->latch.state() == CompileLatch::State::kCompiling &&\n"
        "                           found.entry->latch.owner() != ThisThreadOwner()))\n"
        "      return {std::move(found.entry), true, false, nullptr};\n",
        "herd",
        "herd: signatures compiled more than once",
    ),
    Mutation(
        "weakref callback does nothing",
        "cpp/store/function_cache.cc",
        "    if (c && f) c->ForgetFunction(f.get());\n    if (f) f->Clear();\n",
        "",
        "churn",
        "entries after all its functions died",
    ),
    Mutation(
        "evicted executables leak (only RSS can see it)",
        "cpp/store/entry_store.h",
        "    for (EntryPtr& e : evicted) {\n",
        "    for (EntryPtr& e : evicted) {\n"
        "      if (e->payload.executable.is_valid()) Py_INCREF(e->payload.executable.ptr());\n",
        "churn",
        "churn: RSS grew",
    ),
)


def _copy_tree(src: str, dst: str) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=src,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if os.path.isfile(os.path.join(src, rel)):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)) or dst, exist_ok=True)
            shutil.copy2(os.path.join(src, rel), os.path.join(dst, rel))


def _tool(name: str) -> str:
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else (shutil.which(name) or name)


def _build(tree: str) -> None:
    build = os.path.join(tree, "build-mutation")
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        gen = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"] if shutil.which(_tool("ninja")) else []
        subprocess.run([_tool("cmake"), "-S", tree, "-B", build, *gen, "-DCMAKE_BUILD_TYPE=Release",
                        "-DFTJIT_STUBS=OFF", f"-DPython_EXECUTABLE={sys.executable}"],
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run([_tool("cmake"), "--build", build], check=True, stdout=subprocess.DEVNULL)
    for old in glob.glob(os.path.join(tree, "ftjit", "_core*.so")):
        os.remove(old)
    for lib in glob.glob(os.path.join(build, "_core*.so")):
        shutil.copy2(lib, os.path.join(tree, "ftjit"))


def _run(tree: str, scenario: str) -> subprocess.CompletedProcess[str]:
    # -S: no site, so no .pth (the checkout's editable install would import the real ftjit); the venv's
    # packages come in through PYTHONPATH, after the copy.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, sysconfig.get_paths()["purelib"]]))
    return subprocess.run([sys.executable, "-S", "-m", "stress", "--scenario", scenario, "--quick", "--seed", "1"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=600)


def main() -> int:
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                          text=True).stdout.strip()
    ok = True
    with tempfile.TemporaryDirectory(prefix="ftjit-mutation-") as tree:
        _copy_tree(root, tree)
        print(f"mutation check in {tree}: building the unmutated copy", flush=True)
        _build(tree)
        for scenario in sorted({m.scenario for m in MUTATIONS}):
            proc = _run(tree, scenario)
            print(f"  control: {scenario} exit {proc.returncode} ({'PASS' if proc.returncode == 0 else 'FAIL'})")
            ok &= proc.returncode == 0
        for m in MUTATIONS:
            path = os.path.join(tree, m.path)
            with open(path) as f:
                original = f.read()
            if original.count(m.old) != 1:
                print(f"  {m.name}: cannot apply (the patched line is not in {m.path} exactly once)")
                ok = False
                continue
            with open(path, "w") as f:
                f.write(original.replace(m.old, m.new))
            try:
                _build(tree)
                proc = _run(tree, m.scenario)
            finally:
                with open(path, "w") as f:
                    f.write(original)
            caught = proc.returncode == 1 and m.expect in proc.stdout
            print(f"  mutation '{m.name}': {m.scenario} exit {proc.returncode}: "
                  f"{'caught' if caught else 'NOT CAUGHT'}")
            lines = [line.strip() for line in proc.stdout.splitlines() if line.startswith(f"  {m.scenario}: ")]
            for line in lines[:_LINES_SHOWN]:
                print(f"    {line[:160]}")
            ok &= caught
    print("mutation check:", "every mutation was caught" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
