// ftjit: the Resolve stage of the call pipeline: finding a signature's
// entry after the probe missed (insert it, or find it compiling and wait
// for its compile), with the wait-for graph that turns a cycle of waits
// into CompileCycleError and a re-entered compile into
// RecursiveCompileError.
//
//   | state    | protection                                                  |
//   |----------|-------------------------------------------------------------|
//   | g_graph  | atomic pointer, process lifetime; swapped for an empty      |
//   |          | graph in a forked child (the old one leaks); the graph has  |
//   |          | its own leaf lock (WaitForGraph)                            |
//   | t_ahead  | thread-local (depth of compiles asked for ahead of traffic) |
//
// Lock order: takes no lock itself. The store's locks and the graph's leaf
// lock are taken inside those calls, around Python-free steps only: never
// across Python code, the compiler or a wait (a waiter releases the GIL
// holding no C++ lock).
#include <Python.h>

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
  if (s == CompileLatch::State::kFailed) RaiseForWaiter(st.spec.fun_name, e.payload.error);
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

int& AheadDepth() { return t_ahead; }

void AfterForkInChild() {
  NoteForkInChild();
  g_graph.store(new WaitForGraph(), std::memory_order_release);
  ReinitSignatureLocksInChild();
  AfterForkInChildCaches();
}

size_t WaitingThreads() { return Graph().waiting(); }

}  // namespace ftjit
