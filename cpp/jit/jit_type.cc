// ftjit: the JitFunction type: a hand-built heap type whose call, GC
// support, descriptor and repr are C slots, and whose every method and
// property is a nanobind function set on it (one declaration gives the
// parser, the docstring and the stub's signature, as jaxlib's PjitFunction).
//
// Errors cross from C++ into Python at one boundary: a slot runs its body
// through Translated(), and nanobind translates what a method throws, alike.
//
//   | state      | protection                                               |
//   |------------|----------------------------------------------------------|
//   | g_jit_type | set once at module init                                  |
//   | JitState   | see JitState                                             |
//
// Lock order: takes no lock itself. Only the test hook _debug_hold_locks
// holds several: FunctionStore::LockAllForTest's, then
// LockSignatureLocksForTest's.
#include "jit/jit_type.h"

#include <Python.h>
#include <structmember.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nanobind/stl/string.h>
#include <nanobind/typing.h>

#include "jit/jit_state.h"
#include "primitives/thread_stack.h"
#include "pyutil/collaborators.h"
#include "pyutil/errors.h"
#include "signature/signature.h"
#include "signature/signature_key.h"
#include "store/function_cache.h"

namespace ftjit {

namespace {

PyObject* g_jit_type = nullptr;  // set once at module init

// A method's `self`: nanobind checks its type before the body runs
// (JitFunction.cache_info(42) is a TypeError), as CPython's methods do.
bool IsJitFunction(PyObject* o) { return PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject*>(g_jit_type)); }
class JitSelf : public nb::object {
  NB_OBJECT_DEFAULT(JitSelf, nb::object, "JitFunction", IsJitFunction)
};

// A parameter or result nanobind passes on unchecked (the Python code it
// goes to checks it), named `kType` in the signature and so in the stub.
bool AnyObject(PyObject*) { return true; }
template <const auto& kType>
class Annotated : public nb::object {
  NB_OBJECT_DEFAULT(Annotated, nb::object, kType, AnyObject)
};

// A method's body on the state of `self` (RuntimeError once the GC cleared
// it); nanobind translates what it throws.
template <class Result = nb::object, class Body>
Result Method(const JitSelf& self, Body&& body) {
  return LeakingOnForcedUnwind(
      [&] {
        JitState& st = StateOf(self.ptr());
        CheckNotCleared(st);
        return nb::steal<Result>(nb::object(body(st)).release());
      },
      [] { ParkThreadEndedAtShutdown(); });
}

// The compiler's method hook of that name, or null (see JitState::MethodHook).
nb::object HookOf(const JitState& st, const char* name) { return st.MethodHook(name); }

// --- the type's slots ------------------------------------------------------------

// A recursion through jitted functions that nears the end of the thread's
// C stack: RecursionError, raised where ThreadStack::kMargin is still left.
// One level of it (this slot, the call's frames, the executable's, the eval
// loop's, up to the next jitted call) took 2.5-5 KiB here (x86_64: GCC 12,
// CPython 3.11 and 3.13t); the rest of the margin covers raising and
// unwinding, and code the deepest level runs that is not a jitted call (a
// compiler, a hook).
NB_NOINLINE PyObject* RaiseStackExhausted() {
  size_t size = ThreadStack::Size();
  PyErr_Format(PyExc_RecursionError,
               "maximum recursion depth exceeded while calling a jitted function: less than %zu KiB of this "
               "thread's %zu KiB C stack is left (a recursion through jitted functions; a thread made after "
               "threading.stack_size(n) with a larger n has room for more levels)",
               (ThreadStack::Limit() - ThreadStack::Low()) / 1024, size / 1024);
  return nullptr;
}

extern "C" PyObject* JitFunction_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                                            PyObject* kwnames) {
  JitState& st = StateOf(self);
  // Recursion through jitted functions stacks this C frame, far larger than
  // a Python-to-Python call's: counted, so that it ends in RecursionError,
  // not a stack overflow. Left explicitly, not by a destructor: a thread
  // ended by CPython at interpreter shutdown (pthread_exit when a waiter or
  // the executable takes the GIL back) unwinds through here with no thread
  // state, where Py_LeaveRecursiveCall would crash (3.12+); Translated does
  // not catch it.
  if (Py_EnterRecursiveCall(" while calling a jitted function")) return nullptr;
  // The count alone does not bound the C stack: a raised limit or a small
  // thread stack allows more levels than the stack holds (CPython 3.14
  // checks the stack itself; 3.11-3.13 do not). So the headroom is checked
  // too: one level of a recursion through a jitted function, and raising
  // out of it, fit in the margin it keeps.
  if (ThreadStack::Exhausted()) {
    Py_LeaveRecursiveCall();
    return RaiseStackExhausted();
  }
  PyObject* out = Translated(
      [&]() -> PyObject* {
        CheckNotCleared(st);
        if (JitDisabledDepth() > 0) return StealOrThrow(PyObject_Vectorcall(st.fun.ptr(), args, nargsf, kwnames)).release().ptr();
        return RunCall(st, CallArgs(args, nargsf, kwnames)).release().ptr();
      },
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

// __reduce__ (see its docstring): the qualified name, as functools.lru_cache
// wrappers pickle, or (ftjit._jit._rebuild, (fun, pickle_options)).
nb::object Reduce(nb::handle me, const JitState& st) {
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
    if (found.is(me)) return name;
  }
  PyObject* rebuild = kRebuild.Get();
  return nb::make_tuple(nb::handle(rebuild), nb::make_tuple(st.fun, st.pickle_options));
}

nb::object FunctionName(nb::handle name) {
  nb::dict d;
  d["function_name"] = name;
  return std::move(d);
}

// What jax.jit's __getstate__() reports of the function: its name, through
// unnamed functools.partial layers.
nb::object GetState(const JitState& st) {
  nb::object fun = st.fun;
  PyObject* partial = kPartial.Get();
  for (;;) {
    nb::object name = nb::getattr(fun, "__name__", nb::none());
    if (nb::isinstance<nb::str>(name)) return FunctionName(name);
    if (PyObject_IsInstance(fun.ptr(), partial) != 1) break;
    fun = fun.attr("func");
  }
  PyErr_Clear();  // an isinstance that raised: unnamed, as any other
  return FunctionName(nb::str("<unnamed function>"));
}

// warmup()'s types, as the stub names them (the Python warm-up checks the values).
constexpr char kSpecsType[] = "collections.abc.Iterable[typing.Any]";
constexpr char kProgressType[] = "bool | typing.TextIO";
constexpr char kWarmupReportType[] = "WarmupReport";

// JitFunction's methods and properties, each declared once: nanobind parses
// its arguments, stubgen renders its signature and docstring into _core.pyi.
// nb::sig spells what C++ types cannot (the ParamSpec _P, whose
// `<module>._P.args` stubgen shortens to `_P.args`; JitFunction[_P, _R]).
// The Python classes the signatures name (CacheInfo, ...) are imported by
// core_stub_patterns.txt: ftjit cannot be imported where the stub is made.
// One function per concern below, each with a Definer.
struct Definer {
  Definer(nb::handle t, const std::string& module)
      : type(t), pargs("*args: " + module + "._P.args, **kwargs: " + module + "._P.kwargs") {}
  nb::handle type;
  const std::string pargs;  // the call's parameters, as the signatures spell them

  template <class F>
  void Method(F&& fn, const std::string& sig, const char* doc) const {
    nb::cpp_function_def(std::forward<F>(fn), nb::scope(type), nb::name(NameIn(sig).c_str()), nb::sig(sig.c_str()),
                         nb::is_method(), doc);
  }
  template <class F>
  void Property(F&& getter, const std::string& sig, const char* doc) const {
    std::string name = NameIn(sig);
    nb::object fget = nb::cpp_function(std::forward<F>(getter), nb::name(name.c_str()), nb::sig(sig.c_str()),
                                       nb::is_method(), doc);
    nb::setattr(type, name.c_str(), nb::handle(reinterpret_cast<PyObject*>(&PyProperty_Type))(fget));
  }
  // nanobind names a function with a custom signature after it (`def
  // name(...`), but gives it a __name__ and __qualname__ only when nb::name
  // comes first (the signature then replaces its text).
  static std::string NameIn(const std::string& sig) { return sig.substr(4, sig.find('(') - 4); }
};

// The cache: counters, clearing, what it holds.
void DefineCacheMethods(const Definer& d) {
  d.Method([](const JitSelf& self) { return Method(self, [](JitState& st) { return MakeCacheInfo(*st.store); }); },
           "def cache_info(self) -> CacheInfo",
           "A snapshot of this function's counters (shared by every wrapper of the\n"
           "same function and options in the same cache). Each field is read\n"
           "atomically, the tuple as a whole is not: under concurrent calls it may\n"
           "be stale.");
  d.Method(
      [](const JitSelf& self) {
        return Method(self, [](JitState& st) {
          // The compiler's own caches of this function first (JAX: its trace
          // caches): a compile racing with this call then either finds its entry
          // dropped below or traces afresh, never re-caches a stale trace.
          if (nb::object hook = HookOf(st, "clear_cache"); hook.is_valid()) hook();
          st.store->Clear();
          return nb::none();
        });
      },
      "def clear_cache(self) -> None",
      "Drops this function's compiled entries; the next call of each\n"
      "signature compiles again. With the JAX compiler, also clears what\n"
      "jax.jit's clear_cache() clears (the function's trace caches).\n"
      "Thread-safe; compiles in progress finish and serve their waiters, but\n"
      "their entries are not kept.");
  d.Method(
      [](const JitSelf& self) {
        return Method(self, [](JitState& st) {
          PyObject* info = kSignatureInfo.Get();
          nb::list out;
          for (const EntryPtr& e : ReadyNewestFirst(st)) {
            out.append(nb::handle(info)(e->sig->ToString(st.spec), e->Hits(), e->payload.compile_seconds,
                                        e->payload.takes_leaves));
          }
          return out;
        });
      },
      "def signatures(self) -> list[SignatureInfo]",
      "The compiled signatures now cached for this function, readable, with\n"
      "hits and compile time; newest compile first (hits do not reorder\n"
      "them). A snapshot; entries may be added or evicted concurrently.");
  d.Method([](const JitSelf& self) { return Method(self, [](JitState& st) { return nb::int_(st.store->size()); }); },
           "def _cache_size(self) -> int",
           "Number of signatures of this function in the cache now (jax.jit's\n"
           "_cache_size). A snapshot.");
  d.Method(
      [](const JitSelf& self) {
        return Method(self, [](JitState& st) {
          nb::list out;
          for (const EntryPtr& e : ReadyNewestFirst(st)) out.append(ExportSignature(*e->sig, st.spec));
          return out;
        });
      },
      "def _signatures(self) -> list[typing.Any]",
      "The cached, compiled signatures as ftjit._signature.Signature records,\n"
      "newest compile first. A snapshot.");
  d.Method([](const JitSelf& self) { return Method(self, [](JitState& st) { return Forgetter(st.store); }); },
           "def _store_forgetter(self) -> typing.Any",
           "A callable (any arguments) that drops this function's entries from its\n"
           "cache, as when the function dies; holds them only weakly.");
}

// Compiles asked for ahead of traffic: precompile, warm-up, saved specs.
void DefineAheadOfTraffic(const Definer& d) {
  d.Method(
      [](const JitSelf& self, nb::args args, nb::kwargs kwargs) {
        return Method(self, [&](JitState& st) {
          AheadOfTraffic ahead;  // not a miss to explain
          VectorcallArgs call(args, kwargs);
          return nb::bool_(Precompile(st, CallArgs(call)));
        });
      },
      "def precompile(self, " + d.pargs + ") -> bool",
      "Compiles the signature of these arguments into the cache, executing\n"
      "nothing. Arguments may be concrete values or jax.ShapeDtypeStruct\n"
      "(anything with .dtype/.shape). True if this call compiled it, False if\n"
      "it was cached already (or compiled meanwhile by another thread, which\n"
      "this call then waited for). Thread-safe; compile-once holds. A compile\n"
      "asked for ahead of traffic is not logged as a miss.");
  nb::cpp_function_def(
      [](const JitSelf& self, Annotated<kSpecsType> specs, nb::typed<nb::object, int> workers,
         nb::typed<nb::object, bool> strict, Annotated<kProgressType> progress) {
        return Method<Annotated<kWarmupReportType>>(self, [&](JitState&) {
          // The warm-up's thread pool and report are Python (ftjit._warmup.warmup).
          PyObject* warmup = kWarmup.Get();
          return nb::handle(warmup)(self, specs, workers, strict, progress);
        });
      },
      nb::scope(d.type), nb::name("warmup"), nb::is_method(), nb::arg("specs"), nb::arg("workers") = 1,
      nb::arg("strict") = false, nb::arg("progress").none() = nb::none(),
      "Compiles each spec's signature into this function's cache, `workers`\n"
      "at a time (specs: tuples of positional arguments, ftjit.Spec or\n"
      "ftjit.SavedSpec; see ftjit._warmup.warmup). Errors are collected in the\n"
      "WarmupReport; with strict=True the first is raised once all specs ran.\n"
      "`progress` draws a bar (None: on stderr when it is a terminal).\n"
      "Thread-safe; compile-once holds against concurrent calls.");
  d.Method(
      [](const JitSelf& self) {
        return Method(self, [&](JitState&) {
          // ftjit._specs.warmup_specs(self): rebuilt from the core's records (_signatures).
          PyObject* warmup_specs = kWarmupSpecs.Get();
          return nb::handle(warmup_specs)(self);
        });
      },
      "def warmup_specs(self) -> SpecList",
      "The specs of the signatures now cached, newest first, in the form\n"
      "warmup() takes (JAX: jax.ShapeDtypeStruct leaves with dtype, shape,\n"
      "weak type and placement; static values as they are). Warming up from\n"
      "them makes exactly these signatures. One that cannot be rebuilt (a node\n"
      "no hook rebuilds, another context than this thread's) is left out and\n"
      "listed in the result's left_out. A snapshot (see ftjit._specs).");
  d.Method(
      [](const JitSelf& self, nb::args args, nb::kwargs kwargs) {
        return Method(self, [&](JitState& st) {
          AheadOfTraffic ahead;
          VectorcallArgs call(args, kwargs);
          return nb::int_(static_cast<int>(PrecompileSavedSpec(st, CallArgs(call))));
        });
      },
      "def _precompile_saved(self, *args: typing.Any, **kwargs: typing.Any) -> int",
      "A saved spec's warm-up (ftjit.SavedSpec): compiles this signature\n"
      "provisionally, not counted against max_signatures until a call or\n"
      "precompile uses it, and only while the counted and provisional\n"
      "signatures leave room under max_signatures. 1: compiled; 0: cached\n"
      "already; -1: no room.");
}

// The compiler's own methods: lower, trace, eval_shape.
void DefineHookMethods(const Definer& d) {
  // lower/trace/eval_shape: the compiler's hook of that name, with the
  // call's arguments (the JAX compiler's: the function's jax.jit method).
  auto through_hook = [](const char* name) {
    return [name](const JitSelf& self, nb::args args, nb::kwargs kwargs) {
      return Method(self, [&](JitState& st) {
        nb::object hook = HookOf(st, name);
        if (!hook.is_valid()) {
          RaiseMessage(PyExc_TypeError, std::string(name) + "() needs a compiler with a '" + name +
                                            "' hook, as the JAX compiler has; the compiler of " +
                                            st.spec.fun_name + "() has none");
        }
        return hook(*args, **kwargs);
      });
    };
  };
  d.Method(through_hook("lower"), "def lower(self, " + d.pargs + ") -> typing.Any",
           "jax.stages.Lowered for these arguments (the compiler's 'lower' hook:\n"
           "the JAX compiler's). Thread-safe; does not touch the cache.");
  d.Method(through_hook("trace"), "def trace(self, " + d.pargs + ") -> typing.Any",
           "jax.stages.Traced for these arguments (the compiler's 'trace' hook).\n"
           "Does not touch the cache.");
  d.Method(through_hook("eval_shape"), "def eval_shape(self, " + d.pargs + ") -> typing.Any",
           "Output shapes and dtypes (a jax.ShapeDtypeStruct pytree) without\n"
           "compiling (the compiler's 'eval_shape' hook).");
}

// The signature a call would have (tests, warm-up, explanations).
void DefineSignatureQueries(const Definer& d) {
  d.Method(
      [](const JitSelf& self) {
        return Method(self, [](JitState& st) -> nb::object {
          CallArgs none(nullptr, 0, nullptr);
          Call c(st, none);
          if (!BuildAdopted(c, /*allow_specs=*/true) || !c.sig.context.is_valid()) return nb::none();
          return nb::borrow(c.sig.context.ptr());
        });
      },
      "def _current_context(self) -> typing.Any",
      "The compiler's context as the core would key this thread's next call\n"
      "on it (None without one, or when the call would take the fallback).");
  d.Method(
      [](const JitSelf& self, nb::args args, nb::kwargs kwargs) {
        return Method(self, [&](JitState& st) -> nb::object {
          VectorcallArgs call(args, kwargs);
          CallArgs view(call);
          Call c(st, view);
          if (!BuildAdopted(c, /*allow_specs=*/true)) return nb::none();
          return ExportSignature(c.sig, st.spec);
        });
      },
      "def _signature_record_of(self, *args: typing.Any, **kwargs: typing.Any) -> typing.Any",
      "The signature these arguments (or specs) would have, as an\n"
      "ftjit._signature.Signature record (None: the call would take the\n"
      "compiler's fallback).");
  d.Method(
      [](const JitSelf& self, nb::args args, nb::kwargs kwargs) {
        return Method(self, [&](JitState& st) {
          VectorcallArgs call(args, kwargs);
          CallArgs view(call);
          Call c(st, view);
          return nb::str((BuildAdopted(c, true) ? c.sig.ToString(st.spec) : st.spec.fun_name + "(<traced>)").c_str());
        });
      },
      "def _signature_of(self, *args: typing.Any, **kwargs: typing.Any) -> str",
      "The readable signature these arguments would have (f(<traced>): the fallback's).");
  d.Method(
      [](const JitSelf& self) {
        return Method(self, [&](JitState& st) {
          nb::list out;
          for (const AvalType& t : st.spec.aval_types) out.append(t.aval.field.direct());
          return nb::tuple(out);
        });
      },
      "def _avals_read_in_place(self) -> tuple[bool, ...]",
      "Tests and bench: for each of the compiler's aval types, whether the core has\n"
      "learned the slot that holds an instance's aval (CompilerHooks.aval_fields):\n"
      "read there on a GIL build, compared with the thread's recent avals on a\n"
      "free-threaded one.");
  d.Method(
      [](const JitSelf& self) {
        return Method(self, [&](JitState& st) {
          nb::dict out;
          out["enabled"] = st.thread_call.is_valid();
          const ThreadCall* tc = st.store->thread_calls().Find(ThisThread().index);
          out["made"] = tc && tc->call.is_valid();
          out["calls"] = tc ? tc->calls.load(std::memory_order_relaxed) : 0;
          out["to_core"] = tc ? tc->to_core.load(std::memory_order_relaxed) : 0;
          out["drops"] = tc ? tc->drops : 0;
          out["bypass"] = tc && tc->bypass;
          out["call"] = tc && tc->call.is_valid() ? tc->call : nb::none();
          return out;
        });
      },
      "def _thread_call_state(self) -> dict[str, typing.Any]",
      "Tests and bench: this thread's call object of the function (CompilerHooks.thread_call): whether the\n"
      "function has one ('enabled'), whether this thread's is made now, its calls, those that reached the\n"
      "core ('to_core'), its drops, whether this thread bypasses it, and the object.");
  d.Method(
      [](const JitSelf& self, int n, nb::args args, nb::kwargs kwargs) {
        if (n < 1) throw nb::value_error("n must be >= 1");
        return Method(self, [&](JitState& st) {
          VectorcallArgs call(args, kwargs);
          return HitStageNs(st, CallArgs(call), n);
        });
      },
      "def _hit_stage_ns(self, n: int, /, *args: typing.Any, **kwargs: typing.Any) -> tuple[float, float]",
      "bench's stage table: mean ns of these cached arguments' signature build and probe.");
  d.Method(
      [](const JitSelf& self, nb::args args, nb::kwargs kwargs) {
        return Method(self, [&](JitState& st) -> nb::object {
          VectorcallArgs call(args, kwargs);
          CallArgs view(call);
          Call c(st, view);
          c.keep_leaves = true;
          if (!BuildAdopted(c)) return nb::none();
          nb::object leaves = StealOrThrow(PyTuple_New(static_cast<Py_ssize_t>(c.leaves.size())));
          for (size_t i = 0; i < c.leaves.size(); ++i) PyTuple_SET_ITEM(leaves.ptr(), i, Py_NewRef(c.leaves[i]));
          return nb::make_tuple(SignatureKeyOf(std::move(c.sig)), leaves);
        });
      },
      "def _batch_key(self, *args: typing.Any, **kwargs: typing.Any) -> tuple[typing.Any, tuple[typing.Any, ...]] "
      "| None",
      "(key, leaves) of a call of these arguments: its whole signature as a hashable key (equal\n"
      "keys: one compiled program) and its dynamic leaves in flatten order (ftjit.batched);\n"
      "None when the call would take the compiler's fallback.");
}

// Python's object protocol: pickling, copies, generic subscription.
void DefineObjectProtocol(const Definer& d) {
  d.Method(
      [](const JitSelf& self) {
        if (!StateOf(self.ptr()).fun.is_valid()) throw nb::type_error("cannot pickle a cleared jitted function");
        return Method(self, [&](JitState& st) { return Reduce(self, st); });
      },
      "def __reduce__(self) -> str | tuple[typing.Any, ...]",
      "Pickles by reference when this object is reachable by its module and\n"
      "qualified name (@ftjit.jit on a module-level function), else by value:\n"
      "the wrapped function and the options, which ftjit.jit rebuilds.");
  d.Method([](const JitSelf& self) { return Method(self, [](JitState& st) { return GetState(st); }); },
           "def __getstate__(self) -> dict[str, str]",
           "What jax.jit's __getstate__() reports of the function (its name).");
  // Copies are the function itself, as for Python functions.
  d.Method([](const JitSelf& self) { return self; }, "def __copy__(self) -> JitFunction[_P, _R]",
           "Itself: a jitted function is immutable.");
  d.Method([](const JitSelf& self, nb::handle) { return self; },
           "def __deepcopy__(self, memo: dict[int, typing.Any], /) -> JitFunction[_P, _R]",
           "Itself: a jitted function is immutable.");
  // JitFunction[P, R] for type checkers (the stub's Generic[_P, _R]);
  // subscriptable at run time, as a Python generic class is.
  nb::setattr(d.type, "__class_getitem__",
              nb::handle(reinterpret_cast<PyObject*>(&PyClassMethod_Type))(
                  nb::handle(reinterpret_cast<PyObject*>(&Py_GenericAliasType))));
}

// Properties, fixed once made (None once the GC cleared the function).
void DefineProperties(const Definer& d) {
  auto field = [](nb::object JitState::*member) {
    return [member](const JitSelf& self) -> nb::object {
      const nb::object& value = StateOf(self.ptr()).*member;
      return value.is_valid() ? value : nb::none();
    };
  };
  d.Property(field(&JitState::fun), "def _fun(self) -> collections.abc.Callable[_P, _R]",
             "The wrapped function (fixed).");
  d.Property(field(&JitState::compile), "def _compiler(self) -> collections.abc.Callable[..., typing.Any]",
             "compile(fun, args, kwargs), as the core calls it (fixed).");
  d.Property(field(&JitState::hooks), "def _hooks(self) -> typing.Any", "The compiler's ftjit.CompilerHooks (fixed).");
  d.Property(field(&JitState::cache), "def _cache(self) -> FunctionCache", "The FunctionCache (fixed).");
  // __globals__: ftjit._jit's namespace, as a Python wrapper defined there
  // would have. Tools that recognise JAX-wrapped functions by the module of
  // their api_boundary (chex's is_traceable) then see a jitted function.
  d.Property(
      [](const JitSelf&) {
        PyObject* globals = kJitModule.Get();
        return nb::borrow<nb::dict>(globals);
      },
      "def __globals__(self) -> dict[str, typing.Any]", "The namespace of ftjit's Python API module.");
}

void DefineMethods(nb::handle type, const std::string& module) {
  const Definer d(type, module);
  DefineCacheMethods(d);
  DefineAheadOfTraffic(d);
  DefineHookMethods(d);
  DefineSignatureQueries(d);
  DefineObjectProtocol(d);
  DefineProperties(d);
}

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
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot kSlots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(JitFunction_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(JitFunction_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(JitFunction_clear)},
    {Py_tp_descr_get, reinterpret_cast<void*>(JitFunction_descr_get)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_repr, reinterpret_cast<void*>(JitFunction_repr)},
    {Py_tp_members, reinterpret_cast<void*>(kMembers)},
    {Py_tp_getset, reinterpret_cast<void*>(kGetSet)},
    {Py_tp_doc, const_cast<char*>("A jitted function: computes each call's signature, compiles it once\n"
                                  "(other threads wait with the GIL released) and calls the executable.\n"
                                  "Create with ftjit.jit().")},
    {0, nullptr},
};

}  // namespace

nb::object NewJitFunction(std::unique_ptr<JitState> st) {
  PyTypeObject* type = reinterpret_cast<PyTypeObject*>(g_jit_type);
  nb::object self = StealOrThrow(type->tp_alloc(type, 0));
  auto* o = reinterpret_cast<JitFunctionObject*>(self.ptr());
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
  // The type parameters of JitFunction(Generic[_P, _R]), declared as
  // nanobind declares them: module attributes the stub renders.
  m.attr("_P") = nb::param_spec("_P");
  m.attr("_R") = nb::type_var("_R", nb::arg("covariant") = true);
  g_jit_type = PyType_FromSpec(&spec);
  if (!g_jit_type) throw nb::python_error();
  nb::handle type(g_jit_type);
  nb::setattr(type, "__nb_signature__", nb::str("class JitFunction(typing.Generic[_P, _R])"));
  DefineMethods(type, nb::cast<std::string>(m.attr("__name__")));
  m.attr("JitFunction") = type;

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
