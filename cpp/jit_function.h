// ftjit: the JitFunction type (a hand-built heap type with vectorcall, a
// descriptor, GC support and pickling) and the module-level switches.
#pragma once

#include <nanobind/nanobind.h>

namespace ftjit {

void RegisterJitFunction(nanobind::module_& m);

}  // namespace ftjit
