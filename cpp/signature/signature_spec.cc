// ftjit: a jitted function's SignatureSpec, set up once: its context hook unpacked, getters resolved.
//
// The compiler's context hook is validated and unpacked (ContextHook), the
// aval types' property getters resolved (DirectGetter); plus the per-call
// check of the hook's `requires`. The per-leaf and per-call helpers that
// must inline into the builder are defined in signature.h.
//
// Shared state: none of its own. A spec (and the hook and getters in it) is
// written only while its JitFunction is constructed, by the constructing
// thread, and is fixed afterwards (until the GC's tp_clear empties an
// unreachable JitFunction's); calls in any thread only read it.
//
// Lock order: takes no locks. Setting up runs Python (attribute lookups on
// types); CheckRequires is Python-free.
#include <Python.h>
#include <nanobind/nanobind.h>

#include <utility>

#include "signature/signature.h"
#include "signature/signature_internal.h"

namespace ftjit {

ContextHook ContextHook::Unpack(const nb::object& hook_obj) {
  ContextHook h;
  PyObject* hook = hook_obj.ptr();
  if (!hook) return h;
  if (!PyTuple_Check(hook)) {
    h.context = hook;
    return h;
  }
  auto bad = [] {
    PyErr_SetString(PyExc_TypeError,
                    "ftjit: a tuple context hook must be (context, probe, probe_arg, probe_ok, "
                    "requires, committed_types, committed_attr, sharding_attr[, extras[, "
                    "spec_types]]), extras a tuple of at most 8 (getter, arg) pairs, spec_types "
                    "a tuple of types");
    throw nb::python_error();
  };
  Py_ssize_t size = PyTuple_GET_SIZE(hook);
  if (size < 8 || size > 10) bad();
  auto item = [&](Py_ssize_t i) -> PyObject* {
    PyObject* o = PyTuple_GET_ITEM(hook, i);
    return o == Py_None ? nullptr : o;
  };
  h.context = item(0);
  h.probe = item(1);
  h.probe_arg = PyTuple_GET_ITEM(hook, 2);
  h.probe_ok = PyTuple_GET_ITEM(hook, 3);
  h.requires = item(4);
  h.committed_types = item(5);
  h.committed_attr = item(6);
  h.sharding_attr = item(7);
  if (size == 10) {
    h.spec_types = item(9);
    if (h.spec_types) {
      if (!PyTuple_Check(h.spec_types)) bad();
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(h.spec_types); ++i) {
        if (!PyType_Check(PyTuple_GET_ITEM(h.spec_types, i))) bad();
      }
    }
  }
  if (PyObject* extras = size >= 9 ? item(8) : nullptr) {
    if (!PyTuple_Check(extras) || static_cast<size_t>(PyTuple_GET_SIZE(extras)) > kMaxExtras) bad();
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(extras); ++i) {
      PyObject* pair = PyTuple_GET_ITEM(extras, i);
      if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
          !PyCallable_Check(PyTuple_GET_ITEM(pair, 0))) {
        bad();
      }
      h.extra_getters[h.num_extras] = PyTuple_GET_ITEM(pair, 0);
      h.extra_args[h.num_extras] = PyTuple_GET_ITEM(pair, 1);
      ++h.num_extras;
    }
    if (h.num_extras > 0 && !h.context) bad();
  }
  if ((h.requires && !PyTuple_Check(h.requires)) ||
      (h.committed_types && (!PyTuple_Check(h.committed_types) || !h.committed_attr ||
                             !h.sharding_attr || !PyUnicode_Check(h.committed_attr) ||
                             !PyUnicode_Check(h.sharding_attr)))) {
    bad();
  }
  return h;
}

void ContextHook::CheckRequires(PyObject* ctx) const {
  if (!requires) return;
  for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(requires); i < n; ++i) {
    PyObject* pair = PyTuple_GET_ITEM(requires, i);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyTuple_Check(ctx)) {
      PyErr_SetString(PyExc_TypeError,
                      "ftjit: context hook 'requires' needs (index, value) pairs and a tuple context");
      throw nb::python_error();
    }
    Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
    if (index == -1 && PyErr_Occurred()) throw nb::python_error();
    if (index < 0 || index >= PyTuple_GET_SIZE(ctx) ||
        PyTuple_GET_ITEM(ctx, index) != PyTuple_GET_ITEM(pair, 1)) {
      throw NeedsFallback{};
    }
  }
}

DirectGetter DirectGetter::Resolve(PyTypeObject* type, PyObject* name) {
  DirectGetter g;
  g.type = type;
  g.name = name;
  // Reading the attribute through the type both finds the descriptor along
  // the MRO (property.__get__(None, type) is the property itself) and makes
  // CPython assign the type a version tag, which is read afterwards.
  nb::object descr = nb::steal(PyObject_GetAttr(reinterpret_cast<PyObject*>(type), name));
  if (!descr.is_valid()) {
    PyErr_Clear();
    return g;
  }
  if (Py_TYPE(descr.ptr()) != &PyProperty_Type || type->tp_getattro != PyObject_GenericGetAttr) {
    return g;
  }
  nb::object fget = nb::steal(PyObject_GetAttrString(descr.ptr(), "fget"));
  if (!fget.is_valid()) {
    PyErr_Clear();
    return g;
  }
  if (fget.is_none() || !PyCallable_Check(fget.ptr())) return g;
  g.version = __atomic_load_n(&type->tp_version_tag, __ATOMIC_RELAXED);
  if (g.version != 0) g.fget = std::move(fget);
  return g;
}

void SignatureSpec::AddAvalType(PyTypeObject* type) {
  AvalType t;
  t.type = type;
  t.aval = DirectGetter::Resolve(type, N().aval);
  if (hook.IsCommittedType(type)) {
    t.committed = DirectGetter::Resolve(type, hook.committed_attr);
    t.sharding = DirectGetter::Resolve(type, hook.sharding_attr);
  }
  aval_types.push_back(std::move(t));
}

void SignatureSpec::SetContextFn(nb::object fn) {
  ContextHook unpacked = ContextHook::Unpack(fn);  // validates; may throw
  context_fn = std::move(fn);
  hook = unpacked;  // borrows from context_fn, which the spec now owns
}

}  // namespace ftjit
