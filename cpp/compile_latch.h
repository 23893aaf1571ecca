// ftjit: compile-once coordination. One latch per cache entry: the thread
// that inserted the entry owns it and compiles; others wait on the latch. A
// process-wide wait-for graph turns would-be deadlocks into errors.
//
// CompileLatch members and their protection:
//
//   | member  | protection                                                 |
//   |---------|------------------------------------------------------------|
//   | owner_  | fixed after construction                                   |
//   | state_  | atomic; written once by the owner (release), under mu_     |
//   | mu_/cv_ | mu_ only pairs with cv_; held for a few instructions       |
//
// Memory ordering: whatever the owner wrote before Publish() (the compiled
// executable, or the error) is visible to any thread that then observes a
// non-kCompiling state (acquire load), with or without waiting.
//
// Lock order: a latch's mu_ and the graph's mu_ are leaves; neither is held
// while acquiring any other lock, the GIL included. Waiting is done in
// slices so that a caller can drop the GIL around each slice and check for
// signals between them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace ftjit {

using ThreadId = std::thread::id;

// Incremented in a forked child (AfterForkInChild): latches made before it
// belong to the parent, whose other threads do not exist in the child.
inline std::atomic<uint64_t> g_fork_generation{0};

class CompileLatch {
 public:
  // kAbandoned: the compile was interrupted (not failed) and its entry
  // dropped; a waiter looks the signature up again and may compile it.
  enum class State : uint8_t { kCompiling, kReady, kFailed, kAbandoned };

  explicit CompileLatch(ThreadId owner)
      : owner_(owner), generation_(g_fork_generation.load(std::memory_order_relaxed)) {}
  CompileLatch(const CompileLatch&) = delete;
  CompileLatch& operator=(const CompileLatch&) = delete;

  ThreadId owner() const { return owner_; }
  State state() const { return state_.load(std::memory_order_acquire); }
  bool compiling() const { return state() == State::kCompiling; }
  // Still compiling, but by a thread of the process this one was forked
  // from (not the forking thread, which lives on here): nobody will ever
  // publish it. The caller must neither wait on it nor touch its mutex or
  // condition variable (a thread that no longer exists may hold them).
  bool OrphanedByFork() const {
    return compiling() && generation_ != g_fork_generation.load(std::memory_order_relaxed) &&
           owner_ != std::this_thread::get_id();
  }

  // Owner only, once: moves to kReady, kFailed or kAbandoned and wakes
  // every waiter.
  void Publish(State final_state) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      state_.store(final_state, std::memory_order_release);
    }
    cv_.notify_all();
  }

  // Blocks for at most `slice` while compiling; returns the state seen last.
  template <class Rep, class Period>
  State WaitFor(std::chrono::duration<Rep, Period> slice) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, slice, [this] { return !compiling(); });
    return state();
  }

 private:
  const ThreadId owner_;
  const uint64_t generation_;  // g_fork_generation when made
  std::atomic<State> state_{State::kCompiling};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Who waits on which latch, process-wide. Before a thread blocks on a latch
// it follows owner -> latch that owner waits on -> its owner ...; reaching
// itself means the wait could never end, so BeginWait refuses. Checking and
// registering happen under one lock, so of two threads about to wait on each
// other the second always sees the first.
//
// Waits nest: Python code run while a thread waits (a signal handler, a GC
// callback run by the wait's signal check) may itself call a jitted function
// and wait on another latch. Each thread therefore has a stack of latches;
// the innermost is what it is blocked on now and the edge the walk follows.
// While an inner wait hides an outer one, a cycle through the outer edge can
// close without anyone's BeginWait seeing it; so a waiter re-checks with
// StillSafe() between the slices of its wait, and the first to see a cycle
// leaves it (under the lock: exactly one thread of the cycle is refused).
//
// A registered latch stays alive while registered: the waiter holds a strong
// reference to it for the whole wait and calls EndWait before dropping it.
class WaitForGraph {
 public:
  // Registers `self` as waiting on `latch` (innermost) and returns true, or
  // returns false (registering nothing) when waiting would close a cycle of
  // compiles.
  bool BeginWait(ThreadId self, const CompileLatch* latch) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ClosesCycleLocked(self, latch)) return false;
    waiting_[self].push_back(latch);
    return true;
  }

  // Ends the innermost wait of `self` (the outer one, if any, is what it
  // waits on again). Harmless when `self` is not waiting.
  void EndWait(ThreadId self) {
    std::lock_guard<std::mutex> lock(mu_);
    PopLocked(self);
  }

  // For a registered waiter, between slices: true while its innermost wait
  // still cannot deadlock. When a cycle has closed through it, ends that wait
  // (as EndWait does, so the caller must not call EndWait for it again) and
  // returns false.
  bool StillSafe(ThreadId self) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = waiting_.find(self);
    if (it == waiting_.end()) return true;
    if (!ClosesCycleLocked(self, it->second.back())) return true;
    PopLocked(self);
    return false;
  }

  // For tests and diagnostics: how many threads are registered as waiting.
  size_t waiting() const {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_.size();
  }

 private:
  // Whether following latch -> owner -> its innermost latch -> ... reaches
  // `self`. Each thread has one innermost latch, so the walk ends within
  // waiting_.size() + 1 steps.
  bool ClosesCycleLocked(ThreadId self, const CompileLatch* latch) const {
    const CompileLatch* cur = latch;
    for (size_t steps = 0; steps <= waiting_.size(); ++steps) {
      if (!cur->compiling()) return false;  // that edge resolves by itself
      ThreadId owner = cur->owner();
      if (owner == self) return true;
      auto it = waiting_.find(owner);
      if (it == waiting_.end()) return false;
      cur = it->second.back();
    }
    return false;
  }

  void PopLocked(ThreadId self) {
    auto it = waiting_.find(self);
    if (it == waiting_.end()) return;
    it->second.pop_back();
    if (it->second.empty()) waiting_.erase(it);
  }

  mutable std::mutex mu_;  // leaf lock
  // Per waiting thread, its nested waits, innermost last; never empty.
  std::unordered_map<ThreadId, std::vector<const CompileLatch*>> waiting_;  // guarded by mu_
};

}  // namespace ftjit
