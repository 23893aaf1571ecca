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
// or a part of it, shared by the entries a redirect joins) and Epochs() (one domain for all).
//
//   StoreEntry (shared_ptr held by the map slot, the LRU, threads on the slow
//   path and, while the ready table lists it, itself: listing.self; freed by
//   its deleter once no call is in flight: see InFlight)
//   | sig, store, store_raw | fixed after construction                      |
//   | latch, lru            | CompileLatch, SharedLru                       |
//   | payload               | written by the compiling thread before        |
//   |                       | Publish(); read after observing the state     |
//   | slots (EntrySlot)     | PerThread: a thread's own line; hits relaxed  |
//   |                       | (added by a plain load and store: one writer),|
//   |                       | in_flight seq_cst (see InFlight), the rest    |
//   |                       | the holding thread's only                     |
//   | unlinked, claimed,    | seq_cst atomics, written once each            |
//   |   left_map            |                                               |
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
//   | counters_             | relaxed atomics (hits: PerThreadCounter)      |
//   | counted_              | relaxed atomic: admitted entries in the map,  |
//   |                       | and evicted signatures that keep their count  |
//   | evicted_              | FTJIT_GUARDED_BY(evicted_mu_), a leaf lock    |
//   | provisional_          | relaxed atomic: provisional entries in the map|
//   | removals_             | seq_cst atomics: entries that left the map,   |
//   |                       | per bucket (redirects' validity)              |
//   | clears_               | acq_rel atomic, bumped by Clear()             |
//
// Lock order: map_'s lock, the LRU's, publish_mu_, evicted_mu_ and the epoch
// domain's are leaves, never held together, but Published takes map_'s lock
// inside publish_mu_ (map_'s lock is never held while taking another). Nothing is
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

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <unordered_set>
#include <utility>
#include <vector>
#ifndef NDEBUG
#include <cassert>
#endif

#include "primitives/compile_latch.h"
#include "primitives/epoch.h"
#include "primitives/listing_table.h"
#include "primitives/live_count.h"
#include "primitives/locks.h"
#include "primitives/per_thread.h"
#include "primitives/reentrant_map.h"
#include "primitives/shared_lru.h"
#include "primitives/thread_annotations.h"
#include "store/thread_slot.h"

namespace ftjit {

struct StoreCounters {
  PerThreadCounter hits;  // a line per thread index: a hit adds with no lock prefix
  std::atomic<uint64_t> misses{0}, compiles{0}, waits{0}, evictions{0}, failures{0};
  std::atomic<uint64_t> compile_nanos{0}, wait_nanos{0};
};

template <class Traits>
class EntryStore;

// A thread's part of an entry (PerThread: one per thread index, made on the
// thread's first call of the entry, on a cache line of its own): its hits
// and in-flight calls, its own executable of the entry (`copy`: the
// extension's ThreadExecutables), and where a context change sent it
// (`redirect`: another entry of the same store, the same arguments under
// this thread's context now; valid while its bucket's removal count is
// still `redirect_gen`, see EntryStore::FindReady). Only the thread holding
// the index writes it (the next thread to take the index inherits it); the
// others read hits and in_flight.
template <class Exe>
struct alignas(64) EntrySlot {
  std::atomic<uint64_t> hits{0};
  std::atomic<int64_t> in_flight{0};
  Exe copy{};
  void* redirect = nullptr;  // a StoreEntry of the same store; never owned
  uint64_t redirect_gen = 0;
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

  using Slot = EntrySlot<typename Traits::LocalExe>;
  PerThread<Slot> slots;  // each thread's part of the entry
  std::atomic<bool> unlinked{false};
  std::atomic<bool> claimed{false};
  std::atomic<bool> counted{false};  // counted in its store's Count()
  std::atomic<bool> left_map{false};  // set once, before its bucket's removal count moves (LeaveMap)
  enum : uint8_t { kNotProvisional = 0, kProvisional = 1, kAdopted = 2 };
  std::atomic<uint8_t> provisional{kNotProvisional};
  EntryListing<StoreEntry> listing FTJIT_GUARDED_BY(store_raw->publish_mu_);
  LruHook<std::shared_ptr<StoreEntry>> lru;
  LiveCount<StoreEntry> live;  // entries not yet freed (after retirement)

  uint64_t Hits() const {
    uint64_t total = 0;
    slots.ForEach([&](const Slot& s) { total += s.hits.load(std::memory_order_relaxed); });
    return total;
  }
  int64_t InFlight() const {
    int64_t total = 0;
    slots.ForEach([&](const Slot& s) { total += s.in_flight.load(std::memory_order_seq_cst); });
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

  using Slot = EntrySlot<typename Traits::LocalExe>;  // StoreEntry::Slot (not named through it: the entry type is not complete here)
  using Record = typename EpochDomain<Mutex>::Record;

  // What a hit holds in flight (see InFlight): the entry the probe found
  // (`head`) and, where this thread's slot of it redirects validly, the
  // redirect's target; else the head again. Slots are this thread's.
  struct Held {
    Entry* head = nullptr;
    Slot* head_slot = nullptr;
    Entry* target = nullptr;
    Slot* target_slot = nullptr;
    explicit operator bool() const { return head != nullptr; }
  };

  // The hit path: probes the ready table in a read section; on a hit counts
  // this thread in flight on the entry found and, with `follow_redirect` (a
  // probe by arguments alone), on its redirect's target (valid while no entry of its bucket left the map since it was set: the
  // target is then listed, and cannot be freed before this section ends; a
  // stale one is forgotten here), and returns them. The caller calls the
  // target's payload (taking no reference to the entry), counts the hit
  // (CountHit) and ends with Release. Nothing shared is written: the slots
  // are this thread's lines, and the LRU's `referenced` bit is written only
  // after an eviction scan cleared it. Empty when the probe cannot decide or
  // finds nothing: the caller calls AfterMiss, then FindOrInsert. Never
  // runs Python.
  Held FindReady(const Sig& sig, Record* rec, size_t index, bool follow_redirect) {
    auto& epochs = Traits::Epochs();
    epochs.EnterRead(rec);
    Held h;
    if (Entry* e = Probe(*ready_.Load(), sig)) {
      Slot& s = e->slots.Get(index);
      s.in_flight.fetch_add(1, std::memory_order_seq_cst);
      h = Held{e, &s, e, &s};
      if (s.redirect && follow_redirect) {
        if (s.redirect_gen == RedirectGen(sig)) {
          auto* t = static_cast<Entry*>(s.redirect);
          Slot& ts = t->slots.Get(index);
          ts.in_flight.fetch_add(1, std::memory_order_seq_cst);
          h.target = t;
          h.target_slot = &ts;
        } else {
          s.redirect = nullptr;  // its target may be gone
        }
      }
    }
    // A hit: Release's LeaveRead frees what this section held back. A miss:
    // the caller's AfterMiss, once it may run deleters.
    epochs.ExitRead(rec);
    return h;
  }
  // Ends the calls FindReady held. May run deleters: the caller holds no lock.
  [[gnu::noinline]] static void Release(const Held& h, Record* rec) {
    if (h.target != h.head) FinishCall(h.target, *h.target_slot, rec);
    FinishCall(h.head, *h.head_slot, rec);
  }

  // The removal count a redirect of entries of `sig`'s arguments (its
  // TableHash) is valid under: read it before the probe that finds the
  // target, and pass it to Redirect.
  uint64_t RedirectGen(const Sig& sig) const {
    return removals_[Traits::TableHash(sig) % kRedirectBuckets].load(std::memory_order_seq_cst);
  }
  // Sends this thread's later calls that find `head` to `target` (another
  // entry of this store of the same arguments, held, found listed by a
  // probe made after `gen` was read), or back to the head (target == head).
  // `slot`: the head's slot of this thread, held. An entry can stay listed
  // a while after it left the map: one that left before `gen` was read is
  // no target (checked here), and one that leaves later moves the count.
  static void Redirect(Entry* head, Slot& slot, Entry* target, uint64_t gen) {
    if (target != head && target->left_map.load(std::memory_order_seq_cst)) target = head;
    slot.redirect = target == head ? nullptr : target;
    slot.redirect_gen = gen;
  }

  // Only the thread holding `index` (whose `slot` this is): plain adds.
  void CountHit(Entry* e, Slot& slot, size_t index) {
    slot.hits.store(slot.hits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    counters_.hits.Add(index);
    SharedLru<EntryPtr, Mutex>::Touch(e);
  }

  // After FindReady returned nothing, at the first point where the caller
  // may run deleters (in the extension, once its signature no longer
  // borrows from its thread's memo): frees what the probe held back.
  static void AfterMiss(Record* rec) { Traits::Epochs().FreeHeldBack(rec); }

  // Ends a call counted in flight (FindReady, Enter; see InFlight). May run
  // deleters (drop payloads): the caller holds no lock.
  static void FinishCall(Entry* e, Slot& slot, Record* rec) {
    auto& epochs = Traits::Epochs();
    epochs.EnterRead(rec);
    slot.in_flight.fetch_sub(1, std::memory_order_seq_cst);
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
  // one atomic, and an entry stops counting when it leaves the map, but for
  // an eviction: an evicted signature keeps its count (its hash is kept,
  // see KeepEvicted), and takes it back when it returns. The max_signatures
  // guard (Guard) is built on it.
  bool Admit(const EntryPtr& e, int64_t limit, bool force) {
    if (TakeBackEvicted(e->sig->hash)) {
      // A signature evicted earlier returns: its count was kept for it.
      e->counted.store(true, std::memory_order_seq_cst);
      if (!map_.ContainsValue(e->sig->hash, e)) Uncount(*e);
      return true;
    }
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
  // The counts that evicted signatures kept go too: a clear starts the
  // max_signatures count again from what stays in the map.
  void Clear() {
    BumpClears();  // every thread's call object of the function goes (Clears())
    auto removed = map_.Clear();
    for (auto& kv : removed) LeaveMap(*kv.second);
    ForgetEvicted();
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
    ReinitInChild(evicted_mu_);
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

  // How many evicted signatures keep their count (see KeepEvicted) at
  // most: 0 (the default) keeps none. The max_signatures limit, where set.
  void set_evicted_kept(size_t n) { evicted_cap_ = n; }
  // Tests: the evicted signatures that keep their count now.
  size_t evicted_kept() const FTJIT_EXCLUDES(evicted_mu_) {
    LockGuard<Mutex> lock(evicted_mu_);
    return evicted_.size();
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
  // How many times Clear() ran: a thread's call object of the whole
  // function (the extension's ThreadCall) made before the last one is
  // replaced at the thread's next call through it.
  uint64_t Clears() const { return clears_.load(std::memory_order_acquire); }
  // Counts one more clear (Clear() does, first; the extension again once
  // its entries are gone, for a thread that read the count in between).
  void BumpClears() { clears_.fetch_add(1, std::memory_order_acq_rel); }
  // A hit that a sample stands for `n` of (the extension's ThreadCall:
  // calls it served alone, without the store): the entry's slot counts
  // them and its LRU bit is set; the store's own hit count is not (the
  // calls are counted where they were served).
  static void CountSampledHits(Entry* e, Slot& slot, uint64_t n) {
    slot.hits.store(slot.hits.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    SharedLru<EntryPtr, Mutex>::Touch(e);
  }

  // Outside the LRU's lock.
  static void ReleaseEvicted(std::vector<EntryPtr>& evicted) {
    for (EntryPtr& e : evicted) {
      if (std::shared_ptr<EntryStore> st = e->store.lock()) {
        st->counters_.evictions.fetch_add(1, std::memory_order_relaxed);
        st->KeepEvicted(*e);  // before it leaves the map: a return of its signature finds the hash
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

  // After every removal of `e` from the map: it stops counting, and the
  // redirects to entries of its arguments' bucket are void (before the
  // caller unlists it).
  void LeaveMap(Entry& e) {
    Uncount(e);
    Unprovision(e);
    e.left_map.store(true, std::memory_order_seq_cst);
    removals_[Traits::TableHash(*e.sig) % kRedirectBuckets].fetch_add(1, std::memory_order_seq_cst);
  }

  void Uncount(Entry& e) {
    if (e.counted.exchange(false, std::memory_order_seq_cst)) counted_.fetch_sub(1, std::memory_order_relaxed);
  }

  // An eviction of a counted entry keeps its count under its signature's
  // hash (at most evicted_cap_ of them; past that it uncounts as before),
  // so that evictions, which other functions' traffic can cause, never
  // give a max_signatures slot back: a signature counts once for its
  // function's life, until a clear. Called before the entry leaves the map,
  // so that a new entry of the signature (inserted only after) finds the
  // hash in Admit. Two signatures of one hash share a kept count (a 64-bit
  // hash: the guard may then admit one signature more).
  void KeepEvicted(Entry& e) FTJIT_EXCLUDES(evicted_mu_) {
    if (evicted_cap_ == 0) return;
    LockGuard<Mutex> lock(evicted_mu_);
    if (evicted_.size() >= evicted_cap_) return;
    if (!e.counted.exchange(false, std::memory_order_seq_cst)) return;  // not counted, or a clear uncounted it
    evicted_.insert(e.sig->hash);  // counted_ keeps its count
  }
  // Whether `hash` kept a count (which it then takes back).
  bool TakeBackEvicted(size_t hash) FTJIT_EXCLUDES(evicted_mu_) {
    if (evicted_cap_ == 0) return false;
    LockGuard<Mutex> lock(evicted_mu_);
    auto it = evicted_.find(hash);
    if (it == evicted_.end()) return false;
    evicted_.erase(it);
    return true;
  }
  // A clear: the kept counts go.
  void ForgetEvicted() FTJIT_EXCLUDES(evicted_mu_) {
    LockGuard<Mutex> lock(evicted_mu_);
    counted_.fetch_sub(static_cast<int64_t>(evicted_.size()), std::memory_order_relaxed);
    evicted_.clear();
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
  std::atomic<uint64_t> clears_{0};
  std::atomic<int64_t> counted_{0};
  std::atomic<int64_t> provisional_{0};
  // Entries that left the map, per bucket of their TableHash: a redirect
  // is void once its bucket's count moved (RedirectGen).
  static constexpr size_t kRedirectBuckets = 64;
  std::array<std::atomic<uint64_t>, kRedirectBuckets> removals_{};
  // The hashes of evicted signatures that keep their count (KeepEvicted):
  // at most evicted_cap_ (the max_signatures limit).
  mutable Mutex evicted_mu_;  // leaf lock
  std::unordered_multiset<size_t> evicted_ FTJIT_GUARDED_BY(evicted_mu_);
  size_t evicted_cap_ = 0;  // fixed before the store is used
  LiveCount<EntryStore> live_;  // stores not yet destroyed
};

}  // namespace ftjit
