"""Built-in stress scenarios; importing this package registers them all (in this order)."""

from __future__ import annotations

from . import herd  # noqa: I001  (registration order is the order of the summary table)
from . import mixed
from . import churn
from . import clear_storm
from . import reentrant_keys
from . import recursion
from . import failing_compiles
from . import jax_default
from . import server
from . import reentrant_hooks
from . import batching
from . import _selftest  # hidden: run only when named (tests/test_stress.py)

__all__ = ["herd", "mixed", "churn", "clear_storm", "reentrant_keys", "recursion", "failing_compiles", "jax_default", "server",
           "reentrant_hooks", "batching"]
