// ftjit: the _core extension module: FunctionCache, JitFunction, switches.
//
// Shared state: none of its own; everything belongs to what registers it.
// Module init (NB_MODULE) runs once, under the import lock.
//
// Lock order: takes no locks.
#include <Python.h>

#include <new>
#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "batch/batcher.h"
#include "jit/jit_state.h"
#include "jit/jit_type.h"
#include "primitives/thread_stack.h"
#include "pyutil/collaborators.h"
#include "pyutil/errors.h"
#include "signature/interned_context.h"
#include "signature/signature.h"
#include "signature/signature_key.h"
#include "signature/thread_memos.h"
#include "store/function_cache.h"

namespace nb = nanobind;

namespace {

// Throws the C++ exception of one kind the core may throw (tests of the
// boundary's translation).
[[noreturn]] void ThrowKind(const std::string& kind) {
  if (kind == "python_error") {
    PyErr_SetString(PyExc_LookupError, "python_error");
    throw nb::python_error();
  }
  if (kind == "type_error") throw nb::type_error("type_error");
  if (kind == "value_error") throw nb::value_error("value_error");
  if (kind == "index_error") throw nb::index_error("index_error");
  if (kind == "key_error") throw nb::key_error("key_error");
  if (kind == "stop_iteration") throw nb::stop_iteration("stop_iteration");
  if (kind == "buffer_error") throw nb::buffer_error("buffer_error");
  if (kind == "import_error") throw nb::import_error("import_error");
  if (kind == "attribute_error") throw nb::attribute_error("attribute_error");
  if (kind == "bad_alloc") throw std::bad_alloc();
  if (kind == "out_of_range") throw std::out_of_range("out_of_range");
  if (kind == "overflow_error") throw std::overflow_error("overflow_error");
  if (kind == "invalid_argument") throw std::invalid_argument("invalid_argument");
  if (kind == "domain_error") throw std::domain_error("domain_error");
  if (kind == "length_error") throw std::length_error("length_error");
  if (kind == "range_error") throw std::range_error("range_error");
  if (kind == "runtime_error") throw std::runtime_error("runtime_error");
  if (kind == "needs_fallback") throw ftjit::NeedsFallback();
  throw std::logic_error("logic_error");
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "ftjit's C++ dispatch core (see ftjit for the public API).";
  // Module-lifetime objects (the default cache, Python types handed to the
  // core) are intentionally alive at interpreter exit.
  nb::set_leak_warnings(false);
  ftjit::InitSignatures();  // before anything can build a signature
  ftjit::InitCaches();      // before anything can make a cache
  ftjit::InitThreadMemos();
  ftjit::RegisterCollaborators(m);  // _set_collaborators, which ftjit's import calls
  ftjit::RegisterFunctionCache(m);
  ftjit::RegisterJitFunction(m);
  ftjit::RegisterThreadExecutables(m);
  ftjit::RegisterSignatureKey(m);
  ftjit::RegisterSignatureRecords(m);  // _leaf_kinds
  ftjit::RegisterBatcher(m);
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
  m.def(
      "_debug_throw",
      [](const std::string& kind, bool at_slot) {
        if (!at_slot) ThrowKind(kind);  // nanobind translates
        PyObject* r = ftjit::Translated([&]() -> PyObject* { ThrowKind(kind); }, static_cast<PyObject*>(nullptr));
        if (!r) throw nb::python_error();  // the slot's translation, handed on unchanged
        return nb::steal(r);
      },
      "Tests only: throws a C++ exception of `kind` from a nanobind-bound function, or through\n"
      "the translation of the type's C slots (at_slot), which must raise alike.");
  m.def(
      "_debug_stack",
      []() { return nb::make_tuple(ftjit::ThreadStack::Left(), ftjit::ThreadStack::Size(),
                                   ftjit::ThreadStack::Here() - ftjit::ThreadStack::Limit()); },
      "Tests only: (bytes of C stack left below the caller, the thread's stack size, bytes left above\n"
      "the point where a jitted call raises RecursionError); left is 2**64 - 1 when unknown.");
  m.def(
      "_live_counts",
      [](bool reclaim) {
        // Frees what no reader can see any more first (this thread is in no
        // read section; deleters may run Python, with no lock held).
        if (reclaim) ftjit::g_epochs->Reclaim();
        using Store = ftjit::EntryStore<ftjit::PyEntryTraits>;
        auto& indices = ftjit::ThreadSlot<ftjit::PyEntryTraits>::Indices();
        nb::dict d;
        d["entries"] = ftjit::LiveCount<ftjit::Entry>::Count();
        d["stores"] = ftjit::LiveCount<Store>::Count();
        d["caches"] = ftjit::LiveCount<ftjit::Cache>::Count();
        d["batch_queues"] = ftjit::LiveBatchQueues();
        d["retired"] = ftjit::g_epochs->retired_count();
        d["epoch_records"] = ftjit::g_epochs->records();
        d["epoch_records_held"] = ftjit::g_epochs->owned_records();
        d["thread_indices_held"] = indices.InUse();
        d["thread_indices_made"] = indices.HighWater();
        d["interned_contexts"] = ftjit::InternedContextCount();
        return d;
      },
      nb::arg("reclaim") = false,
      "What the core holds now, by kind (diagnostics and tests; each count read atomically, not all at\n"
      "one instant): entries (compiled or compiling, not yet freed), stores (one per live function and\n"
      "options), caches (FunctionCache cores), batch_queues, retired (objects unlinked and awaiting their\n"
      "grace period: entries, tables), epoch_records (made; held: by live threads), thread_indices\n"
      "(held by live threads; made: the most ever held at once) and interned_contexts. With reclaim,\n"
      "what no thread can still see is freed first.");
  m.def("_interned_contexts", &ftjit::InternedContextCount,
        "How many compiler contexts are interned now (diagnostics): each lives while a signature "
        "or a thread's memo uses it.");
  m.def("clear_caches", &ftjit::ClearAllCaches,
        "Drops the compiled entries of every live FunctionCache.");
}
