// ftjit: JitFunction — signature, lookup, compile-once, call.
//
// The call path (see DESIGN.md, "The way a call flows"):
//   disabled on this thread? -> fun(*args)
//   BuildSignature (may run Python; no lock held)
//   FunctionEntries::FindOrInsert (leaf locks only around Python-free probes)
//     ready     -> executable(*args)                                 hot path
//     compiling -> owner is this thread? RecursiveCompileError
//                  cycle in the wait-for graph? CompileCycleError
//                  else wait, GIL released, waking every 100 ms for signals
//     inserted  -> this thread compiles, publishes, wakes the waiters
// Errors cross into Python in one place: JitFunction_vectorcall.
//
// Shared state and its protection:
//
//   | state                 | protection                                        |
//   |-----------------------|---------------------------------------------------|
//   | t_disabled            | thread-local (disable_jit() depth)                |
//   | g_graph               | atomic pointer, process lifetime; swapped for an  |
//   |                       | empty graph in a forked child (the old one        |
//   |                       | leaks); the graph has its own leaf lock           |
//   | g_jit_type            | set once at module init                           |
//   | JitState (one per     | fixed after construction, except that the GC's    |
//   |   JitFunction)        | tp_clear empties an unreachable one (calls check  |
//   |                       | Cleared() first); freed by tp_dealloc             |
//   | entries and counters  | function_cache.h / entry_store.h                  |
//
// Lock order: this file takes no lock itself. The locks of the function's
// entries (entry_store.h, which states their one nesting) and the wait-for
// graph's leaf lock (compile_latch.h) are taken inside those calls, around
// Python-free steps only: never across Python code, the compiler or a wait
// (a waiter releases the GIL holding no C++ lock). Only the test hook
// _debug_hold_locks holds them together: FunctionEntries::LockAllForTest's
// (function_cache.cc), then LockSignatureLocksForTest's (signature.cc).
#include "jit_function.h"

#include <Python.h>
#include <structmember.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <chrono>
#ifdef __GLIBCXX__
#include <cxxabi.h>  // abi::__forced_unwind
#endif
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "function_cache.h"
#include "signature.h"
#include "thread_memos.h"

namespace ftjit {

namespace nb = nanobind;

namespace {

// disable_jit() nesting depth of this thread.
thread_local int t_disabled = 0;

// Process lifetime; replaced (the old one leaked) in a forked child, where
// it may hold a mutex locked by, and edges of, threads that do not exist.
std::atomic<WaitForGraph*> g_graph{new WaitForGraph()};
WaitForGraph& Graph() { return *g_graph.load(std::memory_order_acquire); }

// os.register_at_fork(after_in_child=...): runs in the child's only thread,
// the one that forked, before any other code of the child.
// Compiles in flight in other threads of the parent will never finish
// here: their entries are dropped (the next call compiles afresh), the
// locks they or their waiters may have held are re-initialised, and the
// wait-for graph starts empty. The forking thread keeps its owner id, so a
// compile it forked from inside carries on and is published here as usual.
void AfterForkInChild() {
  NoteForkInChild();
  g_graph.store(new WaitForGraph(), std::memory_order_release);
  ReinitSignatureLocksInChild();
  AfterForkInChildCaches();
}

// Per-JitFunction state; fixed after construction except where noted.
struct JitState {
  nb::object fun;             // cleared only by tp_clear
  nb::object compiler;
  nb::object cache;           // the FunctionCache Python object
  nb::object options;         // hashable options key shared with other wrappers
  nb::object pickle_options;  // dict handed back to ftjit on unpickling
  SignatureSpec spec;
  std::shared_ptr<FunctionEntries> entries;
  bool strip_static = false;  // call executables with dynamic arguments only
  nb::object fallback;        // called instead when NeedsFallback (may be null)
  // Exception types (a tuple) after which a failed executable call is made
  // again through `fallback`, which reports it its own way (JAX: a NaN found
  // under jax_debug_nans, re-run de-optimised to name the op). May be null.
  nb::object redo_types;
  double compile_timeout = 0;  // seconds a waiter waits at most; <= 0: forever
  nb::object on_compile;      // hook(name, signature, seconds, error or None)
  nb::object on_wait;         // hook(name, signature, seconds)
};

struct JitFunctionObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* dict;
  PyObject* weaklist;
  JitState* state;
};

PyObject* g_jit_type = nullptr;  // set once at module init

JitState& StateOf(PyObject* self) {
  return *reinterpret_cast<JitFunctionObject*>(self)->state;
}

nb::object FetchNormalized() {
  PyObject *t = nullptr, *v = nullptr, *tb = nullptr;
  PyErr_Fetch(&t, &v, &tb);
  PyErr_NormalizeException(&t, &v, &tb);
  if (tb && v) PyException_SetTraceback(v, tb);
  Py_XDECREF(t);
  Py_XDECREF(tb);
  return nb::steal(v);
}

[[noreturn]] void Reraise(PyObject* exc) {
  PyObject* tb = PyException_GetTraceback(exc);  // new ref or null
  PyErr_Restore(Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(exc))), Py_NewRef(exc), tb);
  throw nb::python_error();
}

// type(exc).__new__(type(exc), *exc.args) with exc's __dict__: a copy that
// skips __init__, for types whose __init__ does not take their own args
// (`def __init__(self, a, b): super().__init__(f"{a}/{b}")`), which
// copy.copy cannot rebuild. Null (error set) on failure.
PyObject* CopyWithoutInit(PyObject* exc) {
  PyTypeObject* tp = Py_TYPE(exc);
  nb::object args = nb::steal(PyObject_GetAttrString(exc, "args"));
  if (!args.is_valid()) return nullptr;
  if (!PyTuple_Check(args.ptr()) || !tp->tp_new) {
    PyErr_SetString(PyExc_TypeError, "exception not copyable");
    return nullptr;
  }
  nb::object copy = nb::steal(tp->tp_new(tp, args.ptr(), nullptr));
  if (!copy.is_valid()) return nullptr;
  if (Py_TYPE(copy.ptr()) != tp) {
    PyErr_SetString(PyExc_TypeError, "exception not copyable");
    return nullptr;
  }
  nb::object dict = nb::steal(PyObject_GetAttrString(exc, "__dict__"));
  if (!dict.is_valid()) return nullptr;
  if (PyDict_Check(dict.ptr()) && PyDict_Size(dict.ptr()) > 0) {
    nb::object copy_dict = nb::steal(PyObject_GetAttrString(copy.ptr(), "__dict__"));
    if (!copy_dict.is_valid()) return nullptr;
    if (!PyDict_Check(copy_dict.ptr()) || PyDict_Update(copy_dict.ptr(), dict.ptr()) != 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "exception not copyable");
      return nullptr;
    }
  }
  return copy.release().ptr();
}

// A copy of `exc` (same type, args, __dict__), carrying its traceback, cause
// and context, or null when the type cannot be copied. Clears any error the
// copy raised.
PyObject* CopyException(PyObject* exc) {
  PyObject* copy = PyObject_CallOneArg(Types().copy, exc);
  if (!copy || Py_TYPE(copy) != Py_TYPE(exc)) {
    ClearErrorKeepingInterrupt();
    Py_XDECREF(copy);
    copy = CopyWithoutInit(exc);
    if (!copy) {
      ClearErrorKeepingInterrupt();
      return nullptr;
    }
  }
  if (PyObject* tb = PyException_GetTraceback(exc)) {
    PyException_SetTraceback(copy, tb);
    Py_DECREF(tb);
  }
  if (PyObject* cause = PyException_GetCause(exc)) PyException_SetCause(copy, cause);
  if (PyObject* ctx = PyException_GetContext(exc)) PyException_SetContext(copy, ctx);
  return copy;
}

// The compile's exception as waiters will read it. The compiling thread
// raises the original, and unwinding writes the original's __traceback__;
// waiters read (and copy) this private copy instead, which nobody raises or
// writes after Publish(). For a type that cannot be copied at all, a
// RuntimeError naming it, caused by the original (never raised by waiters).
nb::object ErrorForWaiters(const nb::object& original) {
  if (PyObject* copy = CopyException(original.ptr())) return nb::steal(copy);
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
  PyObject* copy = CopyException(error.ptr());
  if (!copy) {
    std::string msg = "ftjit: the compile of " + st.spec.fun_name +
                      "() failed in another thread with " + Py_TYPE(error.ptr())->tp_name +
                      ", which cannot be copied for this thread (see __cause__)";
    copy = PyObject_CallFunction(PyExc_RuntimeError, "s", msg.c_str());
    if (!copy) throw nb::python_error();  // e.g. MemoryError: fresh, this thread's own
    PyException_SetCause(copy, Py_NewRef(error.ptr()));
  }
  nb::object owned = nb::steal(copy);
  Reraise(owned.ptr());
}

[[noreturn]] void RaiseMessage(PyObject* type, const std::string& msg) {
  PyErr_SetString(type, msg.c_str());
  throw nb::python_error();
}

// Calls an observability hook; its exceptions are reported as unraisable,
// never allowed to replace the call's own result or error.
void CallHook(const nb::object& hook, std::initializer_list<PyObject*> args) {
  if (!hook.is_valid()) return;
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);  // keep a pending error (failed compile) intact
  std::vector<PyObject*> argv(args);
  PyObject* r = PyObject_Vectorcall(hook.ptr(), argv.data(), argv.size(), nullptr);
  if (!r) {
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
      ClearErrorKeepingInterrupt();  // a Ctrl-C in a logging hook is not "unraisable"
    } else if (PyErr_ExceptionMatches(PyExc_RecursionError)) {
      // At the recursion limit (a deep chain of nested compiles): reporting
      // it would run sys.unraisablehook there and fail again, printing
      // "Exception ignored in sys.unraisablehook". The log line is lost.
      PyErr_Clear();
    } else {
      PyErr_WriteUnraisable(hook.ptr());
    }
  } else {
    Py_DECREF(r);
  }
  PyErr_Restore(t, v, tb);
}

nb::object SignatureString(const JitState& st, const Entry& e) {
  return nb::steal(PyUnicode_FromString(e.sig->ToString(st.spec.fun_name).c_str()));
}

uint64_t NanosSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
}

nb::object CallExecutableOnce(JitState& st, PyObject* exe, PyObject* const* args, size_t nargsf,
                              PyObject* kwnames);

// Calls the executable; when it fails with one of st.redo_types, the call is
// made again through the fallback (see JitState::redo_types).
nb::object CallExecutable(JitState& st, PyObject* exe, PyObject* const* args, size_t nargsf,
                          PyObject* kwnames) {
  nb::object out = CallExecutableOnce(st, exe, args, nargsf, kwnames);
  if (!out.is_valid() && st.redo_types.is_valid() && st.fallback.is_valid() &&
      PyErr_ExceptionMatches(st.redo_types.ptr())) {
    PyErr_Clear();
    return nb::steal(PyObject_Vectorcall(st.fallback.ptr(), args, nargsf, kwnames));
  }
  return out;
}

nb::object CallExecutableOnce(JitState& st, PyObject* exe, PyObject* const* args, size_t nargsf,
                              PyObject* kwnames) {
  if (!st.strip_static) {
    return nb::steal(PyObject_Vectorcall(exe, args, nargsf, kwnames));
  }
  size_t nargs = PyVectorcall_NARGS(nargsf);
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  SmallVector<PyObject*, 8> dyn;
  for (size_t i = 0; i < nargs; ++i) {
    if (!st.spec.IsStaticPosition(i, nargs)) dyn.push_back(args[i]);
  }
  size_t dyn_pos = dyn.size();
  nb::object dyn_names;
  if (nkw > 0) {
    SmallVector<PyObject*, 8> names;
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      PyObject* name = PyTuple_GET_ITEM(kwnames, k);
      if (st.spec.static_argnames.empty() || !st.spec.IsStaticName(name)) {
        names.push_back(name);
        dyn.push_back(args[nargs + k]);
      }
    }
    if (static_cast<Py_ssize_t>(names.size()) == nkw) {
      dyn_names = nb::borrow(kwnames);
    } else if (!names.empty()) {
      dyn_names = nb::steal(PyTuple_New(names.size()));
      if (!dyn_names.is_valid()) throw nb::python_error();
      for (size_t j = 0; j < names.size(); ++j) {
        PyTuple_SET_ITEM(dyn_names.ptr(), j, Py_NewRef(names[j]));
      }
    }
  }
  return nb::steal(PyObject_Vectorcall(exe, dyn.data(), dyn_pos, dyn_names.ptr()));
}

// This thread inserted `e`: compile it and publish the result (or the
// error) to every waiter. Throws the compile's exception.
// Whatever happens in a compile, the latch is published: waiters never hang.
struct CompilePublisher {
  JitState& st;
  const EntryPtr& e;
  bool done = false;
  void Fail(CompileLatch::State how = CompileLatch::State::kFailed) {
    done = true;
    st.entries->Discard(e);  // before publishing: the next call recompiles
    st.entries->counters().failures.fetch_add(1, std::memory_order_relaxed);
    e->latch.Publish(how);
  }
  ~CompilePublisher() {
    if (!done) {
      // A C++ exception escaped (e.g. bad_alloc): report it to waiters.
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      e->payload.error = nb::steal(PyObject_CallFunction(
          PyExc_RuntimeError, "s", "ftjit: the compile was aborted by an internal error"));
      PyErr_Clear();
      PyErr_Restore(t, v, tb);
      Fail();
    }
  }
};

void CompileBody(JitState& st, const EntryPtr& e, PyObject* const* args, size_t nargsf,
                 PyObject* kwnames, CompilePublisher& publisher) {
  Counters& c = st.entries->counters();
  st.entries->AdmitLru(e);
  size_t nargs = PyVectorcall_NARGS(nargsf);
  auto t0 = std::chrono::steady_clock::now();
  nb::object exe;
  {
    nb::object a = nb::steal(PyTuple_New(nargs));
    nb::object kw = nb::steal(PyDict_New());
    bool ok = a.is_valid() && kw.is_valid();
    if (ok) {
      for (size_t i = 0; i < nargs; ++i) PyTuple_SET_ITEM(a.ptr(), i, Py_NewRef(args[i]));
      Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
      for (Py_ssize_t k = 0; ok && k < nkw; ++k) {
        ok = PyDict_SetItem(kw.ptr(), PyTuple_GET_ITEM(kwnames, k), args[nargs + k]) == 0;
      }
    }
    if (ok) {
      PyObject* call_args[] = {st.fun.ptr(), a.ptr(), kw.ptr()};
#ifdef __GLIBCXX__
      try {
        exe = nb::steal(PyObject_Vectorcall(st.compiler.ptr(), call_args, 3, nullptr));
      } catch (abi::__forced_unwind&) {
        // Ended inside the compiler at interpreter shutdown, with no thread
        // state: the argument tuple and dict, whose last references these
        // are, must not be deallocated here. Leaked.
        a.release();
        kw.release();
        throw;
      }
#else
      exe = nb::steal(PyObject_Vectorcall(st.compiler.ptr(), call_args, 3, nullptr));
#endif
      if (exe.is_valid() && !PyCallable_Check(exe.ptr())) {
        // A failed compile (counted, not cached), rather than an entry that
        // raises "'int' object is not callable" on every call.
        PyErr_Format(PyExc_TypeError,
                     "the compiler of %s() returned an object of type %s, which is not callable: "
                     "compiler(fun, args, kwargs) must return the executable",
                     st.spec.fun_name.c_str(), Py_TYPE(exe.ptr())->tp_name);
        exe = nb::object();
      }
    }
  }
  if (!exe.is_valid()) {
    nb::object error = FetchNormalized();
    // An interruption of this thread (KeyboardInterrupt, SystemExit: any
    // BaseException that is not an Exception) is not the compile's result:
    // it stays with this thread, and a waiter compiles again instead.
    if (PyObject_IsInstance(error.ptr(), PyExc_Exception) == 1) {
      e->payload.error = ErrorForWaiters(error);
      publisher.Fail();
    } else {
      PyErr_Clear();  // IsInstance may have raised (a hostile __class__)
      publisher.Fail(CompileLatch::State::kAbandoned);
    }
    if (st.on_compile.is_valid()) {
      nb::object secs = nb::steal(PyFloat_FromDouble(static_cast<double>(NanosSince(t0)) * 1e-9));
      nb::object name = nb::steal(PyUnicode_FromString(st.spec.fun_name.c_str()));
      nb::object sig = SignatureString(st, *e);
      if (secs.is_valid() && name.is_valid() && sig.is_valid()) {
        CallHook(st.on_compile, {name.ptr(), sig.ptr(), secs.ptr(), error.ptr()});
      }
      PyErr_Clear();
    }
    Reraise(error.ptr());
  }
  uint64_t nanos = NanosSince(t0);
  e->payload.executable = std::move(exe);
  e->payload.compile_seconds = static_cast<double>(nanos) * 1e-9;
  e->payload.compiled_order = g_compile_order.fetch_add(1, std::memory_order_relaxed) + 1;
  c.compiles.fetch_add(1, std::memory_order_relaxed);
  c.compile_nanos.fetch_add(nanos, std::memory_order_relaxed);
  publisher.done = true;
  e->latch.Publish(CompileLatch::State::kReady);
  st.entries->Published(e);
  if (st.on_compile.is_valid()) {
    nb::object secs = nb::steal(PyFloat_FromDouble(e->payload.compile_seconds));
    nb::object name = nb::steal(PyUnicode_FromString(st.spec.fun_name.c_str()));
    nb::object sig = SignatureString(st, *e);
    if (!secs.is_valid() || !name.is_valid() || !sig.is_valid()) throw nb::python_error();
    CallHook(st.on_compile, {name.ptr(), sig.ptr(), secs.ptr(), Py_None});
  }
}

void Compile(JitState& st, const EntryPtr& e, PyObject* const* args, size_t nargsf,
             PyObject* kwnames) {
  st.entries->counters().misses.fetch_add(1, std::memory_order_relaxed);
  CompilePublisher publisher{st, e};
#ifdef __GLIBCXX__
  try {
    CompileBody(st, e, args, nargsf, kwnames, publisher);
  } catch (abi::__forced_unwind&) {
    // This thread is being ended by CPython at interpreter shutdown (it took
    // the GIL back in the compiler): there is no thread state to report
    // anything with, so the publisher must not run Python.
    publisher.done = true;
    throw;
  }
#else
  CompileBody(st, e, args, nargsf, kwnames, publisher);
#endif
}

nb::object CompileAndCall(JitState& st, const EntryPtr& e, PyObject* const* args,
                          size_t nargsf, PyObject* kwnames) {
  Compile(st, e, args, nargsf, kwnames);
  return CallExecutable(st, e->payload.executable.ptr(), args, nargsf, kwnames);
}

// `e` is being compiled by another thread (or by this one: recursion).
// Returns true once it is ready, false when its compile was abandoned (the
// caller looks the signature up again); raises the compile's error if it
// failed.
bool WaitForCompile(JitState& st, Entry& e) {
  OwnerId self = ThisThreadOwner();
  if (e.latch.owner() == self) {
    RaiseMessage(Types().recursive_compile,
                 e.sig->ToString(st.spec.fun_name) +
                     " was called while this same thread was compiling it: the compiler "
                     "(or the function it traces) re-entered the jitted function with the "
                     "signature being compiled, which can never finish. Break the recursion, "
                     "or call the un-jitted function (__wrapped__) inside.");
  }
  auto raise_cycle = [&] {
    RaiseMessage(Types().compile_cycle,
                 "compiling in this thread needs " + e.sig->ToString(st.spec.fun_name) +
                     ", which another thread is compiling while it waits (directly or through "
                     "other threads) for a compile this thread is running: the compiles form a "
                     "cycle and would deadlock. Compile one of the functions first, or break "
                     "the mutual dependency.");
  };
  if (!Graph().BeginWait(self, &e.latch)) raise_cycle();
  struct EndWait {
    OwnerId self;
    bool registered = true;
    ~EndWait() {
      if (registered) Graph().EndWait(self);
    }
  } end_wait{self};
  Counters& c = st.entries->counters();
  c.waits.fetch_add(1, std::memory_order_relaxed);
  auto t0 = std::chrono::steady_clock::now();
  const bool bounded = st.compile_timeout > 0;
  const auto deadline =
      t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(bounded ? st.compile_timeout : 0.0));
  CompileLatch::State s = e.latch.state();
  while (s == CompileLatch::State::kCompiling) {
    auto slice = std::chrono::steady_clock::duration(std::chrono::milliseconds(100));
    if (bounded) {
      auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) {
        c.wait_nanos.fetch_add(NanosSince(t0), std::memory_order_relaxed);
        // Not waiting any more (the message below runs __repr__ code).
        Graph().EndWait(self);
        end_wait.registered = false;
        char secs[32];
        std::snprintf(secs, sizeof(secs), "%g", st.compile_timeout);
        RaiseMessage(Types().compile_timeout,
                     "gave up after compile_timeout=" + std::string(secs) + " s waiting for " +
                         e.sig->ToString(st.spec.fun_name) +
                         ", which another thread is compiling; the compile carries on and "
                         "later calls will use it");
      }
      if (left < slice) slice = left;
    }
    // Explicit calls, not an RAII guard: during interpreter shutdown
    // PyEval_RestoreThread may end this (daemon) thread with pthread_exit,
    // whose forced unwind must not start inside a noexcept destructor.
    PyThreadState* ts = PyEval_SaveThread();
    s = e.latch.WaitFor(slice);
    PyEval_RestoreThread(ts);
    // A signal handler run by the check below may have forked, leaving this
    // thread in a child where the compile's owner does not exist.
    if (s == CompileLatch::State::kCompiling && e.latch.OrphanedByFork()) {
      c.wait_nanos.fetch_add(NanosSince(t0), std::memory_order_relaxed);
      return false;  // the caller looks again, and drops the orphan
    }
    if (s == CompileLatch::State::kCompiling) {
      // Signal handlers run here, and this thread is not blocked while they
      // do: one may compile something another thread then waits for.
      Graph().EnterPython(self);
      int signalled = PyErr_CheckSignals();
      Graph().LeavePython(self);
      if (signalled != 0) {
        c.wait_nanos.fetch_add(NanosSince(t0), std::memory_order_relaxed);
        throw nb::python_error();
      }
    }
    // A cycle may have closed while a nested wait (Python code run by the
    // signal check above, here or in another thread) hid an outer edge from
    // the walk of BeginWait: see WaitForGraph.
    if (s == CompileLatch::State::kCompiling && !Graph().StillSafe(self)) {
      end_wait.registered = false;
      c.wait_nanos.fetch_add(NanosSince(t0), std::memory_order_relaxed);
      raise_cycle();
    }
  }
  uint64_t waited = NanosSince(t0);
  c.wait_nanos.fetch_add(waited, std::memory_order_relaxed);
  // The wait is over: the hook and the error below run Python code, which
  // may compile (nothing may take this thread for blocked meanwhile).
  Graph().EndWait(self);
  end_wait.registered = false;
  if (st.on_wait.is_valid()) {
    nb::object secs = nb::steal(PyFloat_FromDouble(static_cast<double>(waited) * 1e-9));
    nb::object name = nb::steal(PyUnicode_FromString(st.spec.fun_name.c_str()));
    nb::object sig = SignatureString(st, e);
    if (!secs.is_valid() || !name.is_valid() || !sig.is_valid()) throw nb::python_error();
    CallHook(st.on_wait, {name.ptr(), sig.ptr(), secs.ptr()});
  }
  if (s == CompileLatch::State::kFailed) RaiseForWaiter(st, e.payload.error);
  return s == CompileLatch::State::kReady;
}

// The entry of `sig` after the hot path missed: either one this thread
// inserted and must compile, or a ready one (found ready, or waited for).
// An abandoned compile (its thread was interrupted) is looked up again, and
// this thread may then be the one to compile it.
struct Resolved {
  EntryPtr entry;
  bool inserted;   // this thread owns the compile
  bool was_ready;  // ready when found: a hit, no wait
};

// `sig` must have adopted its context (CallSignature::AdoptContext).
Resolved Resolve(JitState& st, CallSignature& sig) {
  for (;;) {
    FunctionEntries::Lookup found = st.entries->FindOrInsert(sig);  // moves `sig` if inserted
    if (found.inserted) return {std::move(found.entry), true, false};
    if (found.entry->latch.state() == CompileLatch::State::kReady) {
      return {std::move(found.entry), false, true};
    }
    if (found.entry->latch.OrphanedByFork()) {
      // In a forked child: its compiling thread stayed in the parent (the
      // after-fork hook drops these; this is the belt to its braces). Drop
      // the entry and look again: this thread then compiles.
      st.entries->Discard(found.entry);
      continue;
    }
    if (WaitForCompile(st, *found.entry)) return {std::move(found.entry), false, false};
  }
}

// RuntimeError (and true) when the GC's tp_clear already emptied this function.
bool Cleared(const JitState& st) {
  if (st.fun.is_valid()) return false;
  PyErr_SetString(PyExc_RuntimeError, "this jitted function was cleared by the garbage collector");
  return true;
}

nb::object CallWithSignature(JitState& st, CallSignature& sig, PyObject* const* args, size_t nargsf,
                             PyObject* kwnames) {
  const ThreadCtx& t = ThisThread();
  for (;;) {
    try {
      BuildSignature(st.spec, args, PyVectorcall_NARGS(nargsf), kwnames, sig);
    } catch (const NeedsFallback&) {
      // E.g. tracers of an outer transformation: the compiler's own path, uncached.
      if (!st.fallback.is_valid()) {
        RaiseMessage(PyExc_TypeError, st.spec.fun_name + "() got an argument that needs the "
                                      "compiler's fallback path, but it has none");
      }
      return nb::steal(PyObject_Vectorcall(st.fallback.ptr(), args, nargsf, kwnames));
    }
    // The hot path: a ready entry found by the lock-free probe. No reference
    // to the executable is taken: the entry (and so its executable) stays
    // alive while this thread is counted in flight on it (entry_store.h).
    if (Entry* e = st.entries->FindReady(sig, t.rec, t.shard)) {
      nb::object out;
      try {
        out = CallExecutable(st, e->payload.executable.ptr(), args, nargsf, kwnames);
      } catch (...) {
        // Also a thread ended by CPython at shutdown (no thread state): the
        // epoch domain then frees nothing here, it only queues.
        FunctionEntries::FinishCall(e, t.rec, t.shard);
        throw;
      }
      FunctionEntries::FinishCall(e, t.rec, t.shard);
      return out;
    }
    // Before any Python code runs with it (interned_context.h).
    if (sig.AdoptContext()) break;
    sig.Clear();  // its context died meanwhile: build it again
  }
  FunctionEntries::AfterMiss(t.rec);  // may run deleters: Python
  Resolved r = Resolve(st, sig);
  if (r.inserted) return CompileAndCall(st, r.entry, args, nargsf, kwnames);
  if (r.was_ready) {
    st.entries->counters().hits.Add(t.shard);
    r.entry->shards[t.shard].hits.fetch_add(1, std::memory_order_relaxed);
  }
  SharedLru<EntryPtr, LeafMutex>::Touch(r.entry);
  return CallExecutable(st, r.entry->payload.executable.ptr(), args, nargsf, kwnames);
}

nb::object Call(JitState& st, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  CallSignature sig;
#ifdef __GLIBCXX__
  try {
    return CallWithSignature(st, sig, args, nargsf, kwnames);
  } catch (abi::__forced_unwind&) {
    // Ended by CPython at interpreter shutdown, with no thread state: the
    // signature's references must not be dropped here (a last one would
    // deallocate without a thread state). Moved into a leaked copy.
    new CallSignature(std::move(sig));
    throw;
  }
#else
  return CallWithSignature(st, sig, args, nargsf, kwnames);
#endif
}

extern "C" PyObject* JitFunction_vectorcall(PyObject* self, PyObject* const* args,
                                            size_t nargsf, PyObject* kwnames) {
  JitState& st = StateOf(self);
  if (Cleared(st)) return nullptr;
  if (t_disabled > 0) return PyObject_Vectorcall(st.fun.ptr(), args, nargsf, kwnames);
  // A jitted function calling itself (or another) recurses through this C
  // frame, which takes far more C stack than a Python-to-Python call: count
  // it, so that deep recursion is a RecursionError, not a stack overflow
  // (CPython's own C calls of Python code do the same).
  // Left explicitly, not by a destructor: a thread ended by CPython at
  // interpreter shutdown (pthread_exit when a waiter or the executable takes
  // the GIL back) unwinds through here with no thread state, where
  // Py_LeaveRecursiveCall would crash (3.12+); neither catch sees it.
  if (Py_EnterRecursiveCall(" while calling a jitted function")) return nullptr;
  PyObject* out;
  try {
    out = Call(st, args, nargsf, kwnames).release().ptr();
  } catch (nb::python_error& err) {
    err.restore();
    out = nullptr;
  } catch (const std::exception& err) {
    PyErr_Format(PyExc_RuntimeError, "ftjit internal error: %s", err.what());
    out = nullptr;
  }
  Py_LeaveRecursiveCall();
  return out;
}

extern "C" int JitFunction_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  Py_VISIT(o->dict);
  if (JitState* st = o->state) {
    Py_VISIT(st->fun.ptr());
    Py_VISIT(st->compiler.ptr());
    Py_VISIT(st->cache.ptr());
    Py_VISIT(st->options.ptr());
    Py_VISIT(st->pickle_options.ptr());
    Py_VISIT(st->spec.arg_names.ptr());
    Py_VISIT(st->spec.pytree_flatten.ptr());
    Py_VISIT(st->spec.registry_flatten.ptr());
    Py_VISIT(st->spec.defer_leaf.ptr());
    Py_VISIT(st->spec.custom_namedtuple.ptr());
    Py_VISIT(st->spec.custom_namedtuple_dict.ptr());
    Py_VISIT(st->spec.context_fn.ptr());
    Py_VISIT(st->spec.fallback_types.ptr());
    Py_VISIT(st->fallback.ptr());
    Py_VISIT(st->redo_types.ptr());
    Py_VISIT(st->on_compile.ptr());
    Py_VISIT(st->on_wait.ptr());
    Py_VISIT(st->spec.plain_types_owner.ptr());
    Py_VISIT(st->spec.aval_types_owner.ptr());
    for (const AvalType& t : st->spec.aval_types) {
      Py_VISIT(t.aval.fget.ptr());
      Py_VISIT(t.committed.fget.ptr());
    }
  }
  return 0;
}

extern "C" int JitFunction_clear(PyObject* self) {
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  Py_CLEAR(o->dict);
  if (JitState* st = o->state) {
    // Move out first: destructors may run arbitrary code that looks at us.
    nb::object fun = std::move(st->fun), compiler = std::move(st->compiler),
               cache = std::move(st->cache), options = std::move(st->options),
               pickle = std::move(st->pickle_options), names = std::move(st->spec.arg_names),
               flatten = std::move(st->spec.pytree_flatten),
               registry_flatten = std::move(st->spec.registry_flatten),
               defer_leaf = std::move(st->spec.defer_leaf),
               custom_nt = std::move(st->spec.custom_namedtuple),
               custom_nt_dict = std::move(st->spec.custom_namedtuple_dict), ctx = std::move(st->spec.context_fn),
               fb_types = std::move(st->spec.fallback_types), fb = std::move(st->fallback),
               redo = std::move(st->redo_types),
               on_compile = std::move(st->on_compile), on_wait = std::move(st->on_wait),
               plain = std::move(st->spec.plain_types_owner),
               aval = std::move(st->spec.aval_types_owner);
    st->spec.hook = ContextHook();  // borrowed from context_fn, moved out above
    // The raw type pointers borrowed from the two owners must not outlive them.
    st->spec.plain_types.clear();
    // The getters' fget references go with the other moved-out locals, once
    // the state is already cleared.
    std::vector<AvalType> aval_getters = std::move(st->spec.aval_types);
    st->spec.aval_types.clear();
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
    if (st->entries && st->entries->is_private()) st->entries->Clear();
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

extern "C" PyObject* JitFunction_cache_info(PyObject* self, PyObject*) {
  try {
    return MakeCacheInfo(*StateOf(self).entries).release().ptr();
  } catch (nb::python_error& err) {
    err.restore();
    return nullptr;
  }
}

extern "C" PyObject* JitFunction_entries_forgetter(PyObject* self, PyObject*) {
  try {
    return Forgetter(StateOf(self).entries).release().ptr();
  } catch (nb::python_error& err) {
    err.restore();
    return nullptr;
  }
}

extern "C" PyObject* JitFunction_shared_state(PyObject* self, PyObject* offered) {
  try {
    return StateOf(self).entries->SharedState(offered).release().ptr();
  } catch (nb::python_error& err) {
    err.restore();
    return nullptr;
  }
}

extern "C" PyObject* JitFunction_clear_cache(PyObject* self, PyObject*) {
  StateOf(self).entries->Clear();
  Py_RETURN_NONE;
}

extern "C" PyObject* JitFunction_signatures(PyObject* self, PyObject*) {
  JitState& st = StateOf(self);
  try {
    std::vector<EntryPtr> entries = st.entries->Entries();
    // Ready ones only (the payload is read after the latch's acquire), the
    // latest compile first.
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [](const EntryPtr& e) {
                                   return e->latch.state() != CompileLatch::State::kReady;
                                 }),
                  entries.end());
    std::sort(entries.begin(), entries.end(), [](const EntryPtr& a, const EntryPtr& b) {
      return a->payload.compiled_order > b->payload.compiled_order;
    });
    nb::list out;
    for (const EntryPtr& e : entries) {
      out.append(nb::make_tuple(e->sig->ToString(st.spec.fun_name),
                                e->Hits(), e->payload.compile_seconds));
    }
    return out.release().ptr();
  } catch (nb::python_error& err) {
    err.restore();
    return nullptr;
  }
}

extern "C" PyObject* JitFunction_ready_count(PyObject* self, PyObject*) {
  JitState& st = StateOf(self);
  try {
    Py_ssize_t n = 0;
    for (const EntryPtr& e : st.entries->Entries()) {
      if (e->latch.state() == CompileLatch::State::kReady) ++n;
    }
    return PyLong_FromSsize_t(n);
  } catch (const std::exception& err) {
    PyErr_Format(PyExc_RuntimeError, "ftjit internal error: %s", err.what());
    return nullptr;
  }
}

// The adopted signature of these arguments, in which array specs
// (jax.ShapeDtypeStruct) stand for arrays; false when the call would take
// the compiler's fallback.
bool BuildAdoptedSignature(JitState& st, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                           CallSignature& sig) {
  for (;;) {
    try {
      BuildSignature(st.spec, args, static_cast<size_t>(nargs), kwnames, sig, /*allow_specs=*/true);
    } catch (const NeedsFallback&) {
      return false;
    }
    if (sig.AdoptContext()) return true;
    sig.Clear();  // its context died meanwhile: build it again
  }
}

// _precompile(*args, **kwargs) -> bool: makes sure the signature of these
// arguments is compiled (compiling it in this thread if nobody has), without
// executing anything. True if this call compiled it.
extern "C" PyObject* JitFunction_precompile(PyObject* self, PyObject* const* args,
                                            Py_ssize_t nargs, PyObject* kwnames) {
  JitState& st = StateOf(self);
  if (Cleared(st)) return nullptr;
  try {
    CallSignature sig;
    if (!BuildAdoptedSignature(st, args, nargs, kwnames, sig)) {
      RaiseMessage(PyExc_TypeError, "cannot precompile " + st.spec.fun_name +
                                        "() here: the call would take the compiler's fallback "
                                        "path, which is not cached (e.g. tracers among the "
                                        "arguments, a JAX trace active, or jax.disable_jit() on)");
    }
    Resolved r = Resolve(st, sig);
    if (!r.inserted) Py_RETURN_FALSE;
    Compile(st, r.entry, args, static_cast<size_t>(nargs), kwnames);
    Py_RETURN_TRUE;
  } catch (nb::python_error& err) {
    err.restore();
    return nullptr;
  } catch (const std::exception& err) {
    PyErr_Format(PyExc_RuntimeError, "ftjit internal error: %s", err.what());
    return nullptr;
  }
}

extern "C" PyObject* JitFunction_signature_of(PyObject* self, PyObject* const* args,
                                              Py_ssize_t nargs, PyObject* kwnames) {
  JitState& st = StateOf(self);
  if (Cleared(st)) return nullptr;
  try {
    CallSignature sig;
    if (!BuildAdoptedSignature(st, args, nargs, kwnames, sig)) {
      return PyUnicode_FromString((st.spec.fun_name + "(<traced>)").c_str());
    }
    return PyUnicode_FromString(sig.ToString(st.spec.fun_name).c_str());
  } catch (nb::python_error& err) {
    err.restore();
    return nullptr;
  }
}

extern "C" PyObject* JitFunction_get_fun(PyObject* self, void*) {
  JitState& st = StateOf(self);
  return Py_NewRef(st.fun.is_valid() ? st.fun.ptr() : Py_None);
}

extern "C" PyObject* JitFunction_get_compiler(PyObject* self, void*) {
  JitState& st = StateOf(self);
  return Py_NewRef(st.compiler.is_valid() ? st.compiler.ptr() : Py_None);
}

extern "C" PyObject* JitFunction_get_cache(PyObject* self, void*) {
  JitState& st = StateOf(self);
  return Py_NewRef(st.cache.is_valid() ? st.cache.ptr() : Py_None);
}

extern "C" PyObject* JitFunction_reduce(PyObject* self, PyObject*) {
  JitState& st = StateOf(self);
  if (!st.fun.is_valid()) {
    PyErr_SetString(PyExc_TypeError, "cannot pickle a cleared jitted function");
    return nullptr;
  }
  return Py_BuildValue("O(OO)", Types().rebuild, st.fun.ptr(), st.pickle_options.ptr());
}

PyMethodDef kMethods[] = {
    {"cache_info", JitFunction_cache_info, METH_NOARGS,
     "cache_info() -> CacheInfo\n\nA snapshot of this function's counters (shared by every\n"
     "wrapper of the same function and options in the same cache). Each\nfield is read "
     "atomically, the tuple as a whole is not: under\nconcurrent calls it may be stale."},
    {"clear_cache", JitFunction_clear_cache, METH_NOARGS,
     "clear_cache() -> None\n\nDrops this function's compiled entries. Compiles in progress\n"
     "finish and serve their waiters, but are not kept. Thread-safe."},
    {"_cached_signatures", JitFunction_signatures, METH_NOARGS,
     "A snapshot list of (readable signature, hits, compile seconds) of ready entries."},
    {"_ready_count", JitFunction_ready_count, METH_NOARGS,
     "The number of compiled signatures now cached (shared by every wrapper of the same\n"
     "function and options in the same cache)."},
    {"_signature_of", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(JitFunction_signature_of)),
     METH_FASTCALL | METH_KEYWORDS,
     "_signature_of(*args, **kwargs) -> str: the readable signature these arguments have."},
    {"_precompile", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(JitFunction_precompile)),
     METH_FASTCALL | METH_KEYWORDS,
     "_precompile(*args, **kwargs) -> bool\n\nCompiles the signature of these arguments if it is not\n"
     "cached (True if this call compiled it). Executes nothing."},
    {"_entries_forgetter", JitFunction_entries_forgetter, METH_NOARGS,
     "A callable (any arguments) that drops this function's entries from its cache, as when\n"
     "the function dies; holds them only weakly."},
    {"_shared_state", JitFunction_shared_state, METH_O,
     "_shared_state(offered) -> object: the object shared by every wrapper of this\n"
     "function and options (the first offered is kept)."},
    {"__reduce__", JitFunction_reduce, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef kMembers[] = {
    {"__vectorcalloffset__", T_PYSSIZET,
     static_cast<Py_ssize_t>(offsetof(JitFunctionObject, vectorcall)), READONLY, nullptr},
    {"__dictoffset__", T_PYSSIZET, static_cast<Py_ssize_t>(offsetof(JitFunctionObject, dict)),
     READONLY, nullptr},
    {"__weaklistoffset__", T_PYSSIZET,
     static_cast<Py_ssize_t>(offsetof(JitFunctionObject, weaklist)), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyGetSetDef kGetSet[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {"_fun", JitFunction_get_fun, nullptr, "The wrapped function (fixed).", nullptr},
    {"_compiler", JitFunction_get_compiler, nullptr, "The compiler (fixed).", nullptr},
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
    {Py_tp_doc, const_cast<char*>(
                    "A jitted function: computes each call's signature, compiles it once\n"
                    "(other threads wait with the GIL released) and calls the executable.\n"
                    "Create with ftjit.jit().")},
    {0, nullptr},
};

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

nb::object MakeJitFunction(nb::object fun, nb::object compiler, nb::object cache,
                           nb::object static_argnums, nb::object static_argnames,
                           nb::object arg_names, std::string name, nb::object options,
                           nb::object pickle_options, nb::object pytree_flatten,
                           nb::object context_fn, bool strip_static, bool jax_style_errors,
                           nb::object fallback,
                           nb::object fallback_types, nb::object plain_types,
                           nb::object aval_types, double compile_timeout,
                           nb::object on_compile, nb::object on_wait,
                           nb::object custom_namedtuple, nb::object redo_types) {
  if (!PyCallable_Check(fun.ptr())) throw nb::type_error("fun must be callable");
  if (!PyCallable_Check(compiler.ptr())) throw nb::type_error("compiler must be callable");
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
  st->compiler = compiler;
  st->cache = cache;
  st->options = options;
  st->pickle_options = pickle_options;
  st->strip_static = strip_static;
  st->spec.jax_style_errors = jax_style_errors;
  st->spec.static_argnums = ToIntVector(static_argnums, "static_argnums");
  for (nb::handle h : static_argnames) {
    if (!PyUnicode_Check(h.ptr())) throw nb::type_error("static_argnames must be str");
    PyObject* s = Py_NewRef(h.ptr());
    PyUnicode_InternInPlace(&s);
    st->spec.static_argnames.push_back(nb::steal(s));
  }
  st->spec.arg_names = arg_names;
  st->spec.fun_name = name;
  if (PyTuple_Check(pytree_flatten.ptr())) {
    if (PyTuple_GET_SIZE(pytree_flatten.ptr()) != 2 ||
        !PyCallable_Check(PyTuple_GET_ITEM(pytree_flatten.ptr(), 0)) ||
        !PyCallable_Check(PyTuple_GET_ITEM(pytree_flatten.ptr(), 1))) {
      throw nb::type_error("pytree_flatten must be a callable or a pair (flatten_one_level, defer_leaf)");
    }
    st->spec.registry_flatten = nb::borrow(PyTuple_GET_ITEM(pytree_flatten.ptr(), 0));
    st->spec.defer_leaf = nb::borrow(PyTuple_GET_ITEM(pytree_flatten.ptr(), 1));
  } else if (!pytree_flatten.is_none()) {
    st->spec.pytree_flatten = pytree_flatten;
  }
  if (!custom_namedtuple.is_none()) {
    if (!PyCallable_Check(custom_namedtuple.ptr())) {
      throw nb::type_error("custom_namedtuple must be callable");
    }
    if (pytree_flatten.is_none()) throw nb::type_error("custom_namedtuple needs pytree_flatten");
    st->spec.custom_namedtuple = custom_namedtuple;
    // JAX's registry hook is a dict's bound __contains__: asked in C.
    if (PyCFunction_Check(custom_namedtuple.ptr())) {
      PyObject* self = PyCFunction_GetSelf(custom_namedtuple.ptr());
      nb::object name = nb::steal(PyObject_GetAttrString(custom_namedtuple.ptr(), "__name__"));
      if (!name.is_valid()) PyErr_Clear();
      if (self && PyDict_CheckExact(self) && name.is_valid() && PyUnicode_Check(name.ptr()) &&
          PyUnicode_CompareWithASCIIString(name.ptr(), "__contains__") == 0) {
        st->spec.custom_namedtuple_dict = nb::borrow(self);
      }
    }
  }
  if (!context_fn.is_none()) st->spec.SetContextFn(context_fn);
  if (!fallback.is_none()) st->fallback = fallback;
  if (!redo_types.is_none()) {
    if (!PyTuple_Check(redo_types.ptr())) throw nb::type_error("redo_types must be a tuple of exception types");
    for (nb::handle t : redo_types) {
      if (!PyExceptionClass_Check(t.ptr())) throw nb::type_error("redo_types must be a tuple of exception types");
    }
    if (PyTuple_GET_SIZE(redo_types.ptr()) > 0) st->redo_types = redo_types;
  }
  // Beyond ~30 years is "forever" (inf included): the deadline must stay
  // representable in steady_clock's 64-bit nanoseconds.
  st->compile_timeout = compile_timeout > 1e9 ? 0.0 : compile_timeout;
  if (!on_compile.is_none()) st->on_compile = on_compile;
  if (!on_wait.is_none()) st->on_wait = on_wait;
  if (!fallback_types.is_none()) st->spec.fallback_types = fallback_types;
  // The spec borrows type pointers from these: it owns tuple copies, which
  // nobody can mutate (a compiler's own list could be, and the borrowed
  // pointer of a type removed from it would dangle once the type died).
  auto own_types = [](const nb::object& types, const char* what) {
    nb::object copy = nb::steal(PySequence_Tuple(types.ptr()));
    if (!copy.is_valid()) throw nb::python_error();
    for (nb::handle t : copy) {
      if (!PyType_Check(t.ptr())) throw nb::type_error((std::string(what) + " must be types").c_str());
    }
    return copy;
  };
  if (!plain_types.is_none()) {
    st->spec.plain_types_owner = own_types(plain_types, "plain_types");
    for (nb::handle t : st->spec.plain_types_owner) {
      st->spec.plain_types.push_back(reinterpret_cast<PyTypeObject*>(t.ptr()));
    }
  }
  if (!aval_types.is_none()) {
    st->spec.aval_types_owner = own_types(aval_types, "aval_types");
    for (nb::handle t : st->spec.aval_types_owner) {
      st->spec.AddAvalType(reinterpret_cast<PyTypeObject*>(t.ptr()));
    }
  }
  st->entries = EntriesFor(cache, fun, options, name);

  PyTypeObject* type = reinterpret_cast<PyTypeObject*>(g_jit_type);
  PyObject* self = type->tp_alloc(type, 0);
  if (!self) throw nb::python_error();
  auto* o = reinterpret_cast<JitFunctionObject*>(self);
  o->vectorcall = JitFunction_vectorcall;
  o->dict = nullptr;
  o->weaklist = nullptr;
  o->state = st.release();
  return nb::steal(self);
}

}  // namespace

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

  m.def("_make_jit_function", &MakeJitFunction, nb::arg("fun"), nb::arg("compiler"),
        nb::arg("cache"), nb::arg("static_argnums"), nb::arg("static_argnames"),
        nb::arg("arg_names"), nb::arg("name"), nb::arg("options"), nb::arg("pickle_options"),
        nb::arg("pytree_flatten").none(), nb::arg("context_fn").none(),
        nb::arg("strip_static"), nb::arg("jax_style_errors") = false,
        nb::arg("fallback").none() = nb::none(),
        nb::arg("fallback_types").none() = nb::none(), nb::arg("plain_types").none() = nb::none(),
        nb::arg("aval_types").none() = nb::none(), nb::arg("compile_timeout") = 0.0,
        nb::arg("on_compile").none() = nb::none(), nb::arg("on_wait").none() = nb::none(),
        nb::arg("custom_namedtuple").none() = nb::none(), nb::arg("redo_types").none() = nb::none());
  m.def("_after_fork_in_child", &AfterForkInChild,
        "For os.register_at_fork(after_in_child=...): compiles in flight in the parent's other "
        "threads are compiled afresh in the child instead of waited for.");
  m.def(
      "_debug_hold_locks",
      [](nb::handle jf, double seconds) {
        if (!PyObject_TypeCheck(jf.ptr(), reinterpret_cast<PyTypeObject*>(g_jit_type))) {
          throw nb::type_error("_debug_hold_locks needs a JitFunction");
        }
        std::shared_ptr<FunctionEntries> fe = StateOf(jf.ptr()).entries;
        fe->LockAllForTest(true);
        LockSignatureLocksForTest(true);
        {
          nb::gil_scoped_release detached;  // held while detached, as a parked waiter holds them
          std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        }
        LockSignatureLocksForTest(false);
        fe->LockAllForTest(false);
      },
      nb::arg("jf"), nb::arg("seconds"),
      "Tests only: holds every lock a call of `jf` may take for `seconds`, detached from the\n"
      "interpreter, as a thread lost at fork (a parked waiter a PyMutex was handed to) holds them.");
  m.def("_disable_jit_enter", []() { ++t_disabled; });
  m.def("_disable_jit_exit", []() {
    if (t_disabled > 0) --t_disabled;
  });
  m.def("_jit_disabled", []() { return t_disabled > 0; });
  m.def("_waiting_threads", []() { return Graph().waiting(); },
        "Threads now registered in the wait-for graph (diagnostics).");
}

}  // namespace ftjit
