// ftjit: the signature code's process-wide state (interned names and dtypes) and its init/fork hooks.
//
// The code that builds, compares and prints signatures is in the
// signature_*.cc files (signature.h lists them).
//
//   | state                   | protection                                      |
//   |-------------------------|-------------------------------------------------|
//   | g_names (declared in    | made here at module init (InitSignatures),      |
//   |   signature_internal.h),| fixed afterwards                                |
//   |   Numpy()               |                                                 |
//   | the dtype table         | guarded by g_dtypes_mu; entries are strong      |
//   |   (InternDtype)         | references, never removed (process lifetime)    |
//
// Lock order: g_dtypes_mu is a leaf: taken with the thread attached, no
// Python code runs under it (Py_NewRef only), and no other lock is taken
// while it is held. On GIL builds it is a no-op (leaf_mutex.h) and the GIL
// serialises it. Only the test hook LockSignatureLocksForTest holds it
// together with another lock: it takes g_dtypes_mu, then g_contexts_mu.
#include <Python.h>
#include <nanobind/nanobind.h>

#include <cstddef>
#include <mutex>
#include <vector>

#include "signature/interned_context.h"
#include "pyutil/leaf_mutex.h"
#include "signature/signature.h"
#include "signature/signature_internal.h"

namespace ftjit {

namespace {

PyObject* Interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) throw nb::python_error();
  return o;  // immortal for our purposes: kept for the module's lifetime
}

// Process-wide interned dtypes: the few dtype objects a program's arrays
// use, kept alive until the process exits, so that signatures may pin them
// (PinnedRef) instead of counting references. Identity only (Python-free);
// bounded: past kMaxDtypes a dtype is simply not interned. Guarded by
// g_dtypes_mu, a leaf LeafMutex taken with the thread attached, under which
// no Python code runs (Py_NewRef only); a no-op on GIL builds, where the GIL
// serialises it.
constexpr size_t kMaxDtypes = 256;
LeafMutex g_dtypes_mu;

}  // namespace

// The interned dtypes (strong references, process lifetime), reached only
// with g_dtypes_mu held.
std::vector<PyObject*>& DtypesLockHeld() FTJIT_REQUIRES(g_dtypes_mu) {
  g_dtypes_mu.AssertHeld();
  static auto* table = new std::vector<PyObject*>();
  return *table;
}

bool InternDtype(PyObject* dtype) {
  LockGuard<LeafMutex> lock(g_dtypes_mu);
  std::vector<PyObject*>& table = DtypesLockHeld();
  for (PyObject* d : table) {
    if (d == dtype) return true;
  }
  if (table.size() >= kMaxDtypes) return false;
  table.push_back(Py_NewRef(dtype));
  return true;
}

void InitSignatures() {
  // Kept for the process's lifetime. Members in declaration order.
  if (!g_names) {
    g_names = new Names{Interned("dtype"), Interned("sharding"), Interned("shape"),
                        Interned("weak_type"), Interned("_fields"), Interned("aval"),
                        Interned("__jax_array__")};
  }
  // numpy is a dependency of ftjit: its types are looked up once, here.
  // Where it cannot be imported (the build's stub generator imports this
  // module in an isolated build environment, which has no numpy), there can
  // be no numpy arrays either: the types stay null, which the builder reads
  // as "not numpy".
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
  ReinitInChild(g_dtypes_mu);
  ReinitContextLockInChild();
}

void LockSignatureLocksForTest(bool lock) FTJIT_NO_THREAD_SAFETY_ANALYSIS {  // takes or releases by its argument
  if (lock) {
    g_dtypes_mu.lock();
    LockContextsForTest(true);
  } else {
    LockContextsForTest(false);
    g_dtypes_mu.unlock();
  }
}

}  // namespace ftjit
