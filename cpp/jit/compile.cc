// ftjit: a compile, run by the one thread that inserted the entry: the
// guard, the compiler's call, the hooks' executable_for, and the latch
// published whatever happens (a result, an error copied for each waiter, or
// abandoned when this thread was interrupted), so that waiters never hang.
//
// Shared state: none of its own (see JitState). Lock order: takes no lock
// itself; the store's calls take their leaf locks around Python-free steps
// only (see Call for the call path this is one step of).
#include <Python.h>

#include <chrono>
#include <exception>

#include <nanobind/nanobind.h>

#include "jit/jit_state.h"
#include "pyutil/collaborators.h"
#include "pyutil/errors.h"
#include "signature/signature.h"
#include "store/function_cache.h"

namespace ftjit {

namespace {

// Logs a compile's outcome through ftjit._observe.on_compile (best effort).
void LogCompile(const JitState& st, const Entry& e, double seconds, PyObject* error) {
  try {
    PyObject* hook = kOnCompile.Get();
    nb::object secs = StealOrThrow(PyFloat_FromDouble(seconds));
    nb::object name = StealOrThrow(PyUnicode_FromString(st.spec.fun_name.c_str()));
    nb::object sig = SignatureString(st, e);
    CallHook(hook, {name.ptr(), sig.ptr(), secs.ptr(), error ? error : Py_None});
  } catch (const std::exception&) {
    SetErrorFromException();
    ClearErrorKeepingInterrupt();
  }
}

// Whatever happens in a compile, the latch is published: waiters never hang.
struct CompilePublisher {
  JitState& st;
  const EntryPtr& e;
  bool done = false;
  void Fail(CompileLatch::State how = CompileLatch::State::kFailed) {
    done = true;
    st.store->Discard(e);  // before publishing: the next call recompiles
    st.store->counters().failures.fetch_add(1, std::memory_order_relaxed);
    e->latch.Publish(how);
  }
  ~CompilePublisher() {
    if (!done) {
      // A C++ exception escaped (e.g. bad_alloc): report it to waiters.
      SavedError saved;
      e->payload.error = nb::steal(PyObject_CallFunction(
          PyExc_RuntimeError, "s", "ftjit: the compile was aborted by an internal error"));
      PyErr_Clear();
      Fail();
    }
  }
};

// compile(fun, args, kwargs): the executable. TypeError for something that
// cannot be called (a failed compile, counted and not cached, rather than an
// entry that raises "'int' object is not callable" on every call).
nb::object RunCompiler(const Call& c) {
  JitState& st = c.st;
  const CallArgs& args = c.args;
  nb::object a = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(args.nargs)));
  nb::object kw = nb::steal(PyDict_New());
  if (!a.is_valid() || !kw.is_valid()) throw nb::python_error();
  for (size_t i = 0; i < args.nargs; ++i) PyTuple_SET_ITEM(a.ptr(), i, Py_NewRef(args.items[i]));
  Py_ssize_t nkw = args.kwnames ? PyTuple_GET_SIZE(args.kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    if (PyDict_SetItem(kw.ptr(), PyTuple_GET_ITEM(args.kwnames, k), args.items[args.nargs + k]) != 0) {
      throw nb::python_error();
    }
  }
  PyObject* call_args[] = {st.fun.ptr(), a.ptr(), kw.ptr()};
  nb::object exe = LeakingOnForcedUnwind(
      [&] { return nb::steal(PyObject_Vectorcall(st.compile.ptr(), call_args, 3, nullptr)); },
      [&] {
        // The argument tuple and dict, whose last references these are.
        a.release();
        kw.release();
      });
  if (!exe.is_valid()) throw nb::python_error();
  if (!PyCallable_Check(exe.ptr())) {
    throw nb::type_error(("the compiler of " + st.spec.fun_name + "() returned an object of type " +
                          Py_TYPE(exe.ptr())->tp_name +
                          ", which is not callable: compiler(fun, args, kwargs) must return the executable")
                             .c_str());
  }
  return exe;
}

// What calls of a compiled signature run (the payload's fields).
struct Executable {
  nb::object exe;         // the executable (null for ThreadExecutables: each thread makes its own)
  nb::object make_local;  // ThreadExecutables.make, or null
  nb::object own_miss;    // ThreadExecutables.own_miss, or null
  bool takes_leaves = false;
};

// The hooks' executable_for(compiled, args, kwargs, leaves), the statics
// left out of args and kwargs with strip_static. TypeError for an answer of
// another shape.
Executable ExecutableFor(const Call& c, nb::object compiled) {
  JitState& st = c.st;
  const CallArgs& args = c.args;
  nb::object dyn = nb::steal(PyList_New(0));
  nb::object kw = nb::steal(PyDict_New());
  nb::object leaf_tuple = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(c.leaves.size())));
  if (!dyn.is_valid() || !kw.is_valid() || !leaf_tuple.is_valid()) throw nb::python_error();
  for (size_t i = 0; i < args.nargs; ++i) {
    if (st.strip_static && st.spec.IsStaticPosition(i, args.nargs)) continue;
    if (PyList_Append(dyn.ptr(), args.items[i]) != 0) throw nb::python_error();
  }
  Py_ssize_t nkw = args.kwnames ? PyTuple_GET_SIZE(args.kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* name = PyTuple_GET_ITEM(args.kwnames, k);
    if (st.strip_static && st.spec.IsStaticName(name)) continue;
    if (PyDict_SetItem(kw.ptr(), name, args.items[args.nargs + k]) != 0) throw nb::python_error();
  }
  for (size_t i = 0; i < c.leaves.size(); ++i) PyTuple_SET_ITEM(leaf_tuple.ptr(), i, Py_NewRef(c.leaves[i]));
  nb::object dyn_tuple = nb::steal(PyList_AsTuple(dyn.ptr()));
  if (!dyn_tuple.is_valid()) throw nb::python_error();
  PyObject* call_args[] = {compiled.ptr(), dyn_tuple.ptr(), kw.ptr(), leaf_tuple.ptr()};
  nb::object r = nb::steal(PyObject_Vectorcall(st.executable_for.ptr(), call_args, 4, nullptr));
  if (!r.is_valid()) throw nb::python_error();
  PyObject* t = r.ptr();
  if (PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 3 && PyCallable_Check(PyTuple_GET_ITEM(t, 0)) &&
      PyCallable_Check(PyTuple_GET_ITEM(t, 1)) && PyBool_Check(PyTuple_GET_ITEM(t, 2))) {
    // ThreadExecutables(make, own_miss, takes_leaves): each thread makes its
    // own copy at its first call (Invoke).
    return Executable{nb::object(), nb::borrow(PyTuple_GET_ITEM(t, 0)), nb::borrow(PyTuple_GET_ITEM(t, 1)),
                      PyTuple_GET_ITEM(t, 2) == Py_True};
  }
  if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2 || !PyCallable_Check(PyTuple_GET_ITEM(t, 0)) ||
      !PyBool_Check(PyTuple_GET_ITEM(t, 1))) {
    PyErr_Format(PyExc_TypeError,
                 "CompilerHooks.executable_for of %s() must return (executable, takes_leaves): a callable "
                 "and a bool, or ftjit.ThreadExecutables, got %R",
                 st.spec.fun_name.c_str(), t);
    throw nb::python_error();
  }
  return Executable{nb::borrow(PyTuple_GET_ITEM(t, 0)), nb::object(), nb::object(), PyTuple_GET_ITEM(t, 1) == Py_True};
}

// Compile's body; `publisher` publishes the latch however it ends.
void CompileBody(Call& c, const EntryPtr& e, const Entry* adopted, bool provisional, CompilePublisher& publisher) {
  JitState& st = c.st;
  Counters& counters = st.store->counters();
  nb::object error;  // the guard's refusal, or what the compile raised
  // The guard counts `e` before it takes an LRU slot: an eviction that slot
  // causes must not make room under the limit for `e` itself. A provisional
  // entry is not counted (until adopted).
  if (!provisional) {
    try {
      Guard(st, e);
    } catch (const std::exception&) {
      error = CaughtError();
    }
  }
  // A call that adopts a warmed saved spec found a compiled signature: a
  // hit; any other compile (or a refused adoption) is the call's miss.
  if (adopted && !error.is_valid()) {
    c.CountHitOnce(*e, e->slots.Get(c.t.index));
  } else {
    counters.misses.fetch_add(1, std::memory_order_relaxed);
    c.MarkCounted();
  }
  st.store->AdmitLru(e);
  auto t0 = std::chrono::steady_clock::now();
  Executable exe;
  if (error.is_valid()) {
    // refused: nothing runs
  } else if (adopted) {
    const CompiledPayload& p = adopted->payload;
    exe = Executable{p.executable, p.make_local, p.own_miss, p.takes_leaves};
  } else {
    try {
      exe.exe = RunCompiler(c);
      if (st.executable_for.is_valid()) exe = ExecutableFor(c, std::move(exe.exe));
    } catch (const std::exception&) {
      error = CaughtError();
    }
  }
  if (error.is_valid()) {
    // An interruption of this thread (KeyboardInterrupt, SystemExit: any
    // BaseException that is not an Exception) is not the compile's result:
    // it stays with this thread, and a waiter compiles again instead.
    if (PyObject_TypeCheck(error.ptr(), reinterpret_cast<PyTypeObject*>(PyExc_Exception))) {
      e->payload.error = ErrorForWaiters(error);
      publisher.Fail();
    } else {
      publisher.Fail(CompileLatch::State::kAbandoned);
    }
    LogCompile(st, *e, static_cast<double>(NanosSince(t0)) * 1e-9, error.ptr());
    ThrowError(std::move(error));
  }
  uint64_t nanos = NanosSince(t0);
  CompiledPayload& p = e->payload;
  p.executable = std::move(exe.exe);
  p.make_local = std::move(exe.make_local);
  p.own_miss = std::move(exe.own_miss);
  p.takes_leaves = exe.takes_leaves;
  p.compile_seconds = adopted ? adopted->payload.compile_seconds : static_cast<double>(nanos) * 1e-9;
  p.compiled_order = g_compile_order.fetch_add(1, std::memory_order_relaxed) + 1;
  if (!adopted) {  // an adoption compiled nothing (its warm-up did, and was counted)
    counters.compiles.fetch_add(1, std::memory_order_relaxed);
    counters.compile_nanos.fetch_add(nanos, std::memory_order_relaxed);
  }
  publisher.done = true;
  if (provisional) st.store->MarkProvisional(e);  // before the latch: finders see it ready and provisional
  e->latch.Publish(CompileLatch::State::kReady);
  if (!provisional) st.store->Published(e);
  if (!adopted) LogCompile(st, *e, p.compile_seconds, nullptr);
}

}  // namespace

void Compile(Call& c, const EntryPtr& e, const Entry* adopted, bool provisional) {
  CompilePublisher publisher{c.st, e};
  // Should CPython end this thread at interpreter shutdown (it took the GIL
  // back in the compiler), there is no thread state to report anything with:
  // the publisher must not run Python.
  LeakingOnForcedUnwind([&] { CompileBody(c, e, adopted, provisional, publisher); },
                        [&] { publisher.done = true; });
}

}  // namespace ftjit
