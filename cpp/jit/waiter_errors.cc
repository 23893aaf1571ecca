// ftjit: a failed compile's error, as each thread that waited for it raises it.
//
// The compiling thread raises the original exception; every waiter raises
// its own copy (same type, args, __dict__, traceback, cause and context), so
// that threads unwinding at once never write the same exception's
// __traceback__ or __context__. A type that cannot be copied is reported by
// a fresh RuntimeError naming it, with the original as its __cause__.
//
// Shared state: none (the error is written by the compiling thread before
// the latch publishes it, and only read after). Lock order: takes no lock.
#include <Python.h>
#include <nanobind/nanobind.h>

#include <string>

#include "jit/jit_state.h"
#include "pyutil/errors.h"
#include "pyutil/imported.h"
#include "signature/signature.h"

namespace ftjit {

namespace {
// type(exc).__new__(type(exc), *exc.args) with exc's __dict__: a copy that
// skips __init__, for types whose __init__ does not take their own args
// (`def __init__(self, a, b): super().__init__(f"{a}/{b}")`), which
// copy.copy cannot rebuild. Null (error set) on failure.
PyObject* CopyWithoutInit(PyObject* exc) {
  PyTypeObject* tp = Py_TYPE(exc);
  nb::object args = nb::steal(PyObject_GetAttrString(exc, "args"));
  if (!args.is_valid()) return nullptr;
  if (!PyTuple_Check(args.ptr()) || !tp->tp_new) {
    PyErr_SetString(PyExc_TypeError, "exception not copyable");
    return nullptr;
  }
  nb::object copy = nb::steal(tp->tp_new(tp, args.ptr(), nullptr));
  if (!copy.is_valid()) return nullptr;
  if (Py_TYPE(copy.ptr()) != tp) {
    PyErr_SetString(PyExc_TypeError, "exception not copyable");
    return nullptr;
  }
  nb::object dict = nb::steal(PyObject_GetAttrString(exc, "__dict__"));
  if (!dict.is_valid()) return nullptr;
  if (PyDict_Check(dict.ptr()) && PyDict_Size(dict.ptr()) > 0) {
    nb::object copy_dict = nb::steal(PyObject_GetAttrString(copy.ptr(), "__dict__"));
    if (!copy_dict.is_valid()) return nullptr;
    if (!PyDict_Check(copy_dict.ptr()) || PyDict_Update(copy_dict.ptr(), dict.ptr()) != 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "exception not copyable");
      return nullptr;
    }
  }
  return copy.release().ptr();
}

// A copy of `exc` (same type, args, __dict__), carrying its traceback, cause
// and context, or null when the type cannot be copied. Clears any error the
// copy raised.
PyObject* CopyException(PyObject* exc) {
  PyObject* copy_fn = kCopy.Get();
  PyObject* copy = copy_fn ? PyObject_CallOneArg(copy_fn, exc) : nullptr;
  if (!copy || Py_TYPE(copy) != Py_TYPE(exc)) {
    ClearErrorKeepingInterrupt();
    Py_XDECREF(copy);
    copy = CopyWithoutInit(exc);
    if (!copy) {
      ClearErrorKeepingInterrupt();
      return nullptr;
    }
  }
  if (PyObject* tb = PyException_GetTraceback(exc)) {
    PyException_SetTraceback(copy, tb);
    Py_DECREF(tb);
  }
  if (PyObject* cause = PyException_GetCause(exc)) PyException_SetCause(copy, cause);
  if (PyObject* ctx = PyException_GetContext(exc)) PyException_SetContext(copy, ctx);
  return copy;
}

}  // namespace

nb::object FetchNormalized() {
  PyObject *t = nullptr, *v = nullptr, *tb = nullptr;
  PyErr_Fetch(&t, &v, &tb);
  PyErr_NormalizeException(&t, &v, &tb);
  if (tb && v) PyException_SetTraceback(v, tb);
  Py_XDECREF(t);
  Py_XDECREF(tb);
  return nb::steal(v);
}

[[noreturn]] void Reraise(PyObject* exc) {
  PyObject* tb = PyException_GetTraceback(exc);  // new ref or null
  PyErr_Restore(Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(exc))), Py_NewRef(exc), tb);
  throw nb::python_error();
}

// The compile's exception as waiters will read it. The compiling thread
// raises the original, and unwinding writes the original's __traceback__;
// waiters read (and copy) this private copy instead, which nobody raises or
// writes after Publish(). For a type that cannot be copied at all, a
// RuntimeError naming it, caused by the original (never raised by waiters).
nb::object ErrorForWaiters(const nb::object& original) {
  if (PyObject* copy = CopyException(original.ptr())) return nb::steal(copy);
  PyObject* wrapper = PyObject_CallFunction(
      PyExc_RuntimeError, "s",
      ("ftjit: the compile failed in another thread with " +
       std::string(Py_TYPE(original.ptr())->tp_name) +
       ", which cannot be copied for this thread (see __cause__)")
          .c_str());
  if (!wrapper) {
    PyErr_Clear();
    return original;
  }
  PyException_SetCause(wrapper, Py_NewRef(original.ptr()));
  return nb::steal(wrapper);
}

// Each waiter raises its own copy of the compile's exception, so that threads
// unwinding at once never write the same exception's __traceback__ or
// __context__. When no copy can be made, a fresh RuntimeError is raised
// instead, with the shared exception as its __cause__ (only read, never
// raised, by this thread).
[[noreturn]] void RaiseForWaiter(const JitState& st, const nb::object& error) {
  PyObject* copy = CopyException(error.ptr());
  if (!copy) {
    std::string msg = "ftjit: the compile of " + st.spec.fun_name +
                      "() failed in another thread with " + Py_TYPE(error.ptr())->tp_name +
                      ", which cannot be copied for this thread (see __cause__)";
    copy = PyObject_CallFunction(PyExc_RuntimeError, "s", msg.c_str());
    if (!copy) throw nb::python_error();  // e.g. MemoryError: fresh, this thread's own
    PyException_SetCause(copy, Py_NewRef(error.ptr()));
  }
  nb::object owned = nb::steal(copy);
  Reraise(owned.ptr());
}

}  // namespace ftjit
