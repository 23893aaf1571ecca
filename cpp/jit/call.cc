// ftjit: a JitFunction call: signature, lookup, compile-once, wait, call.
//
// The call path (docs/design.md, "The way a call flows"):
//   BuildSignature (may run Python; no lock held)
//   FindReady: the lock-free probe of the ready table      -> executable(*args)
//   else FindOrInsert (leaf locks only around Python-free steps):
//     ready     -> executable(*args)
//     compiling -> owner is this thread? RecursiveCompileError
//                  cycle in the wait-for graph? CompileCycleError
//                  else wait, GIL released, waking every 100 ms for signals
//     inserted  -> this thread compiles, publishes, wakes the waiters
//
//   | state      | protection                                                 |
//   |------------|------------------------------------------------------------|
//   | t_jit_disabled | thread-local (disable_jit() depth)                     |
//   | t_ahead    | thread-local (depth of compiles asked for ahead of traffic)|
//   | g_graph    | atomic pointer, process lifetime; swapped for an empty     |
//   |            | graph in a forked child (the old one leaks); the graph has |
//   |            | its own leaf lock (WaitForGraph)                           |
//   | JitState   | see JitState                                               |
//
// Lock order: takes no lock itself. The store's locks (EntryStore states
// their one nesting) and the wait-for graph's leaf lock are taken inside
// those calls, around Python-free steps only: never across Python code, the
// compiler or a wait (a waiter releases the GIL holding no C++ lock).
#include <Python.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "jit/jit_state.h"
#include "pyutil/collaborators.h"
#include "pyutil/errors.h"
#include "signature/signature.h"
#include "store/function_cache.h"

namespace ftjit {

namespace {

thread_local int t_ahead = 0;

// Process lifetime; replaced (the old one leaked) in a forked child, where
// it may hold a mutex locked by, and edges of, threads that do not exist.
std::atomic<WaitForGraph*> g_graph{new WaitForGraph()};
WaitForGraph& Graph() { return *g_graph.load(std::memory_order_acquire); }

// --- calling the executable ----------------------------------------------------

// The executable with the call's dynamic arguments only (strip_static: the
// JAX compiler's executables take those). Out of line: its argument arrays
// stay off the frame of calls that pass every argument, which recursion
// through jitted functions stacks.
[[gnu::noinline]] nb::object CallExecutableStripped(JitState& st, PyObject* exe, PyObject* const* args,
                                                    size_t nargsf, PyObject* kwnames) {
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
  return LeakingOnForcedUnwind(
      [&] { return nb::steal(PyObject_Vectorcall(exe, dyn.data(), dyn_pos, dyn_names.ptr())); },
      [&] { dyn_names.release(); });  // no thread state: leaked, not deallocated
}

}  // namespace

nb::object CallExecutable(JitState& st, PyObject* exe, bool takes_leaves, PyObject* const* args, size_t nargsf,
                          PyObject* kwnames, const LeafObjects& leaves) {
  nb::object out;
  if (takes_leaves) {
    if (!st.executable_for.is_valid()) {
      // Entries are shared by wrappers of equal compilers, whose hooks agree.
      RaiseMessage(PyExc_RuntimeError, "ftjit: an executable that takes leaves, reached by a "
                                       "function whose hooks have no executable_for");
    }
    out = nb::steal(PyObject_Vectorcall(exe, leaves.data(), leaves.size(),
                                        nullptr));
  } else {
    out = st.strip_static ? CallExecutableStripped(st, exe, args, nargsf, kwnames)
                          : nb::steal(PyObject_Vectorcall(exe, args, nargsf, kwnames));
  }
  if (out.is_valid()) return out;
  if (st.redo_types.is_valid() && st.fallback.is_valid() && PyErr_ExceptionMatches(st.redo_types.ptr())) {
    PyErr_Clear();
    return StealOrThrow(PyObject_Vectorcall(st.fallback.ptr(), args, nargsf, kwnames));
  }
  throw nb::python_error();
}

nb::object CallFallbackOf(JitState& st, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  // E.g. tracers of an outer transformation: the compiler's own path, uncached.
  if (!st.fallback.is_valid()) {
    RaiseMessage(PyExc_TypeError, st.spec.fun_name + "() got an argument that needs the "
                                  "compiler's fallback path, but it has none");
  }
  return StealOrThrow(PyObject_Vectorcall(st.fallback.ptr(), args, nargsf, kwnames));
}

namespace {

// --- waiting for another thread's compile --------------------------------------

[[noreturn]] void RaiseCycle(const JitState& st, const Entry& e) {
  RaiseMessage(kCompileCycleError.Get(),
               "compiling in this thread needs " + e.sig->ToString(st.spec) +
                   ", which another thread is compiling while it waits (directly or through "
                   "other threads) for a compile this thread is running: the compiles form a "
                   "cycle and would deadlock. Compile one of the functions first, or break "
                   "the mutual dependency.");
}

// One wait of this thread on `e`'s latch, registered in the wait-for graph
// while it lasts, with its counters.
class Wait {
 public:
  Wait(JitState& st, Entry& e) : st_(st), e_(e), self_(ThisThreadOwner()) {
    if (e.latch.owner() == self_) {
      RaiseMessage(kRecursiveCompileError.Get(),
                   e.sig->ToString(st.spec) +
                       " was called while this same thread was compiling it: the compiler "
                       "(or the function it traces) re-entered the jitted function with the "
                       "signature being compiled, which can never finish. Break the recursion, "
                       "or call the un-jitted function (__wrapped__) inside.");
    }
    if (!Graph().BeginWait(self_, &e.latch)) RaiseCycle(st, e);
    registered_ = true;
    st.store->counters().waits.fetch_add(1, std::memory_order_relaxed);
    if (st.compile_timeout > 0) {
      deadline_ = t0_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(st.compile_timeout));
    }
  }
  ~Wait() {
    if (registered_) Graph().EndWait(self_);
  }

  // Waits until the compile ends: its final state, or kCompiling when the
  // compile's owner was left in the parent of a fork (the caller looks
  // again). Raises on a timeout, a signal handler's error or a cycle.
  CompileLatch::State Run() {
    CompileLatch::State s = e_.latch.state();
    while (s == CompileLatch::State::kCompiling) {
      s = Slice();
      if (s != CompileLatch::State::kCompiling) break;
      // A signal handler run by the check below may have forked, leaving
      // this thread in a child where the compile's owner does not exist.
      if (e_.latch.OrphanedByFork()) return s;
      CheckSignals();
      // A cycle may have closed while a nested wait (Python code run by the
      // signal check, here or in another thread) hid an outer edge from the
      // walk of BeginWait: see WaitForGraph.
      if (!Graph().StillSafe(self_)) {
        registered_ = false;
        RaiseCycle(st_, e_);
      }
    }
    return s;
  }

  // The wait is over: the hook and the error that follow run Python code,
  // which may compile (nothing may take this thread for blocked meanwhile).
  uint64_t End() {
    uint64_t waited = Elapsed();
    if (registered_) Graph().EndWait(self_);
    registered_ = false;
    return waited;
  }

 private:
  // Up to 100 ms on the latch (less to the deadline), the GIL released.
  CompileLatch::State Slice() {
    auto slice = std::chrono::steady_clock::duration(std::chrono::milliseconds(100));
    if (deadline_) {
      auto left = *deadline_ - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) TimeOut();
      if (left < slice) slice = left;
    }
    // Explicit calls, not an RAII guard: during interpreter shutdown
    // PyEval_RestoreThread may end this (daemon) thread with pthread_exit,
    // whose forced unwind must not start inside a noexcept destructor.
    PyThreadState* ts = PyEval_SaveThread();
    CompileLatch::State s = e_.latch.WaitFor(slice);
    PyEval_RestoreThread(ts);
    return s;
  }

  // Signal handlers run here, and this thread is not blocked while they
  // do: one may compile something another thread then waits for.
  void CheckSignals() {
    Graph().EnterPython(self_);
    int signalled = PyErr_CheckSignals();
    Graph().LeavePython(self_);
    if (signalled != 0) throw nb::python_error();
  }

  [[noreturn]] void TimeOut() {
    End();  // not waiting any more (the message below runs __repr__ code)
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%g", st_.compile_timeout);
    RaiseMessage(kCompileTimeoutError.Get(),
                 "gave up after compile_timeout=" + std::string(secs) + " s waiting for " +
                     e_.sig->ToString(st_.spec) +
                     ", which another thread is compiling; the compile carries on and "
                     "later calls will use it");
  }

  uint64_t Elapsed() {
    if (!counted_) {
      counted_ = true;
      waited_ = NanosSince(t0_);
      st_.store->counters().wait_nanos.fetch_add(waited_, std::memory_order_relaxed);
    }
    return waited_;
  }

  JitState& st_;
  Entry& e_;
  const OwnerId self_;
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  bool registered_ = false;
  bool counted_ = false;
  uint64_t waited_ = 0;
};

// Waits for `e`'s compile: true once ready, false when it was abandoned
// (the caller looks again); raises the compile's error if it failed.
bool WaitForCompile(JitState& st, Entry& e) {
  Wait wait(st, e);
  CompileLatch::State s;
  try {
    s = wait.Run();
  } catch (nb::python_error&) {
    wait.End();  // counted, whatever ended it
    throw;
  }
  uint64_t waited = wait.End();
  if (s == CompileLatch::State::kCompiling) return false;  // orphaned by a fork: look again
  {
    PyObject* hook = kOnWait.Get();
    nb::object secs = StealOrThrow(PyFloat_FromDouble(static_cast<double>(waited) * 1e-9));
    nb::object name = StealOrThrow(PyUnicode_FromString(st.spec.fun_name.c_str()));
    nb::object sig = SignatureString(st, e);
    CallHook(hook, {name.ptr(), sig.ptr(), secs.ptr()});
  }
  if (s == CompileLatch::State::kFailed) RaiseForWaiter(st, e.payload.error);
  return s == CompileLatch::State::kReady;
}

}  // namespace

// --- finding the entry after a miss -------------------------------------------

Resolved Resolve(JitState& st, CallSignature& sig, bool adopt) {
  for (;;) {
    FunctionStore::Lookup found = st.store->FindOrInsert(sig);  // moves `sig` if inserted
    if (found.inserted) return {std::move(found.entry), true, false, nullptr};
    if (found.entry->latch.state() == CompileLatch::State::kReady) {
      if (!adopt) return {std::move(found.entry), false, true, nullptr};
      switch (found.entry->provisional.load(std::memory_order_seq_cst)) {
        case Entry::kNotProvisional:
          return {std::move(found.entry), false, true, nullptr};
        case Entry::kProvisional:
          if (EntryPtr fresh = st.store->Adopt(found.entry)) {
            return {std::move(fresh), true, false, std::move(found.entry)};
          }
          continue;  // adopted by another thread, or removed: look again
        default:
          continue;  // adopted meanwhile: the map holds the fresh entry
      }
    }
    if (found.entry->latch.OrphanedByFork()) {
      // In a forked child: its compiling thread stayed in the parent (the
      // after-fork hook drops these; this is the belt to its braces). Drop
      // the entry and look again: this thread then compiles.
      st.store->Discard(found.entry);
      continue;
    }
    if (WaitForCompile(st, *found.entry)) {
      // Ready now. A provisional compile (a saved spec's warm-up) that a
      // call waited for is adopted: looked up again.
      if (!adopt || found.entry->provisional.load(std::memory_order_seq_cst) == Entry::kNotProvisional) {
        return {std::move(found.entry), false, false, nullptr};
      }
    }
  }
}

namespace {

nb::object CallAfterMiss(JitState& st, CallSignature& sig, const ThreadCtx& t, PyObject* const* args,
                         size_t nargsf, PyObject* kwnames, const LeafObjects& leaves);

nb::object CallWithSignature(JitState& st, CallSignature& sig, PyObject* const* args, size_t nargsf,
                             PyObject* kwnames) {
  const ThreadCtx& t = ThisThread();
  LeafObjects leaves;  // kept only for hooks whose executables may take them
  LeafObjects* keep = st.executable_for.is_valid() ? &leaves : nullptr;
  for (;;) {
    try {
      BuildSignature(st.spec, args, PyVectorcall_NARGS(nargsf), kwnames, sig, /*allow_specs=*/false, keep);
    } catch (const NeedsFallback&) {
      return CallFallbackOf(st, args, nargsf, kwnames);
    }
    // The hot path: a ready entry found by the lock-free probe. No reference
    // to the executable is taken: the entry (and so its executable) stays
    // alive while this thread is counted in flight on it (EntryStore::FindReady).
    if (Entry* e = st.store->FindReady(sig, t.rec, t.shard)) {
      nb::object out;
      try {
        out = UsesCopies(*e) ? CallEntry(st, *e, t, args, nargsf, kwnames, leaves)
                             : CallExecutable(st, e->payload.executable.ptr(), e->payload.takes_leaves, args,
                                              nargsf, kwnames, leaves);
      } catch (...) {
        // Also a thread ended by CPython at shutdown (no thread state): the
        // epoch domain then frees nothing here, it only queues.
        FunctionStore::FinishCall(e, t.rec, t.shard);
        throw;
      }
      FunctionStore::FinishCall(e, t.rec, t.shard);
      return out;
    }
    if (sig.AdoptContext()) break;  // before any Python code runs with it
    sig.Clear();  // its context died meanwhile: build it again
    leaves.clear();
  }
  return CallAfterMiss(st, sig, t, args, nargsf, kwnames, leaves);
}

// The rest of a call that missed: find, compile or wait for its entry, and
// call it. Not inlined into the hit path: a recursion through jitted
// functions stacks the hit path's frame, which stays small without it.
[[gnu::noinline]] nb::object CallAfterMiss(JitState& st, CallSignature& sig, const ThreadCtx& t,
                                           PyObject* const* args, size_t nargsf, PyObject* kwnames,
                                           const LeafObjects& leaves) {
  FunctionStore::AfterMiss(t.rec);  // may run deleters: Python
  Resolved r = Resolve(st, sig);
  if (r.inserted) {
    Compile(st, r.entry, args, nargsf, kwnames, leaves, r.adopted.get());
  } else if (r.was_ready) {
    st.store->CountHit(r.entry.get(), t.shard);
  } else {
    SharedLru<EntryPtr, LeafMutex>::Touch(r.entry);
  }
  return CallEntry(st, *r.entry, t, args, nargsf, kwnames, leaves);
}

}  // namespace

nb::object CallWhole(JitState& st, CallSignature& sig, const ThreadCtx& t, PyObject* const* args, size_t nargsf,
                     PyObject* kwnames, LeafObjects& leaves) {
  LeafObjects* keep = st.executable_for.is_valid() ? &leaves : nullptr;
  for (;;) {
    sig.Clear();
    leaves.clear();
    try {
      BuildSignature(st.spec, args, PyVectorcall_NARGS(nargsf), kwnames, sig, /*allow_specs=*/false, keep);
    } catch (const NeedsFallback&) {
      return CallFallbackOf(st, args, nargsf, kwnames);
    }
    // Before any Python code runs with it; else its context died
    // meanwhile: build it again.
    if (sig.AdoptContext()) break;
  }
  return CallAfterMiss(st, sig, t, args, nargsf, kwnames, leaves);
}

[[noreturn]] void RaiseMessage(PyObject* type, const std::string& msg) {
  PyErr_SetString(type, msg.c_str());
  throw nb::python_error();
}

void CallHook(PyObject* hook, std::initializer_list<PyObject*> args) {
  SavedError pending;  // a failed compile's error, kept intact
  std::vector<PyObject*> argv(args);
  PyObject* r = PyObject_Vectorcall(hook, argv.data(), argv.size(), nullptr);
  if (r) {
    Py_DECREF(r);
  } else if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
    ClearErrorKeepingInterrupt();  // a Ctrl-C in a logging hook is not "unraisable"
  } else if (PyErr_ExceptionMatches(PyExc_RecursionError)) {
    // At the recursion limit (a deep chain of nested compiles): reporting
    // it would run sys.unraisablehook there and fail again, printing
    // "Exception ignored in sys.unraisablehook". The log line is lost.
    PyErr_Clear();
  } else {
    PyErr_WriteUnraisable(hook);
  }
}

nb::object SignatureString(const JitState& st, const Entry& e) {
  return StealOrThrow(PyUnicode_FromString(e.sig->ToString(st.spec).c_str()));
}

nb::object Call(JitState& st, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  CallSignature sig;
  return LeakingOnForcedUnwind(
      [&] {
        if (st.spec.context_in_executable) return CallContextInExecutable(st, sig, args, nargsf, kwnames);
        return CallWithSignature(st, sig, args, nargsf, kwnames);
      },
      // Ended by CPython at interpreter shutdown, with no thread state: the
      // signature's references must not be dropped here (a last one would
      // deallocate without a thread state). Moved into a leaked copy.
      [&] { new CallSignature(std::move(sig)); });
}

bool BuildAdopted(JitState& st, PyObject* const* args, size_t nargs, PyObject* kwnames, CallSignature& sig,
                  LeafObjects* leaves) {
  for (;;) {
    try {
      BuildSignature(st.spec, args, nargs, kwnames, sig, /*allow_specs=*/true, leaves);
    } catch (const NeedsFallback&) {
      return false;
    }
    if (sig.AdoptContext()) return true;
    sig.Clear();  // its context died meanwhile: build it again
    if (leaves) leaves->clear();
  }
}

namespace {

// BuildAdopted for a compile asked for ahead of traffic, which a call that
// would take the fallback path cannot be.
void BuildToPrecompile(JitState& st, PyObject* const* args, size_t nargs, PyObject* kwnames, CallSignature& sig,
                       LeafObjects& leaves) {
  if (!BuildAdopted(st, args, nargs, kwnames, sig, st.executable_for.is_valid() ? &leaves : nullptr)) {
    RaiseMessage(PyExc_TypeError, "cannot precompile " + st.spec.fun_name +
                                      "() here: the call would take the compiler's fallback "
                                      "path, which is not cached (e.g. tracers among the "
                                      "arguments, a JAX trace active, or jax.disable_jit() on)");
  }
}

}  // namespace

bool Precompile(JitState& st, PyObject* const* args, size_t nargs, PyObject* kwnames) {
  CallSignature sig;
  LeafObjects leaves;
  BuildToPrecompile(st, args, nargs, kwnames, sig, leaves);
  Resolved r = Resolve(st, sig);
  if (!r.inserted) return false;
  Compile(st, r.entry, args, nargs, kwnames, leaves, r.adopted.get());
  return r.adopted == nullptr;  // an adopted one was compiled already
}

PrecompileSaved PrecompileSavedSpec(JitState& st, PyObject* const* args, size_t nargs, PyObject* kwnames) {
  CallSignature sig;
  LeafObjects leaves;
  BuildToPrecompile(st, args, nargs, kwnames, sig, leaves);
  // Only into the room max_signatures leaves beside the counted signatures
  // and the other provisional ones (a reservation, exact among warm-ups;
  // traffic counted meanwhile is counted as usual).
  FunctionStore& store = *st.store;
  if (store.Find(sig)) return PrecompileSaved::kCached;  // cached already: needs no room
  if (!store.ReserveProvisional(store.limit().max)) return PrecompileSaved::kNoRoom;
  struct Reservation {
    FunctionStore& store;
    bool held = true;
    ~Reservation() {
      if (held) store.ReleaseProvisional();
    }
  } reservation{store};
  Resolved r = Resolve(st, sig, /*adopt=*/false);
  if (!r.inserted) return PrecompileSaved::kCached;
  Compile(st, r.entry, args, nargs, kwnames, leaves, nullptr, /*provisional=*/true);  // throws if it failed
  reservation.held = false;  // handed to the entry (MarkProvisional)
  return PrecompileSaved::kCompiled;
}

std::string SignatureOf(JitState& st, PyObject* const* args, size_t nargs, PyObject* kwnames) {
  CallSignature sig;
  if (!BuildAdopted(st, args, nargs, kwnames, sig)) return st.spec.fun_name + "(<traced>)";
  return sig.ToString(st.spec);
}

int& AheadDepth() { return t_ahead; }

void AfterForkInChild() {
  NoteForkInChild();
  g_graph.store(new WaitForGraph(), std::memory_order_release);
  ReinitSignatureLocksInChild();
  AfterForkInChildCaches();
}

size_t WaitingThreads() { return Graph().waiting(); }

}  // namespace ftjit
