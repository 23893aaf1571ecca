"""One error translation: the type's C slots (vectorcall, repr, getters)
raise what nanobind raises for the methods it binds, kind by kind."""

from __future__ import annotations

import pytest

from ftjit import _core

KINDS = {
    "python_error": LookupError,
    "type_error": TypeError,
    "value_error": ValueError,
    "index_error": IndexError,
    "key_error": KeyError,
    "stop_iteration": StopIteration,
    "buffer_error": BufferError,
    "import_error": ImportError,
    "attribute_error": AttributeError,
    "bad_alloc": MemoryError,
    "out_of_range": IndexError,
    "overflow_error": OverflowError,
    "invalid_argument": ValueError,
    "domain_error": ValueError,
    "length_error": ValueError,
    "range_error": ValueError,
    "runtime_error": RuntimeError,
    "needs_fallback": RuntimeError,
    "logic_error": RuntimeError,
}


def _raised(kind, at_slot):
    with pytest.raises(BaseException) as info:
        _core._debug_throw(kind, at_slot)
    return info.value


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_slot_raises_each_kind_as_nanobind_does(kind):
    bound, slot = _raised(kind, False), _raised(kind, True)
    assert type(slot) is type(bound) is KINDS[kind]
    assert slot.args == bound.args


def test_messages_are_kept():
    assert _raised("value_error", True).args == ("value_error",)
    assert _raised("needs_fallback", True).args == ("ftjit: the call needs the compiler's fallback path",)
