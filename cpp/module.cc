// ftjit: the _core extension module: FunctionCache, JitFunction, switches.
//
// Shared state: Types() (signature.h), written once by _set_python_types
// when ftjit/_jit.py is imported, before ftjit makes any jitted function,
// and fixed afterwards (a second call is refused). Everything else belongs
// to the file that registers it. Module init (NB_MODULE) runs once, under
// the import lock.
//
// Lock order: takes no locks.
#include <nanobind/nanobind.h>

#include "function_cache.h"
#include "jit_function.h"
#include "interned_context.h"
#include "signature.h"
#include "thread_memos.h"

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
  m.def(
      "_live_functions",
      []() {
        nb::list out;
        for (auto& fe : ftjit::LiveEntries()) {
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
  m.def(
      "_set_python_types",
      [](nb::object unhashable, nb::object unsupported, nb::object recursive,
         nb::object cycle, nb::object timeout, nb::object cache_info, nb::object rebuild, nb::object copy,
         nb::object ndarray, nb::object generic, nb::object placement_label) {
        ftjit::PythonTypes& t = ftjit::Types();
        if (t.cache_info) throw std::runtime_error("_set_python_types may be called once");
        // Kept for the module's lifetime.
        t.unhashable_static = unhashable.release().ptr();
        t.unsupported_argument = unsupported.release().ptr();
        t.recursive_compile = recursive.release().ptr();
        t.compile_cycle = cycle.release().ptr();
        t.compile_timeout = timeout.release().ptr();
        t.cache_info = cache_info.release().ptr();
        t.rebuild = rebuild.release().ptr();
        t.copy = copy.release().ptr();
        t.ndarray = ndarray.release().ptr();
        t.generic = generic.release().ptr();
        t.placement_label = placement_label.release().ptr();
      },
      "Internal: hands the core the Python classes it raises and builds.");
}
