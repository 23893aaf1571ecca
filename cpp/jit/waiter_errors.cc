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

#include <exception>
#include <string>

#include "jit/jit_state.h"
#include "pyutil/errors.h"
#include "jit/imports.h"
#include "signature/signature.h"

namespace ftjit {

namespace {
// type(exc).__new__(type(exc), *exc.args) with exc's __dict__: a copy that
// skips __init__, for types whose __init__ does not take their own args
// (`def __init__(self, a, b): super().__init__(f"{a}/{b}")`), which
// copy.copy cannot rebuild. Throws when it cannot be made.
nb::object CopyWithoutInit(PyObject* exc) {
  PyTypeObject* tp = Py_TYPE(exc);
  nb::object args = nb::steal(PyObject_GetAttrString(exc, "args"));
  if (!args.is_valid()) throw nb::python_error();
  if (!PyTuple_Check(args.ptr()) || !tp->tp_new) throw nb::type_error("exception not copyable");
  nb::object copy = nb::steal(tp->tp_new(tp, args.ptr(), nullptr));
  if (!copy.is_valid()) throw nb::python_error();
  if (Py_TYPE(copy.ptr()) != tp) throw nb::type_error("exception not copyable");
  nb::object dict = nb::steal(PyObject_GetAttrString(exc, "__dict__"));
  if (!dict.is_valid()) throw nb::python_error();
  if (PyDict_Check(dict.ptr()) && PyDict_Size(dict.ptr()) > 0) {
    nb::object copy_dict = nb::steal(PyObject_GetAttrString(copy.ptr(), "__dict__"));
    if (!copy_dict.is_valid()) throw nb::python_error();
    if (!PyDict_Check(copy_dict.ptr())) throw nb::type_error("exception not copyable");
    if (PyDict_Update(copy_dict.ptr(), dict.ptr()) != 0) throw nb::python_error();
  }
  return copy;
}

// copy.copy(exc), if that gives an exception of exc's own type, else
// CopyWithoutInit(exc). Throws when neither can be made.
nb::object CopyOf(PyObject* exc) {
  nb::object copy = nb::steal(PyObject_CallOneArg(kCopy.Get(), exc));
  if (copy.is_valid() && Py_TYPE(copy.ptr()) == Py_TYPE(exc)) return copy;
  if (PyErr_Occurred()) ClearErrorKeepingInterrupt();
  return CopyWithoutInit(exc);
}

// A copy of `exc` (same type, args, __dict__), carrying its traceback, cause
// and context, or null when the type cannot be copied (the copy's error
// cleared, as the error policy of pyutil/errors.h says).
nb::object CopyException(PyObject* exc) {
  nb::object copy;
  try {
    copy = CopyOf(exc);
  } catch (const std::exception&) {
    SetErrorFromException();
    ClearErrorKeepingInterrupt();
    return nb::object();
  }
  if (PyObject* tb = PyException_GetTraceback(exc)) {
    PyException_SetTraceback(copy.ptr(), tb);
    Py_DECREF(tb);
  }
  if (PyObject* cause = PyException_GetCause(exc)) PyException_SetCause(copy.ptr(), cause);
  if (PyObject* ctx = PyException_GetContext(exc)) PyException_SetContext(copy.ptr(), ctx);
  return copy;
}

}  // namespace

// The compile's exception as waiters will read it. The compiling thread
// raises the original, and unwinding writes the original's __traceback__;
// waiters read (and copy) this private copy instead, which nobody raises or
// writes after Publish(). For a type that cannot be copied at all, a
// RuntimeError naming it, caused by the original (never raised by waiters).
nb::object ErrorForWaiters(const nb::object& original) {
  if (nb::object copy = CopyException(original.ptr()); copy.is_valid()) return copy;
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
  nb::object copy = CopyException(error.ptr());
  if (!copy.is_valid()) {
    std::string msg = "ftjit: the compile of " + st.spec.fun_name +
                      "() failed in another thread with " + Py_TYPE(error.ptr())->tp_name +
                      ", which cannot be copied for this thread (see __cause__)";
    copy = nb::steal(PyObject_CallFunction(PyExc_RuntimeError, "s", msg.c_str()));
    if (!copy.is_valid()) throw nb::python_error();  // e.g. MemoryError: fresh, this thread's own
    PyException_SetCause(copy.ptr(), Py_NewRef(error.ptr()));
  }
  ThrowError(std::move(copy));
}

}  // namespace ftjit
