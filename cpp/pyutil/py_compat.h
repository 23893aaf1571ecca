// ftjit: small shims over CPython API differences between 3.11 and 3.14(t),
// so the rest of the core can use the strong-reference APIs everywhere.
//
// Stateless; takes no locks. (GetOptionalAttr runs Python: properties,
// __getattr__.)
#pragma once

#include <Python.h>

namespace ftjit {

// New reference to list[i], or nullptr with IndexError set. Never borrowed:
// under free threading another thread may mutate the list.
inline PyObject* ListGetItemRef(PyObject* list, Py_ssize_t i) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyList_GetItemRef(list, i);
#else
  PyObject* item = PyList_GetItem(list, i);  // borrowed; the GIL keeps it
  Py_XINCREF(item);
  return item;
#endif
}

// 1 and a new reference in *out if found, 0 if absent, -1 with an error set.
inline int DictGetItemRef(PyObject* dict, PyObject* key, PyObject** out) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyDict_GetItemRef(dict, key, out);
#else
  PyObject* item = PyDict_GetItemWithError(dict, key);  // borrowed
  if (item) {
    Py_INCREF(item);
    *out = item;
    return 1;
  }
  *out = nullptr;
  return PyErr_Occurred() ? -1 : 0;
#endif
}

// dict.setdefault(key, value): 1 and a new reference in *out to what the
// dict holds under key after (value or an earlier one), -1 with an error set.
inline int DictSetDefaultRef(PyObject* dict, PyObject* key, PyObject* value, PyObject** out) {
#if PY_VERSION_HEX >= 0x030D0000
  int r = PyDict_SetDefaultRef(dict, key, value, out);
  return r < 0 ? -1 : 1;
#else
  PyObject* item = PyDict_SetDefault(dict, key, value);  // borrowed; the GIL keeps it
  if (!item) return -1;
  Py_INCREF(item);
  *out = item;
  return 1;
#endif
}

// 1 and a new reference if the attribute exists, 0 if it does not (creating
// no AttributeError: probing for `.dtype` stays cheap), -1 on any other error.
inline int GetOptionalAttr(PyObject* obj, PyObject* name, PyObject** out) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyObject_GetOptionalAttr(obj, name, out);
#else
  return _PyObject_LookupAttr(obj, name, out);
#endif
}

// Whether this thread has its thread state attached, so that it may touch
// Python objects. A thread that CPython ends at interpreter shutdown (it
// took the GIL back: pthread_exit, a forced unwind) unwinds with none.
inline bool ThreadIsAttached() {
#if PY_VERSION_HEX >= 0x030D0000
  return PyThreadState_GetUnchecked() != nullptr;  // thread-local: null when detached
#elif PY_VERSION_HEX >= 0x030C0000
  return _PyThreadState_UncheckedGet() != nullptr;
#else
  // 3.11's "current thread state" is the GIL holder's, process-wide: it is
  // this thread's own exactly when this thread holds the GIL.
  PyThreadState* mine = PyGILState_GetThisThreadState();
  return mine != nullptr && mine == _PyThreadState_UncheckedGet();
#endif
}

}  // namespace ftjit
