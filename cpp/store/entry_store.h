// ftjit: the compiled entries of one function (EntryStore), bounded by the
// capacity many functions share, wired from the primitives: a ReentrantMap
// of every entry (compiling or ready: the slow path and all writers), a
// ListingTable of the ready ones (the hit path, with no lock: EpochDomain),
// a SharedLru and a CompileLatch per entry. Python-free: the types come from
// `Traits` (PyEntryTraits in the extension, the C++ tests' own), so the
// composition itself runs under ThreadSanitizer. Traits provides Sig
// (immutable once inserted, with a `size_t hash`), Payload and LocalExe
// (default constructible), Mutex (StdMutex or LeafMutex), FastEquals
// (noexcept, Python-free: kEqual, kNotEqual or kUnknown), Equals (may
// re-enter, may throw), TableHash (what the ready table keys on: the hash,
// or a part of it for FindReadyLocal) and Epochs() (one domain for all).
//
//   StoreEntry (shared_ptr held by the map slot, the LRU, threads on the slow
//   path and, while the ready table lists it, itself: listing.self; freed by
//   its deleter once no call is in flight: see InFlight)
//   | sig, store, store_raw | fixed after construction                      |
//   | latch, lru            | CompileLatch, SharedLru                       |
//   | payload               | written by the compiling thread before        |
//   |                       | Publish(); read after observing the state     |
//   | shards[i].hits        | relaxed atomics, one cache line per shard     |
//   | shards[i].in_flight   | seq_cst atomics, same lines (see InFlight)    |
//   | shards[i].local       | the thread holding shard i only (exclusive    |
//   |                       | but in kSharedShard, where it is unused)      |
//   | left_map (LeaveMap),  | seq_cst atomics, written once each            |
//   |   unlinked, claimed   |                                               |
//   | counted               | atomic: set by Admit, cleared once on leaving |
//   |                       | the map                                       |
//   | provisional           | atomic: set before the latch is published,    |
//   |                       | left once by CAS (see Provisional entries)    |
//   | listing               | FTJIT_GUARDED_BY(store_raw->publish_mu_),     |
//   |                       | reached only through ListingLockHeld          |
//
//   EntryStore (one per function and options)
//   | lru_                  | fixed after construction (the LRU: its lock)  |
//   | map_                  | ReentrantMap: its own leaf lock               |
//   | ready_                | ListingTable: written under publish_mu_;      |
//   |                       | probed by readers with no lock                |
//   | newest_               | FTJIT_GUARDED_BY(publish_mu_)                 |
//   | publish_mu_           | leaf lock: serialises the writes of ready_;   |
//   |                       | guards newest_ and every entry's listing      |
//   | counters_             | relaxed atomics (hits sharded per thread)     |
//   | counted_              | relaxed atomic: admitted entries in the map   |
//   | provisional_          | relaxed atomic: provisional entries in the map|
//   | removals_             | seq_cst atomic: entries that left the map     |
//
// Lock order: map_'s lock, the LRU's, publish_mu_ and the epoch domain's are
// leaves, never held together, but Published takes map_'s lock inside
// publish_mu_ (map_'s lock is never held while taking another). Nothing is
// freed under any of them: removed entries and retired tables are handed
// back and dropped after unlocking.
//
// InFlight: an entry no table lists may still be in use by a thread that
// found it before it was unlinked. When the last shared_ptr to an entry goes
// (for an entry ever listed, after the grace period of its last table, so
// every thread that found it has counted itself in flight by then), the
// deleter marks it `unlinked`; whoever then sees it unlinked with nothing in
// flight (the deleter, or the FinishCall that brings the count to zero)
// claims it (`claimed`: exactly one does) and retires it. Both sides write
// first and check after (seq_cst), so one of them always sees the other.
// Both look at the entry only inside a read section, and Retire frees it a
// grace period later: a FinishCall that lost the claim never reads freed
// memory.
//
// Listing: an entry is listed by Published() if the map still holds it, and
// then holds itself (listing.self) while an array a reader may probe lists
// it. Unlisting (Discard, Clear, the store's death) tombstones exactly the
// entries the map lost (a clear must not unlist an entry inserted and listed
// after it) and retires their listing.self with the array the table
// replaced, if any. Both run under publish_mu_, a listing checks the map
// inside it, and an unlisting comes after the map lost the entry: whichever
// of a publish and a removal of one entry comes second sees what the first
// did. Listed entries are also linked newest first (listing.newer/older,
// from newest_) for NewestReady.
//
// Provisional entries: compiled ahead of traffic from a saved spec, neither
// counted by Admit nor listed. The first call that needs one adopts it
// (Adopt): the map's slot gets a fresh entry, compiling and owned by the
// adopter, whose compile takes the provisional payload once the guard
// counted it (so the limit sees the signature when traffic uses it). The
// claim is one CAS on `provisional` (kProvisional -> kAdopted) under the
// map's lock with the slot's replacement: a thread that found the old entry
// and sees kAdopted looks again. A removal CASes kProvisional ->
// kNotProvisional: exactly one of the two happens, and provisional_ counts
// down once.
#pragma once

#include <pthread.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>
#ifndef NDEBUG
#include <cassert>
#endif

#include "primitives/compile_latch.h"
#include "primitives/epoch.h"
#include "primitives/listing_table.h"
#include "primitives/locks.h"
#include "primitives/reentrant_map.h"
#include "primitives/shared_lru.h"
#include "primitives/thread_annotations.h"

namespace ftjit {

// Each thread takes the lowest free of kMaxThreadShards shards, exclusively
// until it ends (ThreadSlot); threads past that share kSharedShard. So up to
// kMaxThreadShards threads write different cache lines on a hit, and a
// thread's shard of an entry (StoreEntry::Shard::local among them) is used
// by that thread alone, then by the next thread to take the shard.
constexpr int kMaxThreadShards = 16;
constexpr int kSharedShard = kMaxThreadShards;
constexpr int kShards = kMaxThreadShards + 1;
static_assert(kMaxThreadShards <= 32, "the free shards are the bits of a uint32_t");

// The taken bits of the exclusive shards. A shard's own fields are handed
// over through the epoch domain's and the threads' own synchronisation,
// never through this word.
class ShardAllocator {
 public:
  int Acquire() {
    uint32_t taken = taken_.load(std::memory_order_relaxed);
    for (;;) {
      if (taken == kAll) return kSharedShard;
      int i = __builtin_ctz(~taken);
      if (taken_.compare_exchange_weak(taken, taken | (1u << i), std::memory_order_acq_rel)) return i;
    }
  }
  void Release(int shard) {
    if (shard >= 0 && shard < kMaxThreadShards) taken_.fetch_and(~(1u << shard), std::memory_order_acq_rel);
  }
  // In a forked child's only thread: only its own shard is taken.
  void ResetInChild(int keep) {
    taken_.store(keep >= 0 && keep < kMaxThreadShards ? 1u << keep : 0u, std::memory_order_relaxed);
  }

 private:
  static constexpr uint32_t kAll = kMaxThreadShards == 32 ? ~0u : (1u << kMaxThreadShards) - 1;
  std::atomic<uint32_t> taken_{0};
};

// This thread's epoch record and shard, taken on first use and read on every
// call from trivially destructible thread-locals (no guard, no
// registration). Both go back when the thread's C++ thread-locals are
// destroyed (Holder), and the thread is marked exited: a use after that (a
// later destructor dropping a jitted function) takes a fresh record, never
// the released one, which another thread may hold by then (two threads
// announcing on one record would let a reclaim free what one of them
// reads). A POSIX thread-specific key gives that late record back (a record
// taken in the last round of key destructors stays held, never shared).
//   | t_ctx_, t_ready_, | thread-local; written by the thread itself only |
//   |   t_exited_       |                                                 |
//   | Shards()          | ShardAllocator (atomic)                         |
template <class Traits>
class ThreadSlot {
 public:
  using Domain = EpochDomain<typename Traits::Mutex>;
  struct Ctx {
    typename Domain::Record* rec;
    int shard;
  };
  static const Ctx& Get() {
    const Ctx* p = t_ready_;  // one thread-local read on every call
    return p ? *p : Slow();
  }
  static ShardAllocator& Shards() {
    static ShardAllocator shards;
    return shards;
  }

 private:
  struct Holder {
    ~Holder() {
      if (t_ctx_.rec) Domain::Release(t_ctx_.rec);
      Shards().Release(t_ctx_.shard);
      t_ctx_.rec = nullptr;
      t_ready_ = nullptr;
      t_exited_ = true;
    }
  };
  static const Ctx& Slow() {
    t_ctx_.shard = Shards().Acquire();
    if (t_exited_) {
      static const pthread_key_t late_key = [] {
        pthread_key_t k;
        pthread_key_create(&k, [](void* rec) {
          Domain::Release(static_cast<typename Domain::Record*>(rec));
          Shards().Release(t_ctx_.shard);
          t_ctx_.rec = nullptr;
          t_ready_ = nullptr;
        });
        return k;
      }();
      t_ctx_.rec = Traits::Epochs().Acquire();
      pthread_setspecific(late_key, t_ctx_.rec);
      t_ready_ = &t_ctx_;
      return t_ctx_;
    }
    thread_local Holder holder;  // constructed once: gives the record back at exit
    t_ctx_.rec = Traits::Epochs().Acquire();
    t_ready_ = &t_ctx_;
    return t_ctx_;
  }
  static inline thread_local Ctx t_ctx_{nullptr, 0};
  static inline thread_local const Ctx* t_ready_ = nullptr;  // &t_ctx_ while it holds a record
  static inline thread_local bool t_exited_ = false;
};

// A relaxed counter split over cache-line-sized shards.
template <int kShards>
class ShardedCounter {
 public:
  void Add(int shard) { shards_[shard % kShards].n.fetch_add(1, std::memory_order_relaxed); }
  uint64_t Load() const {
    uint64_t total = 0;
    for (const Shard& s : shards_) total += s.n.load(std::memory_order_relaxed);
    return total;
  }

 private:
  struct alignas(64) Shard {
    std::atomic<uint64_t> n{0};
  };
  std::array<Shard, kShards> shards_;
};

struct StoreCounters {
  ShardedCounter<kShards> hits;
  std::atomic<uint64_t> misses{0}, compiles{0}, waits{0}, evictions{0}, failures{0};
  std::atomic<uint64_t> compile_nanos{0}, wait_nanos{0};
};

template <class Traits>
class EntryStore;

// A thread's own executables of an entry, in its exclusive shard: `exe`, the
// entry's own, and where a context change sent this thread (FindReadyLocal):
// `target`, another entry of the same store (the same arguments under this
// thread's context now), whose own executable `via` is, valid while no entry
// has left the store's map since it was set (`gen`: removals_ then).
template <class Exe>
struct LocalSlot {
  Exe exe{};
  Exe via{};
  void* target = nullptr;  // a StoreEntry of the same store; never owned
  uint64_t gen = 0;
};

// See Listing.
template <class Entry>
struct EntryListing {
  std::shared_ptr<Entry> self;
  Entry* newer = nullptr;
  Entry* older = nullptr;
};

template <class Traits>
struct StoreEntry {
  using Sig = typename Traits::Sig;
  using Store = EntryStore<Traits>;

  StoreEntry(std::shared_ptr<const Sig> s, std::weak_ptr<Store> st, const Store* raw)
      : sig(std::move(s)), store(std::move(st)), store_raw(raw), latch(ThisThreadOwner()) {}
  StoreEntry(const StoreEntry&) = delete;
  StoreEntry& operator=(const StoreEntry&) = delete;

  const std::shared_ptr<const Sig> sig;
  const std::weak_ptr<Store> store;  // for eviction
  const Store* const store_raw;      // identity only, never dereferenced
  CompileLatch latch;
  typename Traits::Payload payload;

  struct alignas(64) Shard {
    std::atomic<uint64_t> hits{0};
    std::atomic<int64_t> in_flight{0};
    LocalSlot<typename Traits::LocalExe> local;
  };
  std::array<Shard, kShards> shards;
  std::atomic<bool> unlinked{false};
  std::atomic<bool> claimed{false};
  std::atomic<bool> counted{false};  // counted in its store's Count()
  std::atomic<bool> left_map{false};
  enum : uint8_t { kNotProvisional = 0, kProvisional = 1, kAdopted = 2 };
  std::atomic<uint8_t> provisional{kNotProvisional};
  EntryListing<StoreEntry> listing FTJIT_GUARDED_BY(store_raw->publish_mu_);
  LruHook<std::shared_ptr<StoreEntry>> lru;

  uint64_t Hits() const {
    uint64_t total = 0;
    for (const Shard& s : shards) total += s.hits.load(std::memory_order_relaxed);
    return total;
  }
  int64_t InFlight() const {
    int64_t total = 0;
    for (const Shard& s : shards) total += s.in_flight.load(std::memory_order_seq_cst);
    return total;
  }

  // Whether this thread must retire the entry (see InFlight). Inside a read
  // section.
  bool ClaimIfIdle() {
    return unlinked.load(std::memory_order_seq_cst) && InFlight() == 0 &&
           !claimed.exchange(true, std::memory_order_seq_cst);
  }
  static void Delete(void* e) { delete static_cast<StoreEntry*>(e); }

  // See InFlight.
  struct Deleter {
    void operator()(StoreEntry* e) const {
      auto& epochs = Traits::Epochs();
      auto* rec = ThreadSlot<Traits>::Get().rec;
      epochs.EnterRead(rec);
      e->unlinked.store(true, std::memory_order_seq_cst);
      bool mine = e->ClaimIfIdle();
      epochs.LeaveRead(rec);
      if (mine) epochs.Retire(e, &StoreEntry::Delete);
    }
  };
};

template <class Traits>
class EntryStore : public std::enable_shared_from_this<EntryStore<Traits>> {
 public:
  using Sig = typename Traits::Sig;
  using Mutex = typename Traits::Mutex;
  using Entry = StoreEntry<Traits>;
  using EntryPtr = std::shared_ptr<Entry>;
  using Listing = EntryListing<Entry>;
  using SigPtr = std::shared_ptr<const Sig>;
  using Lru = SharedLru<EntryPtr, Mutex>;

  explicit EntryStore(std::shared_ptr<Lru> lru) : lru_(std::move(lru)) {}
  EntryStore(const EntryStore&) = delete;
  EntryStore& operator=(const EntryStore&) = delete;
  ~EntryStore() {
    // Entries left in the shared LRU must stop counting against it.
    if (map_.size() != 0) {
      const EntryStore* self = this;
      std::vector<EntryPtr> unlinked =
          lru_->RemoveIf([self](const EntryPtr& e) { return e->store_raw == self; });
    }
    UnlistAll();
  }

  // The hit path: probes the ready table in a read section; on a hit counts
  // it and this thread in flight on the entry and returns it, and the caller
  // calls its payload (taking no reference) and ends with FinishCall. Nothing
  // shared is written: each thread has its own shard line, and the LRU's
  // `referenced` bit is written only after an eviction scan cleared it. Null
  // when the probe cannot decide or finds nothing: the caller calls
  // AfterMiss, then FindOrInsert. Never runs Python.
  Entry* FindReady(const Sig& sig, typename EpochDomain<Mutex>::Record* rec, int shard) {
    auto& epochs = Traits::Epochs();
    epochs.EnterRead(rec);
    Entry* e = Probe(*ready_.Load(), sig);
    if (e) {
      e->shards[shard].in_flight.fetch_add(1, std::memory_order_seq_cst);
      CountHit(e, shard);
    }
    // A hit: FinishCall's LeaveRead frees what this section held back. A
    // miss: the caller's AfterMiss, once it may run deleters.
    epochs.ExitRead(rec);
    return e;
  }

  // The hit path of a function whose executables check the context (and
  // keep a copy per thread: LocalSlot). As FindReady, but the hit is not
  // counted (the executable may find its context changed and miss: the
  // caller counts it on the entry that served it), and `*target` is set to
  // the entry this thread's shard of `e` redirects to, counted in flight
  // too, while the redirect is valid (no entry left the map since it was
  // set: the target is then listed and cannot be freed before this section
  // ends); else to `e`. The caller ends the call with FinishCall on both
  // (once if they are one) and resets a stale redirect (its executable is
  // Python's to drop).
  Entry* FindReadyLocal(const Sig& sig, typename EpochDomain<Mutex>::Record* rec, int shard, Entry** target) {
    auto& epochs = Traits::Epochs();
    epochs.EnterRead(rec);
    Entry* e = Probe(*ready_.Load(), sig);
    *target = e;
    if (e) {
      e->shards[shard].in_flight.fetch_add(1, std::memory_order_seq_cst);
      const LocalSlot<typename Traits::LocalExe>& local = e->shards[shard].local;
      if (local.target && local.gen == removals_.load(std::memory_order_seq_cst)) {
        Entry* t = static_cast<Entry*>(local.target);
        if (!t->left_map.load(std::memory_order_seq_cst)) {
          t->shards[shard].in_flight.fetch_add(1, std::memory_order_seq_cst);
          *target = t;
        }
      }
    }
    epochs.ExitRead(rec);
    return e;
  }
  // The generation a redirect is valid in.
  uint64_t removals() const { return removals_.load(std::memory_order_seq_cst); }

  void CountHit(Entry* e, int shard) {
    e->shards[shard].hits.fetch_add(1, std::memory_order_relaxed);
    counters_.hits.Add(shard);
    SharedLru<EntryPtr, Mutex>::Touch(e);
  }

  // After FindReady returned null, at the first point where the caller may
  // run deleters (in the extension, once its signature no longer borrows
  // from its thread's memo): frees what the probe held back.
  static void AfterMiss(typename EpochDomain<Mutex>::Record* rec) {
    Traits::Epochs().FreeHeldBack(rec);
  }

  // Ends a call that FindReady counted in flight (see InFlight). May run
  // deleters (drop payloads): the caller holds no lock.
  static void FinishCall(Entry* e, typename EpochDomain<Mutex>::Record* rec, int shard) {
    auto& epochs = Traits::Epochs();
    epochs.EnterRead(rec);
    e->shards[shard].in_flight.fetch_sub(1, std::memory_order_seq_cst);
    bool mine = e->ClaimIfIdle();
    epochs.LeaveRead(rec);
    if (mine) epochs.Retire(e, &Entry::Delete);
  }

  struct Lookup {
    EntryPtr entry;
    bool inserted;  // this thread owns the compile
  };
  // Moves `sig` into a new entry only if inserting (otherwise `sig` is intact
  // on return, whatever raced). May run Traits::Equals (re-entrant, may
  // throw; `sig` is then unusable).
  Lookup FindOrInsert(Sig& sig) {
    auto eq = [](const SigPtr& stored, const Sig& probe) { return Traits::Equals(*stored, probe); };
    if (EntryPtr found = map_.Find(sig.hash, sig, eq)) return Lookup{std::move(found), false};
    auto owned = std::make_shared<Sig>(std::move(sig));
    SigPtr key = owned;
    auto make = [this, &key]() {
      EntryPtr e(new Entry(key, this->weak_from_this(), this), typename Entry::Deleter());
      return std::make_pair(key, std::move(e));
    };
    auto r = map_.FindOrInsert(key->hash, *key, eq, make);
    if (!r.inserted) {
      // Another thread inserted it meanwhile: the caller gets `sig` back.
      key.reset();
      sig = std::move(*owned);
    }
    return Lookup{std::move(r.value), r.inserted};
  }

  // Compiling or ready, or null. May run Traits::Equals.
  EntryPtr Find(const Sig& sig) const {
    return map_.Find(sig.hash, sig, [](const SigPtr& stored, const Sig& probe) { return Traits::Equals(*stored, probe); });
  }

  void AdmitLru(const EntryPtr& e) {
    std::vector<EntryPtr> evicted = lru_->Insert(e, Evictable);
    // A clear may have removed `e` from the map before this link. Every
    // clear empties the map first and unlinks from the LRU second, so
    // checking the map after linking closes the gap.
    if (!map_.ContainsValue(e->sig->hash, e)) lru_->Remove(e);
    ReleaseEvicted(evicted);
  }

  // The owner published `e` ready: lists it (see Listing), then re-applies
  // the LRU bound (pinned entries may have pushed it over).
  void Published(const EntryPtr& e) FTJIT_EXCLUDES(publish_mu_) {
    typename Table::Array* old = nullptr;
    {
      LockGuard<Mutex> lock(publish_mu_);
      Listing& l = ListingLockHeld(e.get());
      if (!l.self && map_.ContainsValue(e->sig->hash, e)) {
        l.self = e;
        l.older = newest_;
        if (newest_) ListingLockHeld(newest_).newer = e.get();
        newest_ = e.get();
        old = ready_.Insert(Traits::TableHash(*e->sig), e.get(), publish_mu_);
      }
    }
    // A rebuild's old array: no entry is unlisted with it.
    if (old) Traits::Epochs().Retire(old, &Table::Delete);
    TrimLru();
  }

  void TrimLru() {
    if (lru_->size() <= lru_->capacity()) return;
    std::vector<EntryPtr> evicted = lru_->Trim(Evictable);
    ReleaseEvicted(evicted);
  }

  // Counts `e` (freshly inserted, by the thread that compiles it) if that
  // leaves at most `limit` counted (any number when `force`); false,
  // counting nothing, otherwise. Exact under concurrent misses: the count is
  // one atomic, and an entry stops counting however it leaves the map. The
  // max_signatures guard (Guard) is built on it.
  bool Admit(const EntryPtr& e, int64_t limit, bool force) {
    int64_t n = counted_.load(std::memory_order_relaxed);
    do {
      if (!force && n >= limit) return false;
    } while (!counted_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
    e->counted.store(true, std::memory_order_seq_cst);
    // A clear may have removed `e` before the mark: as in AdmitLru, a clear
    // empties the map first and uncounts second. Uncount happens once.
    if (!map_.ContainsValue(e->sig->hash, e)) Uncount(*e);
    return true;
  }
  int64_t Count() const { return counted_.load(std::memory_order_relaxed); }

  // Counts one more provisional entry if that leaves Count() +
  // ProvisionalCount() at most `limit` (any number when `limit` < 0). The
  // reservation is released (ReleaseProvisional) or handed to an entry by
  // MarkProvisional. Exact under concurrent warm-ups; traffic admitted
  // meanwhile may leave the sum above `limit`.
  bool ReserveProvisional(int64_t limit) {
    int64_t n = provisional_.load(std::memory_order_relaxed);
    do {
      if (limit >= 0 && n + Count() >= limit) return false;
    } while (!provisional_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
    return true;
  }
  void ReleaseProvisional() { provisional_.fetch_sub(1, std::memory_order_relaxed); }
  // `e`: freshly inserted by this thread, compiled, its latch not yet
  // published. The owner then does not call Published().
  void MarkProvisional(const EntryPtr& e) {
    e->provisional.store(Entry::kProvisional, std::memory_order_seq_cst);
    // A clear may have removed `e` before the mark (as in Admit).
    if (!map_.ContainsValue(e->sig->hash, e)) Unprovision(*e);
  }
  int64_t ProvisionalCount() const { return provisional_.load(std::memory_order_relaxed); }

  // Adopts `p`, found ready and provisional: returns the fresh entry that
  // took its slot, which this thread owns and compiles from p's payload;
  // null (the caller looks again) when another thread adopted p first or p
  // left the map.
  EntryPtr Adopt(const EntryPtr& p) {
    EntryPtr fresh(new Entry(p->sig, this->weak_from_this(), this), typename Entry::Deleter());
    auto claim = [&p]() noexcept {
      uint8_t expected = Entry::kProvisional;
      return p->provisional.compare_exchange_strong(expected, Entry::kAdopted, std::memory_order_seq_cst);
    };
    if (!map_.ReplaceValueIf(p->sig->hash, p, claim, fresh)) return nullptr;
    provisional_.fetch_sub(1, std::memory_order_relaxed);
    lru_->Remove(p);
    return fresh;
  }

  void Discard(const EntryPtr& e) {
    EntryPtr removed = map_.Erase(e->sig->hash, e);
    if (removed) LeaveMap(*e);
    lru_->Remove(e);
    Unlist(e);
  }

  // Compiles in progress finish and serve their waiters but are not kept.
  void Clear() {
    auto removed = map_.Clear();
    for (auto& kv : removed) LeaveMap(*kv.second);
    // Exactly the entries the clear removed: one inserted (linked, listed)
    // since belongs to the map now and stays. An entry linked after this
    // unlink sees itself gone from the map (AdmitLru).
    lru_->RemoveEach(removed, [](const auto& kv) -> const EntryPtr& { return kv.second; });
    std::vector<Entry*> gone;
    gone.reserve(removed.size());
    for (auto& kv : removed) gone.push_back(kv.second.get());
    Unlist(std::move(gone));
  }

  // Drops the entries CompileLatch::OrphanedByFork (never listed: not ready).
  void DropOrphans() {
    auto removed =
        map_.EraseIf([](const SigPtr&, const EntryPtr& e) { return e->latch.OrphanedByFork(); });
    for (auto& kv : removed) {
      LeaveMap(*kv.second);
      lru_->Remove(kv.second);
    }
  }

  // In a forked child's only thread, before any use.
  void ReinitLocksInChild() {
    map_.ReinitLockInChild();
    ReinitInChild(publish_mu_);
  }

  // Tests only: holds this store's locks as a thread lost at fork may.
  // Outside the analysis: it takes or releases by its argument.
  void LockStoreForTest(bool lock) FTJIT_NO_THREAD_SAFETY_ANALYSIS {
    if (lock) {
      publish_mu_.lock();
      map_.LockForTest();
    } else {
      map_.UnlockForTest();
      publish_mu_.unlock();
    }
  }

  size_t size() const { return map_.size(); }
  // The `limit` newest ready entries, newest first, in O(limit): a miss
  // explanation picks its candidates from these.
  std::vector<EntryPtr> NewestReady(size_t limit) const FTJIT_EXCLUDES(publish_mu_) {
    std::vector<EntryPtr> out;
    LockGuard<Mutex> lock(publish_mu_);
    for (Entry* e = newest_; e && out.size() < limit; e = ListingLockHeld(e).older) {
      out.push_back(ListingLockHeld(e).self);
    }
    return out;
  }
  size_t ready_size() const FTJIT_EXCLUDES(publish_mu_) {
    LockGuard<Mutex> lock(publish_mu_);
    return ready_.size(publish_mu_);
  }
  std::vector<EntryPtr> Entries() const {
    std::vector<EntryPtr> out;
    for (auto& kv : map_.Snapshot()) out.push_back(std::move(kv.second));
    return out;
  }
  const std::shared_ptr<Lru>& lru() const { return lru_; }
  StoreCounters& counters() { return counters_; }

  // Outside the LRU's lock.
  static void ReleaseEvicted(std::vector<EntryPtr>& evicted) {
    for (EntryPtr& e : evicted) {
      if (std::shared_ptr<EntryStore> st = e->store.lock()) {
        st->counters_.evictions.fetch_add(1, std::memory_order_relaxed);
        st->Discard(e);
      }
    }
    evicted.clear();  // the entries die here (or when their last call ends), no lock held
  }

  static bool Evictable(const EntryPtr& e) { return !e->latch.compiling(); }

 private:
  using Table = ListingTable<Entry>;

  // What an unlisting retires: the entries' listing.self and the array the
  // table replaced (null if it did not rebuild).
  struct Unlisted {
    typename Table::Array* array;
    std::vector<EntryPtr> refs;
    static void Delete(void* p) {
      auto* u = static_cast<Unlisted*>(p);
      delete u->array;
      delete u;  // drops the refs: entries whose last reference this was go
    }
  };

  static Entry* Probe(const typename Table::Array& table, const Sig& sig) {
    bool undecided = false;
    return table.Find(
        Traits::TableHash(sig), sig,
        [](const Entry& stored, const Sig& probe) noexcept { return Traits::FastEquals(*stored.sig, probe); },
        &undecided);
  }

  // After every removal of `e` from the map: it stops counting, and is
  // marked gone for FindReadyLocal's redirects (left_map first, then the
  // generation, both before the caller unlists it).
  void LeaveMap(Entry& e) {
    Uncount(e);
    Unprovision(e);
    e.left_map.store(true, std::memory_order_seq_cst);
    removals_.fetch_add(1, std::memory_order_seq_cst);
  }

  void Uncount(Entry& e) {
    if (e.counted.exchange(false, std::memory_order_seq_cst)) counted_.fetch_sub(1, std::memory_order_relaxed);
  }
  // Exactly once: an adoption's CAS and this one exclude each other.
  void Unprovision(Entry& e) {
    uint8_t expected = Entry::kProvisional;
    if (e.provisional.compare_exchange_strong(expected, Entry::kNotProvisional, std::memory_order_seq_cst)) {
      provisional_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  friend struct StoreEntry<Traits>;  // its listing names publish_mu_ as its guard

  // Every access to a listing goes through here: that `e` is this store's
  // (its guard is e->store_raw->publish_mu_) the analysis cannot prove, so
  // it is asserted instead.
  Listing& ListingLockHeld(Entry* e) const FTJIT_REQUIRES(publish_mu_)
      FTJIT_NO_THREAD_SAFETY_ANALYSIS {
    publish_mu_.AssertHeld();
#ifndef NDEBUG
    assert(e->store_raw == this && "an entry listed by another store");
#endif
    return e->listing;
  }

  void Unlist(const EntryPtr& e) FTJIT_EXCLUDES(publish_mu_) {
    Unlist(std::vector<Entry*>{e.get()});
  }

  // Unlists those of `gone` that are listed.
  void Unlist(const std::vector<Entry*>& gone) FTJIT_EXCLUDES(publish_mu_) {
    Unlisted* u = nullptr;
    {
      LockGuard<Mutex> lock(publish_mu_);
      std::vector<EntryPtr> refs;
      std::vector<std::pair<size_t, Entry*>> items;
      for (Entry* e : gone) {
        Listing& l = ListingLockHeld(e);
        if (!l.self) continue;
        (l.newer ? ListingLockHeld(l.newer).older : newest_) = l.older;
        if (l.older) ListingLockHeld(l.older).newer = l.newer;
        l.newer = l.older = nullptr;
        items.emplace_back(Traits::TableHash(*e->sig), e);
        refs.push_back(std::move(l.self));
      }
      if (refs.empty()) return;
      u = new Unlisted{ready_.Erase(items, publish_mu_), std::move(refs)};
    }
    Traits::Epochs().Retire(u, &Unlisted::Delete);
  }

  // The store's death: nothing may stay listed.
  void UnlistAll() FTJIT_EXCLUDES(publish_mu_) {
    Unlisted* u = new Unlisted{nullptr, {}};
    {
      LockGuard<Mutex> lock(publish_mu_);
      for (Entry* e = newest_; e;) {
        Listing& l = ListingLockHeld(e);
        e = l.older;
        l.newer = l.older = nullptr;
        u->refs.push_back(std::move(l.self));
      }
      newest_ = nullptr;
      u->array = ready_.Take(publish_mu_);
    }
    Traits::Epochs().Retire(u, &Unlisted::Delete);
  }

  const std::shared_ptr<Lru> lru_;
  ReentrantMap<SigPtr, EntryPtr, Mutex> map_;
  Table ready_;
  mutable Mutex publish_mu_;
  Entry* newest_ FTJIT_GUARDED_BY(publish_mu_) = nullptr;
  StoreCounters counters_;
  std::atomic<int64_t> counted_{0};
  std::atomic<int64_t> provisional_{0};
  std::atomic<uint64_t> removals_{0};
};

}  // namespace ftjit
