"""Interpreter shutdown while daemon threads wait on a compile must exit cleanly."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import threading, time, ftjit
    gate = threading.Event()
    def compiler(fun, args, kwargs):
        gate.wait()
        return fun
    jf = ftjit.jit(lambda x: x, compiler=compiler, cache=ftjit.FunctionCache(8))
    threading.Thread(target=jf, args=(1.0,), daemon=True).start()
    time.sleep(0.2)
    for v in (2.0, 3.0):
        threading.Thread(target=jf, args=(v,), daemon=True).start()
    deadline = time.monotonic() + 10
    while jf.cache_info().waits < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("waits", jf.cache_info().waits)
    """
)


def test_exit_while_threads_wait_on_a_compile():
    # A waiter re-taking the GIL during finalisation is ended by CPython (3.11-3.13
    # use pthread_exit); that must not abort the process ("terminate called ...").
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "waits 2", proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "terminate" not in proc.stderr
