// ftjit: compile-once coordination. One latch per cache entry: the thread
// that inserted the entry owns it and compiles; others wait on the latch. A
// process-wide wait-for graph turns would-be deadlocks into errors.
//
//   | member                            | protection                         |
//   |-----------------------------------|------------------------------------|
//   | CompileLatch::owner_, generation_ | fixed after construction           |
//   | CompileLatch::state_              | atomic; written once by the owner  |
//   |                                   | (release)                          |
//   | WaitForGraph::waiting_            | FTJIT_GUARDED_BY(mu_)              |
//
// Memory ordering: whatever the owner wrote before Publish() (the executable,
// or the error) is visible to any thread that then observes a non-kCompiling
// state (acquire load), with or without waiting.
//
// A waiter sleeps on the state word itself (a futex on Linux), holding no
// lock: a latch has no mutex or condition variable that a thread could hold
// at fork time, and destroying one never blocks, even in a forked child
// where the parent's waiters do not exist.
//
// Lock order: the graph's mu_ is a leaf; it is never held while acquiring
// any other lock, the GIL included. Waiting is done in slices so that a
// caller can drop the GIL around each slice and check for signals between
// them.
#pragma once

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <unordered_map>
#include <vector>

#include "primitives/locks.h"
#include "primitives/thread_annotations.h"

namespace ftjit {

// A thread's identity as a compile owner, from a process-wide counter: never
// reused, unlike std::thread::id and pthread ids (a child's new thread could
// be taken for the owner of a compile of the parent's).
using OwnerId = uint64_t;
inline std::atomic<OwnerId> g_next_owner{1};
inline OwnerId ThisThreadOwner() {
  thread_local const OwnerId id = g_next_owner.fetch_add(1, std::memory_order_relaxed);
  return id;
}

// Written only by NoteForkInChild() in a forked child's only thread, read
// relaxed: a thread the child starts later synchronises with it through the
// thread creation itself. g_fork_survivor: the thread that ran the latest
// fork, the one thread of the parent that lives on here.
inline std::atomic<uint64_t> g_fork_generation{0};
inline std::atomic<OwnerId> g_fork_survivor{0};

inline void NoteForkInChild() {
  g_fork_survivor.store(ThisThreadOwner(), std::memory_order_relaxed);
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
}

namespace detail {

// Sleeps while `*word == expected`, for at most `timeout`; may wake early.
inline void WaitOnWord(std::atomic<uint32_t>* word, uint32_t expected,
                       std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return;
#if defined(__linux__)
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                    std::atomic<uint32_t>::is_always_lock_free,
                "a futex needs a plain 32-bit word");
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // EAGAIN, EINTR and ETIMEDOUT all mean "look again": the caller does.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts,
          nullptr, 0);
#else
  // No futex: poll in short naps.
  auto nap = std::min<std::chrono::nanoseconds>(timeout, std::chrono::milliseconds(1));
  if (word->load(std::memory_order_acquire) == expected) std::this_thread::sleep_for(nap);
#endif
}

inline void WakeAllOnWord(std::atomic<uint32_t>* word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
          nullptr, 0);
#else
  (void)word;
#endif
}

}  // namespace detail

class CompileLatch {
 public:
  // kAbandoned: the compile was interrupted (not failed) and its entry
  // dropped; a waiter looks the signature up again and may compile it.
  enum class State : uint32_t { kCompiling, kReady, kFailed, kAbandoned };

  explicit CompileLatch(OwnerId owner)
      : owner_(owner), generation_(g_fork_generation.load(std::memory_order_relaxed)) {}
  CompileLatch(const CompileLatch&) = delete;
  CompileLatch& operator=(const CompileLatch&) = delete;

  OwnerId owner() const { return owner_; }
  State state() const { return static_cast<State>(state_.load(std::memory_order_acquire)); }
  bool compiling() const { return state() == State::kCompiling; }
  // Still compiling, by a thread of the parent that does not exist in this
  // child (the forking thread may have forked from inside this very compile,
  // and finishes it here): nobody will publish it, so nobody may wait on it.
  bool OrphanedByFork() const {
    return compiling() && generation_ != g_fork_generation.load(std::memory_order_relaxed) &&
           owner_ != g_fork_survivor.load(std::memory_order_relaxed);
  }

  // Owner only, once. Never blocks.
  void Publish(State final_state) {
    state_.store(static_cast<uint32_t>(final_state), std::memory_order_release);
    detail::WakeAllOnWord(&state_);
  }

  // Blocks for at most `slice` while compiling; returns the state seen last.
  template <class Rep, class Period>
  State WaitFor(std::chrono::duration<Rep, Period> slice) {
    const auto deadline = std::chrono::steady_clock::now() + slice;
    for (;;) {
      uint32_t s = state_.load(std::memory_order_acquire);
      if (s != static_cast<uint32_t>(State::kCompiling)) return static_cast<State>(s);
      auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= std::chrono::nanoseconds::zero()) return State::kCompiling;
      detail::WaitOnWord(&state_, s, left);
    }
  }

 private:
  const OwnerId owner_;
  const uint64_t generation_;  // g_fork_generation when made
  std::atomic<uint32_t> state_{static_cast<uint32_t>(State::kCompiling)};
};

class WaitForGraph {
 public:
  // Registers `self` as waiting on `latch` (innermost), or returns false,
  // registering nothing, when that would close a cycle of compiles.
  bool BeginWait(OwnerId self, const CompileLatch* latch) FTJIT_EXCLUDES(mu_) {
    LockGuard<StdMutex> lock(mu_);
    if (ClosesCycleLockHeld(self, latch)) return false;
    waiting_[self].push_back(latch);
    return true;
  }

  // Ends the innermost wait of `self`. Harmless when `self` is not waiting.
  void EndWait(OwnerId self) FTJIT_EXCLUDES(mu_) {
    LockGuard<StdMutex> lock(mu_);
    PopLockHeld(self);
  }

  // For a registered waiter, between slices: true while its innermost wait
  // still cannot deadlock. When a cycle has closed through it, ends that wait
  // (the caller must not call EndWait for it again) and returns false.
  bool StillSafe(OwnerId self) FTJIT_EXCLUDES(mu_) {
    LockGuard<StdMutex> lock(mu_);
    auto it = waiting_.find(self);
    if (it == waiting_.end()) return true;
    if (!ClosesCycleLockHeld(self, it->second.back())) return true;
    PopLockHeld(self);
    return false;
  }

  // `self` is about to run Python code from inside its wait (signal
  // handlers): until LeavePython it is not blocked (it may compile, and
  // others may wait for that), so walks that reach it stop there. Harmless
  // when `self` is not waiting.
  void EnterPython(OwnerId self) FTJIT_EXCLUDES(mu_) {
    LockGuard<StdMutex> lock(mu_);
    auto it = waiting_.find(self);
    if (it != waiting_.end()) it->second.push_back(nullptr);
  }
  void LeavePython(OwnerId self) FTJIT_EXCLUDES(mu_) {
    LockGuard<StdMutex> lock(mu_);
    PopLockHeld(self);
  }

  // Threads registered as waiting (tests, diagnostics).
  size_t waiting() const FTJIT_EXCLUDES(mu_) {
    LockGuard<StdMutex> lock(mu_);
    return waiting_.size();
  }

 private:
  // Whether latch -> owner -> its innermost latch -> ... reaches `self`. Each
  // thread has one innermost latch: the walk ends within size() + 1 steps.
  bool ClosesCycleLockHeld(OwnerId self, const CompileLatch* latch) const FTJIT_REQUIRES(mu_) {
    mu_.AssertHeld();
    const CompileLatch* cur = latch;
    for (size_t steps = 0; steps <= waiting_.size(); ++steps) {
      if (!cur) return false;               // that thread runs Python: not blocked
      if (!cur->compiling()) return false;  // that edge resolves by itself
      OwnerId owner = cur->owner();
      if (owner == self) return true;
      auto it = waiting_.find(owner);
      if (it == waiting_.end()) return false;
      cur = it->second.back();
    }
    return false;
  }

  void PopLockHeld(OwnerId self) FTJIT_REQUIRES(mu_) {
    mu_.AssertHeld();
    auto it = waiting_.find(self);
    if (it == waiting_.end()) return;
    it->second.pop_back();
    if (it->second.empty()) waiting_.erase(it);
  }

  mutable StdMutex mu_;  // leaf lock
  // Per waiting thread, its nested waits, innermost last; never empty. A
  // null entry marks Python code running inside the wait below it.
  std::unordered_map<OwnerId, std::vector<const CompileLatch*>> waiting_ FTJIT_GUARDED_BY(mu_);
};

}  // namespace ftjit
