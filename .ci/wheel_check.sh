#!/usr/bin/env bash
# ftjit CI: builds the wheel the way `pip install .` does (isolated build from
# a clean copy of the tree, not the editable dev install), checks that it
# ships the extension, the typed stub and py.typed, and imports and runs it
# from the installed files alone.
set -euo pipefail
cd "$(dirname "$0")/.."

VPY=$(realpath -ms "${1:-.venv/bin/python}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Build from a clean copy of the tracked files as they are in the working
# tree (what the rest of CI tested; no build/ or .venv).
mkdir "$work/src"
git ls-files -z | tar --null -T - -cf - | tar -x -C "$work/src"
"$VPY" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/ftjit-*.whl)
echo "[wheel] built $(basename "$wheel")"

"$VPY" - "$wheel" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["ftjit/__init__.py", "ftjit/py.typed", "ftjit/_core.pyi", "ftjit/errors.py", "ftjit/_jax.py"]
missing = [n for n in need if n not in names]
if not any(n.startswith("ftjit/_core.") and n.endswith((".so", ".pyd")) for n in names):
    missing.append("ftjit/_core extension")
if missing:
    sys.exit(f"[wheel] FAIL: the wheel lacks {missing}")
print(f"[wheel] contents ok: {len(names)} files, extension, _core.pyi and py.typed present")
PY

"$VPY" -m pip install -q --no-deps --target "$work/site" "$wheel"
# -S: no site hooks, so the editable dev install's finder stays out; the
# venv's site-packages (numpy, jax) are reached through PYTHONPATH, after the
# installed wheel.
site=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
(cd "$work" && PYTHONPATH="$work/site:$site" "$VPY" -S - "$work/site" <<'PY'
import os, sys
import ftjit
root = os.path.join(sys.argv[1], "ftjit")
assert os.path.dirname(ftjit.__file__) == root, f"imported {ftjit.__file__}, not the wheel's"
assert os.path.isfile(os.path.join(root, "py.typed"))
calls = []
def compiler(fun, args, kwargs):
    calls.append(1)
    return fun
f = ftjit.jit(lambda x, y: x + y, compiler=compiler)
assert f(1.0, 2.0) == 3.0 and f(3.0, 4.0) == 7.0 and len(calls) == 1
g = ftjit.jit(lambda x: x * 2)
assert float(g(21.0)) == 42.0
print(f"[wheel] installed wheel imports from {root} and runs (custom and JAX compilers)")
PY
)
