"""The default compiler: traces, lowers and compiles with JAX (XLA).

ftjit keeps its own cache, compile-once and recursion handling; JAX does the
tracing and compiling, once per signature. The hot path calls the C++
callable inside ``jax.stages.Compiled`` when this JAX exposes it (a private
API, behind a feature check) and the public ``Compiled`` otherwise.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

__all__ = ["JaxCompiler", "fast_callable", "FAST_PATH"]

# Whether fast_callable() may use Compiled's private C++ callable. Tests turn
# it off to prove the public fallback gives the same answers.
FAST_PATH = True

_hooks_lock = threading.Lock()
_hooks: dict[str, Any] | None = None


def _jax_hooks() -> dict[str, Any]:
    """The JAX-specific hooks the C++ core uses, built once (imports jax)."""
    global _hooks
    with _hooks_lock:
        if _hooks is None:
            import jax
            from jax import tree_util
            from jax._src import config as jax_config

            array_type = type(jax.numpy.zeros((), dtype=np.float32))

            def pytree_flatten(obj: Any) -> tuple[Any, list[Any]] | None:
                """One level of JAX's registry: (treedef, children), or None for a leaf."""
                children, treedef = tree_util.tree_flatten(obj, is_leaf=lambda x: x is not obj)
                if treedef.num_nodes == 1 and treedef.num_leaves == 1:
                    return None
                return treedef, children

            _hooks = {
                # config_ext.trace_context is C++: every config that changes
                # tracing (jax_enable_x64, ...), thread-local overrides included.
                "context": jax_config.trace_context,
                "pytree_flatten": pytree_flatten,
                "fallback_types": (jax.core.Tracer,),
                "plain_types": (array_type, np.ndarray),
                "aval_types": (array_type,) if _has_aval(array_type) else (),
            }
        return _hooks


def _has_aval(array_type: type) -> bool:
    """Feature check: jax Arrays expose .aval with plain dtype/shape/weak_type."""
    try:
        import jax.numpy as jnp

        x = jnp.zeros((2,), dtype=np.float32)
        aval = x.aval
        return (
            type(x) is array_type
            and aval.dtype == x.dtype
            and tuple(aval.shape) == x.shape
            and bool(aval.weak_type) == bool(x.weak_type)
        )
    except Exception:
        return False


def fast_callable(compiled: Any) -> Callable[..., Any]:
    """The fastest callable equivalent to ``compiled`` (a ``jax.stages.Compiled``).

    Uses the C++ callable that ``Compiled.__call__`` builds lazily, when this
    JAX version has it; otherwise the public ``Compiled`` object itself.
    """
    if FAST_PATH:
        try:
            call = compiled._executable.create_cpp_call(compiled._params)
        except Exception:  # a JAX without this private API: degrade, never fail
            call = None
        if call is not None and callable(call):
            return call
    return compiled


class JaxCompiler:
    """``compiler(fun, args, kwargs) -> executable`` backed by ``jax.jit``.

    Equal (and hashing equal) for equal options, so that two ``ftjit.jit``
    wrappers of one function share compiled entries. Executables take the
    dynamic arguments only (``strip_static``); the core strips the statics.
    """

    strip_static = True
    #: a static argument's failing __eq__ raises jax.jit's ValueError (caused by the original)
    jax_style_errors = True

    __slots__ = ("static_argnums", "static_argnames", "jit_options")

    def __init__(
        self,
        static_argnums: tuple[int, ...] = (),
        static_argnames: tuple[str, ...] = (),
        jit_options: tuple[tuple[str, Any], ...] = (),
    ):
        self.static_argnums = tuple(static_argnums)
        self.static_argnames = tuple(static_argnames)
        self.jit_options = tuple(jit_options)

    # -- the compiler protocol --------------------------------------------
    def jax_jit(self, fun: Callable[..., Any]) -> Any:
        import jax

        return jax.jit(
            fun, static_argnums=self.static_argnums, static_argnames=self.static_argnames, **dict(self.jit_options)
        )

    def __call__(self, fun: Callable[..., Any], args: tuple, kwargs: dict) -> Callable[..., Any]:
        return fast_callable(self.jax_jit(fun).lower(*args, **kwargs).compile())

    def lower(self, fun: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        return self.jax_jit(fun).lower(*args, **kwargs)

    def fallback(self, fun: Callable[..., Any]) -> Callable[..., Any]:
        """JAX's own path, for calls ftjit must not cache (tracer arguments)."""
        return self.jax_jit(fun)

    @property
    def context(self) -> Callable[[], Any]:
        return _jax_hooks()["context"]

    @property
    def pytree_flatten(self) -> Callable[[Any], Any]:
        return _jax_hooks()["pytree_flatten"]

    @property
    def fallback_types(self) -> tuple[type, ...]:
        return _jax_hooks()["fallback_types"]

    @property
    def plain_types(self) -> tuple[type, ...]:
        return _jax_hooks()["plain_types"]

    @property
    def aval_types(self) -> tuple[type, ...]:
        return _jax_hooks()["aval_types"]

    # -- identity ----------------------------------------------------------
    def _key(self) -> tuple:
        return (self.static_argnums, self.static_argnames, self.jit_options)

    def __eq__(self, other: object) -> bool:
        return type(other) is JaxCompiler and other._key() == self._key()

    def __hash__(self) -> int:
        return hash((JaxCompiler, self._key()))

    def __repr__(self) -> str:
        return (
            f"JaxCompiler(static_argnums={self.static_argnums}, static_argnames={self.static_argnames}, "
            f"jit_options={dict(self.jit_options)})"
        )
