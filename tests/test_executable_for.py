"""CompilerHooks.executable_for, the protocol of flatten once, with a compiler
of our own and no JAX (so that ThreadSanitizer runs it: dev.sh tsan-ft): what
the hook is asked (the compiled object, the dynamic arguments, the leaves in
ftjit's order), that each call of a signature then gets its own leaves, and
that a wrong answer is a failed compile naming the hook. With the JAX
compiler: tests/test_flat_calls.py."""

import pytest

import ftjit
from helpers import run_threads


def _takes_leaves(jf):
    return [s.takes_leaves for s in jf.signatures()]


class LeafCompiler:
    """A compiler whose executable_for keeps what it was asked and, when
    ``flat``, returns a callable of the leaves that says what it got."""

    def __init__(self, flat=True, answer=None):
        self.flat = flat
        self.answer = answer
        self.asked = []

    def __call__(self, fun, args, kwargs):
        return fun

    def hooks(self, fun):
        return ftjit.CompilerHooks(strip_static=True, executable_for=self.executable_for)

    def executable_for(self, compiled, args, kwargs, leaves):
        self.asked.append((compiled, args, kwargs, leaves))
        if self.answer is not None:
            return self.answer
        if self.flat:
            return (lambda *leaves: ("leaves", leaves)), True
        return (lambda *a, **k: ("args", a, k)), False


def test_executable_for_gets_the_dynamic_arguments_and_the_leaves_in_order():
    comp = LeafCompiler()

    def f(a, n, b, *, c, mode):
        raise AssertionError("not called: the executable stands for it")

    jf = ftjit.jit(f, compiler=comp, static_argnums=1, static_argnames="mode", cache=ftjit.FunctionCache())
    d = {"y": 2, "x": 1}
    assert jf(d, 7, [3, None, (4,)], mode="m", c=5.0) == ("leaves", (1, 2, 3, 4, 5.0))
    assert jf(d, 7, [6, None, (7,)], c=8.0, mode="m") == ("leaves", (1, 2, 6, 7, 8.0))
    ((compiled, args, kwargs, leaves),) = comp.asked  # once per compile
    assert compiled is f
    assert args == (d, [3, None, (4,)]) and kwargs == {"c": 5.0}
    assert leaves == (1, 2, 3, 4, 5.0)
    assert _takes_leaves(jf) == [True]


def test_executable_for_may_keep_the_arguments():
    comp = LeafCompiler(flat=False)
    jf = ftjit.jit(lambda x, *, y: None, compiler=comp, cache=ftjit.FunctionCache())
    assert jf(1, y=2) == ("args", (1,), {"y": 2})
    assert _takes_leaves(jf) == [False]


@pytest.mark.parametrize("answer", [None.__class__, (print, 1), (1, True), [print, True], (print,)])
def test_a_wrong_answer_of_executable_for_is_a_failed_compile_naming_the_hook(answer):
    comp = LeafCompiler(answer=answer)

    def g(x):
        return x

    jf = ftjit.jit(g, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(TypeError) as info:
        jf(1)
    assert str(info.value) == (f"CompilerHooks.executable_for of {g.__qualname__}() must return (executable, takes_leaves): "
                               f"a callable and a bool, or ftjit.ThreadExecutables, got {answer!r}")
    assert jf.cache_info().failures == 1 and jf.cache_info().size == 0


def test_executable_for_must_be_callable():
    with pytest.raises(TypeError, match=r"^CompilerHooks.executable_for must be callable or None, got 3$"):
        ftjit.CompilerHooks(executable_for=3)


def test_threads_each_call_with_their_own_leaves():
    comp = LeafCompiler()
    jf = ftjit.jit(lambda d, *, k: None, compiler=comp, cache=ftjit.FunctionCache())

    def work(i):
        seen = set()
        for j in range(200):
            d = {"b": [i, j], "a": (i,)}
            seen.add(jf(d, k=-i))
        return seen

    results = run_threads(8, work)
    for i, seen in enumerate(results):
        assert seen == {("leaves", (i, i, j, -i)) for j in range(200)}
    assert len(comp.asked) == 1 and jf.cache_info().compiles == 1
