"""The package ships typed stubs and declares what it supports."""

import ast
import inspect
import pathlib
import re
import sys

import ftjit
import ftjit._core
import pytest
from helpers import builtin_signature, parse_python


def test_core_stub_is_installed_and_typed():
    stub = pathlib.Path(ftjit._core.__file__).with_name("_core.pyi")
    text = stub.read_text()
    assert "class FunctionCache:" in text
    assert "def __init__(self, capacity: int = 4096) -> None" in text
    assert "class JitFunction(Generic[_P, _R]):" in text
    assert "def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R" in text
    assert "def precompile(self, *args: _P.args, **kwargs: _P.kwargs) -> bool" in text
    assert "def cache_info(self) -> CacheInfo" in text
    assert "def clear_caches() -> None" in text


def _stub_class(name: str) -> ast.ClassDef:
    tree = parse_python(pathlib.Path(ftjit._core.__file__).with_name("_core.pyi").read_text())
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    return cls


def _annotation(node: ast.expr | None) -> str | None:
    """An annotation as the stub spells it: the core's signatures qualify the
    names stubgen imports or finds in the module (typing.Any, _core._P.args)."""
    if node is None:
        return None
    qualified = rf"\b(typing|collections\.abc|{re.escape(ftjit._core.__name__)})\."
    return re.sub(qualified, "", ast.unparse(node))


def _parameters(fn: ast.FunctionDef, annotations: bool = True) -> list[tuple]:
    """(name, kind, default, annotation) of each parameter, and the result's annotation last."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + a.defaults
    out = []
    for i, arg in enumerate(positional):
        kind = "positional-only" if i < len(a.posonlyargs) else "positional-or-keyword"
        out.append((arg.arg, kind, defaults[i] and ast.unparse(defaults[i]), arg.annotation))
    if a.vararg:
        out.append((a.vararg.arg, "var-positional", None, a.vararg.annotation))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "keyword-only", default and ast.unparse(default), arg.annotation))
    if a.kwarg:
        out.append((a.kwarg.arg, "var-keyword", None, a.kwarg.annotation))
    out.append(("->", "result", None, fn.returns))
    return [(n, k, d, _annotation(t) if annotations else None) for n, k, d, t in out]


def _nanobind_declaration(fn) -> tuple[ast.FunctionDef, str | None]:
    """A nanobind function's one declaration (it has one overload), parsed,
    with its default values put back where the signature marks them; and
    its docstring."""
    ((sig, doc, defaults),) = fn.__nb_signature__
    for i, value in enumerate(defaults or ()):
        sig = sig.replace(f"\\={i}", value) if isinstance(value, str) else sig.replace(f"\\{i}", repr(value))
    (node,) = parse_python(sig + ": ...").body
    return node, doc


def _slot_declaration(name: str, slot) -> ast.FunctionDef:
    """A C slot's signature as CPython reports it (its __text_signature__), as a def."""
    (node,) = parse_python(f"def {name}{builtin_signature(slot)}: ...").body
    return node


# JitFunction's class attributes that are not methods, and why the stub leaves them out.
NOT_DECLARED = {
    "__doc__": "the class docstring",
    "__module__": "the class's module",
    "__dict__": "each function's attribute dict (functools.update_wrapper fills it)",
    "__nb_signature__": "the class line itself, class JitFunction(Generic[_P, _R])",
    "__class_getitem__": "what Generic[_P, _R] gives a type checker",
    "__vectorcalloffset__": "how PyType_FromSpec is told where the call slot is",
}


def test_the_stub_declares_jitfunction_as_the_type_defines_it():
    """_core.pyi's JitFunction has exactly the type's methods and properties,
    each with the parameters (names, kinds, defaults), annotations and
    docstring of its nanobind declaration; the C slots with the parameters
    CPython reports; and the class line the type declares. A stub left
    stale by a change to a method, or a method the stub lacks, fails here."""
    cls, jf_type = _stub_class("JitFunction"), ftjit.JitFunction
    stub = {node.name: node for node in cls.body if isinstance(node, ast.FunctionDef)}
    live = {name: value for name, value in vars(jf_type).items() if name not in NOT_DECLARED}
    assert sorted(stub) == sorted(live)
    (header,) = parse_python(jf_type.__nb_signature__ + ": ...").body
    assert [_annotation(b) for b in cls.bases] == [_annotation(b) for b in header.bases] == ["Generic[_P, _R]"]
    assert ast.get_docstring(cls) == inspect.cleandoc(jf_type.__doc__)
    slots = []
    for name, value in live.items():
        declared = stub[name]
        is_property = [ast.unparse(d) for d in declared.decorator_list] == ["property"]
        assert is_property == isinstance(value, property), name
        if isinstance(value, property):
            value = value.fget
        if type(value).__module__ == "nanobind":
            node, doc = _nanobind_declaration(value)
            assert _parameters(declared) == _parameters(node), name
            assert ast.get_docstring(declared) == inspect.cleandoc(doc), name
        else:
            # A C slot: CPython's signature has no annotations, and its self is positional-only.
            slots.append(name)
            assert _parameters(declared, annotations=False)[1:] == \
                _parameters(_slot_declaration(name, value), annotations=False)[1:], name
    assert sorted(slots) == ["__call__", "__get__", "__repr__"]
    # The attributes ftjit.jit sets on each function (functools.update_wrapper).
    jf = ftjit.jit(lambda x: x, compiler=lambda fun, args, kwargs: fun, cache=ftjit.FunctionCache())
    attributes = [node.target.id for node in cls.body if isinstance(node, ast.AnnAssign)]
    assert attributes == ["__wrapped__", "__signature__"]
    assert all(name in vars(jf) for name in attributes)


def test_py_typed_marker_ships():
    assert pathlib.Path(ftjit.__file__).with_name("py.typed").exists()


def test_gil_stays_disabled_on_free_threaded_builds():
    # On a free-threaded interpreter, importing the extension (FREE_THREADED in
    # nanobind_add_module, i.e. the Py_mod_gil slot) must not re-enable the GIL.
    import sysconfig

    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip("not a free-threaded interpreter")
    assert sys._is_gil_enabled() is False


def test_the_extension_imports_without_numpy_as_the_stub_generator_imports_it(tmp_path):
    # The build generates _core.pyi by importing the extension on its own (as
    # `_core`) in the build environment, which has no numpy when pip builds
    # in isolation (pip wheel ., an sdist install): its init must not need it.
    import subprocess

    from helpers import child_env

    script = (
        "import sys; sys.modules['numpy'] = None; sys.path.insert(0, sys.argv[1]); "
        "import _core; print(sorted(n for n in ('JitFunction', 'FunctionCache') if hasattr(_core, n)))"
    )
    core_dir = str(pathlib.Path(ftjit._core.__file__).parent)
    proc = subprocess.run([sys.executable, "-c", script, core_dir], capture_output=True, text=True, timeout=120,
                          env=child_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['FunctionCache', 'JitFunction']"
