"""ftjit's error classes (ftjit.errors): each is exported from ftjit and from
ftjit.errors, subclasses the builtin exceptions callers already catch, and is
the class the runtime raises."""

import pytest

import ftjit
import ftjit.errors
from helpers import CountingCompiler

pytestmark = pytest.mark.timeout(120)


_ERRORS = {
    "RecursiveCompileError": (RecursionError,),
    "CompileCycleError": (RecursionError,),
    "CompileTimeoutError": (TimeoutError,),
    "RecompileLimitError": (RuntimeError,),
    "UnhashableStaticArgumentError": (TypeError, ValueError),
    "UnsupportedArgumentError": (TypeError,),
    "BatchTimeoutError": (TimeoutError,),
}


@pytest.mark.parametrize("name", sorted(_ERRORS))
def test_error_classes_exported_and_subclass_builtins(name):
    cls = getattr(ftjit.errors, name)
    assert getattr(ftjit, name) is cls
    assert name in ftjit.errors.__all__
    assert name in ftjit.__all__
    assert cls.__module__ == "ftjit.errors"
    for base in _ERRORS[name]:
        assert issubclass(cls, base)
    assert ftjit.errors is ftjit.__dict__["errors"]


def test_error_module_lists_exactly_these():
    assert sorted(ftjit.errors.__all__) == sorted(_ERRORS)


def test_raised_errors_are_the_exported_classes():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x, n: x, static_argnums=1, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(ftjit.UnhashableStaticArgumentError) as ei:
        jf(1.0, [1, 2])
    assert isinstance(ei.value, TypeError) and isinstance(ei.value, ValueError)
    with pytest.raises(ftjit.UnsupportedArgumentError) as ei2:
        jf(object(), 1)
    assert isinstance(ei2.value, TypeError)
    assert comp.calls == 0

    holder = {}
    rec = CountingCompiler(on_compile=lambda fun, args, kwargs: holder["jf"](*args, **kwargs))
    holder["jf"] = ftjit.jit(lambda x: x, compiler=rec, cache=ftjit.FunctionCache())
    with pytest.raises(ftjit.RecursiveCompileError) as ei3:
        holder["jf"](1.0)
    assert isinstance(ei3.value, RecursionError)
