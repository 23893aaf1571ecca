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
#include "pyutil/waiter_errors.h"

#include <Python.h>

#include <exception>
#include <string>

#include <nanobind/nanobind.h>

#include "pyutil/collaborators.h"
#include "pyutil/errors.h"

namespace ftjit {

namespace nb = nanobind;

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

// copy.copy(exc) if that keeps exc's type, else CopyWithoutInit(exc).
nb::object CopyOf(PyObject* exc) {
  nb::object copy = nb::steal(PyObject_CallOneArg(kCopy.Get(), exc));
  if (copy.is_valid() && Py_TYPE(copy.ptr()) == Py_TYPE(exc)) return copy;
  if (PyErr_Occurred()) ClearErrorKeepingInterrupt();
  return CopyWithoutInit(exc);
}

// A copy of `exc` (same type, args, __dict__), carrying its traceback, cause
// and context, or null when the type cannot be copied (the copy's error
// cleared by ClearErrorKeepingInterrupt).
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

[[noreturn]] void RaiseForWaiter(const std::string& fun_name, const nb::object& error) {
  nb::object copy = CopyException(error.ptr());
  if (!copy.is_valid()) {
    std::string msg = "ftjit: the compile of " + fun_name + "() failed in another thread with " +
                      Py_TYPE(error.ptr())->tp_name + ", which cannot be copied for this thread (see __cause__)";
    copy = nb::steal(PyObject_CallFunction(PyExc_RuntimeError, "s", msg.c_str()));
    if (!copy.is_valid()) throw nb::python_error();  // e.g. MemoryError: fresh, this thread's own
    PyException_SetCause(copy.ptr(), Py_NewRef(error.ptr()));
  }
  ThrowError(std::move(copy));
}

}  // namespace ftjit
