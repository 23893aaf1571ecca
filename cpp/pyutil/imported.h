// ftjit: a Python object the core uses but does not define (ftjit's error
// classes, its record types, copy.copy), imported on first use and kept for
// the process's life. Each floor declares the ones it uses in its own
// imports.h, one definition each.
//
//   | Imported::obj_       | atomic; null until the first Get() stores the  |
//   |                      | import, then fixed                             |
//
// Lock order: takes no lock. The first Get() imports (runs Python), so it
// must never run under a C++ lock; two threads importing at once store the
// same object (the module's attribute), the second store is dropped.
#pragma once

#include <Python.h>

#include <atomic>

#include "pyutil/errors.h"

namespace ftjit {

class Imported {
 public:
  // Constant-initialised: a function-local or namespace-scope `static
  // Imported x(...)` has no guard, so a stop-the-world never waits on one.
  constexpr Imported(const char* module, const char* name) : module_(module), name_(name) {}
  Imported(const Imported&) = delete;
  Imported& operator=(const Imported&) = delete;

  // Borrowed (kept alive for the process's life); throws when the import fails.
  PyObject* Get() {
    PyObject* p = obj_.load(std::memory_order_acquire);
    return p ? p : Load();
  }

 private:
  PyObject* Load() {
    PyObject* value = nullptr;
    {
      // A pending error (the cause of the one about to be raised) survives
      // the import, unless the import fails.
      SavedError saved;
      PyObject* module = PyImport_ImportModule(module_);
      value = module ? PyObject_GetAttrString(module, name_) : nullptr;
      Py_XDECREF(module);
    }
    if (!value) throw nanobind::python_error();
    PyObject* expected = nullptr;
    if (!obj_.compare_exchange_strong(expected, value, std::memory_order_acq_rel)) {
      Py_DECREF(value);  // another thread stored the same object first
      return expected;
    }
    return value;  // the reference is kept for the process's life
  }

  const char* module_;
  const char* name_;
  std::atomic<PyObject*> obj_{nullptr};
};

}  // namespace ftjit
