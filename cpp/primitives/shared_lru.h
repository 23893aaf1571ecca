// ftjit: one capacity bound shared by many caches, with second-chance (CLOCK)
// recency so that a cache hit never takes the LRU's lock. Items are handles
// (shared_ptr-like) to nodes that embed an `LruHook`.
//
//   | member                 | protection                                   |
//   |------------------------|----------------------------------------------|
//   | SharedLru::capacity_   | fixed after construction                     |
//   | SharedLru::order_      | FTJIT_GUARDED_BY(mu_) (front = most recently |
//   |                        | added)                                       |
//   | LruHook::pos, linked   | guarded by the owning SharedLru's mu_:       |
//   |                        | private to SharedLru, which reaches them     |
//   |                        | only through HookLockHeld (REQUIRES(mu_))    |
//   | LruHook::referenced    | relaxed atomic; set by Touch() without lock  |
//
// Touch() stores to `referenced` only when it is clear, so threads hitting a
// hot item share its cache line read-only. Eviction scans from the back: a
// referenced item loses its bit and moves to the front; an unreferenced one
// is evicted. Items the caller marks unevictable (still compiling) are
// skipped, so the LRU may run over capacity while every surplus item is
// pinned; Trim() restores the bound.
//
// Lock order: mu_ is a leaf: no other lock is taken under it. Evicted and
// removed items are returned, for the caller to destroy outside it.
#pragma once

#include <atomic>
#include <cstddef>
#include <iterator>
#include <list>
#include <new>
#include <vector>

#include "primitives/locks.h"
#include "primitives/thread_annotations.h"

namespace ftjit {

template <class Item, class Mutex>
class SharedLru;

template <class Item>
class LruHook {
  // Guarded by the owning SharedLru's mu_, which the analysis cannot name
  // from here.
  template <class, class>
  friend class SharedLru;
  typename std::list<Item>::iterator pos;
  bool linked = false;

 public:
  std::atomic<bool> referenced{false};  // relaxed; racy on purpose
};

// `Item` is a handle with `->lru` of type LruHook<Item>.
template <class Item, class Mutex>
class SharedLru {
 public:
  explicit SharedLru(size_t capacity) : capacity_(capacity) {}
  SharedLru(const SharedLru&) = delete;
  SharedLru& operator=(const SharedLru&) = delete;

  size_t capacity() const { return capacity_; }

  size_t size() const FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    return order_.size();
  }

  // Lock-free; safe from any thread at any time.
  template <class Handle>  // an Item, or a raw pointer to what it points to
  static void Touch(const Handle& item) {
    if (!item->lru.referenced.load(std::memory_order_relaxed)) {
      item->lru.referenced.store(true, std::memory_order_relaxed);
    }
  }

  // Links `item` at the front, then evicts down to capacity. `evictable` runs
  // under the lock: cheap and pure.
  template <class Evictable>
  std::vector<Item> Insert(const Item& item, Evictable&& evictable) FTJIT_EXCLUDES(mu_) {
    std::vector<Item> evicted;
    LockGuard<Mutex> lock(mu_);
    if (!HookLockHeld(item).linked) {
      order_.push_front(item);
      HookLockHeld(item).pos = order_.begin();
      HookLockHeld(item).linked = true;
      item->lru.referenced.store(false, std::memory_order_relaxed);
    }
    EvictLockHeld(evictable, evicted);
    return evicted;
  }

  template <class Evictable>
  std::vector<Item> Trim(Evictable&& evictable) FTJIT_EXCLUDES(mu_) {
    std::vector<Item> evicted;
    LockGuard<Mutex> lock(mu_);
    EvictLockHeld(evictable, evicted);
    return evicted;
  }

  bool Remove(const Item& item) FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    return RemoveLockHeld(item);
  }

  // `get(element)` gives its Item. The caller keeps the items alive: the
  // list's references are dropped under the lock, never the last one.
  template <class Range, class Get>
  void RemoveEach(const Range& items, Get&& get) FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    for (const auto& x : items) RemoveLockHeld(get(x));
  }

  template <class Pred>
  std::vector<Item> RemoveIf(Pred&& pred) FTJIT_EXCLUDES(mu_) {
    std::vector<Item> out;
    LockGuard<Mutex> lock(mu_);
    for (auto it = order_.begin(); it != order_.end();) {
      if (pred(*it)) {
        HookLockHeld(*it).linked = false;
        out.push_back(std::move(*it));
        it = order_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

  std::vector<Item> Clear() FTJIT_EXCLUDES(mu_) {
    return RemoveIf([](const Item&) { return true; });
  }

  // In a forked child's only thread, before any use (ReinitInChild).
  void ReinitLockInChild() { ReinitInChild(mu_); }
  // Tests only: hold the lock as a thread that vanished at fork would.
  void LockForTest() const FTJIT_ACQUIRE(mu_) { mu_.lock(); }
  void UnlockForTest() const FTJIT_RELEASE(mu_) { mu_.unlock(); }

 private:
  LruHook<Item>& HookLockHeld(const Item& item) const FTJIT_REQUIRES(mu_) {
    mu_.AssertHeld();
    return item->lru;
  }

  bool RemoveLockHeld(const Item& item) FTJIT_REQUIRES(mu_) {
    mu_.AssertHeld();
    if (!HookLockHeld(item).linked) return false;
    HookLockHeld(item).linked = false;
    order_.erase(HookLockHeld(item).pos);
    return true;
  }

  template <class Evictable>
  void EvictLockHeld(Evictable& evictable, std::vector<Item>& evicted) FTJIT_REQUIRES(mu_) {
    mu_.AssertHeld();
    // Each item is visited at most twice (clear its bit, evict): bounded
    // even when everything is pinned.
    size_t budget = 2 * order_.size();
    while (order_.size() > capacity_ && budget-- > 0) {
      auto it = std::prev(order_.end());
      Item& item = *it;
      if (evictable(item) &&
          !item->lru.referenced.exchange(false, std::memory_order_relaxed)) {
        HookLockHeld(item).linked = false;
        evicted.push_back(std::move(item));
        order_.erase(it);
      } else {
        order_.splice(order_.begin(), order_, it);
      }
    }
  }

  const size_t capacity_;
  mutable Mutex mu_;  // leaf lock
  std::list<Item> order_ FTJIT_GUARDED_BY(mu_);
};

}  // namespace ftjit
