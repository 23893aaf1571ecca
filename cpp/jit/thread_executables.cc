// ftjit: executables a thread owns, which check the compiler's context
// themselves (CompilerHooks.context_in_executable, ftjit.ThreadExecutables):
// the hit path that calls them without reading the context, a thread's own
// copies of an entry's executable, and the two callbacks a copy makes:
// `miss` (a context it has not served) and `eager` (the compiler's eager
// mode: jax.disable_jit()).
//
// Why: jaxlib's C++ call of a compiled program checks JAX's configs on
// every call and locks its own cache. Reading the context in ftjit as well
// would check it twice, and one shared call object makes every thread wait
// on that lock. So each thread calls a copy of its own (made lazily, in
// that thread), and ftjit reads the context only when a copy misses: each
// call checks the context once.
//
// The hit path (CallContextInExecutable) finds the entry of the arguments
// alone (the head) and the one this thread's shard of it redirects to
// (LocalSlot: the same arguments under this thread's last context). A copy
// that meets a context it has not cached calls ContextMiss, which runs the
// copy's own program (`own_miss`: the copy caches it) or resolves that
// context's entry through the store (compile once, waits, cycles),
// redirects the shard to it and returns its outputs uncached (`drop`). A
// plain executable of such a function is checked by the core before it is
// called.
//
//   | state            | protection                                         |
//   |------------------|----------------------------------------------------|
//   | t_frame          | thread-local: the innermost call of a copy         |
//   | a shard's local  | the thread holding that shard (EntryStore's        |
//   |   (LocalSlot)    | exclusive shards), and the entry's destructor      |
//   | g_miss, g_eager  | made at module init, then fixed                    |
//
// Memory: at most one copy per (entry, exclusive shard), plus the shared
// one: at most kMaxThreadShards + 1 per signature, whatever the number of
// threads. A thread that ends leaves its copies in its shard, to the next
// thread that takes it; they go with the entry.
//
// Lock order: takes no lock itself; the store's calls take their leaf
// locks around Python-free steps only. Every callback runs Python with no
// ftjit lock held.
#include <Python.h>

#include <nanobind/nanobind.h>

#include "jit/jit_state.h"
#include "pyutil/errors.h"
#include "signature/signature.h"
#include "store/function_cache.h"

namespace ftjit {

namespace {

// The call of a copy a callback belongs to: the call's arguments, the entry
// found and the one whose copy runs, and whether the call's hit or miss has
// been counted. On the caller's stack, linked to the thread's previous one.
struct CallFrame {
  JitState* st;
  PyObject* const* args;
  size_t nargsf;
  PyObject* kwnames;
  const LeafObjects* leaves;
  Entry* head;    // found by the call's arguments
  Entry* target;  // whose executable runs
  int shard;
  bool counted;   // the call's hit (or miss) is counted already
  CallFrame* prev;
};

thread_local CallFrame* t_frame = nullptr;

// Pushes `f` for the duration of a call; restores the previous one however
// the call ends (a callback may call jitted functions: frames nest).
class FrameScope {
 public:
  explicit FrameScope(CallFrame& f) : f_(f) {
    f_.prev = t_frame;
    t_frame = &f_;
  }
  ~FrameScope() { t_frame = f_.prev; }
  FrameScope(const FrameScope&) = delete;
  FrameScope& operator=(const FrameScope&) = delete;

 private:
  CallFrame& f_;
};

// ContextMiss and Eager as Python callables: made at module init, kept
// for the process's life (never dropped: no destructor at exit).
PyObject* g_miss = nullptr;
PyObject* g_eager = nullptr;

nb::object MakeLocal(const Entry& e) { return MakeCopy(e.payload.make_local); }

// This thread's own copy of `e` (made now if it has none); `e`'s shared copy
// for a thread of the shared shard.
PyObject* OwnCopy(Entry& e, int shard) {
  if (shard == kSharedShard) return e.payload.executable.ptr();
  LocalSlot<nb::object>& local = e.shards[shard].local;
  if (!local.exe.is_valid()) local.exe = MakeLocal(e);
  return local.exe.ptr();
}

// Forgets this thread's copies of `head` (after a copy's call failed: a copy
// keeps a failed context as "uncached", so the next call makes a fresh one).
void ResetLocal(Entry& head, int shard) {
  if (shard == kSharedShard) return;
  LocalSlot<nb::object>& local = head.shards[shard].local;
  nb::object exe = std::move(local.exe), via = std::move(local.via);
  local.target = nullptr;
  // Dropped here, after the slot is consistent (a destructor may run Python).
}

// Ends what FindReady/FindReadyLocal counted in flight, however the call ends.
struct InFlight {
  const ThreadCtx& t;
  Entry* head;
  Entry* target;
  ~InFlight() {
    if (target && target != head) FunctionStore::FinishCall(target, t.rec, t.shard);
    if (head) FunctionStore::FinishCall(head, t.rec, t.shard);
  }
};

// The call a copy was made for: the original arguments, to the fallback.
nb::object CallFallback(const CallFrame& f) {
  return StealOrThrow(PyObject_Vectorcall(f.st->fallback.ptr(), f.args, f.nargsf, f.kwnames));
}

// ContextMiss(*args, **kwargs): the copy being called in this thread cannot
// serve its call from what it cached. Returns (outputs, cache_data, drop).
nb::object ContextMiss(nb::args args, nb::kwargs kwargs) {
  CallFrame* f = t_frame;
  if (!f) {
    RaiseMessage(PyExc_RuntimeError, "ftjit: a ThreadExecutables executable called its miss outside of a call "
                                     "of the jitted function");
  }
  JitState& st = *f->st;
  // The signature with this thread's context now (the probe first: a call
  // that must defer runs the fallback, uncached).
  CallSignature full;
  for (;;) {
    try {
      BuildSignature(st.spec, f->args, PyVectorcall_NARGS(f->nargsf), f->kwnames, full);
    } catch (const NeedsFallback&) {
      f->counted = true;
      return nb::make_tuple(CallFallback(*f), nb::none(), true);
    }
    if (full.AdoptContext()) break;
    full.Clear();  // its context died meanwhile: build it again
  }
  Entry& target = *f->target;
  if (SameContextAndPlacements(*target.sig, full)) {
    // The copy's own context (its first call, or a context it dropped): its
    // program runs, and the copy caches what it returns.
    if (!f->counted) {
      st.store->CountHit(&target, f->shard);
      f->counted = true;
    }
    return StealOrThrow(PyObject_Call(target.payload.own_miss.ptr(), args.ptr(), kwargs.ptr()));
  }
  // Another context: its entry, through compile-once (counted there).
  f->counted = true;
  const uint64_t gen = st.store->removals();
  Resolved r = Resolve(st, full);
  if (r.inserted) {
    Compile(st, r.entry, f->args, f->nargsf, f->kwnames, *f->leaves, r.adopted.get());
  } else if (r.was_ready) {
    st.store->CountHit(r.entry.get(), f->shard);
  }
  Entry& e = *r.entry;
  nb::object out;
  if (!e.payload.make_local.is_valid()) {
    out = CallExecutable(st, e.payload.executable.ptr(), e.payload.takes_leaves, f->args, f->nargsf, f->kwnames,
                         *f->leaves);
  } else {
    nb::object copy = nb::borrow(OwnCopy(e, f->shard));
    if (f->shard != kSharedShard) {
      // This thread's next calls of these arguments go to `e` directly.
      LocalSlot<nb::object>& local = f->head->shards[f->shard].local;
      nb::object old = std::move(local.via);  // may be the copy that called us: `copy`'s caller holds it
      if (&e == f->head) {
        local.target = nullptr;
      } else {
        local.via = copy;
        local.target = &e;
        local.gen = gen;
      }
    }
    CallFrame inner{&st, f->args, f->nargsf, f->kwnames, f->leaves, f->head, &e, f->shard, true, nullptr};
    FrameScope scope(inner);
    out = StealOrThrow(PyObject_Call(copy.ptr(), args.ptr(), kwargs.ptr()));
  }
  return nb::make_tuple(out, nb::none(), true);
}

// Eager(*args, **kwargs): the compiler's eager mode is on (jax.disable_jit()):
// the call goes to the fallback, with its own arguments, uncached.
nb::object Eager(nb::args, nb::kwargs) {
  CallFrame* f = t_frame;
  if (!f) {
    RaiseMessage(PyExc_RuntimeError, "ftjit: a ThreadExecutables executable called eager outside of a call of "
                                     "the jitted function");
  }
  f->counted = true;
  return CallFallback(*f);
}

// The call of `target`'s copy (this thread's own, or the redirect's) as the
// call of `head`'s arguments, with its frame. Counts a hit on `target` unless
// a callback counted the call.
nb::object CallCopy(JitState& st, Entry& head, Entry& target, const ThreadCtx& t, PyObject* const* args,
                    size_t nargsf, PyObject* kwnames, const LeafObjects& leaves, bool counted) {
  nb::object held;  // a redirect's copy, which a miss may replace while it runs
  PyObject* exe;
  if (&target != &head) {
    held = head.shards[t.shard].local.via;
    exe = held.ptr();
  } else {
    if (t.shard != kSharedShard && head.shards[t.shard].local.target) ResetLocal(head, t.shard);  // stale
    exe = OwnCopy(head, t.shard);
  }
  CallFrame frame{&st, args, nargsf, kwnames, &leaves, &head, &target, t.shard, counted, nullptr};
  nb::object out;
  try {
    FrameScope scope(frame);
    out = CallExecutable(st, exe, target.payload.takes_leaves, args, nargsf, kwnames, leaves);
  } catch (nb::python_error&) {
    // A hit still (the program raised); the error, held by the exception,
    // waits while the copies go.
    if (!frame.counted) st.store->CountHit(frame.target, t.shard);
    ResetLocal(head, t.shard);
    throw;
  }
  if (!frame.counted) st.store->CountHit(frame.target, t.shard);
  return out;
}

}  // namespace

bool UsesCopies(const Entry& e) { return e.payload.make_local.is_valid(); }

nb::object MakeCopy(const nb::object& make_local) {
  nb::object exe = StealOrThrow(PyObject_CallFunctionObjArgs(make_local.ptr(), g_miss, g_eager, nullptr));
  if (!PyCallable_Check(exe.ptr())) {
    RaiseMessage(PyExc_TypeError, std::string("ThreadExecutables.make returned an object that is not callable: ") +
                                      Py_TYPE(exe.ptr())->tp_name);
  }
  return exe;
}

nb::object CallEntry(JitState& st, Entry& e, const ThreadCtx& t, PyObject* const* args, size_t nargsf,
                     PyObject* kwnames, const LeafObjects& leaves) {
  if (!UsesCopies(e)) {
    return CallExecutable(st, e.payload.executable.ptr(), e.payload.takes_leaves, args, nargsf, kwnames, leaves);
  }
  return CallCopy(st, e, e, t, args, nargsf, kwnames, leaves, /*counted=*/true);
}

nb::object CallContextInExecutable(JitState& st, CallSignature& sig, PyObject* const* args, size_t nargsf,
                                   PyObject* kwnames) {
  const ThreadCtx& t = ThisThread();
  LeafObjects leaves;
  LeafObjects* keep = st.executable_for.is_valid() ? &leaves : nullptr;
  const size_t nargs = PyVectorcall_NARGS(nargsf);
  try {
    BuildSignature(st.spec, args, nargs, kwnames, sig, /*allow_specs=*/false, keep, /*partial=*/true);
  } catch (const NeedsFallback&) {
    return CallFallbackOf(st, args, nargsf, kwnames);
  } catch (nb::python_error&) {
    // Arguments a call that defers would not have looked at (a trace is
    // active, eager mode is on): the fallback takes them, as it would had
    // the context been read first. (The hooks' own errors keep the original.)
    bool defers = false;
    try {
      defers = st.spec.hook.Defers();
    } catch (nb::python_error&) {
    }
    if (!defers) throw;
    return CallFallbackOf(st, args, nargsf, kwnames);
  }
  Entry* target = nullptr;
  Entry* head = st.store->FindReadyLocal(sig, t.rec, t.shard, &target);
  if (head) {
    InFlight in_flight{t, head, target};
    if (UsesCopies(*head)) return CallCopy(st, *head, *target, t, args, nargsf, kwnames, leaves, false);
    // A plain executable (the core checks the context and placements for
    // it): the whole signature, compared with the head's.
    CallSignature whole;
    try {
      BuildSignature(st.spec, args, nargs, kwnames, whole);
    } catch (const NeedsFallback&) {
      return CallFallbackOf(st, args, nargsf, kwnames);
    }
    if (whole.AdoptContext() && SameContextAndPlacements(*head->sig, whole)) {
      st.store->CountHit(head, t.shard);
      return CallEntry(st, *head, t, args, nargsf, kwnames, leaves);
    }
    // Another context's or placement's (or, rarely, a context that died
    // meanwhile): the slow path.
  } else {
    FunctionStore::AfterMiss(t.rec);  // may run deleters: Python
  }
  return CallWhole(st, sig, t, args, nargsf, kwnames, leaves);
}

void RegisterThreadExecutables(nb::module_& m) {
  m.def("_context_miss", &ContextMiss,
        "Tests and compilers only: the miss callback of ThreadExecutables copies (see ftjit.ThreadExecutables).");
  m.def("_eager", &Eager,
        "Tests and compilers only: the eager callback of ThreadExecutables copies (see ftjit.ThreadExecutables).");
  m.def("_thread_shard", [] { return ThisThread().shard; },
        "Tests only: this thread's shard (0-15 exclusive among live threads, 16 shared by the rest).");
  g_miss = nb::object(m.attr("_context_miss")).release().ptr();
  g_eager = nb::object(m.attr("_eager")).release().ptr();
}

}  // namespace ftjit
