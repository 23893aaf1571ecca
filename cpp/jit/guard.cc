// ftjit: the max_signatures guard and miss explanations, in the thread that
// inserted an entry and is about to compile it.
//
// The count is the store's (EntryStore::Admit: the entries admitted and
// still in the map, exact under concurrent misses); the text is written by
// ftjit._explain from the records ExportSignature makes.
//
//   | state            | protection                                         |
//   |------------------|----------------------------------------------------|
//   | g_explain_misses | relaxed atomic (ftjit.set_explain_misses)          |
//   | the store's count, its once-only warning | EntryStore::Admit,         |
//   |                  | FunctionStore::TakeWarning                         |
//
// Lock order: takes no lock itself; Candidates takes a snapshot of the
// store's map (its leaf lock, around Python-free steps only).
#include <Python.h>

#include <atomic>
#include <vector>

#include <nanobind/nanobind.h>

#include "jit/jit_state.h"
#include "pyutil/collaborators.h"
#include "signature/signature.h"
#include "store/function_cache.h"

namespace ftjit {

namespace {

std::atomic<bool> g_explain_misses{false};

// Up to kExplainCandidates cached signatures a miss of `e` is explained
// against, exported, oldest first: among the kExplainScanned newest, those
// of the same call structure (arguments passed alike, same tree tokens),
// else the newest of any. So a miss costs O(arguments), not O(cached
// signatures).
constexpr size_t kExplainCandidates = 16;
constexpr size_t kExplainScanned = 256;

bool SameStructure(const CallSignature& a, const CallSignature& b) {
  if (a.num_positional != b.num_positional || !(a.tree == b.tree) || a.kwnames.size() != b.kwnames.size()) {
    return false;
  }
  for (size_t i = 0; i < a.kwnames.size(); ++i) {
    if (PyUnicode_Compare(a.kwnames[i].ptr(), b.kwnames[i].ptr()) != 0) return false;
  }
  return true;
}

nb::object Candidates(JitState& st, const Entry& e) {
  // Newest first; `e` is compiling, so not among them.
  std::vector<EntryPtr> ready = st.store->NewestReady(kExplainScanned);
  std::vector<const Entry*> picked;
  for (const EntryPtr& c : ready) {
    if (picked.size() < kExplainCandidates && SameStructure(*c->sig, *e.sig)) picked.push_back(c.get());
  }
  if (picked.empty()) {
    for (size_t i = 0; i < ready.size() && i < kExplainCandidates; ++i) picked.push_back(ready[i].get());
  }
  nb::list out;
  for (auto it = picked.rbegin(); it != picked.rend(); ++it) out.append(ExportSignature(*(*it)->sig, st.spec));
  return std::move(out);
}

}  // namespace

void Guard(JitState& st, const EntryPtr& e) {
  FunctionStore& fs = *st.store;
  const SignatureLimit& limit = fs.limit();
  const bool explaining = AheadDepth() == 0 &&
                          (st.explain_misses < 0 ? g_explain_misses.load(std::memory_order_relaxed)
                                                 : st.explain_misses > 0);
  bool excess = false, warn_now = false;
  if (limit.max >= 0) {
    excess = !fs.Admit(e, limit.max, /*force=*/false);
    if (excess && !limit.raising) {
      fs.Admit(e, limit.max, /*force=*/true);  // "warn": compiled, and counted
      warn_now = fs.TakeWarning();
    }
  }
  const bool message = excess && (limit.raising || warn_now);
  if (!explaining && !message) return;
  PyObject* on_miss = kOnMiss.Get();
  nb::object name = nb::str(st.spec.fun_name.c_str());
  nb::object text = nb::handle(on_miss)(name, st.spec.arg_names, st.hooks, Candidates(st, *e),
                                        ExportSignature(*e->sig, st.spec), nb::bool_(explaining),
                                        message ? limit.max : -1, nb::bool_(limit.raising));
  if (!message) return;
  const char* msg = PyUnicode_AsUTF8(text.ptr());
  if (!msg) throw nb::python_error();
  if (limit.raising) RaiseMessage(kRecompileLimitError.Get(), msg);
  // The caller of the jitted function (this C code has no frame of its own).
  if (PyErr_WarnEx(PyExc_RuntimeWarning, msg, 1) < 0) {
    fs.Unwarn();  // not shown (raised): the next excess warns
    throw nb::python_error();
  }
}

std::atomic<bool>& ExplainMisses() { return g_explain_misses; }

}  // namespace ftjit
