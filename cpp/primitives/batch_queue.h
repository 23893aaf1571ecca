// ftjit: the queue that merges concurrent calls of one signature into
// batches (ftjit.batched), Python-free and templated over its lock
// (LeafMutex in the extension, StdMutex in cpp/tests/test_batch_queue.cc).
//
// A call joins its queue (Join). One that finds nothing forming and nothing
// running goes alone. Any other waits, pending; the first pending call
// leads: it takes a batch of the pending calls (TryTake: when max_batch of
// them wait, when no batch runs, or once it waited max_wait and fewer than
// max_running batches run), runs it unlocked, and hands each member its
// outcome (Finish): kDone (its row of the batch's output) or kRetry (the
// batch failed: it runs alone, so that an error stays with its example).
// While a batch runs, the next forms under the next leader (the first
// pending call, promoted as the batch is taken).
//
// Running slots: each batch or lone call that runs holds one, tagged with
// the time it started (the caller's clock, in ns). One that has run
// `stall` or longer (an example that never finishes, say) no longer counts
// against max_running, nor as "a batch runs": so a batch that never ends
// holds only its own callers, and the next batch starts beside it. A leader interrupted
// while its batch ran puts the others back in front (Requeue). A waiter
// that stops waiting (a timeout, an interrupt) leaves (GiveUp): a pending
// one is taken out and, if it led, the lead passes on; a taken one is
// marked kGone and its row is dropped.
//
// Invariants, under mu_: !leading_ implies pending_ is empty; leading_
// implies pending_.front() is the leader (state kLead). A waiter's state
// goes kPending -> kLead -> kTaken -> kDone | kRetry (kPending -> kTaken
// for the others), or to kGone from any of the first three; Requeue turns
// kTaken back to kPending.
//
// Waking. Each waiter sleeps on its own state word (a futex on Linux),
// which only the thread that decides its fate changes, under mu_ (release;
// the owner reads it with acquire); the leader collecting sleeps on the
// queue's changed_ word, bumped when a batch may start (max_batch pending,
// a running batch or alone call ended). Nobody sleeps holding mu_, and
// wakes happen after unlocking, so one wake per sleeping waiter is a
// system call on the waker's thread and the woken threads run in
// parallel; a word nobody sleeps on is woken with no system call
// (SleepWord).
//
// Fork: every sleeper sleeps on a word, holding no lock, so no lock of the
// parent's waiters is left held in a child. A queue made before the latest
// fork is closed in the child (Join answers kClosed without touching mu_,
// which a parent thread may hold): its waiters do not exist there.
//
// Memory: waiters are shared (shared_ptr) by the queue's lists and their
// owner, so one that leaves while its batch runs is still there when the
// leader hands out outcomes. Nothing is freed under mu_ that runs code: the
// lists hold shared_ptrs whose last release is the owner's or the leader's,
// after unlocking (W's destructor may run Python code in the extension).
//
//   | member                         | protection                           |
//   |--------------------------------|--------------------------------------|
//   | pending_, leading_, started_,  | FTJIT_GUARDED_BY(mu_)                |
//   |   closed_                      |                                      |
//   | changed_                       | atomic word (a SleepWord); bumped    |
//   |                                | under mu_                            |
//   | max_batch_, max_running_,      | fixed at construction                |
//   |   generation_                  |                                      |
//   | BatchWaiter::state             | atomic; written under mu_ (release), |
//   |                                | read by its owner (acquire)          |
//   | BatchWaiter::index             | written by its leader before the     |
//   |                                | state that publishes it              |
//
// Lock order: mu_ is a leaf.
#pragma once

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "primitives/compile_latch.h"  // detail::WaitOnWord, WakeAllOnWord, g_fork_generation
#include "primitives/locks.h"
#include "primitives/thread_annotations.h"

namespace ftjit {

// A waiter's state word (see BatchQueue).
enum BatchState : uint32_t { kPending, kLead, kTaken, kDone, kRetry, kGone };

// A word threads sleep on, with the count of its sleepers, so that a wake
// with none asleep (the common case: a lone call's end) is no system call
// (one costs microseconds under a sandbox's kernel, gVisor's). Dekker's
// pattern: a sleeper counts itself, then the kernel compares the word; a
// waker changes the word, then reads the count; the fences order both, so
// either the waker sees the sleeper or the sleeper sees the new word.
class SleepWord {
 public:
  std::atomic<uint32_t> word{0};

  // Sleeps while the word is `seen`, for at most `timeout`; may wake early.
  void Wait(uint32_t seen, std::chrono::nanoseconds timeout) {
    sleepers_.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    detail::WaitOnWord(&word, seen, timeout);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }
  // After the word changed: wakes its sleepers, if any.
  void Wake() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_relaxed) != 0) detail::WakeAllOnWord(&word);
  }

 private:
  std::atomic<uint32_t> sleepers_{0};
};

struct BatchWaiter {
  SleepWord state{};  // a BatchState
  size_t index = 0;   // its row in its batch (the leader's is 0)

  BatchWaiter() { state.word.store(kPending, std::memory_order_relaxed); }
  uint32_t Load() const { return state.word.load(std::memory_order_acquire); }
  // Sleeps while the state is `seen`, for at most `timeout`; may wake early.
  void Wait(uint32_t seen, std::chrono::nanoseconds timeout) { state.Wait(seen, timeout); }
  void Wake() { state.Wake(); }
};

// W derives from BatchWaiter (the extension adds the call's arguments and
// its outcome); the queue holds shared_ptr<W>.
template <class Mutex, class W>
class BatchQueue {
 public:
  using WaiterPtr = std::shared_ptr<W>;
  enum class Role { kAlone, kLead, kFollow, kClosed };

  BatchQueue(size_t max_batch, size_t max_running)
      : max_batch_(std::max<size_t>(1, max_batch)),
        max_running_(std::max<size_t>(1, max_running)),
        generation_(g_fork_generation.load(std::memory_order_relaxed)) {}
  BatchQueue(const BatchQueue&) = delete;
  BatchQueue& operator=(const BatchQueue&) = delete;

  // A new call: kAlone (run it now; Finish(nullptr) when it ends), kLead
  // (w leads: TryTake), kFollow (w waits on its state word), or kClosed
  // (this queue is closed, or a parent's: use another).
  // `now`: the time a kAlone call starts running (see Running slots).
  Role Join(const WaiterPtr& w, uint64_t now = 0) FTJIT_EXCLUDES(mu_) {
    if (generation_ != g_fork_generation.load(std::memory_order_relaxed)) return Role::kClosed;
    {
      LockGuard<Mutex> lock(mu_);
      if (closed_) return Role::kClosed;
      if (started_.empty() && !leading_) {
        started_.push_back(now);
        return Role::kAlone;
      }
      w->state.word.store(kPending, std::memory_order_relaxed);
      pending_.push_back(w);
      if (!leading_) {
        leading_ = true;
        w->state.word.store(kLead, std::memory_order_relaxed);  // its own thread: no wake
        return Role::kLead;
      }
      if (pending_.size() != max_batch_) return Role::kFollow;
      BumpLockHeld();
    }
    WakeChanged();
    return Role::kFollow;
  }

  // The leader `w`: starts its batch when it may (`waited`: it waited
  // max_wait already; `now`, `stall`: see Running slots), moving the
  // members (w first) into `batch` and promoting the next leader, whom the
  // caller wakes (`*next`, or null). Else false, with `*seen` the changed_
  // word to sleep on and `*stale_at` (when given) the time the oldest
  // running slot stops counting (UINT64_MAX: none will).
  bool TryTake(const W* w, bool waited, std::vector<WaiterPtr>* batch, WaiterPtr* next, uint32_t* seen,
               uint64_t now = 0, uint64_t stall = UINT64_MAX, uint64_t* stale_at = nullptr) FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    *seen = changed_.word.load(std::memory_order_relaxed);
    size_t running = 0;
    uint64_t oldest = UINT64_MAX;
    for (uint64_t s : started_) {
      if (now - s < stall || now < s) {
        ++running;
        oldest = std::min(oldest, s);
      }
    }
    if (!(pending_.size() >= max_batch_ || running == 0 || (waited && running < max_running_))) {
      if (stale_at) *stale_at = oldest == UINT64_MAX || stall == UINT64_MAX ? UINT64_MAX : oldest + stall;
      return false;
    }
    assert(!pending_.empty() && pending_.front().get() == w && "the leader is the first pending call");
    (void)w;
    size_t n = std::min(max_batch_, pending_.size());
    batch->clear();
    for (size_t i = 0; i < n; ++i) {
      pending_.front()->state.word.store(kTaken, std::memory_order_relaxed);  // no wake: still waiting
      pending_.front()->index = i;
      batch->push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
    started_.push_back(now);
    *next = PromoteLockHeld();
    return true;
  }

  // Sleeps while changed_ is `seen` (the leader collecting).
  void WaitChanged(uint32_t seen, std::chrono::nanoseconds timeout) { changed_.Wait(seen, timeout); }

  // A lone call (batch null) or batch ended; `started`: when it started
  // (as Join or TryTake was given it). Each member but the leader still
  // taken gets `outcome` (kDone or kRetry) and is added to `wake`, for the
  // caller to wake after this returns. True when the queue is now idle,
  // and closed.
  bool Finish(const std::vector<WaiterPtr>* batch, const W* leader, uint32_t outcome, std::vector<WaiterPtr>* wake,
              uint64_t started = 0) FTJIT_EXCLUDES(mu_) {
    bool closed;
    {
      LockGuard<Mutex> lock(mu_);
      if (batch) {
        for (const WaiterPtr& m : *batch) {
          if (m.get() == leader || m->state.word.load(std::memory_order_relaxed) != kTaken) continue;
          m->state.word.store(outcome, std::memory_order_release);
          wake->push_back(m);
        }
      }
      EndRunLockHeld(started);
      BumpLockHeld();
      closed = CloseIfIdleLockHeld();
    }
    WakeChanged();
    return closed;
  }

  // The leader was interrupted while its batch ran: the other members go
  // back in front of the pending calls (after a leader collecting, if
  // any; else the first of them leads, added to `wake`). True when idle.
  bool Requeue(const std::vector<WaiterPtr>& batch, const W* leader, std::vector<WaiterPtr>* wake,
               uint64_t started = 0) FTJIT_EXCLUDES(mu_) {
    bool closed;
    {
      LockGuard<Mutex> lock(mu_);
      auto at = leading_ ? pending_.begin() + 1 : pending_.begin();
      for (const WaiterPtr& m : batch) {
        if (m.get() == leader || m->state.word.load(std::memory_order_relaxed) != kTaken) continue;
        m->state.word.store(kPending, std::memory_order_relaxed);
        at = pending_.insert(at, m) + 1;
      }
      if (!leading_ && !pending_.empty()) {
        leading_ = true;
        pending_.front()->state.word.store(kLead, std::memory_order_release);
        wake->push_back(pending_.front());
      }
      EndRunLockHeld(started);
      BumpLockHeld();
      closed = CloseIfIdleLockHeld();
    }
    WakeChanged();
    return closed;
  }

  // `w` stops waiting (a timeout, an interrupt). A pending one leaves the
  // queue (a leader hands the lead on: `*next`, to wake); a taken one is
  // marked kGone. Returns the state it had: kDone, kRetry (and, when
  // `lead_too` is false, kLead) mean its fate was decided and nothing
  // changed. `*closed`: the queue is now idle, and closed.
  // The caller holds `w` (a shared_ptr of its own), so the queue's
  // reference, dropped here, is never the last.
  uint32_t GiveUp(W* w, bool lead_too, WaiterPtr* next, bool* closed) FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    uint32_t s = w->state.word.load(std::memory_order_relaxed);
    *closed = false;
    if (s == kTaken) {
      w->state.word.store(kGone, std::memory_order_relaxed);
    } else if (s == kPending || (s == kLead && lead_too)) {
      auto it = std::find_if(pending_.begin(), pending_.end(), [w](const WaiterPtr& p) { return p.get() == w; });
      pending_.erase(it);
      w->state.word.store(kGone, std::memory_order_relaxed);
      if (s == kLead) *next = PromoteLockHeld();
      *closed = CloseIfIdleLockHeld();
    }
    return s;
  }

  size_t max_batch() const { return max_batch_; }

  // Tests only: (pending, leading, running, closed), read under mu_.
  struct Snapshot {
    size_t pending;
    bool leading;
    size_t running;
    bool closed;
  };
  Snapshot SnapshotForTest() FTJIT_EXCLUDES(mu_) {
    LockGuard<Mutex> lock(mu_);
    return {pending_.size(), leading_, started_.size(), closed_};
  }

 private:
  // The first pending call leads next (returned, to be woken), or none
  // does (null: the lead lapses).
  WaiterPtr PromoteLockHeld() FTJIT_REQUIRES(mu_) {
    mu_.AssertHeld();
    if (pending_.empty()) {
      leading_ = false;
      return nullptr;
    }
    pending_.front()->state.word.store(kLead, std::memory_order_release);
    return pending_.front();
  }

  // A batch may start: the word a leader collecting sleeps on changes
  // (WakeChanged, after unlocking, wakes it).
  void BumpLockHeld() FTJIT_REQUIRES(mu_) {
    mu_.AssertHeld();
    changed_.word.fetch_add(1, std::memory_order_release);
  }
  void WakeChanged() { changed_.Wake(); }

  bool CloseIfIdleLockHeld() FTJIT_REQUIRES(mu_) {
    mu_.AssertHeld();
    if (pending_.empty() && !leading_ && started_.empty()) closed_ = true;
    return closed_;
  }

  // A run that started at `started` ends: its slot goes.
  void EndRunLockHeld(uint64_t started) FTJIT_REQUIRES(mu_) {
    mu_.AssertHeld();
    auto it = std::find(started_.begin(), started_.end(), started);
    assert(it != started_.end() && "a run ends that never started");
    if (it != started_.end()) started_.erase(it);
  }

  const size_t max_batch_;
  const size_t max_running_;
  const uint64_t generation_;
  Mutex mu_;
  std::deque<WaiterPtr> pending_ FTJIT_GUARDED_BY(mu_);
  bool leading_ FTJIT_GUARDED_BY(mu_) = false;
  // Each running batch's or lone call's start (see Running slots): at most
  // max_running fresh ones, and the stale ones of examples that never end.
  std::vector<uint64_t> started_ FTJIT_GUARDED_BY(mu_);
  bool closed_ FTJIT_GUARDED_BY(mu_) = false;
  SleepWord changed_;
};

}  // namespace ftjit
