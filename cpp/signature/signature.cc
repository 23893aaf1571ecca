// ftjit: the signature code's process-wide state (interned names and
// dtypes) and its init and fork hooks.
//
//   | state                   | protection                                      |
//   |-------------------------|-------------------------------------------------|
//   | g_names, Numpy()        | made here at module init (InitSignatures),      |
//   |                         | fixed afterwards                                |
//   | g_dtypes (InternDtype)  | a LeafTable: guarded by its leaf lock; strong   |
//   |                         | references, never removed (process lifetime)    |
//
// Lock order: g_dtypes.mu is a leaf. Only the test hook
// LockSignatureLocksForTest holds it together with another lock: it takes
// g_dtypes.mu, then the contexts table's.
#include "signature/signature.h"

#include <Python.h>

#include <cstddef>
#include <vector>

#include <nanobind/nanobind.h>

#include "pyutil/leaf_table.h"
#include "signature/interned_context.h"
#include "signature/signature_internal.h"

namespace ftjit {

namespace {

PyObject* Interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) throw nb::python_error();
  return o;  // immortal for our purposes: kept for the module's lifetime
}

// Process-wide interned dtypes, kept alive until exit so that signatures
// may pin them (PinnedRef). Identity only (Python-free); bounded: past 256
// a dtype is simply not interned. Never destroyed.
LeafTable<PyObject*>& g_dtypes = *new LeafTable<PyObject*>(256);

}  // namespace

bool InternDtype(PyObject* dtype) {
  LockGuard<LeafMutex> lock(g_dtypes.mu);
  std::vector<PyObject*>& table = g_dtypes.items();
  for (PyObject* d : table) {
    if (d == dtype) return true;
  }
  if (g_dtypes.full()) return false;
  table.push_back(Py_NewRef(dtype));  // a strong reference, kept for the process's life
  return true;
}

void InitSignatures() {
  // Kept for the process's lifetime. Members in declaration order.
  if (!g_names) {
    g_names = new Names{Interned("dtype"), Interned("sharding"), Interned("shape"),
                        Interned("weak_type"), Interned("_fields"), Interned("aval"),
                        Interned("__jax_array__")};
  }
  // Where numpy cannot be imported (the build's stub generator imports this
  // module in an isolated build environment), there can be no numpy arrays
  // either: the types stay null, which the builder reads as "not numpy".
  NumpyTypes& t = Numpy();
  if (!t.ndarray) {
    PyObject* numpy = PyImport_ImportModule("numpy");
    if (!numpy) {
      if (!PyErr_ExceptionMatches(PyExc_ImportError)) throw nb::python_error();
      PyErr_Clear();
      return;
    }
    nb::module_ module = nb::steal<nb::module_>(numpy);
    t.ndarray = nb::object(module.attr("ndarray")).release().ptr();
    t.generic = nb::object(module.attr("generic")).release().ptr();
    // The struct's fields read as the attributes say, on a real array (a
    // numpy whose layout differs keeps the attribute reads).
    nb::object probe = module.attr("empty")(nb::make_tuple(2, 3, 5), "int16");
    const auto* f = reinterpret_cast<const NumpyArrayFields*>(probe.ptr());
    t.read_fields = Py_TYPE(probe.ptr()) == reinterpret_cast<PyTypeObject*>(t.ndarray) && f->nd == 3 &&
                    f->dimensions[0] == 2 && f->dimensions[1] == 3 && f->dimensions[2] == 5 &&
                    f->descr == nb::object(probe.attr("dtype")).ptr();
  }
}

void ReinitSignatureLocksInChild() {
  g_dtypes.ReinitLockInChild();
  ReinitContextLockInChild();
}

void LockSignatureLocksForTest(bool lock) {
  if (lock) {
    g_dtypes.HoldForTest(true);
    LockContextsForTest(true);
  } else {
    LockContextsForTest(false);
    g_dtypes.HoldForTest(false);
  }
}

}  // namespace ftjit
