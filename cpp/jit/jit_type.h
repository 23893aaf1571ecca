// ftjit: the JitFunction type (a hand-built heap type whose call, GC support,
// descriptor and repr are C slots, and whose methods and properties are
// nanobind functions set on it) and the module-level switches.
//
// Declares no shared state and takes no locks; the type's state, guards and
// lock order: JitState and the call path (Call).
#pragma once

#include <nanobind/nanobind.h>

namespace ftjit {

// Registers JitFunction (with its type parameters _P and _R, for the stub)
// and the module-level switches on `m`; or raises.
void RegisterJitFunction(nanobind::module_& m);

}  // namespace ftjit
