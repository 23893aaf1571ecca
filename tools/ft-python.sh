#!/usr/bin/env bash
# Provides a free-threaded CPython (Py_GIL_DISABLED) and prints its path on
# stdout; progress goes to stderr. In order, it takes:
#
#   1. $FTJIT_FT_PYTHON, when set (it must be a free-threaded build, else this fails);
#   2. python3.14t or python3.13t on PATH, when free-threaded and working;
#   3. the one this script built before, in $FTJIT_CACHE (default ~/.cache/ftjit);
#   4. otherwise it builds CPython 3.13.5 with --disable-gil into that cache.
#
# The source comes from Debian's source archive (suite trixie), through apt
# with private lists in a temporary directory: the system's apt configuration
# is read (proxies, keyrings) but not changed. apt checks the source against
# the archive's signed Release file. Building takes about 10 minutes on two
# idle cores. Concurrent runs wait for one build (flock).
#
# With --tsan it provides (always by building, into cpython-3.13.5t-tsan) a
# free-threaded CPython built --with-thread-sanitizer, for running ftjit's
# Python-level tests under ThreadSanitizer (bash dev.sh tsan-ft); about 15
# minutes on two cores.
#
# Usage: bash tools/ft-python.sh [--tsan]   (or: bash dev.sh ft-python [--tsan])
set -euo pipefail

VERSION=3.13.5
TSAN=0
case "${1:-}" in
  "") ;;
  --tsan) TSAN=1 ;;
  *) echo "usage: bash tools/ft-python.sh [--tsan]" >&2; exit 2 ;;
esac
CACHE=$(realpath -m "${FTJIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ftjit}")
PREFIX="$CACHE/cpython-${VERSION}t$([ "$TSAN" = 1 ] && echo -tsan || true)"
PYBIN="$PREFIX/bin/python3.13t"

log() { printf '[ft-python] %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# True when $1 runs, is free-threaded, and has what pip needs (ssl, zlib, ctypes).
usable_ft() {
  TSAN_OPTIONS="${TSAN_OPTIONS:-report_bugs=0}" "$1" -c 'import sys, sysconfig, ssl, zlib, ctypes
sys.exit(0 if sysconfig.get_config_var("Py_GIL_DISABLED") else 1)' >/dev/null 2>&1
}

if [ "$TSAN" = 0 ] && [ -n "${FTJIT_FT_PYTHON:-}" ]; then
  p=$(command -v "$FTJIT_FT_PYTHON" || true)
  [ -n "$p" ] || die "FTJIT_FT_PYTHON=$FTJIT_FT_PYTHON is not an executable"
  usable_ft "$p" || die "FTJIT_FT_PYTHON=$p ($("$p" --version 2>&1)) is not a working free-threaded build (Py_GIL_DISABLED off, or no ssl/zlib/ctypes)"
  log "using FTJIT_FT_PYTHON: $p"
  echo "$p"; exit 0
fi
for cand in python3.14t python3.13t; do
  [ "$TSAN" = 0 ] || break
  p=$(command -v "$cand" || true)
  if [ -n "$p" ] && [ "$p" != "$PYBIN" ] && usable_ft "$p"; then
    log "using $cand from PATH: $p"
    echo "$p"; exit 0
  fi
done

mkdir -p "$CACHE"
exec 9>"$PREFIX.lock"
if ! flock -n 9; then
  log "another run is building CPython ${VERSION}t into $PREFIX: waiting for it"
  flock 9
fi
if [ -x "$PYBIN" ] && usable_ft "$PYBIN"; then
  log "using the cached build: $PYBIN"
  echo "$PYBIN"; exit 0
fi

command -v apt-get >/dev/null || die "no free-threaded CPython found, and no apt-get to fetch the source with.
  Install one (python.org installer, 'uv python install 3.13t', conda-forge 'python-freethreading',
  or a distribution's python3.13-nogil) and set FTJIT_FT_PYTHON, or put python3.13t on PATH."
for tool in make gcc tar xz; do
  command -v "$tool" >/dev/null || die "building CPython needs '$tool', which is not installed"
done

start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/ftjit-cpython.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ "$TSAN" = 1 ]; then
  log "building CPython ${VERSION}t with ThreadSanitizer into $PREFIX (about 15 minutes on two cores)"
else
  log "no free-threaded CPython found: building CPython ${VERSION}t into $PREFIX (about 4 minutes on two idle cores)"
fi

# The Debian mirror the system already uses (deb822 .sources or one-line .list).
uri=$( { grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
         grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{for (i=2;i<=NF;i++) if ($i !~ /^\[/) {print $i; break}}'
       } | grep -E '/debian/?$' | head -1 || true)
uri=${uri:-http://deb.debian.org/debian}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || die "$keyring is missing: cannot check the source archive's signature"
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
echo "deb-src [signed-by=$keyring] $uri trixie main" > "$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=$work/none"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o "APT::Sandbox::User=$(id -un)" -o "Debug::NoLocking=1")
log "apt-get update (private lists: deb-src $uri trixie main)"
apt-get "${apt_opts[@]}" -q update >&2 || die "apt-get update of $uri trixie failed"
log "apt-get source --download-only python3.13"
(cd "$work/src" && apt-get "${apt_opts[@]}" -q source --download-only python3.13 >&2) ||
  die "apt-get source python3.13 failed"
tarball=$(ls "$work/src"/python3.13_"${VERSION}".orig.tar.* 2>/dev/null | head -1 || true)
[ -n "$tarball" ] || die "Debian's trixie no longer serves python3.13 ${VERSION} (got: $(ls "$work/src" | tr '\n' ' '))"
log "unpacking $(basename "$tarball")"
tar -xf "$tarball" -C "$work/src"
srcdir=$(find "$work/src" -maxdepth 1 -type d -name "Python-${VERSION}*" | head -1)
[ -n "$srcdir" ] || die "no Python-${VERSION} directory in $tarball"

jobs=$(nproc 2>/dev/null || echo 2)
stage="$PREFIX.partial"
rm -rf "$stage"
extra=()
[ "$TSAN" = 1 ] && extra=(--with-thread-sanitizer)
log "configure --disable-gil ${extra[*]} --prefix=$PREFIX"
(cd "$srcdir" && ./configure --disable-gil "${extra[@]}" --prefix="$PREFIX" --with-ensurepip=install --disable-test-modules \
   > "$work/configure.log" 2>&1) ||
  { tail -30 "$work/configure.log" >&2; die "configure failed"; }
log "make -j$jobs (progress: one line a minute)"
( while sleep 60; do log "  still compiling ($(( $(date +%s) - start )) s; $(find "$srcdir" -name '*.o' | wc -l) objects)"; done ) &
ticker=$!
rc=0
(cd "$srcdir" && make -j"$jobs" > "$work/make.log" 2>&1) || rc=$?
kill "$ticker" 2>/dev/null || true
[ "$rc" -eq 0 ] || { tail -40 "$work/make.log" >&2; die "make failed"; }
log "make install (into a staging directory, then moved into place)"
(cd "$srcdir" && make install DESTDIR="$stage" > "$work/install.log" 2>&1) ||
  { tail -30 "$work/install.log" >&2; die "make install failed"; }
rm -rf "$PREFIX"
mv "$stage$PREFIX" "$PREFIX"
rm -rf "$stage"
if [ "$TSAN" = 1 ]; then
  # CPython's own suppressions for its known free-threading races, from the
  # same source tree, next to the interpreter (dev.sh tsan-ft starts from it).
  cp "$srcdir/Tools/tsan/suppressions_free_threading.txt" "$PREFIX/tsan-suppressions-cpython.txt"
fi
usable_ft "$PYBIN" || die "the build at $PYBIN is not usable: $("$PYBIN" -c 'import sysconfig, ssl, zlib, ctypes' 2>&1 | tail -1)
  (missing -dev headers? Debian: libssl-dev zlib1g-dev libffi-dev)"
log "built $("$PYBIN" --version 2>&1) (free-threaded) in $(( $(date +%s) - start )) s: $PYBIN"
echo "$PYBIN"
