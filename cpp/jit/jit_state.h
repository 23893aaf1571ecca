// ftjit: what the JitFunction files share: the per-function state, the
// Python object's layout, and the few helpers more than one of them uses.
// The type itself: jit_type.cc; the call and wait path: call.cc; a compile:
// compile.cc; the max_signatures guard: guard.cc;
// a failed compile's error as each waiter raises it: waiter_errors.cc.
//
//   | state                  | protection                                      |
//   |------------------------|-------------------------------------------------|
//   | JitState (one per      | fixed after construction, except that the GC's  |
//   |   JitFunction)         | tp_clear empties an unreachable one (every entry|
//   |                        | point checks CheckNotCleared first); freed by   |
//   |                        | dealloc                                         |
//   | its store and counters | store/function_cache.h, store/entry_store.h     |
//
// Lock order: declares no lock.
#pragma once

#include <Python.h>
#include <nanobind/nanobind.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "signature/signature.h"
#include "store/function_cache.h"

namespace ftjit {

namespace nb = nanobind;

// Per-JitFunction state; fixed after construction except where noted.
struct JitState {
  nb::object fun;             // the wrapped function; cleared only by tp_clear
  nb::object compile;         // compile(fun, args, kwargs) -> executable
  nb::object hooks;           // the compiler's ftjit.CompilerHooks (ftjit/_hooks.py)
  nb::object cache;           // the FunctionCache Python object
  nb::object options;         // hashable options key shared with other wrappers
  nb::object pickle_options;  // dict handed back to ftjit.jit on unpickling
  // Called instead of the executable when the call must not be cached
  // (NeedsFallback), and after one of redo_types: the hooks' `fallback`.
  nb::object fallback;
  // Exception types (a tuple) after which a failed executable call is made
  // again through `fallback`, which reports it its own way (JAX: a NaN found
  // under jax_debug_nans, re-run de-optimised to name the op). May be null.
  nb::object redo_types;
  // The hooks' executable_for(compiled, args, kwargs, leaves) ->
  // (executable, takes_leaves), asked once per compile; may be null. When
  // set, every call keeps its leaves (BuildSignature's leaf_objects).
  nb::object executable_for;
  // The compiler's hooks that JitFunction's methods of the same names call
  // (CompilerHooks.METHOD_HOOKS: lower, trace and eval_shape with the
  // method's arguments, clear_cache first thing), read once at jit()
  // (ReadHooks) with their names (str); a hook is null where the compiler
  // has none.
  static constexpr size_t kMaxMethodHooks = 8;
  nb::object method_hook_names[kMaxMethodHooks];
  nb::object method_hooks[kMaxMethodHooks];
  SignatureSpec spec;
  std::shared_ptr<FunctionStore> store;
  bool strip_static = false;   // call executables with dynamic arguments only
  double compile_timeout = 0;  // seconds a waiter waits at most; <= 0: forever
  int explain_misses = -1;     // log why each miss missed: 1, 0, or -1 (ExplainMisses())

  // The method hook named `name`, or null: a comparison of C strings over
  // the names read at jit(), no attribute lookup.
  nb::object MethodHook(const char* name) const {
    for (size_t i = 0; i < kMaxMethodHooks && method_hook_names[i].is_valid(); ++i) {
      if (PyUnicode_CompareWithASCIIString(method_hook_names[i].ptr(), name) == 0) return method_hooks[i];
    }
    return nb::object();
  }

  // Every Python object the state holds, each once: for the GC's traverse
  // and clear (jit_type.cc), so that no list of fields is kept twice.
  template <class F>
  void ForEachObject(F&& f) {
    for (nb::object* o :
         {&fun, &compile, &hooks, &cache, &options, &pickle_options, &fallback, &redo_types, &executable_for}) {
      f(*o);
    }
    for (nb::object& o : method_hook_names) f(o);
    for (nb::object& o : method_hooks) f(o);
    spec.ForEachObject(f);
  }
};

struct JitFunctionObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* dict;
  PyObject* weaklist;
  JitState* state;
};

inline JitState& StateOf(PyObject* self) { return *reinterpret_cast<JitFunctionObject*>(self)->state; }

// Raises type(msg), as a C++ throw of the Python error.
[[noreturn]] void RaiseMessage(PyObject* type, const std::string& msg);

// Throws RuntimeError once the GC's tp_clear has emptied this function
// (every entry point checks first).
inline void CheckNotCleared(const JitState& st) {
  if (!st.fun.is_valid()) RaiseMessage(PyExc_RuntimeError, "this jitted function was cleared by the garbage collector");
}

// Calls an observability hook (ftjit._observe.on_compile / on_wait); its
// exceptions are reported as unraisable, never allowed to replace the
// call's own result or error.
void CallHook(PyObject* hook, std::initializer_list<PyObject*> args);

// The readable signature of entry `e`, as a str.
nb::object SignatureString(const JitState& st, const Entry& e);

inline uint64_t NanosSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

// --- waiter_errors.cc: a failed compile's error, once per waiter ------------

// The compile's exception as waiters will read it: a private copy that
// nobody raises or writes after Publish() (see waiter_errors.cc).
nb::object ErrorForWaiters(const nb::object& original);
// Raises this waiter's own copy of the compile's exception.
[[noreturn]] void RaiseForWaiter(const JitState& st, const nb::object& error);

// --- jit_type.cc and construct.cc: the type, and a function of it -------------

// A new JitFunction owning `st`.
nb::object NewJitFunction(std::unique_ptr<JitState> st);
// Registers _make_jit_function (construct.cc).
void RegisterConstruction(nb::module_& m);

// --- compile.cc: a compile, by the thread that inserted the entry ------------

// This thread inserted `e` (its miss): runs the guard, links `e` into the
// LRU, compiles, and publishes the executable, or the error to every waiter
// (abandoned, when this thread was interrupted: a waiter compiles again).
// Throws the compile's exception. With `adopted` (the provisional entry
// whose slot `e` took: entry_store.h), the guard runs as for any miss and
// `e` takes its executable instead of compiling. With `provisional` (a
// saved spec's warm-up), the guard does not run and `e` is published
// provisional: in the map, unlisted, uncounted until adopted.
void Compile(JitState& st, const EntryPtr& e, PyObject* const* args, size_t nargsf, PyObject* kwnames,
             const LeafObjects& leaves, const Entry* adopted = nullptr, bool provisional = false);

// --- call.cc: the call and wait path ------------------------------------------

// The entry of a signature after the hit path missed: either one this
// thread inserted and must compile, or a ready one (found ready, or waited
// for). An abandoned compile (its thread was interrupted) is looked up
// again, and this thread may then be the one to compile it.
struct Resolved {
  EntryPtr entry;
  bool inserted;   // this thread owns the compile
  bool was_ready;  // ready when found: a hit, no wait
  // With `inserted`: the provisional entry whose slot `entry` took, whose
  // payload the compile takes instead of compiling (entry_store.h,
  // "Provisional entries").
  EntryPtr adopted;
};
// `sig` must have adopted its context (CallSignature::AdoptContext). With
// `adopt`, a provisional entry found ready is adopted (a call, a precompile
// of the program's own); without, it is found as any ready entry (the
// warm-up of another saved spec). Counts waits; the caller counts the rest.
Resolved Resolve(JitState& st, CallSignature& sig, bool adopt = true);
// Calls `exe` with the call's leaves when `takes_leaves` (flattened once,
// by BuildSignature), else with its arguments; when it fails with one of
// st.redo_types, the call is made again through the fallback (see
// JitState::redo_types). Throws what it raised.
nb::object CallExecutable(JitState& st, PyObject* exe, bool takes_leaves, PyObject* const* args, size_t nargsf,
                          PyObject* kwnames, const LeafObjects& leaves);
// The call through the compiler's fallback (uncached); throws on error.
nb::object CallFallbackOf(JitState& st, PyObject* const* args, size_t nargsf, PyObject* kwnames);
// A call whose partial signature (context_in_executable) missed: builds its
// whole signature into `sig` (and its leaves), then finds, compiles or
// waits for its entry, and calls it. Throws on error.
nb::object CallWhole(JitState& st, CallSignature& sig, const ThreadCtx& t, PyObject* const* args, size_t nargsf,
                     PyObject* kwnames, LeafObjects& leaves);

// --- thread_executables.cc: copies per thread that check the context ------------

// Whether `e`'s executable is ThreadExecutables (a copy per thread).
bool UsesCopies(const Entry& e);
// A new copy from ThreadExecutables.make (given the core's miss and eager
// callbacks). Throws what it raised, or TypeError for a non-callable.
nb::object MakeCopy(const nb::object& make_local);
// Calls ready entry `e`, whose hit (or miss) the caller counted: its
// executable, or this thread's own copy of it. Throws on error.
nb::object CallEntry(JitState& st, Entry& e, const ThreadCtx& t, PyObject* const* args, size_t nargsf,
                     PyObject* kwnames, const LeafObjects& leaves);
// A call of a function whose executables check the context (the hit path
// reads none). Throws on error.
nb::object CallContextInExecutable(JitState& st, CallSignature& sig, PyObject* const* args, size_t nargsf,
                                   PyObject* kwnames);
// Registers _context_miss and _eager (and keeps them for the copies).
void RegisterThreadExecutables(nb::module_& m);

// A call of the jitted function (the vectorcall's body). Throws on error.
nb::object Call(JitState& st, PyObject* const* args, size_t nargsf, PyObject* kwnames);
// precompile(*args, **kwargs): compiles this signature if it is not cached;
// true if this call compiled it. Executes nothing.
bool Precompile(JitState& st, PyObject* const* args, size_t nargs, PyObject* kwnames);
// _precompile_saved(*args, **kwargs): a saved spec's warm-up. Compiles the
// signature as a provisional entry (not counted against max_signatures
// until a call or precompile adopts it), only while the counted and
// provisional signatures leave room under max_signatures. Executes nothing.
enum class PrecompileSaved { kNoRoom = -1, kCached = 0, kCompiled = 1 };
PrecompileSaved PrecompileSavedSpec(JitState& st, PyObject* const* args, size_t nargs, PyObject* kwnames);
// guard.cc: the max_signatures guard for the compile of `e` (just inserted
// by this thread): throws when the compile must not run (RecompileLimitError,
// or the warning turned into an error). Explains the miss when asked to.
void Guard(JitState& st, const EntryPtr& e);
// The adopted signature of these arguments (array specs such as
// jax.ShapeDtypeStruct stand for arrays); false when the call would take the
// compiler's fallback.
bool BuildAdopted(JitState& st, PyObject* const* args, size_t nargs, PyObject* kwnames, CallSignature& sig,
                  LeafObjects* leaves = nullptr);
// The readable signature these arguments would have ("f(<traced>)" for a
// call that would take the fallback).
std::string SignatureOf(JitState& st, PyObject* const* args, size_t nargs, PyObject* kwnames);
// disable_jit(): this thread's nesting depth. Read by every call: a
// trivially destructible thread-local (no guard), inline.
inline thread_local int t_jit_disabled = 0;
inline int& JitDisabledDepth() { return t_jit_disabled; }
// This thread's compiles asked for ahead of traffic (precompile, warmup):
// not misses to explain. A nesting depth (call.cc).
int& AheadDepth();
struct AheadOfTraffic {
  AheadOfTraffic() { ++AheadDepth(); }
  ~AheadOfTraffic() { --AheadDepth(); }
  AheadOfTraffic(const AheadOfTraffic&) = delete;
  AheadOfTraffic& operator=(const AheadOfTraffic&) = delete;
};
// The process-wide switch of miss explanations, for functions jitted with
// explain_misses=None (ftjit.set_explain_misses). A relaxed atomic (call.cc).
std::atomic<bool>& ExplainMisses();
// os.register_at_fork(after_in_child=...), see call.cc.
void AfterForkInChild();
// Threads now registered in the wait-for graph (diagnostics).
size_t WaitingThreads();

}  // namespace ftjit
