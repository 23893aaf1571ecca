"""pytest configuration for the ftjit tests.

No custom markers or options: ``thread_unsafe`` comes from pytest-run-parallel
and ``timeout`` from pytest-timeout. The helpers module sits next to this file.
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
