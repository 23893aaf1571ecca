// ftjit: the call pipeline of a JitFunction (docs/design.md, "The way a
// call flows"), one path from arguments to executable:
//
//   Build   the signature (partial for a function whose executables check
//           the context and placements: context_in_executable)
//   Probe   the ready table, lock-free (EntryStore::FindReady)
//   Hit     -> Invoke
//   Miss    the whole signature (probed again if the first was partial),
//           adopted -> Resolve -> Compile, or a wait for another
//           thread's compile -> Invoke
//   Invoke  the entry's executable, or this thread's own copy of it
//           (ThreadExecutables: made on the thread's first call, kept in
//           its slot of the entry). A copy checks the context itself and
//           calls ContextMiss for one it has not served: the same
//           pipeline again, from Build, for the whole signature; the
//           entry it finds becomes this thread's redirect of the head.
//
// What a call holds while it runs: the entries it invokes (counted in
// flight, or a strong reference after Resolve) and the copy it calls (a
// strong reference): a re-entrant call on this thread (a hook, a logging
// handler, a finalizer) may replace the slot's copy or clear the cache,
// never free what an outer call runs.
//
//   | state        | protection                                            |
//   |--------------|-------------------------------------------------------|
//   | ThreadCtx::  | the thread's own: the innermost call of a copy, for   |
//   |   frame      | the copy's callbacks (ContextMiss, Eager)             |
//   | g_miss,      | made at module init, then fixed                       |
//   |   g_eager    |                                                       |
//   | a slot's     | the thread holding its index (EntrySlot)              |
//   |   copy,      |                                                       |
//   |   redirect   |                                                       |
//
// Lock order: takes no lock itself; the store's calls take their leaf
// locks around Python-free steps only. Every executable, copy and callback
// runs with no ftjit lock held.
#include <Python.h>

#include <chrono>
#include <string>
#include <utility>

#include <nanobind/nanobind.h>

#include "jit/jit_state.h"
#include "pyutil/errors.h"
#include "signature/signature.h"
#include "store/function_cache.h"

namespace ftjit {

namespace {

// --- calling an executable --------------------------------------------------------

// The executable with the call's dynamic arguments only (strip_static: the
// JAX compiler's executables take those). Out of line: its argument arrays
// stay off the frame of calls that pass every argument, which recursion
// through jitted functions stacks.
[[gnu::noinline]] nb::object CallStripped(const Call& c, PyObject* exe) {
  const SignatureSpec& spec = c.st.spec;
  const CallArgs& a = c.args;
  Py_ssize_t nkw = a.kwnames ? PyTuple_GET_SIZE(a.kwnames) : 0;
  SmallVector<PyObject*, 8> dyn;
  for (size_t i = 0; i < a.nargs; ++i) {
    if (!spec.IsStaticPosition(i, a.nargs)) dyn.push_back(a.items[i]);
  }
  size_t dyn_pos = dyn.size();
  nb::object dyn_names;
  if (nkw > 0) {
    SmallVector<PyObject*, 8> names;
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      PyObject* name = PyTuple_GET_ITEM(a.kwnames, k);
      if (spec.static_argnames.empty() || !spec.IsStaticName(name)) {
        names.push_back(name);
        dyn.push_back(a.items[a.nargs + k]);
      }
    }
    if (static_cast<Py_ssize_t>(names.size()) == nkw) {
      dyn_names = nb::borrow(a.kwnames);
    } else if (!names.empty()) {
      dyn_names = nb::steal(PyTuple_New(names.size()));
      if (!dyn_names.is_valid()) throw nb::python_error();
      for (size_t j = 0; j < names.size(); ++j) PyTuple_SET_ITEM(dyn_names.ptr(), j, Py_NewRef(names[j]));
    }
  }
  return LeakingOnForcedUnwind(
      [&] { return nb::steal(PyObject_Vectorcall(exe, dyn.data(), dyn_pos, dyn_names.ptr())); },
      [&] { dyn_names.release(); });  // no thread state: leaked, not deallocated
}

// Calls `exe` with the call's leaves when `takes_leaves`, else with its
// arguments: its result, or null with the error set.
nb::object CallRaw(const Call& c, PyObject* exe, bool takes_leaves) {
  const JitState& st = c.st;
  if (takes_leaves) {
    if (!st.executable_for.is_valid()) {
      // Entries are shared by wrappers of equal compilers, whose hooks agree.
      RaiseMessage(PyExc_RuntimeError, "ftjit: an executable that takes leaves, reached by a "
                                       "function whose hooks have no executable_for");
    }
    return nb::steal(PyObject_Vectorcall(exe, c.leaves.data(), c.leaves.size(), nullptr));
  }
  return st.strip_static ? CallStripped(c, exe)
                         : nb::steal(PyObject_Vectorcall(exe, c.args.items, c.args.nargsf, c.args.kwnames));
}

// With an executable's error set: true (and cleared) when it is one of
// st.redo_types, after which the call is made again through the fallback.
bool IsRedo(const Call& c) {
  const JitState& st = c.st;
  if (!st.redo_types.is_valid() || !st.fallback.is_valid() || !PyErr_ExceptionMatches(st.redo_types.ptr())) {
    return false;
  }
  PyErr_Clear();
  return true;
}

// CallRaw, made again through the fallback when it fails with one of
// st.redo_types.
[[gnu::noinline]] nb::object CallExecutable(const Call& c, PyObject* exe, bool takes_leaves) {
  nb::object out = CallRaw(c, exe, takes_leaves);
  if (out.is_valid()) return out;
  if (IsRedo(c)) return Fallback(c);
  throw nb::python_error();
}

// --- Invoke ------------------------------------------------------------------------

bool UsesCopies(const Entry& e) { return e.payload.make_local.is_valid(); }

// The call of a copy, for the copy's callbacks: the call, the entry whose
// copy runs, and the head (the entry the call's probe found, whose slot of
// this thread redirects). On the caller's stack, linked to the thread's
// previous one (a callback may call jitted functions: frames nest).
struct CopyFrame {
  Call& call;
  Entry& entry;
  Slot& slot;
  Entry& head;
  Slot& head_slot;
  CopyFrame* prev = nullptr;
};

// The thread's innermost CopyFrame is its ThreadCtx's `frame` (the call
// holds its Ctx already: no thread-local lookup).
class CopyFrameScope {
 public:
  explicit CopyFrameScope(CopyFrame& f) : f_(f) {
    f_.prev = static_cast<CopyFrame*>(f_.call.t.frame);
    f_.call.t.frame = &f_;
  }
  ~CopyFrameScope() { f_.call.t.frame = f_.prev; }
  CopyFrameScope(const CopyFrameScope&) = delete;
  CopyFrameScope& operator=(const CopyFrameScope&) = delete;

 private:
  CopyFrame& f_;
};

// ContextMiss and Eager as Python callables: made at module init, kept for
// the process's life (never dropped: no destructor at exit).
PyObject* g_miss = nullptr;
PyObject* g_eager = nullptr;

// Invoke's variant for ThreadExecutables: this thread's own copy of `e`,
// held while it runs (a re-entrant call may drop the slot's reference
// after a failure, or make a fresh copy). Out of line: the hit path of a
// plain executable stays small (recursion through jitted functions stacks
// it).
[[gnu::noinline]] nb::object InvokeCopy(Call& c, Entry& e, Slot& slot, Entry& head, Slot& head_slot) {
  nb::object copy = slot.copy;
  if (!copy.is_valid()) {
    copy = MakeCopy(e.payload.make_local);
    slot.copy = copy;
  }
  CopyFrame frame{c, e, slot, head, head_slot};
  nb::object out;
  try {
    CopyFrameScope scope(frame);
    out = CallExecutable(c, copy.ptr(), e.payload.takes_leaves);
  } catch (nb::python_error&) {
    // A hit still (the program raised). A copy keeps a failed context as
    // uncached: the next call of this thread makes a fresh one.
    c.CountHitOnce(e, slot);
    if (slot.copy.ptr() == copy.ptr()) nb::object dropped = std::move(slot.copy);  // `copy` still holds it
    throw;
  }
  c.CountHitOnce(e, slot);
  return out;
}

// Invoke: calls entry `e` for `c`, which holds `e` (in flight, or by a
// strong reference) and `head` (the entry its probe found); the slots are
// this thread's. Counts the call's hit on `e` unless a stage counted it.
[[gnu::always_inline]] inline nb::object Invoke(Call& c, Entry& e, Slot& slot, Entry& head, Slot& head_slot) {
  if (UsesCopies(e)) return InvokeCopy(c, e, slot, head, head_slot);
  c.CountHitOnce(e, slot);
  return CallExecutable(c, e.payload.executable.ptr(), e.payload.takes_leaves);
}

// Invoke of what the probe found and holds in flight, released however the
// call ends.
[[gnu::always_inline]] inline nb::object InvokeHeld(Call& c, const FunctionStore::Held& h) {
  nb::object out;
  try {
    out = Invoke(c, *h.target, *h.target_slot, *h.head, *h.head_slot);
  } catch (...) {
    // Also a thread ended by CPython at shutdown (no thread state): the
    // epoch domain then frees nothing here, it only queues.
    FunctionStore::Release(h, c.t.rec);
    throw;
  }
  FunctionStore::Release(h, c.t.rec);
  return out;
}

// --- the pipeline --------------------------------------------------------------------

// Resolve -> Compile or Wait, counted, for a call whose whole signature is
// built, adopted and missed the probe: the entry (held), ready.
[[gnu::noinline]] EntryPtr ResolveCounted(Call& c) {
  FunctionStore::AfterMiss(c.t.rec);  // may run deleters (Python): the signature owns its context now
  Resolved r = Resolve(c.st, c.sig);  // moves c.sig into the entry if it inserts
  if (r.inserted) {
    Compile(c, r.entry, r.adopted.get());
  } else if (r.was_ready) {
    c.CountHitOnce(*r.entry, r.entry->slots.Get(c.t.index));
  } else {
    SharedLru<EntryPtr, LeafMutex>::Touch(r.entry);  // waited for (counted by Resolve)
  }
  c.MarkCounted();
  return std::move(r.entry);
}

// ResolveCounted -> Invoke. Out of line: recursion through jitted
// functions stacks the hit path's frame, which stays small without it.
[[gnu::noinline]] nb::object Miss(Call& c) {
  EntryPtr e = ResolveCounted(c);
  Slot& slot = e->slots.Get(c.t.index);  // `e` is held: its slot cannot go
  return Invoke(c, *e, slot, *e, slot);
}

// Build -> Probe -> Hit | Miss for `c`, from a whole signature unless
// `partial`. A partial probe's hit counts only on an entry whose
// executables check the context (copies); any other is looked up again by
// the whole signature.
nb::object Run(Call& c, bool partial) {
  FunctionStore& store = *c.st.store;
  for (;;) {
    if (!Build(c, partial)) return Fallback(c);
    if (FunctionStore::Held h = store.FindReady(c.sig, c.t.rec, c.t.index, /*follow_redirect=*/partial)) {
      if (!partial || UsesCopies(*h.target)) return InvokeHeld(c, h);
      FunctionStore::Release(h, c.t.rec);  // a plain executable: the whole signature decides
    } else if (partial) {
      FunctionStore::AfterMiss(c.t.rec);  // a partial signature borrows no context
    }
    if (partial) {
      partial = false;
      continue;
    }
    // Before any Python code runs with it; else its context died
    // meanwhile: built again.
    if (c.sig.AdoptContext()) return Miss(c);
  }
}

// --- a copy's callbacks ----------------------------------------------------------------

// The thread's innermost `frame` of a call object's callbacks; a callback
// called outside a call of the jitted function (`object` says whose) is a
// RuntimeError.
template <class Frame>
Frame& Innermost(void* frame, const char* object, const char* what) {
  if (!frame) {
    RaiseMessage(PyExc_RuntimeError, std::string("ftjit: ") + object + " called its " + what +
                                         " outside of a call of the jitted function");
  }
  return *static_cast<Frame*>(frame);
}

CopyFrame& CurrentCopy(const char* what) {
  return Innermost<CopyFrame>(ThisThread().frame, "a ThreadExecutables executable", what);
}

// ContextMiss(*args, **kwargs): the copy being called in this thread cannot
// serve its call from what it cached. Returns (outputs, cache_data, drop).
nb::object ContextMiss(nb::args args, nb::kwargs kwargs) {
  CopyFrame& f = CurrentCopy("miss");
  Call& outer = f.call;
  // The same arguments, whole: this thread's context and placements now.
  Call c(outer.st, outer.args);
  if (!BuildAdopted(c)) {
    outer.MarkCounted();
    return nb::make_tuple(Fallback(outer), nb::none(), true);
  }
  if (SameContextAndPlacements(*f.entry.sig, c.sig)) {
    // The copy's own context (its first call, or one it dropped): its
    // program runs, and the copy caches what it returns.
    outer.CountHitOnce(f.entry, f.slot);
    return StealOrThrow(PyObject_Call(f.entry.payload.own_miss.ptr(), args.ptr(), kwargs.ptr()));
  }
  // Another context: its entry, through the pipeline again (counted there).
  // One found listed becomes this thread's redirect of the head, valid while
  // no entry of these arguments left the store since `gen`.
  outer.MarkCounted();
  FunctionStore& store = *c.st.store;
  const uint64_t gen = store.RedirectGen(c.sig);
  nb::object out;
  if (FunctionStore::Held h = store.FindReady(c.sig, c.t.rec, c.t.index, /*follow_redirect=*/false)) {
    FunctionStore::Redirect(&f.head, f.head_slot, h.head, gen);
    out = InvokeHeld(c, h);
  } else {
    out = Miss(c);
  }
  return nb::make_tuple(out, nb::none(), true);
}

// Eager(*args, **kwargs): the compiler's eager mode is on (jax.disable_jit()):
// the call goes to the fallback, with its own arguments, uncached.
nb::object Eager(nb::args, nb::kwargs) {
  CopyFrame& f = CurrentCopy("eager");
  f.call.MarkCounted();
  return Fallback(f.call);
}

// --- a thread's call object of the whole function (ThreadCall) ---------------------------
//
// The hooks' thread_call makes, for each thread, one call object of the
// whole function that caches signatures itself (jaxlib's C++ call: its own
// signature, cache and call of the program), the first level of the
// thread's calls: a hit is one call into it, and the store never sees it.
// What it does not hold, it asks the core for (ThreadCallMiss): the whole
// pipeline, for the entry of its call (compiled once, waited for, explained,
// limited, as any miss), whose own program's miss then runs the call and
// returns what the call object keeps. Rules (issue 55):
//   - a call made while its thread is inside the function's call object
//     (a static's __hash__ or __eq__, a compile that recurses) takes the
//     store's path: the object's cache is never entered twice;
//   - the object keeps only signatures whose statics and node data are
//     exact builtin values (its lookup then runs no user __eq__); others it
//     is told to drop, and after kMaxDrops drops the thread bypasses it;
//   - a miss that raised leaves a signature the object keeps as
//     fall-back-to-miss for good (never cached again): the object is
//     replaced;
//   - clear_cache() (and the function's death, a cache clear) empties
//     every live object's own cache from the clearing thread (jaxlib locks
//     it, as jax.clear_caches() does) and bumps the store's Clears(): each
//     thread replaces its own object at its next call, never another
//     thread's, and a thread that bypassed it tries again; a forked child
//     leaks the other threads' (ForgetOtherThreadsInChild);
//   - every kSampleEvery-th call of a thread also finds its entry in the
//     store, to keep its recency and count its hits (kSampleEvery of them,
//     an estimate); the function's hits stay exact (ThreadCall::calls,
//     to_core).

// A call through a thread's call object, for the object's callbacks. On
// the caller's stack, linked to the thread's previous one.
struct ThreadCallFrame {
  JitState& st;
  const CallArgs& args;
  ThreadCall& tc;
  bool reached_core = false;  // the object called its miss or its eager callback
  bool miss_raised = false;
  void* prev = nullptr;
};

PyObject* g_call_miss = nullptr;
PyObject* g_call_eager = nullptr;

inline void PlainAdd(std::atomic<uint64_t>& n, std::memory_order order = std::memory_order_relaxed) {
  n.store(n.load(std::memory_order_relaxed) + 1, order);
}

// Whether a call now must defer (ContextHook::Defers); an error asking is
// taken for "defers" (the store's path then meets it), a Ctrl-C kept.
bool Defers(const JitState& st) {
  try {
    return st.spec.hook.Defers();
  } catch (nb::python_error& e) {
    e.restore();
    ClearErrorKeepingInterrupt();
    if (PyErr_Occurred()) throw nb::python_error();
    return true;
  }
}

// A new call object from the hooks' thread_call; null where it gave None.
nb::object MakeThreadCall(const JitState& st) {
  nb::object capacity = nb::steal(PyLong_FromLongLong(st.thread_call_capacity));
  if (!capacity.is_valid()) throw nb::python_error();
  nb::object call = StealOrThrow(PyObject_CallFunctionObjArgs(st.thread_call.ptr(), g_call_miss, g_call_eager,
                                                               st.thread_call_argnums.ptr(),
                                                               st.thread_call_argnames.ptr(), capacity.ptr(),
                                                               nullptr));
  if (call.is_none()) return nb::object();
  if (!PyCallable_Check(call.ptr())) {
    RaiseMessage(PyExc_TypeError, std::string("CompilerHooks.thread_call returned an object that is not callable: ") +
                                      Py_TYPE(call.ptr())->tp_name);
  }
  return call;
}

// One call in kSampleEvery: finds the call's entry in the store, to set its
// recency bit and count it kSampleEvery hits. A call whose arguments would
// not build here (the fallback's, or an error) is not sampled: its own call
// raises or defers as usual.
[[gnu::noinline]] void SampleHit(JitState& st, const CallArgs& args) {
  Call c(st, args);
  try {
    if (!Build(c, /*partial=*/true)) return;
  } catch (nb::python_error& e) {
    e.restore();
    ClearErrorKeepingInterrupt();
    if (PyErr_Occurred()) throw nb::python_error();
    return;
  }
  if (FunctionStore::Held h = st.store->FindReady(c.sig, c.t.rec, c.t.index, /*follow_redirect=*/true)) {
    FunctionStore::CountSampledHits(h.target, *h.target_slot, ThreadCall::kSampleEvery);
    FunctionStore::Release(h, c.t.rec);
  } else {
    FunctionStore::AfterMiss(c.t.rec);
  }
}

// With the error of a thread's call object that raised before asking the
// core set: throws the error a build of the arguments' signature raises
// instead (not counted: to_core), else the object's own.
[[noreturn]] void RaiseSignatureErrorOr(JitState& st, const CallArgs& args, ThreadCall& tc) {
  nb::python_error own;  // fetched: the build runs with no error set
  Call c(st, args);
  try {
    Build(c, /*partial=*/true);
  } catch (nb::python_error&) {
    PlainAdd(tc.to_core, std::memory_order_release);
    throw;
  }
  own.restore();
  throw nb::python_error();
}

// The call through this thread's call object of the function, into
// `out`; false (nothing run, nothing counted) when the call takes the
// store's path instead: the hooks made no object for this thread.
[[gnu::noinline]] bool CallThrough(JitState& st, const CallArgs& args, const ThreadCtx& t, ThreadCall& tc,
                                   nb::object& out) {
  if (--tc.until_sample == 0) {
    tc.until_sample = ThreadCall::kSampleEvery;
    SampleHit(st, args);
  }
  const uint64_t clears = st.store->Clears();
  nb::object call = tc.call;  // held while it runs: a callback may replace the slot's
  if (!call.is_valid() || tc.clears != clears) {
    // Not made for a call that defers (a trace is active, eager mode): the
    // hooks' make may run the compiler's checks, which need neither.
    if (Defers(st)) return false;
    call = MakeThreadCall(st);
    nb::object old = std::exchange(tc.call, call);  // dropped once the new one is in place
    tc.clears = clears;
    tc.drops = 0;
    tc.bypass = !call.is_valid();  // none for this thread: the store's path, until a clear
    if (tc.bypass) return false;
    st.store->AddThreadCall(call);
  }
  PlainAdd(tc.calls);
  ThreadCallFrame frame{st, args, tc};
  PyObject* result;
  {
    // Undone however the call ends (a thread ended at shutdown included:
    // the next thread to take the index finds the object free).
    struct Inside {
      const ThreadCtx& t;
      ThreadCallFrame& f;
      Inside(const ThreadCtx& ctx, ThreadCallFrame& frame) : t(ctx), f(frame) {
        f.prev = t.call_frame;
        t.call_frame = &f;
        ++f.tc.depth;
      }
      ~Inside() {
        --f.tc.depth;
        t.call_frame = f.prev;
      }
    } inside(t, frame);
    result = LeakingOnForcedUnwind(
        [&] { return PyObject_Vectorcall(call.ptr(), args.items, args.nargsf, args.kwnames); },
        [&] { call.release(); });  // ended at shutdown, with no thread state: leaked, not dropped
  }
  if (result) {
    out = nb::steal(result);
    return true;
  }
  if (!frame.reached_core) {
    Call c(st, args);
    if (IsRedo(c)) {  // the program it ran failed with one of redo_types: made again, as the store's path does
      out = Fallback(c);
      return true;
    }
    // Raised before the object asked the core: by its own parse of the
    // arguments (a pytree's flatten, dict keys it cannot sort), or by the
    // program it ran (which must not run again). The arguments' signature
    // is built, as the store's path would first: its error, if it raises
    // one, is ftjit's own for these arguments (and the call is not counted,
    // as there); else the object's error stands.
    RaiseSignatureErrorOr(st, args, tc);
  } else if (frame.miss_raised && tc.call.ptr() == call.ptr()) {
    // A signature whose miss raised stays in the object as fall-back-to-
    // miss for good (it asks the core every time and never keeps it
    // again): the object goes, the next call makes a fresh one.
    nb::object dropped = std::move(tc.call);
  }
  throw nb::python_error();
}

// Whether the call's statics are all builtin keys (IsBuiltinKey): the
// thread's call object hashes and compares them itself, so only those go
// to it, and what a user's __hash__ or __eq__ raises or re-enters is the
// store's to handle.
bool StaticsAreBuiltin(const SignatureSpec& spec, const CallArgs& a) {
  if (spec.static_argnums.empty() && spec.static_argnames.empty()) return true;
  for (size_t i = 0; i < a.nargs; ++i) {
    if (spec.IsStaticPosition(i, a.nargs) && !IsBuiltinKey(a.items[i])) return false;
  }
  if (a.kwnames && !spec.static_argnames.empty()) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(a.kwnames); ++k) {
      if (spec.IsStaticName(PyTuple_GET_ITEM(a.kwnames, k)) && !IsBuiltinKey(a.items[a.nargs + k])) return false;
    }
  }
  return true;
}

ThreadCallFrame& CurrentThreadCall(const char* what) {
  return Innermost<ThreadCallFrame>(ThisThread().call_frame, "a thread_call call object", what);
}

// A signature the object may not keep, or could not serve: counted; past
// kMaxDrops the thread's calls of the function take the store's path.
void Dropped(ThreadCall& tc) {
  if (++tc.drops >= ThreadCall::kMaxDrops) tc.bypass = true;
}

// The call of entry `e` (held) for a thread's call object's miss: its own
// program's miss (the copies' own_miss), whose (outputs, cache data, drop)
// the object keeps, unless `keep` is false; an entry without copies runs
// as the store's path would, and the object drops the signature.
nb::object ServeMiss(Call& c, Entry& e, Slot& slot, bool keep, ThreadCall& tc) {
  if (!UsesCopies(e)) {
    Dropped(tc);
    return nb::make_tuple(Invoke(c, e, slot, e, slot), nb::none(), true);
  }
  c.CountHitOnce(e, slot);
  nb::object res = CallRaw(c, e.payload.own_miss.ptr(), e.payload.takes_leaves);
  if (!res.is_valid()) {
    if (!IsRedo(c)) throw nb::python_error();
    Dropped(tc);
    return nb::make_tuple(Fallback(c), nb::none(), true);
  }
  if (!PyTuple_Check(res.ptr()) || PyTuple_GET_SIZE(res.ptr()) < 2) {
    RaiseMessage(PyExc_TypeError, std::string("ftjit: a ThreadExecutables own_miss returned ") +
                                      Py_TYPE(res.ptr())->tp_name + ", not (outputs, cache data, ...)");
  }
  if (keep && PyTuple_GET_ITEM(res.ptr(), 1) != Py_None) return res;
  Dropped(tc);
  return nb::make_tuple(nb::borrow(PyTuple_GET_ITEM(res.ptr(), 0)), nb::none(), true);
}

nb::object ThreadCallMissBody(ThreadCallFrame& f) {
  Call c(f.st, f.args);
  if (!BuildAdopted(c)) {
    c.MarkCounted();
    return nb::make_tuple(Fallback(c), nb::none(), true);
  }
  const bool keep = c.sig.KeysAreBuiltin();
  FunctionStore& store = *c.st.store;
  if (FunctionStore::Held h = store.FindReady(c.sig, c.t.rec, c.t.index, /*follow_redirect=*/false)) {
    nb::object out;
    try {
      out = ServeMiss(c, *h.target, *h.target_slot, keep, f.tc);
    } catch (...) {
      FunctionStore::Release(h, c.t.rec);
      throw;
    }
    FunctionStore::Release(h, c.t.rec);
    return out;
  }
  EntryPtr e = ResolveCounted(c);
  return ServeMiss(c, *e, e->slots.Get(c.t.index), keep, f.tc);
}

// ThreadCallMiss(*args, **kwargs): the thread's call object of the function
// holds no program for its call (the call's own arguments, which the frame
// has). Returns (outputs, cache data or None, drop).
nb::object ThreadCallMiss(nb::args, nb::kwargs) {
  ThreadCallFrame& f = CurrentThreadCall("miss");
  f.reached_core = true;
  PlainAdd(f.tc.to_core, std::memory_order_release);
  try {
    // A thread CPython ends at shutdown inside the miss (a compile or a
    // wait taking the GIL back) is parked, not unwound: the frames above
    // are jaxlib's and a noexcept callback's.
    return LeakingOnForcedUnwind([&] { return ThreadCallMissBody(f); }, [] { ParkThreadEndedAtShutdown(); });
  } catch (...) {
    f.miss_raised = true;
    throw;
  }
}

// ThreadCallEager(*args, **kwargs): the compiler's eager mode is on: the
// call goes to the fallback, uncached.
nb::object ThreadCallEager(nb::args, nb::kwargs) {
  ThreadCallFrame& f = CurrentThreadCall("eager");
  f.reached_core = true;
  PlainAdd(f.tc.to_core, std::memory_order_release);
  Call c(f.st, f.args);
  c.MarkCounted();
  return LeakingOnForcedUnwind([&] { return Fallback(c); }, [] { ParkThreadEndedAtShutdown(); });
}

}  // namespace

// --- the stages the rest of the core shares ------------------------------------------

[[gnu::noinline]] bool Build(Call& c, bool partial, bool allow_specs) {
  JitState& st = c.st;
  if (c.built) {  // a build again (a partial one, or a context that died): in place
    c.sig.Clear();
    c.leaves.clear();
  }
  c.built = true;
  LeafObjects* keep = st.executable_for.is_valid() || c.keep_leaves ? &c.leaves : nullptr;
  try {
    BuildSignature(st.spec, c.args.items, c.args.nargs, c.args.kwnames, c.sig, allow_specs, keep, partial);
  } catch (const NeedsFallback&) {
    return false;
  } catch (nb::python_error&) {
    if (!partial) throw;
    // Arguments a call that defers would not have looked at (a trace is
    // active, eager mode is on): the fallback takes them, as it would had
    // the context been read first. (The hooks' own errors keep the original.)
    bool defers = false;
    try {
      defers = st.spec.hook.Defers();
    } catch (nb::python_error& probe_error) {  // the probe's own error: the build's goes on, a Ctrl-C is kept
      probe_error.restore();
      ClearErrorKeepingInterrupt();
    }
    if (!defers) throw;
    return false;
  }
  return true;
}

bool BuildAdopted(Call& c, bool allow_specs) {
  for (;;) {
    if (!Build(c, /*partial=*/false, allow_specs)) return false;
    if (c.sig.AdoptContext()) return true;  // else its context died meanwhile: built again
  }
}

nb::object Fallback(const Call& c) {
  // E.g. tracers of an outer transformation: the compiler's own path, uncached.
  const JitState& st = c.st;
  if (!st.fallback.is_valid()) {
    RaiseMessage(PyExc_TypeError, st.spec.fun_name + "() got an argument that needs the "
                                  "compiler's fallback path, but it has none");
  }
  return StealOrThrow(PyObject_Vectorcall(st.fallback.ptr(), c.args.items, c.args.nargsf, c.args.kwnames));
}

nb::object RunCall(JitState& st, const CallArgs& args) {
  if (st.thread_call.is_valid()) {
    const ThreadCtx& t = ThisThread();
    ThreadCall& tc = st.store->thread_calls().Get(t.index);
    nb::object out;
    if (tc.depth == 0 && (!tc.bypass || tc.clears != st.store->Clears()) && StaticsAreBuiltin(st.spec, args) &&
        CallThrough(st, args, t, tc, out)) {
      return out;
    }
  }
  Call c(st, args);
  return LeakingOnForcedUnwind(
      [&] { return Run(c, st.spec.context_in_executable); },
      // Ended by CPython at interpreter shutdown, with no thread state: the
      // signature's references must not be dropped here (a last one would
      // deallocate without a thread state). Moved into a leaked copy.
      [&] { new CallSignature(std::move(c.sig)); });
}

nb::object MakeCopy(const nb::object& make_local) {
  nb::object exe = StealOrThrow(PyObject_CallFunctionObjArgs(make_local.ptr(), g_miss, g_eager, nullptr));
  if (!PyCallable_Check(exe.ptr())) {
    RaiseMessage(PyExc_TypeError, std::string("ThreadExecutables.make returned an object that is not callable: ") +
                                      Py_TYPE(exe.ptr())->tp_name);
  }
  return exe;
}

// --- ahead of traffic --------------------------------------------------------------------

namespace {

// BuildAdopted for a compile asked for ahead of traffic, which a call that
// would take the fallback path cannot be.
void BuildToPrecompile(Call& c) {
  if (!BuildAdopted(c, /*allow_specs=*/true)) {
    RaiseMessage(PyExc_TypeError, "cannot precompile " + c.st.spec.fun_name +
                                      "() here: the call would take the compiler's fallback "
                                      "path, which is not cached (e.g. tracers among the "
                                      "arguments, a JAX trace active, or jax.disable_jit() on)");
  }
}

}  // namespace

bool Precompile(JitState& st, const CallArgs& args) {
  Call c(st, args);
  BuildToPrecompile(c);
  Resolved r = Resolve(st, c.sig);
  if (!r.inserted) return false;
  Compile(c, r.entry, r.adopted.get());
  return r.adopted == nullptr;  // an adopted one was compiled already
}

PrecompileSaved PrecompileSavedSpec(JitState& st, const CallArgs& args) {
  Call c(st, args);
  BuildToPrecompile(c);
  // Only into the room max_signatures leaves beside the counted signatures
  // and the other provisional ones (a reservation, exact among warm-ups;
  // traffic counted meanwhile is counted as usual).
  FunctionStore& store = *st.store;
  if (store.Find(c.sig)) return PrecompileSaved::kCached;  // cached already: needs no room
  if (!store.ReserveProvisional(store.limit().max)) return PrecompileSaved::kNoRoom;
  struct Reservation {
    FunctionStore& store;
    bool held = true;
    ~Reservation() {
      if (held) store.ReleaseProvisional();
    }
  } reservation{store};
  Resolved r = Resolve(st, c.sig, /*adopt=*/false);
  if (!r.inserted) return PrecompileSaved::kCached;
  Compile(c, r.entry, nullptr, /*provisional=*/true);  // throws if it failed
  reservation.held = false;  // handed to the entry (MarkProvisional)
  return PrecompileSaved::kCompiled;
}

nb::tuple HitStageNs(JitState& st, const CallArgs& args, int n) {
  const bool partial = st.spec.context_in_executable;
  auto mean_ns = [&](bool probe) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      Call c(st, args);
      if (!Build(c, partial)) RaiseMessage(PyExc_TypeError, "these arguments take the fallback path");
      if (!probe) continue;
      FunctionStore::Held h = st.store->FindReady(c.sig, c.t.rec, c.t.index, /*follow_redirect=*/partial);
      if (!h) {
        if (partial || c.sig.AdoptContext()) FunctionStore::AfterMiss(c.t.rec);
        RaiseMessage(PyExc_ValueError, "these arguments' signature is not cached: call the function first");
      }
      FunctionStore::Release(h, c.t.rec);
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / n;
  };
  const double build = mean_ns(false);
  return nb::make_tuple(build, mean_ns(true) - build);
}

void RegisterThreadExecutables(nb::module_& m) {
  m.def("_context_miss", &ContextMiss,
        "Tests and compilers only: the miss callback of ThreadExecutables copies (see ftjit.ThreadExecutables).");
  m.def("_eager", &Eager,
        "Tests and compilers only: the eager callback of ThreadExecutables copies (see ftjit.ThreadExecutables).");
  m.def("_thread_index", [] { return ThisThread().index; },
        "Tests only: this thread's index (the lowest free among live threads; it names the thread's slot of\n"
        "every entry, which the next thread to take the index inherits).");
  m.def("_thread_call_miss", &ThreadCallMiss,
        "Tests and compilers only: the miss callback of CompilerHooks.thread_call's call objects.");
  m.def("_thread_call_eager", &ThreadCallEager,
        "Tests and compilers only: the eager callback of CompilerHooks.thread_call's call objects.");
  g_call_miss = nb::object(m.attr("_thread_call_miss")).release().ptr();
  g_call_eager = nb::object(m.attr("_thread_call_eager")).release().ptr();
  g_miss = nb::object(m.attr("_context_miss")).release().ptr();
  g_eager = nb::object(m.attr("_eager")).release().ptr();
}

}  // namespace ftjit
