// ftjit: equality of call signatures: exact (Equals, may run __eq__) and
// Python-free (FastEquals).
//
// Shared state: none (a stored signature is immutable; the probe is the
// calling thread's own). Lock order: takes no locks. FastEquals is
// Python-free and never throws, so the hit path runs it inside an epoch
// read section (EpochDomain), where nothing may block or call out; Equals
// runs __eq__ and must never run under a C++ lock.
#include <Python.h>

#include <cstddef>
#include <cstring>

#include <nanobind/nanobind.h>

#include "signature/signature.h"
#include "signature/signature_internal.h"

namespace ftjit {

namespace {

using FastEq = CallSignature::FastEq;

// Same type and (identical or __eq__). Type equality keeps 1, True and 1.0
// apart, as three different static values.
bool StrictEqual(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (Py_TYPE(a) != Py_TYPE(b)) return false;
  int r = PyObject_RichCompareBool(a, b, Py_EQ);
  if (r < 0) throw nb::python_error();
  return r == 1;
}

bool SameObjectOrEqual(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (!a || !b) return false;
  int r = PyObject_RichCompareBool(a, b, Py_EQ);
  if (r < 0) throw nb::python_error();
  return r == 1;
}

// Python-free equality of two objects, as StrictEqual would decide it, for
// exact builtin value types whose comparison runs no user code.
FastEq FastObjectEquals(PyObject* a, PyObject* b, int depth = 0) noexcept {
  if (a == b) return FastEq::kEqual;
  PyTypeObject* t = Py_TYPE(a);
  if (t != Py_TYPE(b)) return FastEq::kNotEqual;  // StrictEqual: types differ
  if (t == &PyLong_Type) {
    // long_richcompare itself, not PyObject_RichCompareBool: that one
    // enters a recursive call, which fails (leaving an error set) at the
    // recursion limit. long_richcompare is C only and cannot fail for two
    // exact ints; should it ever, "unknown" sends the caller to Equals().
    PyObject* r = PyLong_Type.tp_richcompare(a, b, Py_EQ);
    if (!r) {
      PyErr_Clear();
      return FastEq::kUnknown;
    }
    bool equal = r == Py_True;
    Py_DECREF(r);  // a bool singleton: no destructor runs
    return equal ? FastEq::kEqual : FastEq::kNotEqual;
  }
  if (t == &PyUnicode_Type) {
    return PyUnicode_Compare(a, b) == 0 ? FastEq::kEqual : FastEq::kNotEqual;
  }
  if (t == &PyFloat_Type) {
    return PyFloat_AS_DOUBLE(a) == PyFloat_AS_DOUBLE(b) ? FastEq::kEqual : FastEq::kNotEqual;
  }
  if (t == &PyBytes_Type) {
    return PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b) &&
                   std::memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b),
                               static_cast<size_t>(PyBytes_GET_SIZE(a))) == 0
               ? FastEq::kEqual
               : FastEq::kNotEqual;
  }
  if (t == &PyBool_Type || a == Py_None) return FastEq::kNotEqual;  // singletons
  if (t == &PyTuple_Type && depth < 4) {
    Py_ssize_t n = PyTuple_GET_SIZE(a);
    if (n != PyTuple_GET_SIZE(b)) return FastEq::kNotEqual;
    FastEq result = FastEq::kEqual;
    for (Py_ssize_t i = 0; i < n; ++i) {
      // Items are compared with == (not by type) inside a tuple: 1 == 1.0
      // there, so only items of one exact type are decided here.
      PyObject* x = PyTuple_GET_ITEM(a, i);
      PyObject* y = PyTuple_GET_ITEM(b, i);
      if (x != y && Py_TYPE(x) != Py_TYPE(y)) return FastEq::kUnknown;
      FastEq item = FastObjectEquals(x, y, depth + 1);
      if (item == FastEq::kNotEqual) return FastEq::kNotEqual;
      if (item == FastEq::kUnknown) result = FastEq::kUnknown;
    }
    return result;
  }
  return FastEq::kUnknown;
}

}  // namespace

bool IsBuiltinKey(PyObject* o, int depth) noexcept {
  PyTypeObject* t = Py_TYPE(o);
  if (t == &PyLong_Type || t == &PyUnicode_Type || t == &PyFloat_Type || t == &PyBytes_Type ||
      t == &PyBool_Type || o == Py_None || t == &PyType_Type) {
    return true;
  }
  if (t != &PyTuple_Type || depth >= 4) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i) {
    if (!IsBuiltinKey(PyTuple_GET_ITEM(o, i), depth + 1)) return false;
  }
  return true;
}

namespace {

// Identity decides; a distinct object needs __eq__.
FastEq FastIdentity(PyObject* a, PyObject* b) noexcept {
  return a == b ? FastEq::kEqual : FastEq::kUnknown;
}

}  // namespace

const char* DebugFastEqualsAtRecursionLimit(PyObject* a, PyObject* b, bool* error_set) {
  // Use up the recursion budget, as a call at the limit finds it.
  int depth = 0;
  while (depth < 1000000 && !Py_EnterRecursiveCall(" (test)")) ++depth;
  PyErr_Clear();
  FastEq r = FastObjectEquals(a, b);
  *error_set = PyErr_Occurred() != nullptr;
  PyErr_Clear();
  while (depth-- > 0) Py_LeaveRecursiveCall();
  return r == FastEq::kEqual ? "equal" : r == FastEq::kNotEqual ? "not equal" : "unknown";
}

namespace {

// The Python-free parts both comparisons check first. `whole`: a partial
// probe (see CallSignature::partial) leaves out the context and placements.
inline bool SameHeader(const CallSignature& a, const CallSignature& b, bool whole) noexcept {
  return a.num_positional == b.num_positional && a.tree == b.tree && a.dims == b.dims &&
         a.leaves.size() == b.leaves.size() && a.statics.size() == b.statics.size() &&
         a.kwnames.size() == b.kwnames.size() && a.aux.size() == b.aux.size() &&
         (!whole || a.context.is_valid() == b.context.is_valid());
}

inline bool SameLeafShape(const LeafSignature& a, const LeafSignature& b, bool whole) noexcept {
  return a.kind == b.kind && a.weak_type == b.weak_type && a.ndim == b.ndim &&
         (!whole || a.sharding.is_valid() == b.sharding.is_valid());
}

// Keyword names by content (no user code runs); the counts are equal.
inline bool SameNames(const CallSignature& a, const CallSignature& b) noexcept {
  for (size_t i = 0; i < a.kwnames.size(); ++i) {
    if (CompareNames(a.kwnames[i].ptr(), b.kwnames[i].ptr()) != 0) return false;
  }
  return true;
}

}  // namespace

CallSignature::FastEq CallSignature::FastEquals(const CallSignature& o) const noexcept {
  const bool whole = !o.partial;
  if (table_hash != o.table_hash || !SameHeader(*this, o, whole)) return FastEq::kNotEqual;
  FastEq result = FastEq::kEqual;
  auto meet = [&result](FastEq part) {
    if (part == FastEq::kUnknown) result = FastEq::kUnknown;
    return part != FastEq::kNotEqual;
  };
  for (size_t i = 0; i < leaves.size(); ++i) {
    const LeafSignature& a = leaves[i];
    const LeafSignature& b = o.leaves[i];
    if (!SameLeafShape(a, b, whole)) return FastEq::kNotEqual;
    if (a.kind == LeafKind::kArray) {
      meet(FastIdentity(a.dtype.ptr(), b.dtype.ptr()));
      if (whole && a.sharding.is_valid()) meet(FastIdentity(a.sharding.ptr(), b.sharding.ptr()));
    }
  }
  if (!SameNames(*this, o)) return FastEq::kNotEqual;
  for (size_t i = 0; i < aux.size(); ++i) {
    if (!meet(FastObjectEquals(aux[i].ptr(), o.aux[i].ptr()))) return FastEq::kNotEqual;
  }
  for (size_t i = 0; i < statics.size(); ++i) {
    if (!meet(FastObjectEquals(statics[i].ptr(), o.statics[i].ptr()))) return FastEq::kNotEqual;
  }
  if (whole && context.is_valid()) {
    // Interned contexts by their struct's identity: a probe's borrowed one
    // may have lost its object meanwhile, never its struct.
    if (context.interned() || o.context.interned()) {
      meet(context.interned() == o.context.interned() ? FastEq::kEqual : FastEq::kUnknown);
    } else {
      meet(FastIdentity(context.ptr(), o.context.ptr()));
    }
  }
  return result;
}

bool CallSignature::KeysAreBuiltin() const noexcept {
  for (const nb::object& a : aux) {
    if (!IsBuiltinKey(a.ptr())) return false;
  }
  for (const nb::object& v : statics) {
    if (!IsBuiltinKey(v.ptr())) return false;
  }
  return true;
}

bool CallSignature::Equals(const CallSignature& o) const {
  // Cheap, Python-free parts first.
  if (hash != o.hash || !SameHeader(*this, o, /*whole=*/true)) return false;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!SameLeafShape(leaves[i], o.leaves[i], /*whole=*/true)) return false;
  }
  if (!SameNames(*this, o)) return false;
  // Then the parts whose comparison may run Python code.
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (leaves[i].kind == LeafKind::kArray &&
        (!SameObjectOrEqual(leaves[i].dtype.ptr(), o.leaves[i].dtype.ptr()) ||
         (leaves[i].sharding.is_valid() &&
          !SameObjectOrEqual(leaves[i].sharding.ptr(), o.leaves[i].sharding.ptr())))) {
      return false;
    }
  }
  for (size_t i = 0; i < aux.size(); ++i) {
    if (!StrictEqual(aux[i].ptr(), o.aux[i].ptr())) return false;
  }
  for (size_t i = 0; i < statics.size(); ++i) {
    bool equal;
    try {
      equal = StrictEqual(statics[i].ptr(), o.statics[i].ptr());
    } catch (nb::python_error& err) {
      if (!jax_style_errors) throw;
      RaiseStaticComparisonError(err, statics[i].ptr(), o.statics[i].ptr());
    }
    if (!equal) return false;
  }
  if (context.is_valid() && !SameObjectOrEqual(context.ptr(), o.context.ptr())) return false;
  return true;
}

bool SameContextAndPlacements(const CallSignature& a, const CallSignature& b) {
  if (a.leaves.size() != b.leaves.size()) return false;
  for (size_t i = 0; i < a.leaves.size(); ++i) {
    const nb::object& x = a.leaves[i].sharding;
    const nb::object& y = b.leaves[i].sharding;
    if (x.is_valid() != y.is_valid() || (x.is_valid() && !SameObjectOrEqual(x.ptr(), y.ptr()))) return false;
  }
  InternedContext* x = a.context.interned();
  if (x && x == b.context.interned()) return true;
  if (!a.context.is_valid() || !b.context.is_valid()) return a.context.is_valid() == b.context.is_valid();
  return SameObjectOrEqual(a.context.ptr(), b.context.ptr());
}

}  // namespace ftjit
