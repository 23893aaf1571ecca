"""The JAX compiler against jax.jit, for the gaps an audit found: hooks built
inside a trace, closed-over tracers, jax.disable_jit, registered nodes with
.dtype/.shape, committed placement, the public fallbacks of every
fast path, warnings, positional-only ``fun``, the static __eq__ error,
int/float/complex subclasses, module-style pytrees, other tracing configs,
and ``lower`` with keywords, statics and ShapeDtypeStructs.

Each test runs the same code under ``jax.jit`` and ``ftjit.jit`` and asserts
the same outcome (results, trace counts, errors, warnings). JAX caches traces
per function object, so the two sides use separate functions."""

from __future__ import annotations

import re

import pytest

from helpers import run_script  # noqa: E402


# -- max_signatures counts committed placements as the core does -----------

MAX_SIGNATURES_PER_DEVICE = """
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=3"
    import jax, jax.numpy as jnp
    import ftjit

    @ftjit.jit(max_signatures=2, on_excess="raise")
    def f(x):
        return x + 1

    devices = jax.devices()
    assert len(devices) == 3, devices
    for d in devices[:2]:
        f(jax.device_put(jnp.ones(2), d))
    try:
        f(jax.device_put(jnp.ones(2), devices[2]))
    except ftjit.RecompileLimitError as e:
        print(str(e).split("(differs from the closest cached one by: ")[1].split(")")[0])
    print(f.cache_info().compiles)
    print(sorted(s.signature for s in f.signatures()))
"""


@pytest.mark.thread_unsafe(reason="spawns an interpreter; slow to repeat 8x")
def test_max_signatures_counts_arrays_committed_to_different_devices():
    out = run_script(MAX_SIGNATURES_PER_DEVICE).splitlines()
    assert len(out) == 3, out
    assert re.fullmatch(r"argument 'x': float32\[2\]@cpu:[01] -> float32\[2\]@cpu:2", out[0]), out
    assert out[1] == "2"
    # signatures() prints placements as the explanation does.
    assert out[2] == "['f(float32[2]@cpu:0)', 'f(float32[2]@cpu:1)']", out
