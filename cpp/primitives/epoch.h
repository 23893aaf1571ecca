// ftjit: epoch-based reclamation (EBR) for the lock-free read path: a reader
// announces itself for the few instructions it looks at shared snapshots; a
// writer that unlinks a snapshot retires it, and it is freed once no reader
// can still see it, without waiting for a later write. Python-free; the lock
// type is a template parameter (StdMutex in the C++ tests, LeafMutex in the
// extension).
//
//   | member                 | protection                                     |
//   |------------------------|------------------------------------------------|
//   | EpochDomain::epoch_    | atomic; advanced (seq_cst) by every retirement |
//   | EpochDomain::pending_  | atomic (seq_cst): retirements not yet freed    |
//   |                        | (in retired_ or deferred_)                     |
//   | EpochDomain::records_  | atomic list head; records are pushed (seq_cst),|
//   |                        | never removed or freed (released ones reused)  |
//   | Record::epoch          | atomic; written only by the thread holding the |
//   |                        | record (0 = not reading), read by reclaimers   |
//   | Record::since          | the holding thread's own (plain)               |
//   | Record::owned          | atomic; claimed by CAS, released at thread exit|
//   | EpochDomain::retired_  | FTJIT_GUARDED_BY(mu_)                          |
//   | EpochDomain::deferred_ | atomic stack head (lock-free push, see Retire) |
//   | EpochDomain::can_free_ | fixed after construction                       |
//
// Lock order: mu_ is a leaf: Retire and Reclaim hold it only to move
// pointers into or out of retired_ (and to read the records), never while a
// deleter runs, and take no other lock under it.
//
// Memory ordering (the argument; every access named here is seq_cst):
//   Reader:  (a) e = epoch_;  (b) record.epoch = e;  (c) p = snapshot pointer;
//            ... reads *p ...;  (d) record.epoch = 0  (release suffices).
//   Writer:  (1) snapshot pointer = p' (unlinks p);  (2) t = epoch_++ (Retire);
//   Reclaim: (3) for each record: r = record.epoch; p (tagged t) is freed only
//            if every r is 0 or > t.
//   If a reader loaded the old p at (c), then (c) precedes (1) in the single
//   total order of seq_cst operations, so (a) < (b) < (c) < (1) < (2) and its
//   e <= t. A reclaim after (2) then reads r == e <= t (still reading: p is
//   kept) or 0 (finished: the release store (d), read by (3), orders all its
//   reads of p before the free). A record read as r > t belongs to a read
//   section that began with (a) after (2), hence after (1): it sees p'.
//   Retire advances the epoch itself, so readers that start later announce
//   epochs above every tag retired before them and never hold reclaim back.
//
// Nothing waits for a later write: a reclaim that keeps p for a reader is
// retried by that reader in LeaveRead. The reclaim read the reader's record
// as e after the retirement counted pending_ and advanced epoch_, and before
// the reader's next seq_cst store to it (or it would have read that store),
// so the reader's loads after that store see pending_ > 0 and epoch_ > e.
// A reader whose sections all began after the last retirement (epoch_ not
// past Record::since) skips it: a stalled reader costs the others one retry.
//
// ThreadSanitizer cannot check this: it treats every release store as a full
// fence, so it never sees a store reordered after a later load (as x86 store
// buffers do). (b), LeaveRead's store of 0, FreeHeldBack's fence, Acquire's
// record push and OldestReaderEpoch's loads are each one half of a
// store-then-load pair: do not relax them from seq_cst, whatever TSAN says.
//
// A read section never blocks, calls out or nests. What a reader uses after
// it must be kept alive by other means (EntryStore's in-flight counts).
//
// Deleters run on the calling thread with mu_ released: they may run
// arbitrary code (drop Python objects). A thread for which can_free_() is
// false (in the extension: no Python thread state, unwound at interpreter
// shutdown) never runs them: Retire pushes the pointer on deferred_,
// lock-free (on GIL builds mu_ is no lock without the GIL), and a later
// reclaim on a thread that may free tags and frees it.
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include "primitives/locks.h"
#include "primitives/thread_annotations.h"

namespace ftjit {

template <class Mutex>
class EpochDomain {
 public:
  struct alignas(64) Record {
    std::atomic<uint64_t> epoch{0};
    uint64_t since = 0;  // first epoch announced since the last LeaveRead (0: none)
    std::atomic<bool> owned{true};
    Record* next = nullptr;  // fixed once pushed
  };

  using Deleter = void (*)(void*);

  // `can_free`, if given, says whether the calling thread may run deleters
  // now; it must be Python-free and cheap.
  explicit EpochDomain(bool (*can_free)() = nullptr) : can_free_(can_free) {}
  EpochDomain(const EpochDomain&) = delete;
  EpochDomain& operator=(const EpochDomain&) = delete;
  ~EpochDomain() {
    // Only for domains whose threads are all gone (the C++ tests).
    for (Retired& r : retired_) r.deleter(r.ptr);
    for (Deferred* d = deferred_.exchange(nullptr); d;) {
      Deferred* next = d->next;
      d->deleter(d->ptr);
      delete d;
      d = next;
    }
    Record* rec = records_.load();
    while (rec) {
      Record* next = rec->next;
      delete rec;
      rec = next;
    }
  }

  // A record for a thread (a released one if any), which it keeps for its
  // life and gives back with Release() at exit (ThreadSlot does both).
  Record* Acquire() {
    for (Record* r = records_.load(std::memory_order_seq_cst); r; r = r->next) {
      bool expected = false;
      if (!r->owned.load(std::memory_order_relaxed) &&
          r->owned.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
        return r;
      }
    }
    Record* r = new Record();
    Record* head = records_.load(std::memory_order_relaxed);
    do {
      r->next = head;
    } while (!records_.compare_exchange_weak(head, r, std::memory_order_seq_cst,
                                            std::memory_order_relaxed));
    return r;
  }
  static void Release(Record* r) {
    r->since = 0;
    r->epoch.store(0, std::memory_order_release);
    r->owned.store(false, std::memory_order_release);
  }

  // Pointers loaded from shared snapshots after this (seq_cst or acquire
  // loads) stay valid until the section ends (ExitRead or LeaveRead).
  void EnterRead(Record* r) {
    assert(r->epoch.load(std::memory_order_relaxed) == 0 && "read sections do not nest");
    uint64_t e = epoch_.load(std::memory_order_seq_cst);
    r->epoch.store(e, std::memory_order_seq_cst);
    if (r->since == 0) r->since = e;
  }
  // Ends a read section; the thread's next LeaveRead frees what it held back.
  static void ExitRead(Record* r) { r->epoch.store(0, std::memory_order_release); }
  // Ends a read section and frees what it, or the ExitRead sections since
  // the last LeaveRead, held back. May run deleters.
  void LeaveRead(Record* r) {
    r->epoch.store(0, std::memory_order_seq_cst);
    FreeHeldBack(r);
  }
  // LeaveRead's freeing, for a thread with no section left to end (a probe
  // that missed). The seq_cst fence stands in for LeaveRead's seq_cst store:
  // it orders the earlier ExitRead stores before the loads below.
  void FreeHeldBack(Record* r) {
    uint64_t since = r->since;
    r->since = 0;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (pending_.load(std::memory_order_seq_cst) != 0 &&
        epoch_.load(std::memory_order_seq_cst) > since) {
      Reclaim();
    }
  }

  // `p`, already unlinked from every snapshot (by a seq_cst store), is freed
  // by deleter(p) once no reader can still see it; frees whatever else has
  // become safe meanwhile. Not inside a read section.
  void Retire(void* p, Deleter deleter) FTJIT_EXCLUDES(mu_) {
    if (!CanFree()) {
      // The tag comes when a reclaim moves it to retired_: later than the
      // unlink, which only keeps it longer.
      Deferred* d = new Deferred{p, deleter, deferred_.load(std::memory_order_relaxed)};
      pending_.fetch_add(1, std::memory_order_seq_cst);
      while (!deferred_.compare_exchange_weak(d->next, d, std::memory_order_seq_cst,
                                              std::memory_order_relaxed)) {
      }
      epoch_.fetch_add(1, std::memory_order_seq_cst);  // readers leaving now must retry
      return;
    }
    {
      LockGuard<Mutex> lock(mu_);
      pending_.fetch_add(1, std::memory_order_seq_cst);
      uint64_t tag = epoch_.fetch_add(1, std::memory_order_seq_cst);
      retired_.push_back(Retired{tag, p, deleter});
    }
    Reclaim();
  }

  // Frees every retired pointer no reader can still see; returns how many
  // are still waiting.
  size_t Reclaim() FTJIT_EXCLUDES(mu_) {
    if (!CanFree()) return pending_.load(std::memory_order_seq_cst);
    std::vector<Retired> ready;
    size_t waiting;
    {
      LockGuard<Mutex> lock(mu_);
      TagDeferredLockHeld();
      if (retired_.empty()) return 0;
      uint64_t oldest = OldestReaderEpoch();
      auto keep = retired_.begin();
      for (auto it = retired_.begin(); it != retired_.end(); ++it) {
        if (it->tag < oldest) {
          ready.push_back(*it);
        } else {
          *keep++ = *it;
        }
      }
      retired_.erase(keep, retired_.end());
      waiting = retired_.size();
      pending_.fetch_sub(ready.size(), std::memory_order_seq_cst);
    }
    for (Retired& r : ready) r.deleter(r.ptr);
    return waiting;
  }

  size_t retired_count() const { return pending_.load(std::memory_order_seq_cst); }

  // In a forked child's only thread, before any use. The records of the
  // parent's other threads are held by nobody (no read section is open at
  // fork: they are Python-free, and fork runs Python), and their epochs
  // would hold every reclaim back: they are released. `mine` (or null) stays.
  void AfterForkInChild(Record* mine) {
    ReinitInChild(mu_);
    for (Record* r = records_.load(std::memory_order_relaxed); r; r = r->next) {
      if (r != mine) Release(r);
    }
  }

  // Tests: every record ever made (held or free for reuse).
  size_t records() const {
    size_t n = 0;
    for (Record* r = records_.load(std::memory_order_seq_cst); r; r = r->next) ++n;
    return n;
  }
  // Tests: the records held now.
  size_t owned_records() const {
    size_t n = 0;
    for (Record* r = records_.load(std::memory_order_seq_cst); r; r = r->next) {
      n += r->owned.load(std::memory_order_acquire) ? 1 : 0;
    }
    return n;
  }

 private:
  struct Retired {
    uint64_t tag;  // epoch_ before the Retire's advance
    void* ptr;
    Deleter deleter;
  };
  struct Deferred {
    void* ptr;
    Deleter deleter;
    Deferred* next;
  };

  bool CanFree() const { return can_free_ == nullptr || can_free_(); }

  // Moves deferred_ into retired_, each with a fresh tag.
  void TagDeferredLockHeld() FTJIT_REQUIRES(mu_) {
    mu_.AssertHeld();
    Deferred* d = deferred_.exchange(nullptr, std::memory_order_seq_cst);
    while (d) {
      Deferred* next = d->next;
      retired_.push_back(Retired{epoch_.fetch_add(1, std::memory_order_seq_cst), d->ptr, d->deleter});
      delete d;
      d = next;
    }
  }

  // A pointer retired with tag t is safe when t < this (UINT64_MAX: no reader).
  uint64_t OldestReaderEpoch() const {
    uint64_t oldest = UINT64_MAX;
    for (Record* r = records_.load(std::memory_order_seq_cst); r; r = r->next) {
      uint64_t e = r->epoch.load(std::memory_order_seq_cst);
      if (e != 0 && e < oldest) oldest = e;
    }
    return oldest;
  }

  // Starts at 1: a record's 0 means "not reading". pending_ shares its line
  // (LeaveRead reads both).
  alignas(64) std::atomic<uint64_t> epoch_{1};
  std::atomic<size_t> pending_{0};
  std::atomic<Record*> records_{nullptr};
  std::atomic<Deferred*> deferred_{nullptr};
  bool (*const can_free_)();
  mutable Mutex mu_;  // leaf lock: guards retired_ only
  std::vector<Retired> retired_ FTJIT_GUARDED_BY(mu_);
};

}  // namespace ftjit
