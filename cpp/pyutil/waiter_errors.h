// ftjit: a failed compile's error, once per thread that waited for it (see
// waiter_errors.cc's preamble). Shared state: none. Lock order: takes no lock.
#pragma once

#include <string>

#include <nanobind/nanobind.h>

namespace ftjit {

// The compile's exception as waiters will read it: a private copy that
// nobody raises or writes after it is published (the compiling thread
// raises the original). For a type that cannot be copied, a RuntimeError
// naming it, caused by the original.
nanobind::object ErrorForWaiters(const nanobind::object& original);
// Raises this waiter's own copy of the compile's exception (or, when none
// can be made, a fresh RuntimeError naming `fun_name`, caused by the shared
// one).
[[noreturn]] void RaiseForWaiter(const std::string& fun_name, const nanobind::object& error);

}  // namespace ftjit
