"""Built-in stress scenarios; importing this package registers them all."""

from __future__ import annotations

from . import herd

__all__ = ["herd"]
