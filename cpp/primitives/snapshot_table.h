// ftjit: an immutable hash table of items, published behind an atomic
// pointer: readers probe it with no lock and write nothing; a writer builds a
// whole new table and swaps it in, retiring the old one to an EpochDomain.
//
// Python-free and header-only. A table holds raw pointers: the owner keeps
// every item alive while any table a reader may still be probing lists it
// (entry_store.h retires an item's keep-alive reference together with the
// last table listing it). Building a table copies pointers only (no
// reference count is written), so a rebuild costs a few ns per item.
//
//   | member                  | protection                                   |
//   |-------------------------|----------------------------------------------|
//   | SnapshotTable (all)     | immutable once built                         |
//   | SnapshotPtr::current_   | atomic; stored (seq_cst) by Swap, which the  |
//   |                         | caller serialises with its own writer lock:  |
//   |                         | Swap(next, writer) FTJIT_REQUIRES(writer)    |
//
// Lock order: takes no locks (writers hold their own around Swap, e.g.
// entry_store.h's publish_mu_). Swap and Take name the writer lock as an
// argument, so that clang++ -Wthread-safety (thread_annotations.h) checks
// that each caller holds it, and they assert it held (debug builds).
//
// Readers: inside an EpochDomain read section, Load() (seq_cst, see
// epoch.h's argument) and Find(); items found may be used after the
// section only if the caller keeps them alive by other means.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "primitives/thread_annotations.h"

namespace ftjit {

template <class Item>
class SnapshotTable {
 public:
  // A table of `items` (hash, item); an empty one when `items` is empty.
  explicit SnapshotTable(std::vector<std::pair<size_t, Item*>> items) : items_(std::move(items)) {
    size_t cap = 4;
    while (cap < 2 * items_.size()) cap *= 2;  // load factor <= 1/2: short probes
    mask_ = cap - 1;
    slots_.reset(new Slot[cap]());
    for (const auto& kv : items_) {
      size_t i = kv.first & mask_;
      while (slots_[i].item) i = (i + 1) & mask_;
      slots_[i] = Slot{kv.first, kv.second};
    }
  }
  SnapshotTable(const SnapshotTable&) = delete;
  SnapshotTable& operator=(const SnapshotTable&) = delete;

  // The item whose `fast_eq(item, probe)` says kEqual among those stored
  // with `hash`, or null; *undecided is set when some candidate said
  // kUnknown (the caller then takes its slow path). `fast_eq` must be
  // Python-free, noexcept and never block.
  template <class Probe, class FastEqFn>
  Item* Find(size_t hash, const Probe& probe, FastEqFn&& fast_eq, bool* undecided) const {
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (!s.item) return nullptr;
      if (s.hash != hash) continue;
      auto r = fast_eq(*s.item, probe);
      if (r == decltype(r)::kEqual) return s.item;
      if (r == decltype(r)::kUnknown) *undecided = true;
    }
  }

  size_t size() const { return items_.size(); }
  // (hash, item) of every item, in the order given: what a rebuild starts from.
  const std::vector<std::pair<size_t, Item*>>& items() const { return items_; }

 private:
  struct Slot {
    size_t hash;
    Item* item;  // null: empty
  };
  size_t mask_ = 0;
  std::unique_ptr<Slot[]> slots_;
  std::vector<std::pair<size_t, Item*>> items_;
};

// The current table of one owner (never null: starts empty).
template <class Item>
class SnapshotPtr {
 public:
  using Table = SnapshotTable<Item>;

  SnapshotPtr() : current_(new Table({})) {}
  SnapshotPtr(const SnapshotPtr&) = delete;
  SnapshotPtr& operator=(const SnapshotPtr&) = delete;
  // Only when no reader can see it any more (the owner is being destroyed,
  // and retires the last table itself; see Take()).
  ~SnapshotPtr() { delete current_.load(std::memory_order_relaxed); }

  // Reader, inside a read section.
  const Table* Load() const { return current_.load(std::memory_order_seq_cst); }

  // Writer, under the caller's writer lock `writer` (a lock type of
  // locks.h, held by this thread): publishes `next` and returns the previous
  // table, which the caller retires (EpochDomain::Retire) after releasing
  // its lock.
  template <class WriterLock>
  Table* Swap(Table* next, const WriterLock& writer) FTJIT_REQUIRES(writer) {
    writer.AssertHeld();
    return current_.exchange(next, std::memory_order_seq_cst);
  }

  // Owner's destructor: unlinks the current table (leaving an empty one) for
  // the caller to retire.
  template <class WriterLock>
  Table* Take(const WriterLock& writer) FTJIT_REQUIRES(writer) {
    return Swap(new Table({}), writer);
  }

  static void Delete(void* table) { delete static_cast<Table*>(table); }

 private:
  std::atomic<Table*> current_;
};

}  // namespace ftjit
