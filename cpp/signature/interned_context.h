// ftjit: the process-wide canonical objects of compiler contexts, which live
// exactly as long as some signature or some thread's memo uses them.
//
// A compiler's context() (e.g. JAX's trace context) builds a fresh tuple on
// every call. Signatures key on it, and the hit path compares keys without
// running Python, so each context is given the canonical object of an equal
// one seen before (InternedContext), compared by identity.
//
// Lifetime: an InternedContext counts its users: stored signatures (entry
// keys), and lookups while they compare. The last user to let go removes it
// from the table and drops its object (attached, no lock held: its
// destructor may run Python), so a context dies with the last function
// using it. Thread memos (ContextMemo) hold it weakly (`weak`): the struct
// stays allocated, never its object. A memo remembers its context's items
// (uncounted pointers) and reuses the canonical object while context()
// returns the very same items: when they compare identical and the context
// still has users *after* the comparison, every remembered item was alive
// at that instant, so the fresh items are those very objects (never others
// at reused addresses).
//
// A probe signature borrows the canonical object its memo found, uncounted:
// no Python code runs until it is probed (the hit path compares the
// InternedContext's identity; the memo keeps the struct allocated) or
// adopted. Adopt() counts it, and fails when the context lost its last user
// meanwhile: the caller builds the signature again. Until then the probe
// holds the fresh context's objects (`anchor`), so no drop of theirs can
// run Python in that window.
//
//   | member                      | protection                                  |
//   |-----------------------------|---------------------------------------------|
//   | InternedContext::obj, hash  | fixed after construction                    |
//   | InternedContext::users      | atomic; incremented under g_contexts.mu by  |
//   |                             | lookups, by Adopt only while above 0 (a     |
//   |                             | CAS); decremented by CAS while above 1, and |
//   |                             | from 1 only under g_contexts.mu, with the   |
//   |                             | removal: 0 is reached once, and is final    |
//   | InternedContext::weak       | atomic (memos' references, plus one)        |
//   | the table (g_contexts)      | guarded by g_contexts.mu, a leaf lock       |
//
// Lock order: g_contexts.mu is a leaf, held only around Python-free steps
// (counting users, editing the table): candidates' __eq__ and the drop of a
// dead context's object run after it is released, and no other lock is
// taken under it. Only the test hook LockSignatureLocksForTest holds it
// together with another lock, g_dtypes.mu, taken first.
#pragma once

#include <Python.h>

#include <atomic>

#include "primitives/small_vector.h"

namespace ftjit {

struct InternedContext {
  PyObject* obj;  // strong while users > 0; dropped when they reach 0
  Py_hash_t hash;
  std::atomic<int64_t> users{1};
  // Memos holding this struct, plus one for all its users together; the
  // struct is freed when it reaches 0.
  std::atomic<int64_t> weak{1};
};

// A signature's context: nothing, an owned object (not interned: the table
// was full), or an interned one, counted or borrowed (see above). Move-only.
class ContextRef {
 public:
  ContextRef() = default;
  static ContextRef Owned(PyObject* strong);               // steals the reference
  static ContextRef Counted(InternedContext* c);           // takes over one user count
  // Counts nothing; `anchor` (strong references, taken over) keeps the
  // fresh context's objects until Adopt() succeeds or this is dropped.
  static ContextRef Borrowed(InternedContext* c, SmallVector<PyObject*, 5>&& anchor);
  ContextRef(ContextRef&& o) noexcept { *this = std::move(o); }
  ContextRef& operator=(ContextRef&& o) noexcept;
  ContextRef(const ContextRef&) = delete;
  ContextRef& operator=(const ContextRef&) = delete;
  ~ContextRef() { Reset(); }

  // The context object: valid for owned and counted references, and for a
  // borrowed one until Adopt() (which may fail if its context died).
  PyObject* ptr() const { return interned_ ? interned_->obj : owned_; }
  bool is_valid() const { return interned_ != nullptr || owned_ != nullptr; }
  InternedContext* interned() const { return interned_; }
  // Makes a borrowed interned context counted (see above); false, leaving
  // it borrowed, when the context has no user left. Python-free when it
  // succeeds.
  bool Adopt();
  // Drops what this holds (may run Python: attached thread, no lock held).
  void Reset();

 private:
  PyObject* owned_ = nullptr;
  InternedContext* interned_ = nullptr;
  SmallVector<PyObject*, 5> anchor_;  // strong; only while borrowed
  bool counted_ = false;
};

// A thread memo's weak reference: keeps the struct allocated, never its
// object. Python-free.
void RetainWeak(InternedContext* c);
void ReleaseWeak(InternedContext* c);

// The canonical context equal to `ctx` (hash `h`): a counted interned one,
// found or newly interned, or, past the table's bound, `ctx` itself, owned.
// Runs __eq__ of candidates (outside the lock), one that raises counting as
// "not equal" (the error cleared): a context with a broken __eq__ fails only
// the calls that carry it (their slow path compares it again, errors
// propagating), never unrelated contexts of equal hash.
ContextRef CanonicalContext(PyObject* ctx, Py_hash_t h);

// Lets go of one user of `c` (may drop it: attached thread, no lock held).
void ReleaseContext(InternedContext* c);

// How many contexts are interned now (tests, diagnostics).
size_t InternedContextCount();

// For a forked child's only thread.
void ReinitContextLockInChild();
// Tests only: takes or releases the table's lock.
void LockContextsForTest(bool lock);

}  // namespace ftjit
