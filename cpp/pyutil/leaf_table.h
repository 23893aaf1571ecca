// ftjit: a process-wide table under its own leaf lock (the interned dtypes,
// the interned contexts): bounded, kept for the process's life, its lock
// re-initialised in a forked child, and held by a test hook.
//
//   | LeafTable::items_ | FTJIT_GUARDED_BY(mu)                              |
//
// Lock order: `mu` is a leaf: taken with the thread attached, no Python
// code runs under it and no other lock is taken while it is held (but by
// the tests' hook, which holds the tables' locks in a fixed order).
#pragma once

#include <cstddef>
#include <vector>

#include "primitives/locks.h"
#include "primitives/thread_annotations.h"
#include "pyutil/leaf_mutex.h"

namespace ftjit {

template <class T>
class LeafTable {
 public:
  explicit LeafTable(size_t capacity) : capacity_(capacity) {}
  LeafTable(const LeafTable&) = delete;
  LeafTable& operator=(const LeafTable&) = delete;

  std::vector<T>& items() FTJIT_REQUIRES(mu) {
    mu.AssertHeld();
    return items_;
  }
  // No room for another item: it is used as is, not interned.
  bool full() FTJIT_REQUIRES(mu) { return items_.size() >= capacity_; }

  // In a forked child, before anything else uses the table.
  void ReinitLockInChild() { ReinitInChild(mu); }
  // Tests only: holds the lock (true) or lets it go (false).
  void HoldForTest(bool hold) FTJIT_NO_THREAD_SAFETY_ANALYSIS {
    if (hold) {
      mu.lock();
    } else {
      mu.unlock();
    }
  }

  LeafMutex mu;

 private:
  const size_t capacity_;
  std::vector<T> items_ FTJIT_GUARDED_BY(mu);
};

}  // namespace ftjit
