// ftjit: Python-error helpers (pyutil/errors.h).
#include "pyutil/errors.h"

#include <Python.h>
#include <nanobind/nanobind.h>

namespace ftjit {

namespace nb = nanobind;

void ClearErrorKeepingInterrupt() {
  bool interrupt = PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
  PyErr_Clear();
  if (!interrupt) return;
  // Rare (a Ctrl-C while a message is built): plain Python calls are fine.
  bool rearm = false;
  nb::object threading = nb::steal(PyImport_ImportModule("threading"));
  nb::object signal = nb::steal(PyImport_ImportModule("signal"));
  if (threading.is_valid() && signal.is_valid()) {
    nb::object current = nb::steal(PyObject_CallMethod(threading.ptr(), "current_thread", nullptr));
    nb::object main = nb::steal(PyObject_CallMethod(threading.ptr(), "main_thread", nullptr));
    nb::object sigint = nb::steal(PyObject_GetAttrString(signal.ptr(), "SIGINT"));
    nb::object handler = sigint.is_valid() ? nb::steal(PyObject_CallMethod(
                                                 signal.ptr(), "getsignal", "O", sigint.ptr()))
                                           : nb::object();
    nb::object default_handler = nb::steal(PyObject_GetAttrString(signal.ptr(), "default_int_handler"));
    rearm = current.is_valid() && main.is_valid() && current.ptr() == main.ptr() && handler.is_valid() &&
            default_handler.is_valid() && handler.ptr() == default_handler.ptr();
  }
  // These are Python calls, which check for signals: a second Ctrl-C landing
  // in them is re-armed whatever they were about to say.
  if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) rearm = true;
  PyErr_Clear();
  if (rearm) PyErr_SetInterrupt();
}

}  // namespace ftjit
