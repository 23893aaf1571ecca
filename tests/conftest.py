"""pytest configuration for the ftjit tests.

No custom markers or options: ``thread_unsafe`` comes from pytest-run-parallel
and ``timeout`` from pytest-timeout. The helpers module sits next to this file.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)
