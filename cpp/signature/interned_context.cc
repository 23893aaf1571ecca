// ftjit: canonical compiler contexts, counted by their users. The state,
// its protection and the lock order: see InternedContext.
#include "signature/interned_context.h"

#include <new>
#include <utility>
#include <vector>

#include "primitives/small_vector.h"
#include "pyutil/errors.h"
#include "pyutil/leaf_table.h"

namespace ftjit {

namespace {

// The interned contexts. Bounded: past 256 live contexts a new one is used
// as is, uninterned (its calls then compare it with == on the slow path).
// Under its leaf lock only user counts are written and pointers moved.
// Never destroyed.
LeafTable<InternedContext*>& g_contexts = *new LeafTable<InternedContext*>(256);

// a == b for two context objects, a raised error taken as "not equal" (see
// CanonicalContext; ClearErrorKeepingInterrupt).
bool EqualOrNot(PyObject* a, PyObject* b) {
  if (a == b) return true;
  int r = PyObject_RichCompareBool(a, b, Py_EQ);
  if (r < 0) {
    ClearErrorKeepingInterrupt();
    return false;
  }
  return r == 1;
}

}  // namespace

ContextRef ContextRef::Owned(PyObject* strong) {
  ContextRef r;
  r.owned_ = strong;
  return r;
}

ContextRef ContextRef::Counted(InternedContext* c) {
  ContextRef r;
  r.interned_ = c;
  r.counted_ = true;
  return r;
}

ContextRef ContextRef::Borrowed(InternedContext* c, SmallVector<PyObject*, 5>&& anchor) {
  ContextRef r;
  r.interned_ = c;
  r.anchor_ = std::move(anchor);
  return r;
}

ContextRef& ContextRef::operator=(ContextRef&& o) noexcept {
  if (this != &o) {
    ContextRef old;
    old.owned_ = owned_;
    old.interned_ = interned_;
    old.anchor_ = std::move(anchor_);
    old.counted_ = counted_;
    owned_ = o.owned_;
    interned_ = o.interned_;
    anchor_ = std::move(o.anchor_);
    counted_ = o.counted_;
    o.owned_ = nullptr;
    o.interned_ = nullptr;
    o.counted_ = false;
    // `old` lets go here, after this one is consistent (it may run Python).
  }
  return *this;
}

namespace {
void DropAll(SmallVector<PyObject*, 5>& refs) {
  SmallVector<PyObject*, 5> old = std::move(refs);
  refs.clear();
  for (size_t i = 0; i < old.size(); ++i) Py_DECREF(old[i]);
}
}  // namespace

bool ContextRef::Adopt() {
  if (!interned_ || counted_) return true;
  int64_t n = interned_->users.load(std::memory_order_relaxed);
  do {
    if (n <= 0) return false;  // died meanwhile: the caller builds the signature again
  } while (!interned_->users.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel,
                                                   std::memory_order_relaxed));
  counted_ = true;
  // The context's object holds the anchor's items now: dropping the anchor
  // frees the fresh tuple at most, and runs no Python.
  if (!anchor_.empty()) DropAll(anchor_);
  return true;
}

void ContextRef::Reset() {
  PyObject* owned = owned_;
  InternedContext* interned = counted_ ? interned_ : nullptr;
  owned_ = nullptr;
  interned_ = nullptr;
  counted_ = false;
  Py_XDECREF(owned);
  if (!anchor_.empty()) DropAll(anchor_);
  if (interned) ReleaseContext(interned);
}

void RetainWeak(InternedContext* c) { c->weak.fetch_add(1, std::memory_order_relaxed); }

void ReleaseWeak(InternedContext* c) {
  if (c->weak.fetch_sub(1, std::memory_order_acq_rel) == 1) delete c;
}

void ReleaseContext(InternedContext* c) {
  // Above one user, a plain decrement (the caller's count keeps it above
  // zero). The last user's decrement happens under the lock, and only then:
  // lookups count candidates under it and Adopt never counts from zero, so
  // a count that reaches zero there stays zero, and exactly one thread
  // removes the context and drops its object. (Decrementing first and
  // re-checking under the lock let a lookup revive and release it
  // meanwhile: two threads then both saw zero and both dropped it.)
  int64_t n = c->users.load(std::memory_order_relaxed);
  while (n > 1) {
    if (c->users.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel, std::memory_order_relaxed)) return;
  }
  bool dead = false;
  {
    LockGuard<LeafMutex> lock(g_contexts.mu);
    if (c->users.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      auto& table = g_contexts.items();
      for (auto it = table.begin(); it != table.end(); ++it) {
        if (*it == c) {
          table.erase(it);
          break;
        }
      }
      dead = true;
    }
  }
  if (dead) {
    PyObject* obj = c->obj;
    ReleaseWeak(c);  // the users' share; memos may keep the struct a while
    Py_DECREF(obj);  // may run Python: no lock held
  }
}

ContextRef CanonicalContext(PyObject* ctx, Py_hash_t h) {
  SmallVector<InternedContext*, 4> candidates;  // each counted for this lookup
  {
    LockGuard<LeafMutex> lock(g_contexts.mu);
    auto& table = g_contexts.items();
    for (InternedContext* c : table) {
      if (c->hash == h) {
        c->users.fetch_add(1, std::memory_order_relaxed);
        candidates.push_back(c);
      }
    }
  }
  InternedContext* found = nullptr;
  for (InternedContext* c : candidates) {
    if (!found && EqualOrNot(c->obj, ctx)) {
      found = c;  // keeps the count taken above
    } else {
      ReleaseContext(c);
    }
  }
  if (found) return ContextRef::Counted(found);
  LockGuard<LeafMutex> lock(g_contexts.mu);
  auto& table = g_contexts.items();
  // Another thread may have interned this very object meanwhile (identity
  // only, under the lock: no Python here); an equal duplicate is harmless,
  // just slower to match.
  for (InternedContext* c : table) {
    if (c->obj == ctx) {
      c->users.fetch_add(1, std::memory_order_relaxed);
      return ContextRef::Counted(c);
    }
  }
  if (g_contexts.full()) return ContextRef::Owned(Py_NewRef(ctx));
  auto* c = new InternedContext{Py_NewRef(ctx), h};  // users == 1: the caller's
  table.push_back(c);
  return ContextRef::Counted(c);
}

size_t InternedContextCount() {
  LockGuard<LeafMutex> lock(g_contexts.mu);
  return g_contexts.items().size();
}

void ReinitContextLockInChild() { g_contexts.ReinitLockInChild(); }

void LockContextsForTest(bool lock) { g_contexts.HoldForTest(lock); }

}  // namespace ftjit
