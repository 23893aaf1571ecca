"""ftjit's version (one place: the package and its specs files read it)."""

__version__ = "0.1.0"
