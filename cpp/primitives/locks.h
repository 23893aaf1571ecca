// ftjit: the lock vocabulary of the primitives, as Clang's thread-safety
// analysis sees it:
//   LockGuard<M>  a scoped lock of a capability M (libstdc++'s std::lock_guard
//                 is not annotated: the analysis would not see the lock taken);
//   StdMutex      std::mutex as a capability (libstdc++'s is not one);
//   DebugOwner    which thread holds a lock, in debug builds, for AssertHeld.
//
// The primitives' `Mutex` template parameter (StdMutex in the C++ tests and
// WaitForGraph, LeafMutex in the extension) provides lock() FTJIT_ACQUIRE(),
// unlock() FTJIT_RELEASE() and AssertHeld() const FTJIT_ASSERT_CAPABILITY(this),
// which aborts, in debug builds, unless the calling thread holds the lock. A
// helper that needs the lock held is named `...LockHeld`, is
// FTJIT_REQUIRES(mu_) and calls mu_.AssertHeld() on entry.
//
// Release builds (NDEBUG) pay nothing: DebugOwner is an empty base,
// AssertHeld an empty function, LockGuard<M> does what std::lock_guard<M> does.
//
//   | member               | protection                                    |
//   |----------------------|-----------------------------------------------|
//   | DebugOwner::owner_   | relaxed atomic; written by the holding thread |
//   |                      | only (set after lock, cleared before unlock)  |
//   | StdMutex::mu_        | the lock itself                               |
//
// Lock order: none (these are the locks; their users state theirs).
#pragma once

#include <mutex>
#include <new>
#ifndef NDEBUG
#include <atomic>
#include <cassert>
#endif

#include "primitives/thread_annotations.h"

namespace ftjit {

template <class M>
class LockGuard;

// Every lock's after-fork hook: puts `mu` back in its unlocked, freshly
// constructed state, in a forked child's only thread before anything else
// uses it. The lock may have been held by (or handed to) a thread that does
// not exist there (see LeafMutex).
template <class M>
void ReinitInChild(M& mu) {
  mu.~M();
  new (&mu) M();
}

// A thread sees its own stores, so owner_ reads as itself exactly while it
// holds the lock (whatever another thread stored last, it is never this
// thread's tag).
class DebugOwner {
#ifndef NDEBUG
 public:
  void NoteAcquired() { owner_.store(Me(), std::memory_order_relaxed); }
  void NoteReleasing() {
    assert(HeldByMe() && "a lock released by a thread that does not hold it");
    owner_.store(nullptr, std::memory_order_relaxed);
  }
  bool HeldByMe() const { return owner_.load(std::memory_order_relaxed) == Me(); }

 private:
  // Distinct for every thread alive (a thread holding a lock is alive).
  static const void* Me() {
    static thread_local const char tag = 0;
    return &tag;
  }
  std::atomic<const void*> owner_{nullptr};
#else
 public:
  void NoteAcquired() {}
  void NoteReleasing() {}
#endif
};

class FTJIT_CAPABILITY("mutex") StdMutex : private DebugOwner {
 public:
  StdMutex() = default;
  StdMutex(const StdMutex&) = delete;
  StdMutex& operator=(const StdMutex&) = delete;

  void lock() FTJIT_ACQUIRE() {
    mu_.lock();
    NoteAcquired();
  }
  void unlock() FTJIT_RELEASE() {
    NoteReleasing();
    mu_.unlock();
  }
  void AssertHeld() const FTJIT_ASSERT_CAPABILITY(this) {
#ifndef NDEBUG
    assert(HeldByMe() && "the lock is not held by this thread");
#endif
  }

 private:
  friend class LockGuard<StdMutex>;
  std::mutex mu_;
};

// std::lock_guard<M>, with the attributes.
template <class M>
class FTJIT_SCOPED_CAPABILITY LockGuard {
 public:
  explicit LockGuard(M& mu) FTJIT_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~LockGuard() FTJIT_RELEASE() { mu_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  M& mu_;
};

// Over a StdMutex: a std::lock_guard of the std::mutex inside, plus the
// owner notes, so that a release build runs std::lock_guard<std::mutex>'s
// code exactly (not one call deeper, through StdMutex::lock).
template <>
class FTJIT_SCOPED_CAPABILITY LockGuard<StdMutex> {
 public:
  explicit LockGuard(StdMutex& mu) FTJIT_ACQUIRE(mu) : mu_(mu), lock_(mu.mu_) {
    mu_.NoteAcquired();
  }
  ~LockGuard() FTJIT_RELEASE() { mu_.NoteReleasing(); }  // then lock_ unlocks
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  StdMutex& mu_;
  std::lock_guard<std::mutex> lock_;
};

}  // namespace ftjit
