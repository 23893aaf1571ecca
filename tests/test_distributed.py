"""Scale-out: ftjit under JAX's multi-process runtime, two processes on localhost.

Each process owns 2 CPU devices (4 in all, joined by jax.distributed with the
gloo CPU collectives). A module-level @ftjit.jit made before
jax.distributed.initialize() must not have started the backend (initialize
refuses then), and a function with out_shardings computes on an array whose
halves live in different processes.

jax.distributed needs TCP (the coordinator's port): where 127.0.0.1 refuses it
(the TPU machine), the test skips. Both processes run JAX on the CPU
(helpers.child_env), also where the test process holds an accelerator.
"""

import socket
import subprocess
import sys
import textwrap

import pytest

from helpers import child_env, require_tcp

pytest.importorskip("jax")

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.thread_unsafe(reason="starts two processes that talk over a localhost port"),
]

WORKER = textwrap.dedent("""
    import sys
    pid, port = int(sys.argv[1]), sys.argv[2]
    import jax
    import numpy as np
    import ftjit


    @ftjit.jit  # decorated before initialize(): must not start the backend
    def total(x):
        return x.sum()


    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                               initialization_timeout=60)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("d",))
    # This process's half of a global [1, 2, 3, 4]: process 0 has [1, 2], process 1 [3, 4].
    local = np.arange(2 * pid, 2 * pid + 2, dtype=np.float32) + 1
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local, (4,))
    double = ftjit.jit(lambda x: x * 2, out_shardings=NamedSharding(mesh, P()))
    a, b, t = double(x), double(x), total(x)
    info = double.cache_info()
    print(pid, jax.process_count(), len(jax.devices()), len(jax.local_devices()), np.asarray(a).tolist(),
          np.asarray(b).tolist(), float(np.asarray(t)), info.compiles, info.hits, flush=True)
    jax.distributed.shutdown()
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_compute_on_an_array_split_between_them():
    require_tcp("jax.distributed (its coordinator listens on a port)")
    port = _free_port()
    env = {k: v for k, v in child_env().items() if k != "XLA_FLAGS"}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(pid), str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
             for pid in (0, 1)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=200)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            p.kill()
    for pid, (code, out, err) in enumerate(outs):
        assert code == 0, (pid, out, err[-3000:])
        # process, processes, global devices, local devices, x * 2 gathered (twice), sum, compiles, hits
        assert out.strip().splitlines()[-1] == f"{pid} 2 4 2 [2.0, 4.0, 6.0, 8.0] [2.0, 4.0, 6.0, 8.0] 10.0 1 1", err[-2000:]
