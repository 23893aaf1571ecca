// ftjit: epoch-based reclamation (EBR) for the lock-free read path: a reader
// announces itself for the few instructions it looks at shared snapshots;
// a writer that unlinks a snapshot retires it, and it is freed only once no
// reader can still be looking at it.
//
// Python-free and header-only; the lock type is a template parameter
// (std::mutex in the C++ tests, LeafMutex in the extension).
//
// Members and their protection:
//
//   | member                 | protection                                     |
//   |------------------------|------------------------------------------------|
//   | EpochDomain::epoch_    | atomic; advanced (seq_cst) by every Retire     |
//   | EpochDomain::records_  | atomic list head; records are pushed, never    |
//   |                        | removed or freed (a thread's is reused later)  |
//   | Record::epoch          | atomic; written only by the thread holding the |
//   |                        | record (0 = not reading), read by reclaimers   |
//   | Record::owned          | atomic; claimed by CAS, released at thread exit |
//   | EpochDomain::retired_  | guarded by mu_                                 |
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
// A read section is a handful of Python-free instructions: it never blocks,
// never calls out and never nests (EnterRead asserts it), so a reclaim
// almost always finds every record at 0 and frees at once. What a reader
// still uses after leaving its section must be kept alive by other means
// (function_cache.h: a per-thread in-flight count on the entry).
//
// Frees run in Reclaim() (and Retire, which calls it), in the calling thread,
// after mu_ is released: the deleter may run arbitrary code (in the extension
// it drops Python objects, so callers reclaim on an attached thread).
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace ftjit {

template <class Mutex>
class EpochDomain {
 public:
  // One per thread that has read through this domain; see the table above.
  struct alignas(64) Record {
    std::atomic<uint64_t> epoch{0};
    std::atomic<bool> owned{true};
    Record* next = nullptr;  // fixed once pushed
  };

  // A deleter for Retire: called once, with the pointer, when it is safe.
  using Deleter = void (*)(void*);

  EpochDomain() = default;
  EpochDomain(const EpochDomain&) = delete;
  EpochDomain& operator=(const EpochDomain&) = delete;
  ~EpochDomain() {
    // Only for domains whose threads are all gone (the C++ tests); the
    // extension's domain lives as long as the process.
    for (Retired& r : retired_) r.deleter(r.ptr);
    Record* rec = records_.load();
    while (rec) {
      Record* next = rec->next;
      delete rec;
      rec = next;
    }
  }

  // A record for a thread: a released one if any, else a new one. The
  // caller keeps it for the thread's life and calls Release() at exit.
  Record* Acquire() {
    for (Record* r = records_.load(std::memory_order_acquire); r; r = r->next) {
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
    } while (!records_.compare_exchange_weak(head, r, std::memory_order_release,
                                            std::memory_order_relaxed));
    return r;
  }
  static void Release(Record* r) {
    r->epoch.store(0, std::memory_order_release);
    r->owned.store(false, std::memory_order_release);
  }

  // Starts a read section on `r` (not nested). Pointers loaded from shared
  // snapshots after this (seq_cst or acquire loads) stay valid until
  // ExitRead.
  void EnterRead(Record* r) {
    assert(r->epoch.load(std::memory_order_relaxed) == 0 && "read sections do not nest");
    r->epoch.store(epoch_.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
  }
  static void ExitRead(Record* r) { r->epoch.store(0, std::memory_order_release); }

  // `p`, already unlinked from every snapshot readers can load from now on
  // (by a seq_cst store), is freed by deleter(p) once no reader can still
  // see it; frees whatever else has become safe meanwhile. Must not be
  // called inside a read section. Calls deleters (arbitrary code) with no
  // lock held.
  void Retire(void* p, Deleter deleter) {
    {
      std::lock_guard<Mutex> lock(mu_);
      uint64_t tag = epoch_.fetch_add(1, std::memory_order_seq_cst);
      retired_.push_back(Retired{tag, p, deleter});
    }
    Reclaim();
  }

  // Frees every retired pointer no reader can still see. Returns how many
  // are still waiting.
  size_t Reclaim() {
    std::vector<Retired> ready;
    size_t waiting;
    {
      std::lock_guard<Mutex> lock(mu_);
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
    }
    for (Retired& r : ready) r.deleter(r.ptr);
    return waiting;
  }

  size_t retired_count() const {
    std::lock_guard<Mutex> lock(mu_);
    return retired_.size();
  }

  // In a forked child's only thread, before any use: the lock may have been
  // held by a thread that does not exist here, and so may records (their
  // threads are gone; a read section is never open at fork, see
  // function_cache.h, so only `owned` is stale: those records are leaked).
  void ReinitLockInChild() {
    mu_.~Mutex();
    new (&mu_) Mutex();
  }

 private:
  struct Retired {
    uint64_t tag;  // epoch_ before the Retire's advance
    void* ptr;
    Deleter deleter;
  };

  // The smallest epoch announced by a reader now, or UINT64_MAX when none
  // reads: a pointer retired with tag t is safe when t < that.
  uint64_t OldestReaderEpoch() const {
    uint64_t oldest = UINT64_MAX;
    for (Record* r = records_.load(std::memory_order_acquire); r; r = r->next) {
      uint64_t e = r->epoch.load(std::memory_order_seq_cst);
      if (e != 0 && e < oldest) oldest = e;
    }
    return oldest;
  }

  // Starts at 1: a record's 0 means "not reading".
  std::atomic<uint64_t> epoch_{1};
  std::atomic<Record*> records_{nullptr};
  mutable Mutex mu_;  // leaf lock: guards retired_ only
  std::vector<Retired> retired_;  // guarded by mu_
};

}  // namespace ftjit
