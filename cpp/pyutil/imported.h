// ftjit: Python objects the core uses but does not define (ftjit's error
// classes, its record types, copy.copy), imported where they are used, on
// first use, and kept for the process's life.
//
//   | Imported::obj_ (each | atomic; null until the first Get() stores the  |
//   |   k... below)        | import, then fixed                             |
//
// Lock order: takes no lock. The first Get() imports (runs Python), so it
// must never run under a C++ lock; two threads importing at once store the
// same object (the module's attribute), the second store is dropped.
#pragma once

#include <Python.h>

#include <atomic>

namespace ftjit {

class Imported {
 public:
  // Constant-initialised: a function-local or namespace-scope `static
  // Imported x(...)` has no guard, so a stop-the-world never waits on one.
  constexpr Imported(const char* module, const char* name) : module_(module), name_(name) {}
  Imported(const Imported&) = delete;
  Imported& operator=(const Imported&) = delete;

  // Borrowed (kept alive for the process's life), or null with an error set
  // when the import fails.
  PyObject* Get() {
    PyObject* p = obj_.load(std::memory_order_acquire);
    return p ? p : Load();
  }

 private:
  PyObject* Load() {
    // A pending error (the cause of the one about to be raised) is kept
    // across the import, unless the import fails: its error then wins.
    PyObject *type, *val, *tb;
    PyErr_Fetch(&type, &val, &tb);
    PyObject* module = PyImport_ImportModule(module_);
    PyObject* value = module ? PyObject_GetAttrString(module, name_) : nullptr;
    Py_XDECREF(module);
    if (!value) {
      Py_XDECREF(type);
      Py_XDECREF(val);
      Py_XDECREF(tb);
      return nullptr;
    }
    PyErr_Restore(type, val, tb);
    PyObject* expected = nullptr;
    if (!obj_.compare_exchange_strong(expected, value, std::memory_order_acq_rel)) {
      Py_DECREF(value);  // another thread stored it first: the same object
      return expected;
    }
    return value;  // the reference is kept for the process's life
  }

  const char* module_;
  const char* name_;
  std::atomic<PyObject*> obj_{nullptr};
};

// ftjit's own classes that the core raises and builds (ftjit/errors.py,
// ftjit/_jit.py), and the Python helpers it calls. One definition each, here.
inline Imported kUnhashableStaticArgumentError{"ftjit.errors", "UnhashableStaticArgumentError"};
inline Imported kUnsupportedArgumentError{"ftjit.errors", "UnsupportedArgumentError"};
inline Imported kRecursiveCompileError{"ftjit.errors", "RecursiveCompileError"};
inline Imported kCompileCycleError{"ftjit.errors", "CompileCycleError"};
inline Imported kCompileTimeoutError{"ftjit.errors", "CompileTimeoutError"};
inline Imported kRecompileLimitError{"ftjit.errors", "RecompileLimitError"};
inline Imported kCacheInfo{"ftjit._jit", "CacheInfo"};
inline Imported kSignatureInfo{"ftjit._jit", "SignatureInfo"};
inline Imported kCopy{"copy", "copy"};
// Logging hooks: on_compile(name, signature, seconds, error or None) and
// on_wait(name, signature, seconds).
inline Imported kOnCompile{"ftjit._observe", "on_compile"};
inline Imported kOnWait{"ftjit._observe", "on_wait"};
// Miss explanations and the max_signatures message (ftjit/_explain.py).
inline Imported kOnMiss{"ftjit._explain", "on_miss"};

}  // namespace ftjit
