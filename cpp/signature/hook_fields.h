// ftjit: an ftjit.CompilerHooks read by field name, in the one wording of a
// wrong field: TypeError "CompilerHooks.<field> <what>, got <repr>". The
// readers (SignatureSpec::ReadHooks, and the JitFunction's for the rest) are
// the one check of a CompilerHooks, which CompilerHooks() runs too
// (_check_hooks) before jit() runs it again on what it keeps.
//
// Shared state: none. Lock order: takes no lock; runs Python (attribute
// lookups, repr()), so never under a C++ lock.
#pragma once

#include <Python.h>

#include <string>

#include <nanobind/nanobind.h>

namespace ftjit {

// Throws TypeError "CompilerHooks.<field> <what>, got <repr(got)>".
[[noreturn]] void WrongHook(const std::string& field, const std::string& what, nanobind::handle got);

// record.<name> when callable; null for None when `none_ok`. `field` names
// it after "CompilerHooks." ("pytree_flatten.defer_leaf").
nanobind::object CallableField(nanobind::handle record, const char* name, const std::string& field,
                               bool none_ok = true);

// A tuple copy of hooks.<name>, a sequence of types (exception types when
// `exceptions`), that nobody can mutate: a spec borrows type pointers from it
// (a compiler's own list could be mutated, and the borrowed pointer of a
// type removed from it would dangle once the type died).
nanobind::object TypesField(nanobind::handle hooks, const char* name, bool exceptions = false);

// hooks.<name>, which must be a bool.
bool BoolField(nanobind::handle hooks, const char* name);

}  // namespace ftjit
