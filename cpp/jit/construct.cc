// ftjit: a JitFunction made from ftjit.jit()'s resolved options and the
// compiler's CompilerHooks, read once into its state.
//
// Shared state: none (the state made here is the new function's own, and
// fixed once returned: see JitState). Lock order: takes no lock of its own
// (StoreFor takes the cache's function-map lock).
#include <Python.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "jit/jit_state.h"
#include "pyutil/collaborators.h"
#include "signature/signature.h"
#include "store/function_cache.h"

namespace ftjit {

namespace {

std::vector<int> ToIntVector(nb::handle seq, const char* what) {
  std::vector<int> out;
  for (nb::handle h : seq) {
    int overflow = 0;
    long long v = PyLong_Check(h.ptr()) ? PyLong_AsLongLongAndOverflow(h.ptr(), &overflow) : 0;
    if (!PyLong_Check(h.ptr()) || overflow != 0 || v < INT32_MIN || v > INT32_MAX) {
      PyErr_Clear();
      throw nb::value_error((std::string(what) + " must hold argument positions (ints between -2**31 and "
                             "2**31 - 1), got " + nb::cast<std::string>(nb::repr(h)))
                                .c_str());
    }
    out.push_back(static_cast<int>(v));
  }
  return out;
}

// A tuple copy of `types` that nobody can mutate: the spec borrows type
// pointers from it (a compiler's own list could be mutated, and the borrowed
// pointer of a type removed from it would dangle once the type died).
nb::object OwnTypes(nb::handle types, const char* what) {
  nb::object copy = nb::steal(PySequence_Tuple(types.ptr()));
  if (!copy.is_valid()) throw nb::python_error();
  for (nb::handle t : copy) {
    if (!PyType_Check(t.ptr())) throw nb::type_error((std::string(what) + " must be types").c_str());
  }
  return copy;
}

// A callable field of `record` (null for None, when `none_ok`).
nb::object CallableField(nb::handle record, const char* name, const std::string& what, bool none_ok) {
  nb::object o = record.attr(name);
  if (none_ok && o.is_none()) return nb::object();
  if (!PyCallable_Check(o.ptr())) {
    throw nb::type_error(("CompilerHooks." + what + " must be callable" + (none_ok ? " or None" : "") + ", got " +
                          nb::cast<std::string>(nb::repr(o)))
                             .c_str());
  }
  return o;
}

// CompilerHooks.pytree_flatten: a Python hook, or an ftjit.RegistryFlatten
// read by field name.
void ReadPytreeFlatten(SignatureSpec& spec, nb::handle flatten) {
  if (flatten.is_none()) return;
  int is_record = PyObject_IsInstance(flatten.ptr(), kRegistryFlatten.Get());
  if (is_record < 0) throw nb::python_error();
  if (is_record) {
    spec.registry_flatten = CallableField(flatten, "flatten_one_level", "pytree_flatten.flatten_one_level", false);
    spec.defer_leaf = CallableField(flatten, "defer_leaf", "pytree_flatten.defer_leaf", false);
  } else if (PyCallable_Check(flatten.ptr())) {
    spec.pytree_flatten = nb::borrow(flatten);
  } else {
    throw nb::type_error(("CompilerHooks.pytree_flatten must be a callable or an ftjit.RegistryFlatten, got " +
                          nb::cast<std::string>(nb::repr(flatten)))
                             .c_str());
  }
}

// The spec's hooks, read once from the CompilerHooks by field name
// (ftjit.CompilerHooks validates them; what the core relies on for memory
// safety is checked again here).
void ReadHooks(JitState& st, nb::handle hooks) {
  SignatureSpec& spec = st.spec;
  auto field = [&](const char* name) { return nb::object(hooks.attr(name)); };
  nb::object pytree_flatten = field("pytree_flatten");
  ReadPytreeFlatten(spec, pytree_flatten);
  nb::object custom_namedtuple = field("custom_namedtuple");
  if (!custom_namedtuple.is_none()) {
    if (!PyCallable_Check(custom_namedtuple.ptr())) throw nb::type_error("custom_namedtuple must be callable");
    if (pytree_flatten.is_none()) throw nb::type_error("custom_namedtuple needs pytree_flatten");
    spec.custom_namedtuple = custom_namedtuple;
    // JAX's registry hook is a dict's bound __contains__: asked in C.
    if (PyCFunction_Check(custom_namedtuple.ptr())) {
      PyObject* self = PyCFunction_GetSelf(custom_namedtuple.ptr());
      nb::object name = nb::getattr(custom_namedtuple, "__name__", nb::none());
      if (self && PyDict_CheckExact(self) && nb::isinstance<nb::str>(name) &&
          nb::cast<std::string>(name) == "__contains__") {
        spec.custom_namedtuple_dict = nb::borrow(self);
      }
    }
  }
  spec.SetContext(field("context"));
  if (nb::object fallback_types = field("fallback_types"); nb::len(fallback_types) > 0) {
    spec.fallback_types = OwnTypes(fallback_types, "fallback_types");
  }
  spec.plain_types_owner = OwnTypes(field("plain_types"), "plain_types");
  for (nb::handle t : spec.plain_types_owner) spec.plain_types.push_back(reinterpret_cast<PyTypeObject*>(t.ptr()));
  spec.aval_types_owner = OwnTypes(field("aval_types"), "aval_types");
  for (nb::handle t : spec.aval_types_owner) spec.AddAvalType(reinterpret_cast<PyTypeObject*>(t.ptr()));
  if (nb::object label = field("placement_label"); !label.is_none()) spec.placement_label = label;
  spec.jax_style_errors = nb::cast<bool>(field("jax_style_errors"));
  st.strip_static = nb::cast<bool>(field("strip_static"));
  if (nb::object fallback = field("fallback"); !fallback.is_none()) st.fallback = fallback;
  nb::object redo_types = OwnTypes(field("redo_types"), "redo_types");
  for (nb::handle t : redo_types) {
    if (!PyExceptionClass_Check(t.ptr())) throw nb::type_error("redo_types must be exception types");
  }
  if (PyTuple_GET_SIZE(redo_types.ptr()) > 0) st.redo_types = redo_types;
  if (nb::object exe_for = field("executable_for"); !exe_for.is_none()) {
    if (!PyCallable_Check(exe_for.ptr())) throw nb::type_error("executable_for must be callable");
    st.executable_for = exe_for;
  }
  // What JitFunction's methods of the same names call (through HookOf).
  nb::object names = nb::steal(PySequence_Tuple(field("METHOD_HOOKS").ptr()));
  if (!names.is_valid()) throw nb::python_error();
  if (static_cast<size_t>(PyTuple_GET_SIZE(names.ptr())) > JitState::kMaxMethodHooks) {
    throw nb::type_error("CompilerHooks.METHOD_HOOKS names more hooks than the core keeps (8)");
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names.ptr()); ++i) {
    nb::handle name = PyTuple_GET_ITEM(names.ptr(), i);
    const char* text = PyUnicode_Check(name.ptr()) ? PyUnicode_AsUTF8(name.ptr()) : nullptr;
    if (!text) throw nb::type_error("CompilerHooks.METHOD_HOOKS must hold field names (str)");
    st.method_hook_names[i] = nb::borrow(name);
    st.method_hooks[i] = CallableField(hooks, text, text, true);
  }
  spec.context_in_executable = nb::cast<bool>(field("context_in_executable"));
  if (spec.context_in_executable && !st.executable_for.is_valid()) {
    throw nb::type_error("context_in_executable needs executable_for");
  }
}

nb::object MakeJitFunction(nb::object fun, nb::object compile, nb::object hooks, nb::object cache,
                           nb::object static_argnums, nb::object static_argnames, nb::object arg_names,
                           std::string name, nb::object options, nb::object pickle_options,
                           double compile_timeout, int64_t max_signatures, bool raise_on_excess,
                           int explain_misses) {
  if (!PyCallable_Check(fun.ptr())) throw nb::type_error("fun must be callable");
  if (!PyCallable_Check(compile.ptr())) throw nb::type_error("compile must be callable");
  if (!IsFunctionCache(cache)) throw nb::type_error("cache must be an ftjit.FunctionCache");
  if (!nb::inst_ready(cache)) {
    throw nb::type_error(("cache is a " + std::string(Py_TYPE(cache.ptr())->tp_name) +
                          " (a FunctionCache subclass) whose __init__ did not call "
                          "super().__init__(): it has no cache to use. Call "
                          "super().__init__(capacity) in its __init__.")
                             .c_str());
  }
  auto st = std::make_unique<JitState>();
  st->fun = fun;
  st->compile = compile;
  st->hooks = hooks;
  st->cache = cache;
  st->options = options;
  st->pickle_options = pickle_options;
  st->spec.static_argnums = ToIntVector(static_argnums, "static_argnums");
  for (nb::handle h : static_argnames) {
    if (!PyUnicode_Check(h.ptr())) throw nb::type_error("static_argnames must be str");
    PyObject* s = Py_NewRef(h.ptr());
    PyUnicode_InternInPlace(&s);
    st->spec.static_argnames.push_back(nb::steal(s));
  }
  st->spec.arg_names = arg_names;
  st->spec.fun_name = name;
  ReadHooks(*st, hooks);
  // Beyond ~30 years is "forever" (inf included): the deadline must stay
  // representable in steady_clock's 64-bit nanoseconds.
  st->compile_timeout = compile_timeout > 1e9 ? 0.0 : compile_timeout;
  st->explain_misses = explain_misses;
  // The limit is part of `options`: every wrapper sharing the store gives the same.
  st->store = StoreFor(cache, fun, options, name, SignatureLimit{max_signatures, raise_on_excess});

  return NewJitFunction(std::move(st));
}

}  // namespace

void RegisterConstruction(nb::module_& m) {
  m.def("_make_jit_function", &MakeJitFunction, nb::arg("fun"), nb::arg("compile"), nb::arg("hooks"),
        nb::arg("cache"), nb::arg("static_argnums"), nb::arg("static_argnames"), nb::arg("arg_names"),
        nb::arg("name"), nb::arg("options"), nb::arg("pickle_options"), nb::arg("compile_timeout") = 0.0,
        nb::arg("max_signatures") = -1, nb::arg("raise_on_excess") = false, nb::arg("explain_misses") = -1);
}

}  // namespace ftjit
