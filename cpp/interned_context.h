// ftjit: the process-wide canonical objects of compiler contexts, which live
// exactly as long as some signature or some thread's memo uses them.
//
// A compiler's context() (e.g. JAX's trace context) builds a fresh tuple on
// every call. Signatures key on it, and the hit path compares keys without
// running Python, so every call of a context equal to one already seen is
// given that context's canonical object (InternedContext), compared by
// identity. Each thread remembers its last context (thread_memos.h) and
// reuses its canonical object while context() returns the very same items.
//
// Lifetime: an InternedContext counts its users: stored signatures (entry
// keys) and thread memos. The last user to let go removes it from the table
// and drops its object (on an attached thread: the object's destructor may
// run Python). So a per-model context object dies with the last function
// using it, instead of living for the process.
//
// A probe signature (built on a call's stack) borrows its thread memo's
// canonical object without counting it: Adopt() counts it before any Python
// code can run with the signature (the slow path; the hit path runs no
// Python between building and probing). A thread memo lets go of a replaced
// context lazily, at its next lookup, when no borrowing probe of that thread
// can be alive.
//
// Isolation: candidates are compared with ==, and a comparison that raises is
// taken as "not equal" (the error cleared): a context with a broken __eq__
// fails only the calls that carry it (their signatures compare it again, with
// errors propagating, on their slow path), never unrelated contexts of equal
// hash.
//
//   | member                      | protection                                  |
//   |-----------------------------|---------------------------------------------|
//   | InternedContext::obj, hash  | fixed after construction                    |
//   | InternedContext::users      | atomic; incremented under g_contexts_mu by  |
//   |                             | lookups (so a releaser re-checks under it)  |
//   | the table (interned_context.cc) | guarded by g_contexts_mu, a leaf lock   |
//
// Lock order: g_contexts_mu is a leaf, held only around Python-free steps
// (counting users, editing the table): candidates' __eq__ and the drop of a
// dead context's object run after it is released, and no other lock is
// taken under it. Only the test hook LockSignatureLocksForTest (signature.cc)
// holds it together with another lock, g_dtypes_mu, taken first.
#pragma once

#include <Python.h>

#include <atomic>

namespace ftjit {

struct InternedContext {
  PyObject* obj;  // strong
  Py_hash_t hash;
  std::atomic<int64_t> users{1};
};

// A signature's context: nothing, an owned object (not interned: the table
// was full), or an interned one, counted or borrowed (see above). Move-only.
class ContextRef {
 public:
  ContextRef() = default;
  static ContextRef Owned(PyObject* strong);               // steals the reference
  static ContextRef Counted(InternedContext* c);           // takes over one user count
  static ContextRef Borrowed(InternedContext* c);          // counts nothing
  ContextRef(ContextRef&& o) noexcept { *this = std::move(o); }
  ContextRef& operator=(ContextRef&& o) noexcept;
  ContextRef(const ContextRef&) = delete;
  ContextRef& operator=(const ContextRef&) = delete;
  ~ContextRef() { Reset(); }

  PyObject* ptr() const { return interned_ ? interned_->obj : owned_; }
  bool is_valid() const { return ptr() != nullptr; }
  InternedContext* interned() const { return interned_; }
  // Makes a borrowed interned context counted (see above). Python-free.
  void Adopt();
  // A counted copy of this reference (for a thread memo). Python-free.
  ContextRef CountedCopy() const;
  // Drops what this holds (may run Python: attached thread, no lock held).
  void Reset();

 private:
  PyObject* owned_ = nullptr;
  InternedContext* interned_ = nullptr;
  bool counted_ = false;
};

// The canonical context equal to `ctx` (hash `h`): a counted interned one,
// found or newly interned, or, past the table's bound, `ctx` itself, owned.
// Runs __eq__ of candidates (outside the lock); never raises for them.
ContextRef CanonicalContext(PyObject* ctx, Py_hash_t h);

// Lets go of one user of `c` (may drop it: attached thread, no lock held).
void ReleaseContext(InternedContext* c);

// How many contexts are interned now (tests, diagnostics).
size_t InternedContextCount();

// For a forked child's only thread (leaf_mutex.h).
void ReinitContextLockInChild();
// Tests only: takes or releases the table's lock.
void LockContextsForTest(bool lock);

}  // namespace ftjit
