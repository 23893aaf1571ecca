// ftjit: what the JitFunction files share: the per-function state, the
// Python object's layout, and the helpers more than one of them uses.
//
//   | state                  | protection                                      |
//   |------------------------|-------------------------------------------------|
//   | JitState (one per      | fixed after construction, except that the GC's  |
//   |   JitFunction)         | tp_clear empties an unreachable one (every entry|
//   |                        | point checks CheckNotCleared first); freed by   |
//   |                        | dealloc                                         |
//   | its store and counters | FunctionStore, EntryStore                       |
//
// Lock order: declares no lock.
#pragma once

#include <Python.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include <nanobind/nanobind.h>

#include "pyutil/vectorcall_args.h"
#include "pyutil/waiter_errors.h"
#include "signature/signature.h"
#include "store/function_cache.h"

namespace ftjit {

namespace nb = nanobind;

// Per-JitFunction state; fixed after construction except where noted.
struct JitState {
  nb::object fun;             // the wrapped function; cleared only by tp_clear
  nb::object compile;         // compile(fun, args, kwargs) -> executable
  nb::object hooks;           // the compiler's ftjit.CompilerHooks
  nb::object cache;           // the FunctionCache Python object
  nb::object options;         // hashable options key shared with other wrappers
  nb::object pickle_options;  // dict handed back to ftjit.jit on unpickling
  // Called instead of the executable when the call must not be cached
  // (NeedsFallback), and after one of redo_types: the hooks' `fallback`.
  nb::object fallback;
  // Exception types (a tuple, or null) after which a failed executable call
  // is made again through `fallback`, which reports it its own way (JAX:
  // jax_debug_nans re-runs de-optimised to name the op).
  nb::object redo_types;
  // The hooks' executable_for(compiled, args, kwargs, leaves) ->
  // (executable, takes_leaves), asked once per compile; may be null. When
  // set, every call keeps its leaves (BuildSignature's leaf_objects).
  nb::object executable_for;
  // The hooks' thread_call(miss, eager, static_argnums, static_argnames,
  // capacity), which makes each thread's call object of the whole function
  // (its ThreadCall, the first-level cache of its calls); null where the
  // function has none (no such hook, or static_argnums it cannot take).
  // With the two tuples and the capacity it is called with: the signatures
  // one object keeps at most (max_signatures, else the cache's capacity).
  nb::object thread_call, thread_call_argnums, thread_call_argnames;
  int64_t thread_call_capacity = 0;
  // CompilerHooks.METHOD_HOOKS, which JitFunction's methods of the same
  // names call, with their names (str), read once at jit(); null where the
  // compiler has none.
  static constexpr size_t kMaxMethodHooks = 8;
  nb::object method_hook_names[kMaxMethodHooks];
  nb::object method_hooks[kMaxMethodHooks];
  SignatureSpec spec;
  std::shared_ptr<FunctionStore> store;
  bool strip_static = false;   // call executables with dynamic arguments only
  double compile_timeout = 0;  // seconds a waiter waits at most; <= 0: forever
  int explain_misses = -1;     // log why each miss missed: 1, 0, or -1 (ExplainMisses())

  // The method hook named `name`, or null (no attribute lookup).
  nb::object MethodHook(const char* name) const {
    for (size_t i = 0; i < kMaxMethodHooks && method_hook_names[i].is_valid(); ++i) {
      if (PyUnicode_CompareWithASCIIString(method_hook_names[i].ptr(), name) == 0) return method_hooks[i];
    }
    return nb::object();
  }

  // Every Python object the state holds, each once: the GC's traverse and
  // clear share this one list of the fields.
  template <class F>
  void ForEachObject(F&& f) {
    for (nb::object* o :
         {&fun, &compile, &hooks, &cache, &options, &pickle_options, &fallback, &redo_types, &executable_for,
          &thread_call, &thread_call_argnums, &thread_call_argnames}) {
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

// Throws RuntimeError once the GC's tp_clear has emptied this function.
inline void CheckNotCleared(const JitState& st) {
  if (!st.fun.is_valid()) RaiseMessage(PyExc_RuntimeError, "this jitted function was cleared by the garbage collector");
}

// Calls an observability hook (ftjit._observe.on_compile / on_wait); its
// exceptions are unraisable, never replacing the call's result or error.
void CallHook(PyObject* hook, std::initializer_list<PyObject*> args);

// The readable signature of entry `e`, as a str.
nb::object SignatureString(const JitState& st, const Entry& e);

inline uint64_t NanosSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

// --- the type, and a function of it -------------------------------------------

nb::object NewJitFunction(std::unique_ptr<JitState> st);
void RegisterConstruction(nb::module_& m);

// --- the call pipeline (docs/design.md, "The way a call flows") ---------------
//
//   Build -> Probe -> Hit | Miss -> Resolve -> Compile/Wait -> Invoke
//
// A call is one value (Call) that every stage takes. Invoke calls an
// entry's executable, or this thread's own copy of it (ThreadExecutables);
// a copy that meets a context it has not served calls the core back
// (ContextMiss), which runs the same pipeline again for the whole signature.

// A call's arguments as the vectorcall slot got them (borrowed for the
// call): `nargs` positional ones, then one per name in `kwnames`.
struct CallArgs {
  PyObject* const* items;
  size_t nargs;
  PyObject* kwnames;  // a tuple, or null
  size_t nargsf;      // nargs, with PY_VECTORCALL_ARGUMENTS_OFFSET as the caller gave it
  CallArgs(PyObject* const* a, size_t nargs_f, PyObject* kw)
      : items(a), nargs(PyVectorcall_NARGS(nargs_f)), kwnames(kw), nargsf(nargs_f) {}
  explicit CallArgs(const VectorcallArgs& v) : CallArgs(v.items(), v.nargs(), v.kwnames()) {}
};

using Slot = Entry::Slot;

// One call as it flows through the pipeline: its arguments, the signature
// and leaves built of them, and whether its hit (or miss, or wait) is
// counted yet. On the caller's stack; the stages below take it.
struct Call {
  Call(JitState& s, const CallArgs& a) : st(s), args(a), t(ThisThread()) {}
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  JitState& st;
  const CallArgs& args;
  const ThreadCtx& t;
  CallSignature sig;
  LeafObjects leaves;  // kept where executables may take them (executable_for), or keep_leaves asks
  bool keep_leaves = false;
  bool built = false;  // sig and leaves hold a build (Build empties them first)

  // A call is counted exactly once, by construction: its hit only through
  // CountHitOnce (a no-op once anything counted the call), and whatever
  // else counts it (a miss, a wait, the fallback: no hit) says so with
  // MarkCounted before or instead.
  void CountHitOnce(Entry& e, Slot& slot) {
    if (counted_) return;
    counted_ = true;
    st.store->CountHit(&e, slot, t.index);
  }
  void MarkCounted() { counted_ = true; }

 private:
  bool counted_ = false;
};

// Build: the call's signature into c.sig (whole, or `partial`: without
// context and placements, for a probe of a function whose executables
// check them); false when the call must take the compiler's fallback.
// `allow_specs`: array specs stand for arrays (precompile, warm-up).
bool Build(Call& c, bool partial, bool allow_specs = false);
// Build, whole, with c.sig's context adopted (built again while its
// context dies meanwhile).
bool BuildAdopted(Call& c, bool allow_specs = false);
// The whole pipeline: the vectorcall's body.
nb::object RunCall(JitState& st, const CallArgs& args);
// The call through the compiler's fallback (uncached).
nb::object Fallback(const Call& c);

// The entry of a signature after the probe missed: one this thread
// inserted and must compile, or a ready one (found ready, or waited for).
struct Resolved {
  EntryPtr entry;
  bool inserted;   // this thread owns the compile
  bool was_ready;  // ready when found: a hit, no wait
  // With `inserted`: the provisional entry whose slot `entry` took, whose
  // payload the compile takes instead of compiling.
  EntryPtr adopted;
};
// Resolve: `sig` must have adopted its context. An abandoned compile is
// looked up again (this thread may compile it). With `adopt`, a provisional
// entry found ready is adopted (a call, a precompile); without, it is
// found as any ready entry (another saved spec's warm-up). Counts waits;
// the caller counts the rest.
Resolved Resolve(JitState& st, CallSignature& sig, bool adopt = true);

// Compile: this thread inserted `e` (its miss): runs the guard, links `e`
// into the LRU, compiles, and publishes the executable, or the error to
// every waiter (abandoned, when this thread was interrupted: a waiter
// compiles again). With `adopted` (the provisional entry whose slot `e`
// took), `e` takes its executable instead of compiling. With `provisional`
// (a saved spec's warm-up), the guard does not run and `e` is published
// provisional: in the map, unlisted, uncounted until adopted. Counts the
// call's miss (or an adoption's hit).
void Compile(Call& c, const EntryPtr& e, const Entry* adopted = nullptr, bool provisional = false);

// precompile(*args, **kwargs): compiles this signature if it is not cached;
// true if this call compiled it. Executes nothing.
bool Precompile(JitState& st, const CallArgs& args);
// _precompile_saved(*args, **kwargs) (see its docstring): compiles a
// provisional entry while max_signatures leaves room. Executes nothing.
enum class PrecompileSaved { kNoRoom = -1, kCached = 0, kCompiled = 1 };
PrecompileSaved PrecompileSavedSpec(JitState& st, const CallArgs& args);
// The max_signatures guard, in the thread about to compile `e`: counts it,
// and explains the miss when asked to (ftjit._explain.on_miss writes the
// text). Past the limit, on_excess="raise" throws RecompileLimitError (the
// compile must not run); "warn" warns once per store and compiles. Compiles
// asked for ahead of traffic are counted, never explained.
void Guard(JitState& st, const EntryPtr& e);
// bench's stage table: mean ns of a hit's Build and of its Probe of these
// (cached) arguments, each over `n` runs in a loop of its own.
nb::tuple HitStageNs(JitState& st, const CallArgs& args, int n);
// A new copy from ThreadExecutables.make (given the core's miss and eager
// callbacks); TypeError for a non-callable.
nb::object MakeCopy(const nb::object& make_local);
// Registers _context_miss and _eager (and keeps them for the copies), and
// the callbacks of the threads' call objects (_thread_call_miss,
// _thread_call_eager).
void RegisterThreadExecutables(nb::module_& m);
// disable_jit(): this thread's nesting depth. Read by every call: inline,
// trivially destructible (no thread-local guard).
inline thread_local int t_jit_disabled = 0;
inline int& JitDisabledDepth() { return t_jit_disabled; }
// This thread's compiles asked for ahead of traffic (precompile, warmup):
// not misses to explain. A nesting depth.
int& AheadDepth();
struct AheadOfTraffic {
  AheadOfTraffic() { ++AheadDepth(); }
  ~AheadOfTraffic() { --AheadDepth(); }
  AheadOfTraffic(const AheadOfTraffic&) = delete;
  AheadOfTraffic& operator=(const AheadOfTraffic&) = delete;
};
// The process-wide switch of miss explanations, for functions jitted with
// explain_misses=None (ftjit.set_explain_misses). A relaxed atomic.
std::atomic<bool>& ExplainMisses();
// os.register_at_fork(after_in_child=...), in the child's only thread:
// compiles in flight in the parent's other threads never finish here, so
// their entries are dropped, the locks they or their waiters may hold are
// re-initialised and the wait-for graph starts empty. The forking thread
// keeps its owner id: a compile it forked from inside is published as usual.
void AfterForkInChild();
// Threads now registered in the wait-for graph (diagnostics).
size_t WaitingThreads();

}  // namespace ftjit
