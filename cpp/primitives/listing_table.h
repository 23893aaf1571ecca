// ftjit: a hash table of items that readers probe with no lock and write
// nothing, while a writer (one at a time, under its own lock) lists and
// unlists items in place, amortized O(1) each. Python-free. It holds raw
// pointers: the owner keeps an item alive while an array a reader may still
// probe lists it (EntryStore retires the item's reference when it unlists it).
//
// An open-addressing array (linear probing) behind an atomic pointer. Each
// slot goes empty -> item -> tombstone, never back, so a probe chain never
// breaks under a reader. When live items + tombstones would fill half the
// slots (Insert), or tombstones outnumber live items (Erase), the writer
// builds a new array of the live items, at most a quarter full, and swaps it
// in; the caller retires the old one (EpochDomain::Retire) after releasing
// its lock. Nothing writes an array once it is swapped out. An array of c'
// slots built for r items (c' <= max(8, 8 r)) is replaced only after >= c'/4
// inserts or d > r/2 erases (c' <= max(8, 16 d)), which pay for the O(c')
// rebuild that replaces it: O(1) each.
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
// Lock order: takes no locks. The writer lock is the caller's (EntryStore's
// publish_mu_), passed to every writer method so that the analysis checks
// the caller holds it (FTJIT_REQUIRES(writer)).
//
// Readers: inside an EpochDomain read section, Load() then Array::Find().
// The swap of current_ and the tombstone, both ways an item stops being
// reachable, are seq_cst stores, and so are a reader's loads of current_ and
// of every slot: they are the unlink (1) and the load (c) of EpochDomain's
// argument, so an item unlisted (then retired) after a reader loaded it
// stays alive until the reader leaves. A reader keeps probing the array it
// loaded, as a reader of an immutable snapshot would. The invariant: a probe
// whose Load() comes after an Insert(x) returned finds x, unless an Erase of
// x began before the probe ended.
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
  // Only when no reader can see it any more (the owner retired the last
  // array itself: Take()).
  ~ListingTable() { delete current_.load(std::memory_order_relaxed); }

  class Array {
   public:
    Array(const Array&) = delete;
    Array& operator=(const Array&) = delete;

    // The item listed with `hash` for which `fast_eq(item, probe)` says
    // kEqual, or null; *undecided is set when one said kUnknown. `fast_eq`
    // must be Python-free, noexcept and never block.
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
    // `order`: release into a published array; relaxed into one not
    // published yet, which the seq_cst store of current_ publishes whole.
    void Put(size_t hash, Item* item, std::memory_order order) {
      size_t i = hash & mask_;
      while (slots_[i].item.load(std::memory_order_relaxed) != kEmpty) i = (i + 1) & mask_;
      slots_[i].hash = hash;
      slots_[i].item.store(reinterpret_cast<uintptr_t>(item), order);
    }
    const size_t mask_;
    const std::unique_ptr<Slot[]> slots_;
  };

  const Array* Load() const { return current_.load(std::memory_order_seq_cst); }

  // Writer. Lists `item` (not listed now) under `hash`. Returns the array it
  // replaced, if it rebuilt, for the caller to retire (with Delete).
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
  // the hash given with it).
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

  // Writer: unlists everything (the owner's destructor); returns the array.
  template <class WriterLock>
  Array* Take(const WriterLock& writer) FTJIT_REQUIRES(writer) {
    writer.AssertHeld();
    live_ = dead_ = 0;
    return current_.exchange(new Array(kMinCapacity), std::memory_order_seq_cst);
  }

  template <class WriterLock>
  size_t size(const WriterLock& writer) const FTJIT_REQUIRES(writer) {
    writer.AssertHeld();
    return live_;
  }

  static void Delete(void* array) { delete static_cast<Array*>(array); }

 private:
  static constexpr uintptr_t kEmpty = 0, kTombstone = 1;
  static constexpr size_t kMinCapacity = 8;

  // Swaps in an array of the live items and `extra` (if not null), at most a
  // quarter full with `room` items, and returns the old one.
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
  size_t live_ = 0;  // listed items in current_
  size_t dead_ = 0;  // tombstones in current_
};

}  // namespace ftjit
