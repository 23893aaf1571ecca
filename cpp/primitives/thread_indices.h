// ftjit: ThreadIndices, small dense numbers for the live threads: each
// thread takes the lowest free one and gives it back when it ends, so the
// indices in use never exceed the most threads alive at once. No bound:
// the thousandth thread gets an index as the first did. Python-free.
//
//   | member  | protection                                                  |
//   |---------|-------------------------------------------------------------|
//   | free_   | FTJIT_GUARDED_BY(mu_): a min-heap of released indices       |
//   | next_   | FTJIT_GUARDED_BY(mu_): the lowest index never handed out    |
//   | mu_     | a leaf lock, held for a few instructions (a heap push/pop)  |
//
// The lock is a StdMutex, not the extension's LeafMutex: Release runs when
// a thread's C++ thread-locals are destroyed, after its Python thread state
// is gone (on GIL builds LeafMutex relies on the GIL). A thread takes it
// twice in its life, so it is never contended on a call.
//
// Lock order: mu_ is a leaf; nothing else is taken under it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

#include "primitives/locks.h"
#include "primitives/thread_annotations.h"

namespace ftjit {

class ThreadIndices {
 public:
  size_t Acquire() FTJIT_EXCLUDES(mu_) {
    LockGuard<StdMutex> lock(mu_);
    if (free_.empty()) return next_++;
    std::pop_heap(free_.begin(), free_.end(), std::greater<size_t>());
    size_t i = free_.back();
    free_.pop_back();
    return i;
  }
  void Release(size_t index) FTJIT_EXCLUDES(mu_) {
    LockGuard<StdMutex> lock(mu_);
    free_.push_back(index);
    std::push_heap(free_.begin(), free_.end(), std::greater<size_t>());
  }
  // The indices handed out so far are below this (diagnostics, tests).
  size_t HighWater() FTJIT_EXCLUDES(mu_) {
    LockGuard<StdMutex> lock(mu_);
    return next_;
  }
  // The indices held by live threads now (diagnostics, tests).
  size_t InUse() FTJIT_EXCLUDES(mu_) {
    LockGuard<StdMutex> lock(mu_);
    return next_ - free_.size();
  }
  // In a forked child's only thread, before any use: only `keep` (the
  // forking thread's index, or SIZE_MAX for none) stays taken.
  void ResetInChild(size_t keep) FTJIT_NO_THREAD_SAFETY_ANALYSIS {
    ReinitInChild(mu_);
    free_.clear();
    for (size_t i = 0; i < next_; ++i) {
      if (i != keep) free_.push_back(i);
    }
    std::make_heap(free_.begin(), free_.end(), std::greater<size_t>());
  }

 private:
  StdMutex mu_;
  std::vector<size_t> free_ FTJIT_GUARDED_BY(mu_);
  size_t next_ FTJIT_GUARDED_BY(mu_) = 0;
};

}  // namespace ftjit
