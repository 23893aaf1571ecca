// ftjit: one capacity bound shared by many caches, with second-chance (CLOCK)
// recency so that a cache hit never takes the LRU's lock.
//
// Items are handles (shared_ptr-like) to nodes that embed an `LruHook`.
// Members and their protection:
//
//   | member                 | protection                                  |
//   |------------------------|---------------------------------------------|
//   | SharedLru::capacity_   | fixed after construction                    |
//   | SharedLru::order_      | guarded by mu_ (front = most recently added) |
//   | LruHook::pos, linked   | guarded by the owning SharedLru's mu_       |
//   | LruHook::referenced    | relaxed atomic; set by Touch() without lock |
//
// Touch() (the hit path) only stores to `referenced` when it is clear, so
// threads hitting the same hot item share its cache line read-only. Eviction
// scans from the back: a referenced item loses its bit and moves to the front
// (a second chance); an unreferenced one is evicted. Items the caller marks
// unevictable (e.g. still compiling) are skipped, so the LRU may run over
// capacity while every surplus item is pinned; Trim() restores the bound.
//
// Evicted and removed items are returned to the caller, who destroys them
// outside the lock. The lock is a leaf: no other lock is taken under it.
#pragma once

#include <atomic>
#include <cstddef>
#include <iterator>
#include <list>
#include <mutex>
#include <new>
#include <vector>


namespace ftjit {

template <class Item>
struct LruHook {
  typename std::list<Item>::iterator pos;  // guarded by the SharedLru's mu_
  bool linked = false;                      // guarded by the SharedLru's mu_
  std::atomic<bool> referenced{false};      // relaxed; racy on purpose
};

// `Item` is a handle with `->lru` of type LruHook<Item>.
template <class Item, class Mutex>
class SharedLru {
 public:
  explicit SharedLru(size_t capacity) : capacity_(capacity) {}
  SharedLru(const SharedLru&) = delete;
  SharedLru& operator=(const SharedLru&) = delete;

  size_t capacity() const { return capacity_; }

  size_t size() const {
    std::lock_guard<Mutex> lock(mu_);
    return order_.size();
  }

  // Marks `item` recently used. Lock-free; safe from any thread at any time.
  template <class Handle>  // an Item, or a raw pointer to what it points to
  static void Touch(const Handle& item) {
    if (!item->lru.referenced.load(std::memory_order_relaxed)) {
      item->lru.referenced.store(true, std::memory_order_relaxed);
    }
  }

  // Links `item` (not yet linked) at the front, then evicts down to capacity.
  // `evictable(item)` is called under the lock and must be cheap and pure.
  template <class Evictable>
  std::vector<Item> Insert(const Item& item, Evictable&& evictable) {
    std::vector<Item> evicted;
    std::lock_guard<Mutex> lock(mu_);
    if (!item->lru.linked) {
      order_.push_front(item);
      item->lru.pos = order_.begin();
      item->lru.linked = true;
      item->lru.referenced.store(false, std::memory_order_relaxed);
    }
    EvictLockHeld(evictable, evicted);
    return evicted;
  }

  // Evicts down to capacity (after pinned items became evictable).
  template <class Evictable>
  std::vector<Item> Trim(Evictable&& evictable) {
    std::vector<Item> evicted;
    std::lock_guard<Mutex> lock(mu_);
    EvictLockHeld(evictable, evicted);
    return evicted;
  }

  // Unlinks `item` if linked. Returns whether it was.
  bool Remove(const Item& item) {
    std::lock_guard<Mutex> lock(mu_);
    return RemoveLockHeld(item);
  }

  // Unlinks every item satisfying `pred`; returns them.
  template <class Pred>
  std::vector<Item> RemoveIf(Pred&& pred) {
    std::vector<Item> out;
    std::lock_guard<Mutex> lock(mu_);
    for (auto it = order_.begin(); it != order_.end();) {
      if (pred(*it)) {
        (*it)->lru.linked = false;
        out.push_back(std::move(*it));
        it = order_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

  // Unlinks everything; returns the items.
  std::vector<Item> Clear() {
    return RemoveIf([](const Item&) { return true; });
  }

  // In a forked child's only thread, before any use (see leaf_mutex.h).
  void ReinitLockInChild() {
    mu_.~Mutex();
    new (&mu_) Mutex();
  }
  // Tests only: hold the lock as a thread that vanished at fork would.
  void LockForTest() const { mu_.lock(); }
  void UnlockForTest() const { mu_.unlock(); }

 private:
  bool RemoveLockHeld(const Item& item) {
    if (!item->lru.linked) return false;
    item->lru.linked = false;
    order_.erase(item->lru.pos);
    return true;
  }

  template <class Evictable>
  void EvictLockHeld(Evictable& evictable, std::vector<Item>& evicted) {
    // Each item is visited at most twice (once to clear its bit, once to
    // evict), so the scan is bounded even when everything is pinned.
    size_t budget = 2 * order_.size();
    while (order_.size() > capacity_ && budget-- > 0) {
      auto it = std::prev(order_.end());
      Item& item = *it;
      if (evictable(item) &&
          !item->lru.referenced.exchange(false, std::memory_order_relaxed)) {
        item->lru.linked = false;
        evicted.push_back(std::move(item));
        order_.erase(it);
      } else {
        // Second chance (or pinned): move to the front.
        order_.splice(order_.begin(), order_, it);
      }
    }
  }

  const size_t capacity_;
  mutable Mutex mu_;        // leaf lock
  std::list<Item> order_;   // guarded by mu_
};

}  // namespace ftjit
