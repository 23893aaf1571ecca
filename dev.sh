#!/usr/bin/env bash
# ftjit developer entry point: sets up .venv, builds ftjit into it, and runs
# the demo, the tests or the benchmarks. Safe to run on a fresh clone.
#
#   bash dev.sh demo [--threads N|--requests N|--seconds S]        main job: serve + load, summary table
#   bash dev.sh stress [--quick|--minutes N|--scenario NAME|...]   thread-safety stress suite
#   bash dev.sh test                                               all tests
#   bash dev.sh test-once [pytest args]                            the unit tests once (xdist), no C++ tests and no
#                                                                  8-thread pass: CI's newest-JAX compatibility run
#   bash dev.sh test-accelerator [pytest args]                     all tests, one process, on the GPU/TPU JAX finds
#   bash dev.sh bench [--quick]                                    benchmarks
#   bash dev.sh build                                              build only
#   bash dev.sh tsa                                                the C++ tests compiled with clang++ -Wthread-safety
#                                                                  -Werror (installs Debian's clang if clang++ is missing)
#   bash dev.sh ft-python [--tsan]                                 print a free-threaded CPython's path
#                                                                  (builds 3.13.5t into ~/.cache/ftjit if none)
#   bash dev.sh tsan-ft                                            the JAX-free tests and stress scenarios under
#                                                                  ThreadSanitizer, on a TSAN-built 3.13.5t
#
# FTJIT_PYTHON picks the interpreter (default python3) and FTJIT_VENV the venv
# (default .venv). FTJIT_PYTHON=ft is short for "the free-threaded CPython of
# `dev.sh ft-python`, in .venv-ft": e.g. FTJIT_PYTHON=ft bash dev.sh test.
set -euo pipefail
cd "$(dirname "$0")"

PY=${FTJIT_PYTHON:-python3}
if [ "$PY" = ft ]; then
  PY=$(bash tools/ft-python.sh)
  FTJIT_VENV=${FTJIT_VENV:-.venv-ft}
fi
VENV=$(realpath -m "${FTJIT_VENV:-.venv}")
VENV_SHOWN=${FTJIT_VENV:-.venv}  # as given, for the log lines
VPY="$VENV/bin/python"

log() { printf '\033[1m[dev] %s\033[0m\n' "$*" >&2; }

setup() {
  if [ ! -x "$VPY" ]; then
    log "creating the environment $VENV_SHOWN with $("$PY" --version 2>&1) (a few seconds)"
    "$PY" -m venv "$VENV"
  fi
  # jax >= 0.10.2 as pyproject requires (the editable install uses --no-deps, so it is checked here).
  if ! "$VPY" -c "import nanobind, scikit_build_core, pytest, xdist, pytest_timeout, pytest_run_parallel, mypy, chex, waitress, prometheus_client, numpy, jax, sys
assert sys.version_info < (3, 13) or __import__('granian')
v = tuple(int(p) for p in jax.__version__.split('.')[:3])
assert v >= (0, 10, 2), jax.__version__" 2>/dev/null; then
    log "installing build and test dependencies into $VENV_SHOWN (first run: ~200 MB of wheels, jaxlib alone 85 MB; about a minute on a fast connection)"
    "$VPY" -m pip install -q -U pip
    # Wheels only: on a free-threaded CPython the newest numpy (2.5.x), scipy
    # or mypy's Rust-built deps may have no cp313t wheel, and pip would then
    # try a source build (which needs gfortran, Rust...). Binary-only makes
    # it take the newest release that has one (numpy 2.4.6 on 3.13t).
    "$VPY" -m pip install -q --only-binary=:all: "scikit-build-core>=0.10" "nanobind>=2.2" ninja cmake \
      "numpy>=1.26" "jax>=0.10.2" "pytest>=8" "pytest-xdist>=3" "pytest-timeout>=2.3" "pytest-run-parallel>=0.4" "mypy>=1.10" \
      chex \
      "waitress>=3.0.2,<4" "prometheus_client>=0.20" "granian>=2.7.9,<2.9; python_version >= '3.13'"
    # chex: tests/test_jax_fixes.py, what chex (a JAX user's test tool) sees of a jitted function.
    # waitress, prometheus_client and granian (3.13+; binary-only takes 2.7.9, the last with cp313t wheels):
    # the serve extra, which examples/serve.py (the demo) and tests/test_serve.py need.
  fi
}

build() {
  setup
  log "building ftjit's C++ core into $VENV_SHOWN (first build: about 30 s on 2 cores; later, only what changed: a few seconds)"
  # No build isolation: the build dependencies are in the venv already, and
  # the cached build/ directory makes rebuilds incremental. Editable, so that
  # the in-tree ftjit/ (first on sys.path for python -m) is the one imported.
  "$VPY" -m pip install -q --no-build-isolation --no-deps -e .
  (cd /tmp && "$VPY" -c "import ftjit; print('[dev] ftjit', ftjit.__version__, 'from', ftjit.__file__)")
}

# Runs pytest and treats "no tests collected" (exit 5) as a failure.
pytest_strict() {
  local rc=0
  "$VPY" -m pytest "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    log "pytest collected no tests: failing"
    return 1
  fi
  return "$rc"
}

# Runs the suite with each test body in 8 threads at once (pytest-run-parallel)
# and checks that it really did: the plugin's "Collected N items to run in
# parallel" line must be there, and (for the library's tests, the first call
# below) N must be at least FTJIT_MIN_PARALLEL_PCT (default 80) percent of the
# tests run; the rest are marked thread_unsafe (or auto-detected as such) and
# run in one thread. $1 is "bar" to apply that minimum, anything else not to;
# the rest are pytest's arguments.
parallel_threads_run() {
  local out rc=0 n total min_pct=${FTJIT_MIN_PARALLEL_PCT:-80} bar=$1
  shift
  out=$(mktemp)
  pytest_strict --parallel-threads=8 --timeout=600 -q -p no:randomly "$@" 2>&1 | tee "$out" || rc=$?
  n=$(grep -oE '^Collected [0-9]+ items to run in parallel' "$out" | grep -oE '[0-9]+' | tail -1 || true)
  total=$(grep -E '[0-9]+ (passed|failed)' "$out" | tail -1 |
          grep -oE '[0-9]+ (passed|failed|skipped|xfailed|xpassed|errors?)' | awk '{s += $1} END {print s + 0}')
  rm -f "$out"
  [ "$rc" -eq 0 ] || return "$rc"
  if [ -z "$n" ]; then
    log "pytest-run-parallel printed no 'Collected N items to run in parallel' line: the tests did not run in parallel"
    return 1
  fi
  log "pytest-run-parallel: $n of $total tests ran in 8 threads at once"
  if [ "$bar" = bar ] && [ $(( n * 100 )) -lt $(( total * min_pct )) ]; then
    log "only $n of $total tests ran in parallel (< ${min_pct}%): too many are thread_unsafe"
    return 1
  fi
}

# Sets cmake, ctest and gen (the generator's arguments): the venv's, else PATH's.
cmake_tools() {
  local bin="$VENV/bin"
  cmake=$([ -x "$bin/cmake" ] && echo "$bin/cmake" || command -v cmake)
  ctest=$([ -x "$bin/ctest" ] && echo "$bin/ctest" || command -v ctest)
  gen=()
  if [ -x "$bin/ninja" ]; then
    gen=(-G Ninja -DCMAKE_MAKE_PROGRAM="$bin/ninja")
  elif command -v ninja >/dev/null; then
    gen=(-G Ninja)
  fi
}

tsan() {
  log "C++ primitives under ThreadSanitizer (ctest)"
  local cmake ctest gen
  cmake_tools
  "$cmake" -S cpp/tests -B build/tsan "${gen[@]}" -DCMAKE_BUILD_TYPE=Debug >/dev/null
  "$cmake" --build build/tsan
  "$ctest" --test-dir build/tsan --output-on-failure --timeout 300
}

# Clang's thread-safety analysis: the C++ tests, and every member of every
# primitive (cpp/tests/tsa_instantiations.cc), over StdMutex and LeafMutex
# (against the venv's Python headers), and the extension's own sources
# (cpp/store, cpp/signature, cpp/jit), compiled, not run, with clang++
# -Wthread-safety -Werror, so that every FTJIT_GUARDED_BY/REQUIRES/EXCLUDES
# of cpp/primitives/thread_annotations.h is checked. Installs Debian's clang
# package when clang++ is missing (as root, or through sudo).
tsa() {
  log "C++ primitives under Clang's thread-safety analysis (clang++ -Wthread-safety -Werror)"
  if ! command -v clang++ >/dev/null; then
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    log "clang++ not found: installing Debian's clang package"
    # The package lists may be missing or stale on a fresh machine: update once if the install fails.
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang >/dev/null ||
      { "${sudo[@]}" apt-get update -q >/dev/null &&
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang >/dev/null; }
  fi
  log "$(clang++ --version | head -1)"
  local cmake ctest gen
  cmake_tools
  "$cmake" -S cpp/tests -B build/tsa "${gen[@]}" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
    -DFTJIT_TSA=ON -DPython_EXECUTABLE="$VPY" >/dev/null
  "$cmake" --build build/tsa
}

# ThreadSanitizer on a free-threaded interpreter, as JAX's nightly CI runs
# it: CPython 3.13.5t built --with-thread-sanitizer (tools/ft-python.sh
# --tsan, cached), ftjit built with -fsanitize=thread into .venv-tsan, then
# the tests and stress scenarios that do not need JAX (jaxlib is not
# instrumented), halting on the first report. Suppressions: CPython's own
# list (Tools/tsan/suppressions_free_threading.txt of the same source) plus
# .ci/tsan-suppressions.txt, each line of which says why.
tsan_ft() {
  local tpy tvenv=.venv-tsan supp
  tpy=$(bash tools/ft-python.sh --tsan)
  # pip, venv creation and the build itself run under TSAN too: quiet them.
  export TSAN_OPTIONS="report_bugs=0"
  if [ ! -x "$tvenv/bin/python" ]; then
    log "creating $tvenv with $tpy (ThreadSanitizer build)"
    "$tpy" -m venv "$tvenv"
  fi
  if ! "$tvenv/bin/python" -c "import nanobind, scikit_build_core, pytest, pytest_timeout, pytest_run_parallel, numpy" 2>/dev/null; then
    log "installing build and test dependencies into $tvenv (no jax: jaxlib is not instrumented)"
    "$tvenv/bin/python" -m pip install -q --only-binary=:all: "scikit-build-core>=0.10" "nanobind>=2.2" ninja cmake \
      "numpy>=1.26" "pytest>=8" "pytest-timeout>=2.3" "pytest-run-parallel>=0.4"
  fi
  log "building ftjit with -fsanitize=thread"
  "$tvenv/bin/python" -m pip install -q --no-build-isolation --no-deps -e . \
    -C build-dir=build/tsan-ft -C cmake.build-type=RelWithDebInfo \
    -C cmake.define.CMAKE_CXX_FLAGS="-fsanitize=thread -g -O1 -fno-omit-frame-pointer" \
    -C cmake.define.CMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -C cmake.define.FTJIT_STUBS=OFF
  supp=$(mktemp)
  cat "$(dirname "$tpy")/../tsan-suppressions-cpython.txt" .ci/tsan-suppressions.txt > "$supp"
  # Reports go to files (pytest captures stderr, and a halted run loses it), printed on failure.
  reports=$(mktemp -d)
  # die_after_fork=0: tests/test_fork.py starts threads in forked children (TSAN refuses by default).
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$supp:log_path=$reports/tsan"
  trap 'for r in "$reports"/tsan.*; do [ -e "$r" ] && { log "ThreadSanitizer report $r:"; cat "$r" >&2; }; done' EXIT
  "$tvenv/bin/python" -c "import ftjit._core as c; print('[dev] ftjit core under TSAN:', c.__file__)"
  log "C++: map + ready table + LRU + latch with the extension's own lock (LeafMutex, a PyMutex here)"
  "$tvenv/bin/cmake" -S cpp/tests -B build/tsan-ft-cpp -G Ninja -DCMAKE_MAKE_PROGRAM="$(realpath "$tvenv/bin/ninja")" \
    -DCMAKE_BUILD_TYPE=Debug -DFTJIT_FT_PYTHON="$tpy" >/dev/null
  "$tvenv/bin/cmake" --build build/tsan-ft-cpp --target test_entry_store_leafmutex
  "$tvenv/bin/ctest" --test-dir build/tsan-ft-cpp -R leafmutex --output-on-failure --timeout 300
  log "tests that need no JAX, under ThreadSanitizer"
  "$tvenv/bin/python" -m pytest tests/test_threads.py tests/test_cache.py tests/test_signature.py \
    tests/test_fork.py tests/test_api.py tests/test_shutdown.py tests/test_executable_for.py tests/test_thread_executables.py \
    tests/test_interrupts.py tests/test_translation.py tests/test_batched.py -q -p no:randomly \
    --timeout=900 "$@"
  log "stress scenarios that need no JAX, under ThreadSanitizer (sizes scaled down: TSAN runs ~20x slower)"
  "$tvenv/bin/python" -m stress --quick --no-jax --scale 0.25 --stall-seconds 120 --budget-seconds 1200
  rm -f "$supp"
}

cmd=${1:-test}
shift || true
case "$cmd" in
  build) build ;;
  stress) build; exec "$VPY" -m stress "$@" ;;
  bench)
    build
    # The PNG chart needs matplotlib (optional: only the benchmarks use it).
    if ! "$VPY" -c "import matplotlib" 2>/dev/null; then
      log "installing matplotlib for the bench chart"
      "$VPY" -m pip install -q --only-binary=:all: matplotlib
    fi
    exec "$VPY" -m bench "$@"
    ;;
  demo) build; exec "$VPY" examples/demo.py "$@" ;;
  tsan) setup; tsan ;;
  tsa) setup; tsa ;;
  ft-python) exec bash tools/ft-python.sh "$@" ;;
  tsan-ft) tsan_ft "$@" ;;
  test-accelerator)
    # The suite in one process (no xdist: the test process holds the accelerator, and on a TPU no second
    # process can open it) on whatever accelerator JAX finds. FTJIT_TEST_ACCELERATOR=1 makes the session
    # print the backend and devices first, and lets tests whose tool is missing skip (tests/helpers.py's
    # require_module). Helper processes run JAX on the CPU (tests/helpers.py's child_env).
    build
    if [ -n "${JAX_PLATFORMS+set}" ]; then
      log "unsetting JAX_PLATFORMS=$JAX_PLATFORMS for this run: JAX picks the accelerator itself"
      unset JAX_PLATFORMS
    fi
    log "unit tests in one process on the accelerator JAX finds (FTJIT_TEST_ACCELERATOR=1)"
    FTJIT_TEST_ACCELERATOR=1 pytest_strict tests -q -rfEs "$@"
    ;;
  test-once)
    build
    log "unit tests once (pytest-xdist, 2 workers; the C++ tests and the 8-thread pass run in \`bash dev.sh test\`)"
    pytest_strict tests -n 2 --timeout=300 -q "$@"
    ;;
  test)
    build
    tsan
    log "unit tests (pytest-xdist, 2 workers)"
    pytest_strict tests -n 2 --timeout=300 -q "$@"
    log "unit tests again, each test body in 8 threads at once (pytest-run-parallel)"
    if [ "$#" -eq 0 ]; then
      # The library's tests, with the minimum share that must run in parallel;
      # then the serving example's (tests/test_serve.py), whose server tests
      # start servers and count their compiles, so run in one thread by nature.
      parallel_threads_run bar tests --ignore=tests/test_serve.py
      log "the serving example's tests, each test body in 8 threads at once where it can be"
      parallel_threads_run no-bar tests/test_serve.py
    else
      parallel_threads_run no-bar tests "$@"
    fi
    ;;
  *) echo "usage: bash dev.sh {demo|stress|test|test-once|test-accelerator|bench|build|tsan|tsa|ft-python|tsan-ft} [args]" >&2; exit 2 ;;
esac
