"""The default compiler: hands a function to JAX.

This is the minimal, correct JAX path of the core issue: each new signature is
compiled by ``jax.jit`` for the function's static arguments. The JAX issue
replaces it with a lowering/compiling path that strips statics in C++.
"""

from __future__ import annotations

from typing import Any, Callable


class JaxCompiler:
    """``compiler(fun, args, kwargs) -> executable`` backed by ``jax.jit``.

    Equal (and hashing equal) for equal options, so that two ``ftjit.jit``
    wrappers of one function share compiled entries.
    """

    __slots__ = ("static_argnums", "static_argnames")

    def __init__(self, static_argnums: tuple[int, ...], static_argnames: tuple[str, ...]):
        self.static_argnums = tuple(static_argnums)
        self.static_argnames = tuple(static_argnames)

    def __call__(self, fun: Callable[..., Any], args: tuple, kwargs: dict) -> Callable[..., Any]:
        import jax

        return jax.jit(fun, static_argnums=self.static_argnums, static_argnames=self.static_argnames)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is JaxCompiler
            and other.static_argnums == self.static_argnums
            and other.static_argnames == self.static_argnames
        )

    def __hash__(self) -> int:
        return hash((JaxCompiler, self.static_argnums, self.static_argnames))

    def __repr__(self) -> str:
        return f"JaxCompiler(static_argnums={self.static_argnums}, static_argnames={self.static_argnames})"
