// ftjit: the JitFunction type: a hand-built heap type (vectorcall, a
// descriptor, GC support, pickling) with every method of a jitted function,
// and its construction from ftjit.jit()'s resolved options and the
// compiler's CompilerHooks (ftjit/_hooks.py).
//
// Errors cross from C++ into Python in one place: every C-API entry point
// of the type runs its body through Translate().
//
//   | state      | protection                                               |
//   |------------|----------------------------------------------------------|
//   | g_jit_type | set once at module init                                  |
//   | JitState   | jit_state.h                                              |
//
// Lock order: takes no lock itself. Only the test hook _debug_hold_locks
// holds several: FunctionStore::LockAllForTest's (function_cache.cc), then
// LockSignatureLocksForTest's (signature.cc).
#include "jit/jit_type.h"

#include <Python.h>
#include <structmember.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "jit/jit_state.h"
#include "pyutil/imported.h"
#include "signature/signature.h"
#include "store/function_cache.h"

namespace ftjit {

namespace {

PyObject* g_jit_type = nullptr;  // set once at module init

Imported kRebuild{"ftjit._jit", "_rebuild"};
Imported kWarmup{"ftjit._warmup", "warmup"};
Imported kWarmupSpecs{"ftjit._specs", "warmup_specs"};
Imported kJitModule{"ftjit._jit", "__dict__"};
Imported kPartial{"functools", "partial"};

// Runs an entry point's body: the one place where C++ exceptions become
// Python errors. `failed` is what the entry point returns with an error set.
// (A forced unwind at interpreter shutdown is neither: it passes through.)
template <class Body>
auto Translate(Body&& body, decltype(body()) failed) -> decltype(body()) {
  try {
    return body();
  } catch (nb::python_error& err) {
    err.restore();
  } catch (const std::exception& err) {
    PyErr_Format(PyExc_RuntimeError, "ftjit internal error: %s", err.what());
  }
  return failed;
}

// A method body returning an nb::object, as a new reference (or null).
template <class Body>
PyObject* Method(PyObject* self, Body&& body) {
  if (Cleared(StateOf(self))) return nullptr;
  return Translate([&]() -> PyObject* { return body(StateOf(self)).release().ptr(); }, nullptr);
}

// The function's CompilerHooks hook of that name, read once at jit(), or null (None).
nb::object HookOf(const JitState& st, const char* name) { return st.MethodHook(name); }

// --- the type's slots ------------------------------------------------------------

extern "C" PyObject* JitFunction_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                                            PyObject* kwnames) {
  JitState& st = StateOf(self);
  if (Cleared(st)) return nullptr;
  if (JitDisabledDepth() > 0) return PyObject_Vectorcall(st.fun.ptr(), args, nargsf, kwnames);
  // A jitted function calling itself (or another) recurses through this C
  // frame, which takes far more C stack than a Python-to-Python call: count
  // it, so that deep recursion is a RecursionError, not a stack overflow
  // (CPython's own C calls of Python code do the same).
  // Left explicitly, not by a destructor: a thread ended by CPython at
  // interpreter shutdown (pthread_exit when a waiter or the executable takes
  // the GIL back) unwinds through here with no thread state, where
  // Py_LeaveRecursiveCall would crash (3.12+); Translate does not catch it.
  if (Py_EnterRecursiveCall(" while calling a jitted function")) return nullptr;
  PyObject* out = Translate([&]() -> PyObject* { return Call(st, args, nargsf, kwnames).release().ptr(); },
                            static_cast<PyObject*>(nullptr));
  Py_LeaveRecursiveCall();
  return out;
}

extern "C" int JitFunction_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  Py_VISIT(o->dict);
  int rc = 0;
  if (JitState* st = o->state) {
    st->ForEachObject([&](nb::object& obj) {
      if (rc == 0 && obj.is_valid()) rc = visit(obj.ptr(), arg);
    });
  }
  return rc;
}

extern "C" int JitFunction_clear(PyObject* self) {
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  Py_CLEAR(o->dict);
  if (JitState* st = o->state) {
    // Moved out first: their destructors may run code that looks at us.
    std::vector<nb::object> dropped;
    st->ForEachObject([&](nb::object& obj) {
      if (obj.is_valid()) dropped.push_back(std::move(obj));
    });
    st->spec.ForgetBorrowed();  // what the spec borrowed from them must not outlive them
    // `dropped` dies here, with the state already cleared.
  }
  return 0;
}

extern "C" void JitFunction_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  PyTypeObject* tp = Py_TYPE(self);
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  if (o->weaklist) PyObject_ClearWeakRefs(self);
  Py_CLEAR(o->dict);
  if (JitState* st = o->state) {
    o->state = nullptr;
    if (st->store && st->store->is_private()) st->store->Clear();
    delete st;
  }
  tp->tp_free(self);
  Py_DECREF(tp);
}

extern "C" PyObject* JitFunction_descr_get(PyObject* self, PyObject* obj, PyObject*) {
  if (obj == nullptr || obj == Py_None) return Py_NewRef(self);
  return PyMethod_New(self, obj);
}

extern "C" PyObject* JitFunction_repr(PyObject* self) {
  JitState& st = StateOf(self);
  if (!st.fun.is_valid()) return PyUnicode_FromString("<ftjit.JitFunction (cleared)>");
  PyObject* r = PyUnicode_FromFormat("<ftjit.JitFunction of %R>", st.fun.ptr());
  if (!r) {
    // The function's own repr failed: a repr must not (it runs in error
    // messages, debuggers, logging).
    ClearErrorKeepingInterrupt();
    if (PyErr_Occurred()) return nullptr;
    r = PyUnicode_FromString("<ftjit.JitFunction>");
  }
  return r;
}

// --- methods -----------------------------------------------------------------------

extern "C" PyObject* JitFunction_cache_info(PyObject* self, PyObject*) {
  return Method(self, [](JitState& st) { return MakeCacheInfo(*st.store); });
}

extern "C" PyObject* JitFunction_cache_size(PyObject* self, PyObject*) {
  return Method(self, [](JitState& st) { return nb::int_(st.store->size()); });
}

extern "C" PyObject* JitFunction_clear_cache(PyObject* self, PyObject*) {
  return Method(self, [](JitState& st) {
    // The compiler's own caches of this function first (JAX: its trace
    // caches): a compile racing with this call then either finds its entry
    // dropped below or traces afresh, never re-caches a stale trace.
    if (nb::object hook = HookOf(st, "clear_cache"); hook.is_valid()) hook();
    st.store->Clear();
    return nb::none();
  });
}

// The entries whose compile finished, newest compile first (the payload is
// read after the latch's acquire).
std::vector<EntryPtr> ReadyNewestFirst(const JitState& st) {
  std::vector<EntryPtr> entries = st.store->Entries();
  entries.erase(std::remove_if(entries.begin(), entries.end(),
                               [](const EntryPtr& e) { return e->latch.state() != CompileLatch::State::kReady; }),
                entries.end());
  std::sort(entries.begin(), entries.end(), [](const EntryPtr& a, const EntryPtr& b) {
    return a->payload.compiled_order > b->payload.compiled_order;
  });
  return entries;
}

extern "C" PyObject* JitFunction_signatures(PyObject* self, PyObject*) {
  return Method(self, [](JitState& st) {
    PyObject* info = kSignatureInfo.Get();
    if (!info) throw nb::python_error();
    nb::list out;
    for (const EntryPtr& e : ReadyNewestFirst(st)) {
      out.append(nb::handle(info)(e->sig->ToString(st.spec), e->Hits(), e->payload.compile_seconds,
                                  e->payload.takes_leaves));
    }
    return nb::object(out);
  });
}

extern "C" PyObject* JitFunction_precompile(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                            PyObject* kwnames) {
  return Method(self, [&](JitState& st) {
    AheadOfTraffic ahead;  // not a miss to explain (ftjit/_observe.py)
    return nb::bool_(Precompile(st, args, static_cast<size_t>(nargs), kwnames));
  });
}

extern "C" PyObject* JitFunction_precompile_saved(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                                  PyObject* kwnames) {
  return Method(self, [&](JitState& st) {
    AheadOfTraffic ahead;
    return nb::int_(static_cast<int>(PrecompileSavedSpec(st, args, static_cast<size_t>(nargs), kwnames)));
  });
}

extern "C" PyObject* JitFunction_signature_record_of(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                                     PyObject* kwnames) {
  return Method(self, [&](JitState& st) -> nb::object {
    CallSignature sig;
    if (!BuildAdopted(st, args, static_cast<size_t>(nargs), kwnames, sig)) return nb::none();
    return ExportSignature(sig);
  });
}

extern "C" PyObject* JitFunction_signature_of(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                              PyObject* kwnames) {
  return Method(self, [&](JitState& st) {
    return nb::str(SignatureOf(st, args, static_cast<size_t>(nargs), kwnames).c_str());
  });
}

// lower/trace/eval_shape: the compiler's hook of that name, with the call's
// arguments (the JAX compiler's: the function's jax.jit method).
template <const char* kName>
PyObject* ThroughHook(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return Method(self, [&](JitState& st) {
    nb::object hook = HookOf(st, kName);
    if (!hook.is_valid()) {
      RaiseMessage(PyExc_TypeError, std::string(kName) + "() needs a compiler with a '" + kName +
                                        "' hook, as the JAX compiler has; the compiler of " +
                                        st.spec.fun_name + "() has none");
    }
    return nb::steal(PyObject_Vectorcall(hook.ptr(), args, static_cast<size_t>(nargs), kwnames));
  });
}
constexpr char kLower[] = "lower";
constexpr char kTrace[] = "trace";
constexpr char kEvalShape[] = "eval_shape";

// Binds a method's arguments to `names` (positionally in that order, or by
// keyword) and checks them as CPython checks a function's, in its words
// ("JitFunction.warmup() got an unexpected keyword argument 'worker'").
// out[i] is the argument bound to names[i] (borrowed), or null.
void BindArguments(const char* method, PyObject* const* args, size_t nargs, PyObject* kwnames,
                   const std::vector<const char*>& names, size_t required, std::vector<PyObject*>& out) {
  std::string where = std::string("JitFunction.") + method + "()";
  out.assign(names.size(), nullptr);
  if (nargs > names.size()) {
    RaiseMessage(PyExc_TypeError, where + " takes from " + std::to_string(required) + " to " +
                                      std::to_string(names.size()) + " positional arguments but " +
                                      std::to_string(nargs) + " were given");
  }
  for (size_t i = 0; i < nargs; ++i) out[i] = args[i];
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    size_t i = 0;
    while (i < names.size() && PyUnicode_CompareWithASCIIString(key, names[i]) != 0) ++i;
    if (i == names.size()) {
      RaiseMessage(PyExc_TypeError, where + " got an unexpected keyword argument '" +
                                        nb::cast<std::string>(nb::str(key)) + "'");
    }
    if (out[i]) RaiseMessage(PyExc_TypeError, where + " got multiple values for argument '" + names[i] + "'");
    out[i] = args[nargs + k];
  }
  for (size_t i = 0; i < required; ++i) {
    if (!out[i]) {
      RaiseMessage(PyExc_TypeError, where + " missing required argument '" + names[i] + "'");
    }
  }
}

extern "C" PyObject* JitFunction_warmup(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                        PyObject* kwnames) {
  return Method(self, [&](JitState&) {
    // ftjit._warmup.warmup(self, specs, workers=..., strict=..., progress=...):
    // the warm-up's thread pool and report are Python.
    static const std::vector<const char*> kNames{"specs", "workers", "strict", "progress"};
    std::vector<PyObject*> bound;
    BindArguments("warmup", args, static_cast<size_t>(nargs), kwnames, kNames, 1, bound);
    PyObject* warmup = kWarmup.Get();
    if (!warmup) throw nb::python_error();
    nb::object call_args = nb::make_tuple(nb::handle(self), nb::handle(bound[0]));
    nb::dict call_kwargs;
    for (size_t i = 1; i < kNames.size(); ++i) {
      if (bound[i]) call_kwargs[kNames[i]] = nb::handle(bound[i]);
    }
    return nb::steal(PyObject_Call(warmup, call_args.ptr(), call_kwargs.ptr()));
  });
}

extern "C" PyObject* JitFunction_warmup_specs(PyObject* self, PyObject*) {
  return Method(self, [&](JitState&) {
    // ftjit._specs.warmup_specs(self): rebuilt from the core's records (_signatures).
    PyObject* warmup_specs = kWarmupSpecs.Get();
    if (!warmup_specs) throw nb::python_error();
    return nb::steal(PyObject_CallOneArg(warmup_specs, self));
  });
}

extern "C" PyObject* JitFunction_store_forgetter(PyObject* self, PyObject*) {
  return Method(self, [](JitState& st) { return Forgetter(st.store); });
}

// _signatures(): the cached, compiled signatures as the core holds them
// (ftjit/_signature.py records), newest compile first.
extern "C" PyObject* JitFunction_structured_signatures(PyObject* self, PyObject*) {
  return Method(self, [](JitState& st) {
    nb::list out;
    for (const EntryPtr& e : ReadyNewestFirst(st)) out.append(ExportSignature(*e->sig));
    return nb::object(out);
  });
}

// _current_context(): the compiler's context as the core would key this
// thread's next call on it (None without one, or when the call would take
// the fallback).
extern "C" PyObject* JitFunction_current_context(PyObject* self, PyObject*) {
  return Method(self, [](JitState& st) {
    CallSignature sig;
    if (!BuildAdopted(st, nullptr, 0, nullptr, sig) || !sig.context.is_valid()) return nb::object(nb::none());
    return nb::borrow(sig.context.ptr());
  });
}

// Pickling by reference when this very object is reachable by its module
// and qualified name (the decorated form, @ftjit.jit on a module-level
// function), as functools.lru_cache wrappers are; otherwise by value: the
// wrapped function (itself by reference) and the options, rebuilt by
// ftjit.jit on unpickling.
extern "C" PyObject* JitFunction_reduce(PyObject* self, PyObject*) {
  JitState& st = StateOf(self);
  if (!st.fun.is_valid()) {
    PyErr_SetString(PyExc_TypeError, "cannot pickle a cleared jitted function");
    return nullptr;
  }
  return Translate([&]() -> PyObject* {
    nb::handle me(self);
    nb::object name = nb::getattr(me, "__qualname__", nb::none());
    nb::object module_name = nb::getattr(me, "__module__", nb::none());
    nb::object modules = nb::module_::import_("sys").attr("modules");
    nb::object module = module_name.is_none() ? nb::none() : modules.attr("get")(module_name);
    if (nb::isinstance<nb::str>(name) && !module.is_none() &&
        nb::cast<std::string>(name).find("<locals>") == std::string::npos) {
      nb::object found = module;
      for (nb::handle part : name.attr("split")(".")) {
        found = nb::getattr(found, part, nb::none());
      }
      if (found.is(me)) return name.release().ptr();
    }
    PyObject* rebuild = kRebuild.Get();
    if (!rebuild) throw nb::python_error();
    return Py_BuildValue("O(OO)", rebuild, st.fun.ptr(), st.pickle_options.ptr());
  }, nullptr);
}

nb::object FunctionName(nb::handle name) {
  nb::dict d;
  d["function_name"] = name;
  return std::move(d);
}

// What jax.jit's __getstate__() reports of the function: its name, through
// unnamed functools.partial layers.
extern "C" PyObject* JitFunction_getstate(PyObject* self, PyObject*) {
  return Method(self, [](JitState& st) {
    nb::object fun = st.fun;
    PyObject* partial = kPartial.Get();
    if (!partial) throw nb::python_error();
    for (;;) {
      nb::object name = nb::getattr(fun, "__name__", nb::none());
      if (nb::isinstance<nb::str>(name)) return FunctionName(name);
      if (PyObject_IsInstance(fun.ptr(), partial) != 1) break;
      fun = fun.attr("func");
    }
    PyErr_Clear();
    return FunctionName(nb::str("<unnamed function>"));
  });
}

// A jitted function is immutable: copies are itself, as for Python functions.
extern "C" PyObject* JitFunction_copy(PyObject* self, PyObject*) { return Py_NewRef(self); }
extern "C" PyObject* JitFunction_deepcopy(PyObject* self, PyObject*) { return Py_NewRef(self); }

// JitFunction[P, R] for type checkers (see _core.pyi); subscriptable at run time.
extern "C" PyObject* JitFunction_class_getitem(PyObject* cls, PyObject* arg) { return Py_GenericAlias(cls, arg); }

extern "C" PyObject* JitFunction_get_fun(PyObject* self, void*) {
  JitState& st = StateOf(self);
  return Py_NewRef(st.fun.is_valid() ? st.fun.ptr() : Py_None);
}

extern "C" PyObject* JitFunction_get_compiler(PyObject* self, void*) {
  JitState& st = StateOf(self);
  return Py_NewRef(st.compile.is_valid() ? st.compile.ptr() : Py_None);
}

extern "C" PyObject* JitFunction_get_hooks(PyObject* self, void*) {
  JitState& st = StateOf(self);
  return Py_NewRef(st.hooks.is_valid() ? st.hooks.ptr() : Py_None);
}

extern "C" PyObject* JitFunction_get_cache(PyObject* self, void*) {
  JitState& st = StateOf(self);
  return Py_NewRef(st.cache.is_valid() ? st.cache.ptr() : Py_None);
}

// A jitted function's __globals__: the namespace of the module that defines
// ftjit's Python API (ftjit._jit), as a Python wrapper function of that
// module would have. Tools that recognise JAX-wrapped functions by the
// api_boundary their wrappers are defined with (chex's is_traceable) then
// see a jitted function for what it is.
extern "C" PyObject* JitFunction_get_globals(PyObject*, void*) {
  PyObject* globals = kJitModule.Get();
  return globals ? Py_NewRef(globals) : nullptr;
}

template <auto Fn>
PyCFunction Fast() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Fn));
}

PyMethodDef kMethods[] = {
    {"cache_info", JitFunction_cache_info, METH_NOARGS,
     "cache_info() -> CacheInfo\n\nA snapshot of this function's counters (shared by every\n"
     "wrapper of the same function and options in the same cache). Each\nfield is read "
     "atomically, the tuple as a whole is not: under\nconcurrent calls it may be stale."},
    {"clear_cache", JitFunction_clear_cache, METH_NOARGS,
     "clear_cache() -> None\n\nDrops this function's compiled entries; the next call of each\n"
     "signature compiles again. With the JAX compiler, also clears what jax.jit's\n"
     "clear_cache() clears (the function's trace caches). Thread-safe; compiles in\n"
     "progress finish and serve their waiters, but their entries are not kept."},
    {"signatures", JitFunction_signatures, METH_NOARGS,
     "signatures() -> list[SignatureInfo]\n\nThe compiled signatures now cached for this function, "
     "readable, with\nhits and compile time; newest compile first (hits do not reorder\nthem). "
     "A snapshot; entries may be added or evicted concurrently."},
    {"precompile", Fast<JitFunction_precompile>(), METH_FASTCALL | METH_KEYWORDS,
     "precompile(*args, **kwargs) -> bool\n\nCompiles the signature of these arguments into the "
     "cache, executing\nnothing. Arguments may be concrete values or jax.ShapeDtypeStruct\n"
     "(anything with .dtype/.shape). True if this call compiled it, False\nif it was cached "
     "already (or compiled meanwhile by another thread,\nwhich this call then waited for). "
     "Thread-safe; compile-once holds. A\ncompile asked for ahead of traffic is not logged as a "
     "miss."},
    {"lower", Fast<ThroughHook<kLower>>(), METH_FASTCALL | METH_KEYWORDS,
     "lower(*args, **kwargs) -> jax.stages.Lowered for these arguments\n(the compiler's 'lower' "
     "hook: the JAX compiler's). Thread-safe; does\nnot touch the cache."},
    {"trace", Fast<ThroughHook<kTrace>>(), METH_FASTCALL | METH_KEYWORDS,
     "trace(*args, **kwargs) -> jax.stages.Traced for these arguments (the\ncompiler's 'trace' "
     "hook). Does not touch the cache."},
    {"eval_shape", Fast<ThroughHook<kEvalShape>>(), METH_FASTCALL | METH_KEYWORDS,
     "eval_shape(*args, **kwargs) -> output shapes and dtypes\n(jax.ShapeDtypeStruct pytree) "
     "without compiling (the compiler's\n'eval_shape' hook)."},
    {"warmup", Fast<JitFunction_warmup>(), METH_FASTCALL | METH_KEYWORDS,
     "warmup(specs, workers=1, strict=False, progress=None) -> WarmupReport\n\nCompiles a list "
     "of signatures in `workers` threads (see ftjit._warmup)."},
    {"warmup_specs", JitFunction_warmup_specs, METH_NOARGS,
     "warmup_specs() -> SpecList\n\nThe specs of the signatures now cached, newest first, in the form\n"
     "warmup() takes (JAX: jax.ShapeDtypeStruct leaves with dtype, shape, weak\ntype and placement; static "
     "values as they are). Warming up from them\nmakes exactly these signatures. One that cannot be rebuilt (a "
     "node no hook\nrebuilds, another context than this thread's) is left out and listed in\nthe "
     "result's left_out. A snapshot (see ftjit._specs)."},
    {"_cache_size", JitFunction_cache_size, METH_NOARGS,
     "Number of signatures of this function in the cache now (jax.jit's _cache_size)."},
    {"_signatures", JitFunction_structured_signatures, METH_NOARGS,
     "The cached, compiled signatures as ftjit._signature.Signature records, newest compile first."},
    {"_current_context", JitFunction_current_context, METH_NOARGS,
     "The compiler's context as the core would key this thread's next call (None without one)."},
    {"_precompile_saved", Fast<JitFunction_precompile_saved>(), METH_FASTCALL | METH_KEYWORDS,
     "_precompile_saved(*args, **kwargs) -> int\n\nA saved spec's warm-up (ftjit.SavedSpec): compiles this "
     "signature provisionally, not counted against max_signatures until a call or precompile uses it, and only "
     "while the counted and provisional signatures leave room under max_signatures. 1: compiled; 0: cached "
     "already; -1: no room."},
    {"_signature_record_of", Fast<JitFunction_signature_record_of>(), METH_FASTCALL | METH_KEYWORDS,
     "The signature these arguments (or specs) would have, as an ftjit._signature.Signature record (None: "
     "the call would take the compiler's fallback)."},
    {"_signature_of", Fast<JitFunction_signature_of>(), METH_FASTCALL | METH_KEYWORDS,
     "_signature_of(*args, **kwargs) -> str: the readable signature these arguments have."},
    {"_store_forgetter", JitFunction_store_forgetter, METH_NOARGS,
     "A callable (any arguments) that drops this function's entries from its cache, as when\n"
     "the function dies; holds them only weakly."},
    {"__reduce__", JitFunction_reduce, METH_NOARGS, nullptr},
    {"__getstate__", JitFunction_getstate, METH_NOARGS,
     "What jax.jit's __getstate__() reports of the function (its name)."},
    {"__copy__", JitFunction_copy, METH_NOARGS, nullptr},
    {"__deepcopy__", JitFunction_deepcopy, METH_O, nullptr},
    {"__class_getitem__", JitFunction_class_getitem, METH_O | METH_CLASS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef kMembers[] = {
    {"__vectorcalloffset__", T_PYSSIZET, static_cast<Py_ssize_t>(offsetof(JitFunctionObject, vectorcall)),
     READONLY, nullptr},
    {"__dictoffset__", T_PYSSIZET, static_cast<Py_ssize_t>(offsetof(JitFunctionObject, dict)), READONLY,
     nullptr},
    {"__weaklistoffset__", T_PYSSIZET, static_cast<Py_ssize_t>(offsetof(JitFunctionObject, weaklist)),
     READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyGetSetDef kGetSet[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {"__globals__", JitFunction_get_globals, nullptr, "The namespace of ftjit's Python API module.",
     nullptr},
    {"_fun", JitFunction_get_fun, nullptr, "The wrapped function (fixed).", nullptr},
    {"_compiler", JitFunction_get_compiler, nullptr, "compile(fun, args, kwargs), as the core calls it (fixed).",
     nullptr},
    {"_hooks", JitFunction_get_hooks, nullptr, "The compiler's ftjit.CompilerHooks (fixed).", nullptr},
    {"_cache", JitFunction_get_cache, nullptr, "The FunctionCache (fixed).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot kSlots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(JitFunction_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(JitFunction_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(JitFunction_clear)},
    {Py_tp_descr_get, reinterpret_cast<void*>(JitFunction_descr_get)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_repr, reinterpret_cast<void*>(JitFunction_repr)},
    {Py_tp_methods, reinterpret_cast<void*>(kMethods)},
    {Py_tp_members, reinterpret_cast<void*>(kMembers)},
    {Py_tp_getset, reinterpret_cast<void*>(kGetSet)},
    {Py_tp_doc, const_cast<char*>("A jitted function: computes each call's signature, compiles it once\n"
                                  "(other threads wait with the GIL released) and calls the executable.\n"
                                  "Create with ftjit.jit().")},
    {0, nullptr},
};

}  // namespace

PyObject* NewJitFunction(std::unique_ptr<JitState> st) {
  PyTypeObject* type = reinterpret_cast<PyTypeObject*>(g_jit_type);
  PyObject* self = type->tp_alloc(type, 0);
  if (!self) return nullptr;
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  o->vectorcall = JitFunction_vectorcall;
  o->dict = nullptr;
  o->weaklist = nullptr;
  o->state = st.release();
  return self;
}

void RegisterJitFunction(nb::module_& m) {
  std::string name = nb::cast<std::string>(m.attr("__name__")) + ".JitFunction";
  PyType_Spec spec = {
      name.c_str(),
      static_cast<int>(sizeof(JitFunctionObject)),
      0,
      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
          Py_TPFLAGS_DISALLOW_INSTANTIATION,  // only ftjit.jit() makes them (a state-less one would crash)
      kSlots,
  };
  g_jit_type = PyType_FromSpec(&spec);
  if (!g_jit_type) throw nb::python_error();
  m.attr("JitFunction") = nb::handle(g_jit_type);

  RegisterConstruction(m);
  m.def("_after_fork_in_child", &AfterForkInChild,
        "For os.register_at_fork(after_in_child=...): compiles in flight in the parent's other "
        "threads are compiled afresh in the child instead of waited for.");
  m.def(
      "_debug_hold_locks",
      [](nb::handle jf, double seconds) {
        if (!PyObject_TypeCheck(jf.ptr(), reinterpret_cast<PyTypeObject*>(g_jit_type))) {
          throw nb::type_error("_debug_hold_locks needs a JitFunction");
        }
        std::shared_ptr<FunctionStore> fs = StateOf(jf.ptr()).store;
        fs->LockAllForTest(true);
        LockSignatureLocksForTest(true);
        {
          nb::gil_scoped_release detached;  // held while detached, as a parked waiter holds them
          std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        }
        LockSignatureLocksForTest(false);
        fs->LockAllForTest(false);
      },
      nb::arg("jf"), nb::arg("seconds"),
      "Tests only: holds every lock a call of `jf` may take for `seconds`, detached from the\n"
      "interpreter, as a thread lost at fork (a parked waiter a PyMutex was handed to) holds them.");
  m.def("_disable_jit_enter", []() { ++JitDisabledDepth(); });
  m.def("_disable_jit_exit", []() {
    if (JitDisabledDepth() > 0) --JitDisabledDepth();
  });
  m.def("_jit_disabled", []() { return JitDisabledDepth() > 0; });
  m.def("_waiting_threads", &WaitingThreads, "Threads now registered in the wait-for graph (diagnostics).");
  m.def("_ahead_enter", []() { ++AheadDepth(); });
  m.def("_ahead_exit", []() {
    if (AheadDepth() > 0) --AheadDepth();
  });
  m.def("_compiling_ahead", []() { return AheadDepth() > 0; },
        "Whether this thread's compiles are asked for ahead of traffic (precompile, warmup).");
  m.def("_set_explain_misses", [](bool on) { ExplainMisses().store(on, std::memory_order_relaxed); },
        "The switch of miss explanations for functions jitted with explain_misses=None.");
  m.def("_explain_misses", []() { return ExplainMisses().load(std::memory_order_relaxed); });
}

}  // namespace ftjit
