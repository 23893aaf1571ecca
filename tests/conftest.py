"""pytest configuration for the ftjit tests.

No custom markers or options: ``thread_unsafe`` comes from pytest-run-parallel
and ``timeout`` from pytest-timeout. The helpers module sits next to this file.

``FTJIT_TEST_ACCELERATOR=1`` (``bash dev.sh test-accelerator``) marks a run on
an accelerator: the session starts by printing JAX's backend and devices, and
refuses pytest-xdist workers (the test process holds the accelerator; on a TPU
no second process can open it). What else it changes: helpers.require_module.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)

import sysconfig

import pytest


@pytest.fixture(autouse=True, scope="session")
def _gil_stays_disabled():
    """On a free-threaded build, the GIL must still be off when the suite ends:
    CPython re-enables it (with only a RuntimeWarning) when something imports
    an extension not marked free-threading safe, and the suite would then
    pass while testing the GIL build. Fails the session's last test
    (teardown error) in each process (xdist worker) where that happened."""
    yield
    if sysconfig.get_config_var("Py_GIL_DISABLED") and sys._is_gil_enabled():
        pytest.fail("the GIL was re-enabled during the test session on a free-threaded build "
                    "(an imported extension is not marked free-threading safe)", pytrace=False)


def _accelerator_run() -> bool:
    return os.environ.get("FTJIT_TEST_ACCELERATOR") == "1"


def pytest_configure(config):
    if _accelerator_run() and (getattr(config.option, "numprocesses", None) or 0) != 0:
        raise pytest.UsageError("FTJIT_TEST_ACCELERATOR=1 runs the suite in one process: the test process holds "
                                "the accelerator (on a TPU, a second process cannot open it); drop -n")


def pytest_sessionstart(session):
    """On an accelerator run, the first lines say where the tests run (also under -q)."""
    if not _accelerator_run() or hasattr(session.config, "workerinput"):
        return
    import jax

    devices = jax.devices()
    lines = [
        f"FTJIT_TEST_ACCELERATOR=1: JAX {jax.__version__}, default backend {jax.default_backend()!r} "
        f"(JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', 'unset')}), "
        f"{len(devices)} device(s): " + ", ".join(f"{d} [{d.device_kind}]" for d in devices),
    ]
    if jax.default_backend() == "cpu":
        lines.append("FTJIT_TEST_ACCELERATOR=1: JAX found no accelerator; the suite runs on the CPU")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line, flush=True)
