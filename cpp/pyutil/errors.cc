// ftjit: the core's error convention (the policy: the header's preamble).
#include "pyutil/errors.h"

#include <Python.h>

#include <new>
#include <stdexcept>

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

PyObject* TakeError() {
#if PY_VERSION_HEX >= 0x030C0000
  return PyErr_GetRaisedException();
#else
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  if (!type) return nullptr;
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value) PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return value;
#endif
}

void RestoreError(PyObject* exc) {
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(exc);
#else
  PyObject* tb = PyException_GetTraceback(exc);  // a new reference, or null
  PyErr_Restore(Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(exc))), exc, tb);
#endif
}

void SetErrorFromException() noexcept {
  try {
    throw;
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const nb::builtin_exception& e) {
    PyObject* kind = PyExc_RuntimeError;
    switch (e.type()) {
      case nb::exception_type::stop_iteration: kind = PyExc_StopIteration; break;
      case nb::exception_type::index_error: kind = PyExc_IndexError; break;
      case nb::exception_type::key_error: kind = PyExc_KeyError; break;
      case nb::exception_type::value_error: kind = PyExc_ValueError; break;
      case nb::exception_type::type_error: kind = PyExc_TypeError; break;
      case nb::exception_type::buffer_error: kind = PyExc_BufferError; break;
      case nb::exception_type::import_error: kind = PyExc_ImportError; break;
      case nb::exception_type::attribute_error: kind = PyExc_AttributeError; break;
      default: break;  // runtime_error (next_overload cannot reach a slot)
    }
    PyErr_SetString(kind, e.what());
  } catch (const std::bad_alloc& e) {
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (const std::out_of_range& e) {
    PyErr_SetString(PyExc_IndexError, e.what());
  } catch (const std::overflow_error& e) {
    PyErr_SetString(PyExc_OverflowError, e.what());
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::domain_error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::length_error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::range_error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

}  // namespace ftjit
