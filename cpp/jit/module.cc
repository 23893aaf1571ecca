// ftjit: the _core extension module: FunctionCache, JitFunction, switches.
//
// Shared state: none of its own; everything belongs to the file that
// registers it. Module init (NB_MODULE) runs once, under the import lock.
//
// Lock order: takes no locks.
#include <nanobind/nanobind.h>

#include "store/function_cache.h"
#include "jit/jit_state.h"
#include "jit/jit_type.h"
#include "signature/interned_context.h"
#include "signature/signature.h"
#include "signature/thread_memos.h"

#include <nanobind/stl/string.h>

namespace nb = nanobind;

NB_MODULE(_core, m) {
  m.doc() = "ftjit's C++ dispatch core (see ftjit for the public API).";
  // Module-lifetime objects (the default cache, Python types handed to the
  // core) are intentionally alive at interpreter exit.
  nb::set_leak_warnings(false);
  ftjit::InitSignatures();  // before anything can build a signature
  ftjit::InitCaches();      // before anything can make a cache
  ftjit::InitThreadMemos();
  ftjit::RegisterFunctionCache(m);
  ftjit::RegisterJitFunction(m);
  ftjit::RegisterThreadExecutables(m);
  m.def(
      "_live_functions",
      []() {
        nb::list out;
        for (auto& fe : ftjit::LiveStores()) {
          out.append(nb::make_tuple(fe->name(), ftjit::MakeCacheInfo(*fe)));
        }
        return out;
      },
      "A snapshot [(name, CacheInfo)] of every live (function, options) pair.");
  m.def(
      "_debug_fast_equals_at_recursion_limit",
      [](nb::handle a, nb::handle b) {
        bool error_set = false;
        const char* r = ftjit::DebugFastEqualsAtRecursionLimit(a.ptr(), b.ptr(), &error_set);
        return nb::make_tuple(r, error_set);
      },
      "Tests only: (result, left an error set) of the hit path's Python-free comparison of two\n"
      "static values, made at the recursion limit.");
  m.def("_interned_contexts", &ftjit::InternedContextCount,
        "How many compiler contexts are interned now (diagnostics): each lives while a signature "
        "or a thread's memo uses it.");
  m.def("clear_caches", &ftjit::ClearAllCaches,
        "Drops the compiled entries of every live FunctionCache.");
}
