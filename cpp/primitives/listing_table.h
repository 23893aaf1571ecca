// ftjit: a hash table of items that readers probe with no lock and write
// nothing, while a writer (one at a time, under its own lock) lists and
// unlists items in place: amortized O(1) per item listed or unlisted,
// whatever the number listed.
//
// Python-free and header-only. The table holds raw pointers: the owner keeps
// every item alive while an array a reader may still be probing lists it
// (entry_store.h retires an item's keep-alive reference when it unlists it).
//
// An open-addressing array (linear probing) behind an atomic pointer. Each
// slot goes empty -> item -> tombstone, never back: Insert writes the hash of
// the first empty slot of the item's probe sequence, then its item (release);
// Erase overwrites the item with the tombstone (seq_cst). So a probe chain
// never breaks under a reader: every slot between an item's home and its own
// stays non-empty for the array's life. When live items + tombstones would
// fill half the slots (Insert), or tombstones outnumber live items (Erase),
// the writer builds a new array of the live items, at most a quarter full,
// and swaps it in; the old one is handed back for the caller to retire
// (EpochDomain::Retire) after releasing its lock. Nothing writes an array
// once it is swapped out.
//
// Costs, n = items listed: Find O(1) expected (at most half the slots are
// taken); Insert and Erase O(1) amortized, no reference count written. A
// rebuild walks the array it replaces: O(c) for c slots. It leaves the new
// one at most a quarter full, with c' <= max(8, 8 r) slots for the r items it
// makes room for. Every insert adds a live item and every erase turns one
// into a tombstone, so the rebuild that replaces that array comes after
// >= c'/4 inserts (at half full) or, when an erase leaves more tombstones
// than live items, after d > r/2 erases (c' <= max(8, 16 d)). So each insert
// and erase pays O(1) of the rebuilds. Take is O(1): it hands the whole array
// back.
//
//   | member                 | protection                                   |
//   |------------------------|----------------------------------------------|
//   | Array::mask_, slots_   | fixed once built (before the array is        |
//   |                        | published by the seq_cst store of current_)  |
//   | Slot::hash             | written by the writer while the slot is      |
//   |                        | empty, before the store that publishes its   |
//   |                        | item; read only after loading a non-empty    |
//   |                        | item                                         |
//   | Slot::item             | atomic; stored by the writer only: empty ->  |
//   |                        | item (release; relaxed in an array not yet   |
//   |                        | published) -> tombstone (seq_cst)            |
//   | current_               | atomic; stored (seq_cst) by the writer       |
//   | live_, dead_           | the writer's: touched only by the writer     |
//   |                        | methods, which REQUIRE its lock              |
//
// Lock order: takes no locks. The writer lock is the caller's (e.g.
// entry_store.h's publish_mu_): every writer method takes it as an argument
// (FTJIT_REQUIRES(writer)), so that clang++ -Wthread-safety
// (thread_annotations.h) checks that each caller holds it, and asserts it
// held (debug builds).
//
// Readers: inside an EpochDomain read section, Load() then Array::Find().
// Both ways an item stops being reachable, the swap of current_ and the
// tombstone, are seq_cst stores, and so are a reader's loads of current_ and
// of every slot's item: they are the unlink (1) and the load (c) of
// epoch.h's argument, so an item unlisted (and then retired by the owner)
// after a reader loaded it stays alive until the reader leaves. A reader
// keeps probing the array it loaded: after a swap it sees neither what is
// inserted into the new array nor what is erased from it meanwhile, as a
// reader of an immutable snapshot would. The exact invariant: a probe whose
// Load() comes after an Insert(x) returned finds x, unless an Erase of x
// began before the probe ended (Insert and rebuilds copy every live item;
// Erase removes only the items it names).
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "primitives/thread_annotations.h"

namespace ftjit {

template <class Item>
class ListingTable {
 public:
  class Array;

  ListingTable() : current_(new Array(kMinCapacity)) {}
  ListingTable(const ListingTable&) = delete;
  ListingTable& operator=(const ListingTable&) = delete;
  // Only when no reader can see it any more (the owner is being destroyed,
  // and retires the last array itself; see Take()).
  ~ListingTable() { delete current_.load(std::memory_order_relaxed); }

  // One array of slots: what a reader probes.
  class Array {
   public:
    Array(const Array&) = delete;
    Array& operator=(const Array&) = delete;

    // The item whose `fast_eq(item, probe)` says kEqual among those listed
    // with `hash`, or null; *undecided is set when some candidate said
    // kUnknown (the caller then takes its slow path). `fast_eq` must be
    // Python-free, noexcept and never block.
    template <class Probe, class FastEqFn>
    Item* Find(size_t hash, const Probe& probe, FastEqFn&& fast_eq, bool* undecided) const {
      for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
        const Slot& s = slots_[i];
        uintptr_t word = s.item.load(std::memory_order_seq_cst);
        if (word == kEmpty) return nullptr;
        if (word == kTombstone || s.hash != hash) continue;
        Item* item = reinterpret_cast<Item*>(word);
        auto r = fast_eq(*item, probe);
        if (r == decltype(r)::kEqual) return item;
        if (r == decltype(r)::kUnknown) *undecided = true;
      }
    }

    size_t capacity() const { return mask_ + 1; }

   private:
    friend class ListingTable;
    explicit Array(size_t capacity) : mask_(capacity - 1), slots_(new Slot[capacity]()) {}
    struct Slot {
      size_t hash;
      std::atomic<uintptr_t> item;  // kEmpty, kTombstone or an Item*
    };
    // The writer's: fills the first empty slot of `hash`'s sequence (`order`:
    // release into a published array; relaxed into one not published yet,
    // which the seq_cst store of current_ then publishes whole).
    void Put(size_t hash, Item* item, std::memory_order order) {
      size_t i = hash & mask_;
      while (slots_[i].item.load(std::memory_order_relaxed) != kEmpty) i = (i + 1) & mask_;
      slots_[i].hash = hash;
      slots_[i].item.store(reinterpret_cast<uintptr_t>(item), order);
    }
    const size_t mask_;
    const std::unique_ptr<Slot[]> slots_;
  };

  // Reader, inside a read section.
  const Array* Load() const { return current_.load(std::memory_order_seq_cst); }

  // Writer, under the caller's writer lock `writer` (a lock type of
  // locks.h, held by this thread). Lists `item` (not listed now) under
  // `hash`. Returns the array it replaced, if it rebuilt (null otherwise),
  // which the caller retires (EpochDomain::Retire, Delete) after releasing
  // its lock.
  template <class WriterLock>
  Array* Insert(size_t hash, Item* item, const WriterLock& writer) FTJIT_REQUIRES(writer) {
    static_assert(alignof(Item) >= 2, "kTombstone (1) must not be an item's address");
    writer.AssertHeld();
    Array* cur = current_.load(std::memory_order_relaxed);
    if (2 * (live_ + dead_ + 1) > cur->capacity()) {
      Array* old = Rebuild(item, hash, live_ + 1, writer);
      ++live_;
      return old;
    }
    cur->Put(hash, item, std::memory_order_release);
    ++live_;
    return nullptr;
  }

  // Writer, as Insert: unlists the items of `gone` (each listed now, under
  // the hash given with it). Returns the array it replaced, if it rebuilt.
  template <class WriterLock>
  Array* Erase(const std::vector<std::pair<size_t, Item*>>& gone, const WriterLock& writer)
      FTJIT_REQUIRES(writer) {
    writer.AssertHeld();
    Array* cur = current_.load(std::memory_order_relaxed);
    for (const auto& [hash, item] : gone) {
      const uintptr_t word = reinterpret_cast<uintptr_t>(item);
      size_t i = hash & cur->mask_;
      while (cur->slots_[i].item.load(std::memory_order_relaxed) != word) {
        assert(cur->slots_[i].item.load(std::memory_order_relaxed) != kEmpty && "erasing an item not listed");
        i = (i + 1) & cur->mask_;
      }
      cur->slots_[i].item.store(kTombstone, std::memory_order_seq_cst);
      --live_;
      ++dead_;
    }
    return dead_ > live_ ? Rebuild(nullptr, 0, live_, writer) : nullptr;
  }

  // Writer, as Insert: unlists everything (the owner's destructor), and
  // returns the array that listed it.
  template <class WriterLock>
  Array* Take(const WriterLock& writer) FTJIT_REQUIRES(writer) {
    writer.AssertHeld();
    live_ = dead_ = 0;
    return current_.exchange(new Array(kMinCapacity), std::memory_order_seq_cst);
  }

  // Items listed now (writer, as Insert).
  template <class WriterLock>
  size_t size(const WriterLock& writer) const FTJIT_REQUIRES(writer) {
    writer.AssertHeld();
    return live_;
  }

  static void Delete(void* array) { delete static_cast<Array*>(array); }

 private:
  static constexpr uintptr_t kEmpty = 0, kTombstone = 1;
  static constexpr size_t kMinCapacity = 8;

  // Swaps in an array of the live items and `extra` (if not null, under
  // `extra_hash`), `room` items in all, filling at most a quarter of its
  // slots, and returns the old one.
  template <class WriterLock>
  Array* Rebuild(Item* extra, size_t extra_hash, size_t room, const WriterLock& writer)
      FTJIT_REQUIRES(writer) {
    writer.AssertHeld();
    size_t cap = kMinCapacity;
    while (cap < 4 * room) cap *= 2;
    Array* next = new Array(cap);
    Array* cur = current_.load(std::memory_order_relaxed);
    for (size_t i = 0; i < cur->capacity(); ++i) {
      const auto& s = cur->slots_[i];
      uintptr_t word = s.item.load(std::memory_order_relaxed);
      if (word != kEmpty && word != kTombstone) {
        next->Put(s.hash, reinterpret_cast<Item*>(word), std::memory_order_relaxed);
      }
    }
    if (extra) next->Put(extra_hash, extra, std::memory_order_relaxed);
    dead_ = 0;
    return current_.exchange(next, std::memory_order_seq_cst);
  }

  std::atomic<Array*> current_;
  size_t live_ = 0;  // listed items in current_ (the writer's)
  size_t dead_ = 0;  // tombstones in current_ (the writer's)
};

}  // namespace ftjit
