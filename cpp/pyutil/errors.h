// ftjit: the core's one error convention.
//
// - The core throws: a Python error is nb::python_error (thrown with the
//   error set), a bad argument one of nanobind's builtin exceptions. No
//   function returns null or false to mean "an error is set".
// - One boundary: the type's C slots run their body through Translated(),
//   which maps every kind as nanobind maps it for the methods it binds, so a
//   method and a slot raise alike.
// - An error is set aside and put back by SavedError, never by hand.
// - A pending Ctrl-C: a KeyboardInterrupt that reaches a place where the core
//   would propagate an error propagates. Where the core swallows an error
//   raised by Python code it runs for itself (a context's __eq__, repr() for
//   a message or for the JitFunction's own repr, a logging hook, copying an
//   exception for a waiter), ClearErrorKeepingInterrupt() clears it (each
//   path tested in tests/test_interrupts.py): on the main
//   thread under Python's default SIGINT handler the interrupt is re-armed,
//   so the interpreter's next signal check raises it; elsewhere it is
//   dropped (re-arming there would interrupt the main thread for another
//   thread's error, or run a custom handler twice).
//
// Shared state: none. Lock order: takes no locks; ClearErrorKeepingInterrupt
// runs Python (imports `threading` and `signal`), so never under a C++ lock.
#pragma once

#include <Python.h>
// Python.h includes libstdc++'s C library wrappers, which define __GLIBCXX__.
#ifdef __GLIBCXX__
#include <cxxabi.h>  // abi::__forced_unwind
#endif

#include <chrono>
#include <exception>
#include <thread>
#include <utility>

#include <nanobind/nanobind.h>

#include "pyutil/py_compat.h"

namespace ftjit {

// Clears the pending error, keeping a KeyboardInterrupt as the policy says.
void ClearErrorKeepingInterrupt();

// The pending exception, taken: a new reference to the normalized exception,
// its traceback attached; null when none is set.
PyObject* TakeError();

// Sets `exc` (a reference, stolen) as the pending exception.
void RestoreError(PyObject* exc);

// A new reference a CPython call returned, owned; null (the call failed)
// throws its error.
inline nanobind::object StealOrThrow(PyObject* result) {
  if (!result) throw nanobind::python_error();
  return nanobind::steal(result);
}

[[noreturn]] inline void ThrowError(nanobind::object exc) {
  RestoreError(exc.release().ptr());
  throw nanobind::python_error();
}

// Sets the pending error aside for a scope and puts it back at its end,
// unless a newer failure wins: an error pending then, or a C++ exception
// leaving the scope. When a forced unwind (no thread state) leaves it, the
// saved error is leaked.
class SavedError {
 public:
  SavedError() : exc_(TakeError()), unwinding_(std::uncaught_exceptions()) {}
  ~SavedError() {
    if (!exc_ || !ThreadIsAttached()) return;
    if (PyErr_Occurred() || std::uncaught_exceptions() > unwinding_) {
      Py_DECREF(exc_);
    } else {
      RestoreError(exc_);
    }
  }
  SavedError(const SavedError&) = delete;
  SavedError& operator=(const SavedError&) = delete;

 private:
  PyObject* exc_;
  int unwinding_;
};

// In a `catch (const std::exception&)` block: sets the Python error for the
// C++ exception being handled, translated as nanobind translates it.
void SetErrorFromException() noexcept;

// In a `catch (const std::exception&)` block: the exception being handled
// as a Python exception object, for code that keeps or hands on an error.
inline nanobind::object CaughtError() {
  SetErrorFromException();
  return nanobind::steal(TakeError());
}

// The C-slot boundary: body()'s result, or `failed` with the Python error
// set for what it threw. A forced unwind (not a std::exception) goes on.
template <class Body, class Result>
Result Translated(Body&& body, Result failed) {
  try {
    return std::forward<Body>(body)();
  } catch (const std::exception&) {
    SetErrorFromException();
    return failed;
  }
}

// A thread that CPython ends at interpreter shutdown (3.11-3.13: pthread_exit
// when it takes the GIL back, a forced unwind) while in a method, e.g. a
// daemon warm-up worker waiting on a compile in precompile(), must not
// unwind into nanobind, whose dispatch is noexcept: std::terminate would
// abort the exiting process. It is parked instead (the on_unwind of
// LeakingOnForcedUnwind), as CPython 3.14 parks such threads itself
// (PyThread_hang_thread); the process exits around it.
[[noreturn]] NB_NOINLINE inline void ParkThreadEndedAtShutdown() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
}

// Runs body(). Should CPython end this thread inside it at interpreter
// shutdown (a forced unwind: there is no thread state), runs on_unwind()
// first, which must not touch Python (it leaks what would be freed), and
// lets the unwind go on; or on_unwind never returns (it parks the thread,
// where the frames above must not be unwound).
template <class Body, class OnUnwind>
decltype(auto) LeakingOnForcedUnwind(Body&& body, OnUnwind&& on_unwind) {
#ifdef __GLIBCXX__
  try {
    return std::forward<Body>(body)();
  } catch (abi::__forced_unwind&) {
    on_unwind();
    throw;
  }
#else
  (void)on_unwind;
  return std::forward<Body>(body)();
#endif
}

}  // namespace ftjit
