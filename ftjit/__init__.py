"""ftjit: a free-threading-first JIT dispatch runtime.

``ftjit.jit(f)`` computes each call's signature, compiles it exactly once
(other threads wait with the GIL released) and calls the executable.
"""

from . import errors
from ._jax import JaxCompiler
from ._jit import CacheInfo, FunctionCache, JitFunction, SignatureInfo, clear_caches, default_cache, disable_jit, jit
from ._observe import FunctionStats, Stats, set_explain_misses, stats
from ._warmup import Spec, WarmupReport, WarmupResult
from .errors import (
    CompileCycleError,
    CompileTimeoutError,
    RecompileLimitError,
    RecursiveCompileError,
    UnhashableStaticArgumentError,
    UnsupportedArgumentError,
)

__version__ = "0.1.0"

__all__ = [
    "jit",
    "JaxCompiler",
    "JitFunction",
    "FunctionCache",
    "CacheInfo",
    "clear_caches",
    "default_cache",
    "disable_jit",
    "errors",
    "SignatureInfo",
    "Stats",
    "FunctionStats",
    "stats",
    "set_explain_misses",
    "Spec",
    "WarmupReport",
    "WarmupResult",
    "CompileCycleError",
    "CompileTimeoutError",
    "RecompileLimitError",
    "RecursiveCompileError",
    "UnhashableStaticArgumentError",
    "UnsupportedArgumentError",
]
