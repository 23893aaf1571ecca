#!/usr/bin/env bash
# ftjit CI: compiles the extension's C++ against a Py_GIL_DISABLED Python
# configuration (objects only, no link), so the free-threaded code paths
# (PyMutex-backed ft_mutex, critical sections, 3.13+ strong-reference APIs)
# are compiled on every run even where no free-threaded interpreter exists.
set -euo pipefail
cd "$(dirname "$0")/.."

VPY=${1:-.venv/bin/python}
nb_inc=$("$VPY" -c "import nanobind, os; print(os.path.join(os.path.dirname(nanobind.__file__), 'include'))")
nb_ext=$("$VPY" -c "import nanobind, os; print(os.path.join(os.path.dirname(nanobind.__file__), 'ext', 'robin_map', 'include'))")

# A CPython >= 3.13 whose headers know Py_GIL_DISABLED: a free-threaded one
# if present, else any 3.13+/3.14+ (its pyconfig.h gets the define).
src_inc=""
for py in "${FTJIT_FT_PYTHON:-}" python3.14t python3.13t python3.14 python3.13 \
          $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[3-9]*/bin/python3 2>/dev/null | sort -r); do
  [ -n "$py" ] || continue
  command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || continue
  inc=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])" 2>/dev/null) || continue
  ver=$("$py" -c "import sys; print(sys.version_info >= (3, 13))" 2>/dev/null) || continue
  if [ "$ver" = "True" ] && [ -f "$inc/Python.h" ]; then src_inc=$inc; echo "[ft-compile] headers of $py ($inc)"; break; fi
done
if [ -z "$src_inc" ]; then
  echo "[ft-compile] SKIPPED (not run, not passed): no CPython >= 3.13 headers on this machine to build a"
  echo "[ft-compile] SKIPPED   Py_GIL_DISABLED configuration from; the free-threaded code paths were NOT compiled."
  echo "[ft-compile] SKIPPED   Install CPython 3.13+ (or set FTJIT_FT_PYTHON) to run this check."
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src_inc" "$work/include"
if ! grep -q '^#define Py_GIL_DISABLED 1' "$work/include/pyconfig.h"; then
  printf '\n#ifndef Py_GIL_DISABLED\n#define Py_GIL_DISABLED 1\n#endif\n' >> "$work/include/pyconfig.h"
fi

fail=0
for f in cpp/*.cc; do
  if g++ -std=c++17 -O1 -Wall -Wextra -Wno-missing-field-initializers -Werror=return-type \
      -DNB_FREE_THREADED -DNB_STATIC -fPIC -fvisibility=hidden -I"$work/include" -I"$nb_inc" -I"$nb_ext" -Icpp \
      -c "$f" -o "$work/$(basename "$f").o"; then
    echo "[ft-compile] ok   $f"
  else
    echo "[ft-compile] FAIL $f"; fail=1
  fi
done
# The free-threaded branch must really have been taken: a probe that only
# compiles when Py_GIL_DISABLED is on and PyMutex is declared. Its failure
# fails the check (an `if`, so that set -e cannot swallow it).
printf '#include <Python.h>\n#ifndef Py_GIL_DISABLED\n#error not free-threaded\n#endif\nint main(){PyMutex m{}; (void)m; return 0;}\n' > "$work/probe.cc"
if g++ -std=c++17 -I"$work/include" -c "$work/probe.cc" -o "$work/probe.o"; then
  echo "[ft-compile] Py_GIL_DISABLED configuration confirmed (PyMutex visible)"
else
  echo "[ft-compile] FAIL probe: the headers in $work/include do not give a Py_GIL_DISABLED build with PyMutex"
  fail=1
fi
if [ "$fail" -ne 0 ]; then
  echo "[ft-compile] FAILED"
else
  echo "[ft-compile] passed"
fi
exit $fail
