// ftjit: asymmetric fences for the hit path's read sections and in-flight
// counts (EpochDomain, EntryStore): the common side (every hit) pays a
// compiler barrier, the rare side (a reclaim, an entry's last reference,
// a call that finds its entry unlinked) pays membarrier(2).
//
// The hit path's orderings are each a store followed by a load, on both
// sides (a Dekker pair: the reader announces its epoch and then loads the
// snapshot; the reclaimer unlinks and then reads the announcements). A
// seq_cst store or fence on each side makes one of them see the other, but
// costs a store-buffer drain (x86: xchg or mfence, tens of cycles) on every
// hit. Linux's MEMBARRIER_CMD_PRIVATE_EXPEDITED makes every running thread
// of the process execute a full barrier before it returns (and a thread
// not running passes one when it is switched in): a reader's program order
// is split at one instruction, and the writer's stores before the call are
// visible to the reader's loads after the split, the reader's stores before
// it to the writer's loads after the call. So a reader's store, a compiler
// barrier (Light) and its load pair with a writer's store, Heavy and its
// load exactly as two seq_cst fences would (the scheme of liburcu's
// membarrier flavour and of folly's asymmetric barriers).
//
//   | asymmetric_ | a relaxed atomic: set at module init before any reader |
//   |             | exists, and in a forked child's only thread            |
//
// Symmetric (seq_cst on both sides, Light and Heavy plain seq_cst fences)
// where membarrier cannot be registered, where FTJIT_FENCES=symmetric asks
// for it, and in ThreadSanitizer builds (TSAN models atomics and fences but
// not membarrier: there the protocol it checks is the symmetric one).
//
// Lock order: takes no lock. Heavy is a system call of a few microseconds;
// it is never on a hit's path.
#pragma once

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <atomic>
#include <cstdlib>

#if defined(__SANITIZE_THREAD__)
#define FTJIT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FTJIT_TSAN 1
#endif
#endif

namespace ftjit {

class Fences {
 public:
  // Whether readers' fences are light now.
  static bool Asymmetric() { return asymmetric_.load(std::memory_order_relaxed); }

  // Chooses the mode: asymmetric if `want` and membarrier registers. Only
  // where no read section can be open: at module init, before any reader,
  // or in a forked child's only thread (read sections never span a fork).
  static bool Init(bool want) {
    bool on = false;
#if defined(__linux__) && !defined(FTJIT_TSAN) && defined(__NR_membarrier)
    if (want) {
      long cmds = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
      on = cmds >= 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
           syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    }
#else
    (void)want;
#endif
    asymmetric_.store(on, std::memory_order_relaxed);
    return on;
  }

  // The reader's side, after its store and before its load.
  static void Light() {
    if (Asymmetric()) {
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
  }

  // The writer's side, after its store and before its load: every thread's
  // Light before it is ordered before the loads after it.
  static void Heavy() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
#if defined(__linux__) && !defined(FTJIT_TSAN) && defined(__NR_membarrier)
    if (Asymmetric() && syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
      // Registered at Init: this cannot fail. Readers' fences are light,
      // so no order would hold past this point.
      std::abort();
    }
#endif
  }

 private:
  static inline std::atomic<bool> asymmetric_{false};
};

}  // namespace ftjit
