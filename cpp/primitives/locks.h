// ftjit: the lock vocabulary of the primitives, in the form Clang's
// thread-safety analysis sees (thread_annotations.h):
//   LockGuard<M>  a scoped lock of a capability M. std::lock_guard would do
//                 the same, but libstdc++ does not annotate it: the analysis
//                 would not see the lock taken, and report every access.
//   StdMutex      std::mutex as a capability (libstdc++'s is not one).
//   DebugOwner    which thread holds a lock, in debug builds only, so that
//                 AssertHeld can check it at run time.
//
// The primitives' `Mutex` template parameter is a lock type that provides
//   lock() FTJIT_ACQUIRE(), unlock() FTJIT_RELEASE(), and
//   AssertHeld() const FTJIT_ASSERT_CAPABILITY(this): a no-op under NDEBUG;
//     otherwise aborts unless the calling thread holds the lock.
// StdMutex (here: the C++ tests and WaitForGraph) and LeafMutex
// (pyutil/leaf_mutex.h: the extension) are such types. A helper that needs
// the lock held is named `...LockHeld`, is FTJIT_REQUIRES(mu_) (the compile-
// time check, under clang++ -Wthread-safety) and calls mu_.AssertHeld() on
// entry (the run-time check, in debug builds: the C++ tests run so).
//
// Release builds (NDEBUG) pay nothing: DebugOwner is then an empty base
// (no storage), AssertHeld an empty inline function, LockGuard<M> does what
// std::lock_guard<M> does (over a StdMutex it holds a std::lock_guard of the
// std::mutex inside), StdMutex is a std::mutex: the extension's release
// build is the same code, instruction for instruction, as before the
// annotations (checked with objdump on every translation unit, GIL and
// free-threaded builds).
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

#include "primitives/thread_annotations.h"

#ifndef NDEBUG
#include <atomic>
#include <cassert>
#endif

namespace ftjit {

template <class M>
class LockGuard;

// Puts `mu` back in its unlocked, freshly constructed state. Only for a
// forked child's only thread, before anything else uses `mu`: the lock may
// have been held by (or handed to) a thread that does not exist there
// (pyutil/leaf_mutex.h explains how). Every lock's after-fork hook is this.
template <class M>
void ReinitInChild(M& mu) {
  mu.~M();
  new (&mu) M();
}

// Debug builds: remembers the thread that holds a lock. A thread sees its
// own stores, so owner_ reads as itself exactly while it holds the lock
// (whatever another thread stored last, it is never this thread's tag).
// Release builds: empty, and an empty base takes no storage.
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

// std::mutex, as a capability the analysis sees, that can say whether the
// calling thread holds it (debug builds).
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
  // Aborts (debug builds) unless the calling thread holds the lock.
  void AssertHeld() const FTJIT_ASSERT_CAPABILITY(this) {
#ifndef NDEBUG
    assert(HeldByMe() && "the lock is not held by this thread");
#endif
  }

 private:
  friend class LockGuard<StdMutex>;
  std::mutex mu_;
};

// Holds `mu` for its scope, visibly to the analysis: what std::lock_guard<M>
// does (the primitives used it before they were annotated), with the
// attributes.
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
// owner notes (debug builds). So a release build runs exactly the
// std::lock_guard<std::mutex> code that WaitForGraph had before. (Through
// StdMutex::lock, one call deeper, GCC 12 -O3 lays out call.cc's
// WaitForCompile differently: the same instructions, two branches swapped.)
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
