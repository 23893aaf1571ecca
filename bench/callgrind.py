"""Instructions per call of every bench case's ftjit side (and its anchor), counted by callgrind.

Noise-free where wall-clock timings are not (these machines are shared):
callgrind counts instructions, the same for the same binary and inputs.
Used to check that a change leaves the hot path's cost as it was.

    python -m bench.callgrind [--calls N] [--no-jax] [--json PATH]

re-runs itself under ``valgrind --tool=callgrind`` with instrumentation off
(imports, compiles and warm-up run uninstrumented), and switches it on only
around ``N`` calls of each side, through callgrind's client requests (a tiny
helper library compiled with the system C compiler against valgrind's
``callgrind.h``). Prints one row per case: instructions per call of each
side, the ftjit side's overhead over the anchor's, and the totals.
Needs valgrind, its headers and a C compiler (Linux).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any, Sequence

_HELPER = r"""
#include <valgrind/callgrind.h>
void ftjit_cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void ftjit_cg_stop(const char* label) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT(label); }
"""


def _helper_library(workdir: str) -> str:
    src, lib = os.path.join(workdir, "cg.c"), os.path.join(workdir, "libcg.so")
    with open(src, "w") as f:
        f.write(_HELPER)
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise SystemExit("bench.callgrind: no C compiler found (set CC)")
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", lib, src], check=True)
    return lib


def _measure(calls: int, with_jax: bool, lib_path: str) -> list[str]:
    """Under callgrind: warms every side up, then counts `calls` calls of each (one dump per side)."""
    from .cases import default_cases

    lib = ctypes.CDLL(lib_path)
    lib.ftjit_cg_stop.argtypes = [ctypes.c_char_p]
    labels = []
    for i, case in enumerate(default_cases(with_jax=with_jax)):
        for side_name, side in (("ftjit", case.ftjit), ("anchor", case.anchor)):
            fn, args = side.fn, side.args
            for _ in range(50):  # compiles, memos, caches
                fn(*args)
            label = f"{i}|{side_name}|{case.name}|{side.label}"
            lib.ftjit_cg_start()
            for _ in range(calls):
                fn(*args)
            lib.ftjit_cg_stop(label.encode())
            labels.append(label)
    return labels


def _read_dumps(outdir: str) -> dict[str, int]:
    """{label: instructions} from callgrind's dump files."""
    out = {}
    for name in os.listdir(outdir):
        if not name.startswith("callgrind.out"):
            continue
        label = total = None
        with open(os.path.join(outdir, name), errors="replace") as f:
            for line in f:
                if line.startswith("desc: Trigger: Client Request: "):
                    label = line.split("Client Request: ", 1)[1].strip()
                elif line.startswith("summary:") or line.startswith("totals:"):
                    total = int(line.split()[1])
        if label and total is not None and "|" in label:
            out[label] = total
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.callgrind", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls counted per side (default %(default)s)")
    parser.add_argument("--no-jax", action="store_true", help="only the rows that need no JAX")
    parser.add_argument("--json", metavar="PATH", help="also write {case: {ftjit, anchor}} as JSON")
    parser.add_argument("--inner", metavar="LIB", help=argparse.SUPPRESS)  # set when re-run under valgrind
    args = parser.parse_args(argv)
    if args.inner:
        _measure(args.calls, not args.no_jax, args.inner)
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("bench.callgrind: valgrind is not installed")
    with tempfile.TemporaryDirectory() as work:
        lib = _helper_library(work)
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=yes",
                   f"--callgrind-out-file={work}/callgrind.out.%p", sys.executable,
                   *(["-S"] if sys.flags.no_site else []), "-m", "bench.callgrind",
                   "--calls", str(args.calls), "--inner", lib] + (["--no-jax"] if args.no_jax else [])
        env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
        # The system allocator, which valgrind follows; a free-threaded build refuses any but mimalloc.
        if sysconfig.get_config_var("Py_GIL_DISABLED"):
            env.pop("PYTHONMALLOC", None)
        else:
            env["PYTHONMALLOC"] = "malloc"
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            return proc.returncode
        counts = _read_dumps(work)
    rows: dict[str, dict[str, Any]] = {}
    for label, total in counts.items():
        index, side, case, who = label.split("|", 3)
        row = rows.setdefault(case, {"index": int(index)})
        row[side] = total / args.calls
        row[side + "_label"] = who
    print(f"instructions per call (callgrind, {args.calls} calls per side; {sys.version.split()[0]}"
          f"{'t' if 'free-threading' in sys.version else ''})")
    print(f"{'case':40} {'ftjit':>10} {'anchor':>10}  {'ftjit - anchor':>14}  anchor")
    for case, row in sorted(rows.items(), key=lambda kv: kv[1]["index"]):
        print(f"{case:40} {row['ftjit']:10.0f} {row['anchor']:10.0f}  {row['ftjit'] - row['anchor']:14.0f}  "
              f"{row['anchor_label']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({case: {"ftjit": row["ftjit"], "anchor": row["anchor"]} for case, row in rows.items()}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
