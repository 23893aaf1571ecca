// ftjit: a JitFunction made from ftjit.jit()'s resolved options and the
// compiler's CompilerHooks, read once into its state.
//
// Shared state: none (the state made here is the new function's own, and
// fixed once returned: see JitState). Lock order: takes no lock of its own
// (StoreFor takes the cache's function-map lock).
#include <Python.h>

#include <algorithm>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "jit/jit_state.h"
#include "pyutil/errors.h"
#include "signature/hook_fields.h"
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

// The field names a CompilerHooks class attribute lists (METHOD_HOOKS,
// PYTHON_HOOKS), as a tuple of str.
nb::object HookNames(nb::handle hooks, const char* list) {
  nb::object names = StealOrThrow(PySequence_Tuple(nb::object(hooks.attr(list)).ptr()));
  for (nb::handle name : names) {
    if (!PyUnicode_Check(name.ptr())) {
      throw nb::type_error(("CompilerHooks." + std::string(list) + " must hold field names (str)").c_str());
    }
  }
  return names;
}

// The hooks, read once by field name: the one check of a CompilerHooks
// (with SignatureSpec::ReadHooks), run by jit() and, into a state it drops, by
// CompilerHooks.__post_init__ (_check_hooks). What the core keeps is its own
// (a frozen dataclass can still be changed with object.__setattr__).
void ReadHooks(JitState& st, nb::handle hooks) {
  st.spec.ReadHooks(hooks);
  st.strip_static = BoolField(hooks, "strip_static");
  st.fallback = CallableField(hooks, "fallback", "fallback");
  nb::object redo_types = TypesField(hooks, "redo_types", /*exceptions=*/true);
  if (PyTuple_GET_SIZE(redo_types.ptr()) > 0) st.redo_types = redo_types;
  st.executable_for = CallableField(hooks, "executable_for", "executable_for");
  if (st.spec.context_in_executable && !st.executable_for.is_valid()) {
    throw nb::type_error("CompilerHooks.context_in_executable needs executable_for (whose ThreadExecutables check "
                         "the context)");
  }
  st.thread_call = CallableField(hooks, "thread_call", "thread_call");
  if (st.thread_call.is_valid() && !st.spec.context_in_executable) {
    throw nb::type_error("CompilerHooks.thread_call needs context_in_executable (a thread's call object checks the "
                         "context itself)");
  }
  // What JitFunction's methods of the same names call (through HookOf).
  nb::object names = HookNames(hooks, "METHOD_HOOKS");
  if (static_cast<size_t>(PyTuple_GET_SIZE(names.ptr())) > JitState::kMaxMethodHooks) {
    throw nb::type_error("CompilerHooks.METHOD_HOOKS names more hooks than the core keeps (8)");
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names.ptr()); ++i) {
    st.method_hook_names[i] = nb::borrow(PyTuple_GET_ITEM(names.ptr(), i));
    const char* name = PyUnicode_AsUTF8(st.method_hook_names[i].ptr());
    if (!name) throw nb::python_error();
    st.method_hooks[i] = CallableField(hooks, name, name);
  }
  // Hooks only ftjit's Python layer calls: checked with the rest, not kept.
  for (nb::handle n : HookNames(hooks, "PYTHON_HOOKS")) {
    const char* name = PyUnicode_AsUTF8(n.ptr());
    if (!name) throw nb::python_error();
    CallableField(hooks, name, name);
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
  // A thread's call object takes static positions as jax.jit resolves
  // them, counted from the front: a negative one (resolved per call, by the
  // number of arguments) keeps every call on the store's path.
  bool negative = false;
  for (int i : st->spec.static_argnums) negative |= i < 0;
  if (negative) st->thread_call = nb::object();
  if (st->thread_call.is_valid()) {
    nb::list nums, names;
    for (int i : st->spec.static_argnums) nums.append(i);
    for (const nb::object& n : st->spec.static_argnames) names.append(n);
    st->thread_call_argnums = nb::tuple(nums);
    st->thread_call_argnames = nb::tuple(names);
  }
  // Beyond ~30 years is "forever" (inf included): the deadline must stay
  // representable in steady_clock's 64-bit nanoseconds.
  st->compile_timeout = compile_timeout > 1e9 ? 0.0 : compile_timeout;
  st->explain_misses = explain_misses;
  // The limit is part of `options`: every wrapper sharing the store gives the same.
  st->store = StoreFor(cache, fun, options, name, SignatureLimit{max_signatures, raise_on_excess});
  if (st->thread_call.is_valid()) {
    // Each thread's object keeps at most what the store may: memory stays
    // O(capacity x threads alive at once).
    uint64_t capacity = st->store->cache().lru.capacity();
    if (max_signatures > 0) capacity = std::min<uint64_t>(capacity, static_cast<uint64_t>(max_signatures));
    st->thread_call_capacity = static_cast<int64_t>(std::min<uint64_t>(capacity, INT32_MAX));
  }

  return NewJitFunction(std::move(st));
}

}  // namespace

void RegisterConstruction(nb::module_& m) {
  m.def("_check_hooks", [](nb::handle hooks) {
        JitState dropped;
        ReadHooks(dropped, hooks);
      },
      nb::arg("hooks"), nb::sig("def _check_hooks(hooks: typing.Any) -> None"),
      "CompilerHooks.__post_init__'s check: reads the hooks as jit() reads them (into a state it drops);\n"
      "a wrong field is a TypeError naming it.");
  m.def("_make_jit_function", &MakeJitFunction, nb::arg("fun"), nb::arg("compile"), nb::arg("hooks"),
        nb::arg("cache"), nb::arg("static_argnums"), nb::arg("static_argnames"), nb::arg("arg_names"),
        nb::arg("name"), nb::arg("options"), nb::arg("pickle_options"), nb::arg("compile_timeout") = 0.0,
        nb::arg("max_signatures") = -1, nb::arg("raise_on_excess") = false, nb::arg("explain_misses") = -1);
}

}  // namespace ftjit
