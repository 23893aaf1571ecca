// ftjit: the core's one error convention.
//
// - The core throws: a Python error is nb::python_error (thrown with the
//   error set, as nanobind's `throw nb::python_error()`), a bad argument
//   nanobind's builtin exceptions (nb::type_error, nb::value_error, ...).
//   No function returns null or false to mean "an error is set".
// - One boundary: the type's C slots run their body through
//   Translated(), which maps every kind as nanobind maps it for
//   the methods it binds (Translated), so a method and a slot raise alike.
// - An error is set aside and put back by SavedError, never by hand.
// - A pending Ctrl-C (the one policy): a KeyboardInterrupt that reaches a
//   place where the core would propagate an error propagates. Where the core
//   swallows an error raised by Python code it runs for itself (a context's
//   __eq__, repr() for a message, a logging hook, copying an exception for a
//   waiter, isinstance on a hostile class), ClearErrorKeepingInterrupt()
//   clears it: on the main thread under Python's default SIGINT handler the
//   interrupt is re-armed, so the interpreter's next signal check raises it;
//   elsewhere it is dropped (re-arming there would interrupt the main thread
//   for another thread's error, or run a custom handler twice).
//
// Shared state: none. Lock order: takes no locks; ClearErrorKeepingInterrupt
// runs Python (imports `threading` and `signal`), so never under a C++ lock.
#pragma once

#include <Python.h>

#include <exception>
#include <utility>
#ifdef __GLIBCXX__
#include <cxxabi.h>  // abi::__forced_unwind
#endif

#include <nanobind/nanobind.h>

#include "pyutil/py_compat.h"

namespace ftjit {

// Clears the pending error, keeping a KeyboardInterrupt as the policy above says.
void ClearErrorKeepingInterrupt();

// The pending exception, taken (the error indicator cleared): a new
// reference to the normalized exception, its traceback attached; null when
// none is set.
PyObject* TakeError();

// Sets `exc` (a reference, stolen) as the pending exception.
void RestoreError(PyObject* exc);

// A new reference a CPython call returned, owned; when it is null (the call
// failed, its error set), throws that error.
inline nanobind::object StealOrThrow(PyObject* result) {
  if (!result) throw nanobind::python_error();
  return nanobind::steal(result);
}

// Raises `exc` (with its own traceback) as the core raises: a C++ throw.
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

// In a `catch (const std::exception&)` block at a C slot: sets the Python
// error for the C++ exception being handled. nb::python_error restores its
// error; nanobind's builtin exceptions become their Python kind;
// std::bad_alloc MemoryError; std::invalid_argument, domain_error,
// length_error and range_error ValueError; std::out_of_range IndexError;
// std::overflow_error OverflowError; any other RuntimeError.
void SetErrorFromException() noexcept;

// In a `catch (const std::exception&)` block: the exception being handled
// as a Python exception object (translated as by SetErrorFromException),
// for code that must keep or hand on an error rather than raise it.
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
