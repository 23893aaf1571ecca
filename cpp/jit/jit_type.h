// ftjit: the JitFunction type (a hand-built heap type with vectorcall, a
// descriptor, GC support and pickling) and the module-level switches.
//
// Declares no shared state and takes no locks; the type's state, guards and
// lock order: JitState (jit_state.h) and the call path (Call).
#pragma once

#include <nanobind/nanobind.h>

namespace ftjit {

void RegisterJitFunction(nanobind::module_& m);

}  // namespace ftjit
