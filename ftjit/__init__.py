"""ftjit: a free-threading-first JIT dispatch runtime.

``ftjit.jit(f)`` computes each call's signature, compiles it exactly once
(other threads wait with the GIL released) and calls the executable.
"""


def _core_not_loaded(error: ImportError) -> ImportError:
    """The ImportError to raise when ftjit's C++ core cannot be imported:
    what to run instead of "cannot import name '_core' from partially
    initialized module" (which is what an unbuilt source tree gives)."""
    import os as _os
    import sys as _sys

    here = _os.path.dirname(_os.path.abspath(__file__))
    root = _os.path.dirname(here)
    interpreter = f"{_sys.executable} (Python {_sys.version.split()[0]}{'t' if 'free-threading' in _sys.version else ''})"
    if getattr(error, "name", None) != "ftjit._core":
        return ImportError(f"ftjit's C++ core (ftjit._core) failed to load in {interpreter}: {error}")
    if _os.path.exists(_os.path.join(root, "pyproject.toml")) and _os.path.exists(_os.path.join(root, "dev.sh")):
        # An ftjit installed in this environment, hidden by the source tree at the front of sys.path?
        import importlib.machinery as _machinery

        others = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != root]
        installed = _machinery.PathFinder.find_spec("ftjit", others)
        origin = getattr(installed, "origin", None)
        if origin and _os.path.dirname(_os.path.abspath(origin)) != here:
            return ImportError(
                f"ftjit's C++ core (ftjit._core) is not built for {interpreter}, and this ftjit is not the "
                f"installed one: run from outside the source tree at {root}. Here, sys.path starts with that tree "
                "(the current directory, or the directory of the script being run), so `import ftjit` found its "
                "ftjit/ source, which has no built core, instead of the ftjit installed at "
                f"{_os.path.dirname(_os.path.abspath(origin))}. (To work in the source tree instead, use its "
                "environment: `bash dev.sh build`, then `.venv/bin/python`.)"
            )
        return ImportError(
            f"ftjit's C++ core (ftjit._core) is not built for {interpreter}. This ftjit is the source tree "
            f"at {root}, which has no built core for this interpreter. Either build it and use the project's "
            f"environment: `bash dev.sh build`, then run with `.venv/bin/python` (or `source .venv/bin/activate` "
            f"first); or install ftjit into this interpreter's environment: `{_sys.executable} -m pip install "
            f"{root}`, and run from outside the source tree (the ftjit/ here shadows an installed one)."
        )
    return ImportError(
        f"ftjit's C++ core (ftjit._core) is missing from {here} for {interpreter}: reinstall ftjit from where "
        "it came from (ftjit is not on PyPI): `pip install --force-reinstall <path to an ftjit clone, its git URL, "
        "or a wheel>`."
    )


try:
    from ._core import clear_caches as _  # noqa: F401 - the C++ core: everything below needs it
except ImportError as _error:
    # A missing core is said in full above; a core that failed to load keeps its cause.
    raise _core_not_loaded(_error) from (None if getattr(_error, "name", None) == "ftjit._core" else _error)
del _, _core_not_loaded

from . import errors
from ._batched import BatchedFunction, BatchInfo, batched
from ._hooks import CompilerHooks, ContextExtra, ContextHooks, ContextRequirement, RegistryFlatten, ThreadExecutables
from ._jax import JaxCompiler
from ._jit import CacheInfo, FunctionCache, JitFunction, SignatureInfo, clear_caches, default_cache, disable_jit, jit
from ._observe import FunctionStats, Stats, set_explain_misses, stats
from ._specs import LeftOut, SavedSpecs, SpecList, load_specs, register_static_dataclass
from ._specs_save import save_specs
from ._warmup import BrokenSpec, SavedSpec, Spec, WarmupReport, WarmupResult
from .errors import (
    BatchTimeoutError,
    CompileCycleError,
    CompileTimeoutError,
    RecompileLimitError,
    RecursiveCompileError,
    UnhashableStaticArgumentError,
    UnsupportedArgumentError,
)

from ._version import __version__  # noqa: F401 - the package's version


def _hand_the_core_its_collaborators() -> None:
    """Hands the C++ core the Python objects it raises, builds and calls, once,
    before this import returns (so before any user code can call the core):
    the core names no ftjit module and imports none of these itself."""
    import copy
    import functools

    from . import _core, _explain, _jit, _observe, _signature, _specs, _warmup

    _core._set_collaborators(
        RecursiveCompileError=errors.RecursiveCompileError,
        CompileCycleError=errors.CompileCycleError,
        CompileTimeoutError=errors.CompileTimeoutError,
        RecompileLimitError=errors.RecompileLimitError,
        UnhashableStaticArgumentError=errors.UnhashableStaticArgumentError,
        UnsupportedArgumentError=errors.UnsupportedArgumentError,
        ContextHooks=ContextHooks,
        RegistryFlatten=RegistryFlatten,
        Leaf=_signature.Leaf,
        Node=_signature.Node,
        Static=_signature.Static,
        Signature=_signature.Signature,
        CacheInfo=CacheInfo,
        SignatureInfo=SignatureInfo,
        rebuild=_jit._rebuild,
        jit_globals=vars(_jit),
        warmup=_warmup.warmup,
        warmup_specs=_specs.warmup_specs,
        on_compile=_observe.on_compile,
        on_wait=_observe.on_wait,
        on_miss=_explain.on_miss,
        copy=copy.copy,
        partial=functools.partial,
    )


_hand_the_core_its_collaborators()
del _hand_the_core_its_collaborators

__all__ = [
    "jit",
    "batched",
    "BatchedFunction",
    "BatchInfo",
    "BatchTimeoutError",
    "CompilerHooks",
    "ContextHooks",
    "ContextExtra",
    "ContextRequirement",
    "RegistryFlatten",
    "ThreadExecutables",
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
    "BrokenSpec",
    "SavedSpec",
    "SpecList",
    "LeftOut",
    "SavedSpecs",
    "save_specs",
    "load_specs",
    "register_static_dataclass",
    "WarmupReport",
    "WarmupResult",
    "CompileCycleError",
    "CompileTimeoutError",
    "RecompileLimitError",
    "RecursiveCompileError",
    "UnhashableStaticArgumentError",
    "UnsupportedArgumentError",
]
