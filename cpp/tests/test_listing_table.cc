// ftjit tests: ftjit::ListingTable read lock-free under ftjit::EpochDomain, against writers that list, evict, clear and rebuild (run under TSAN).
#include "primitives/listing_table.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "primitives/epoch.h"
#include "primitives/locks.h"
#include "primitives/thread_annotations.h"

namespace {

using Domain = ftjit::EpochDomain<ftjit::StdMutex>;
using ftjit::LockGuard;
using ftjit::StdMutex;
using namespace std::chrono_literals;

constexpr int kAlive = 0x5eed;
constexpr int kDead = -1;

std::atomic<int64_t> g_live_items{0};

// An item whose canary a reader checks while it may still be listed: a
// freed item (use after free) reads kDead or races with the free under TSAN.
struct Item {
  explicit Item(size_t k) : key(k) { g_live_items.fetch_add(1); }
  ~Item() {
    canary.store(kDead, std::memory_order_relaxed);
    g_live_items.fetch_sub(1);
  }
  const size_t key;
  std::atomic<int> canary{kAlive};
};

enum class FastEq { kEqual, kNotEqual, kUnknown };
FastEq SameKey(const Item& stored, const size_t& probe) noexcept {
  return stored.key == probe ? FastEq::kEqual : FastEq::kNotEqual;
}
size_t HashOf(size_t key) { return key * 0x9e3779b97f4a7c15ULL; }

using Table = ftjit::ListingTable<Item>;
using Array = Table::Array;

// Arrays a table replaced and the items only they still listed, freed
// together after the grace period (what EntryStore's Unlisted does).
struct Retired {
  std::vector<Array*> arrays;
  std::vector<std::shared_ptr<Item>> items;
  static void Delete(void* p) {
    auto* r = static_cast<Retired*>(p);
    for (Array* a : r->arrays) delete a;
    delete r;
  }
};

// Makes the table list `now` instead of `before` (both free of duplicates)
// under the owner's writer lock `writer`: erases what left, inserts what
// came, and retires the replaced arrays with the items erased.
void PublishLockHeld(const StdMutex& writer, Domain& domain, Table& table,
                     const std::vector<std::shared_ptr<Item>>& before,
                     const std::vector<std::shared_ptr<Item>>& now) FTJIT_REQUIRES(writer) {
  auto* r = new Retired{};
  auto in = [](const std::vector<std::shared_ptr<Item>>& v, const std::shared_ptr<Item>& it) {
    return std::find(v.begin(), v.end(), it) != v.end();
  };
  std::vector<std::pair<size_t, Item*>> gone;
  for (auto& it : before) {
    if (!in(now, it)) {
      gone.emplace_back(HashOf(it->key), it.get());
      r->items.push_back(it);
    }
  }
  if (Array* old = table.Erase(gone, writer)) r->arrays.push_back(old);
  for (auto& it : now) {
    if (in(before, it)) continue;
    if (Array* old = table.Insert(HashOf(it->key), it.get(), writer)) r->arrays.push_back(old);
  }
  domain.Retire(r, &Retired::Delete);
}

// The writer lock of the single-threaded tests' owner.
StdMutex g_writer_mu;

// PublishLockHeld under g_writer_mu.
void Publish(Domain& domain, Table& table, const std::vector<std::shared_ptr<Item>>& before,
             const std::vector<std::shared_ptr<Item>>& now) FTJIT_EXCLUDES(g_writer_mu) {
  LockGuard<StdMutex> lock(g_writer_mu);
  PublishLockHeld(g_writer_mu, domain, table, before, now);
}

// Lists `items` in a fresh table (single-threaded: replaced arrays are
// deleted at once).
void ListAll(Table& table, const std::vector<std::pair<size_t, Item*>>& items) FTJIT_EXCLUDES(g_writer_mu) {
  LockGuard<StdMutex> lock(g_writer_mu);
  for (const auto& [hash, item] : items) delete table.Insert(hash, item, g_writer_mu);
}

// Finds, probes and misses: every listed key is found, others are not, with
// colliding hashes (keys that share a bucket) too, and after tombstones.
void TestFindAndMiss() {
  std::vector<std::shared_ptr<Item>> items;
  std::vector<std::pair<size_t, Item*>> listed;
  for (size_t k = 0; k < 100; ++k) {
    items.push_back(std::make_shared<Item>(k * 3));
    listed.emplace_back(HashOf(k * 3), items.back().get());
  }
  Table t;
  ListAll(t, listed);
  {
    LockGuard<StdMutex> lock(g_writer_mu);
    CHECK_EQ(t.size(g_writer_mu), size_t{100});
  }
  for (size_t k = 0; k < 300; ++k) {
    bool undecided = false;
    Item* found = t.Load()->Find(HashOf(k), k, SameKey, &undecided);
    CHECK(!undecided);
    CHECK_EQ(found != nullptr, k % 3 == 0);
    if (found) CHECK_EQ(found->key, k);
  }
  // Same hash, different keys: the probe goes on past the first candidate,
  // and past a tombstone.
  std::vector<std::shared_ptr<Item>> owners;
  std::vector<std::pair<size_t, Item*>> same;
  for (size_t k = 0; k < 5; ++k) {
    owners.push_back(std::make_shared<Item>(k));
    same.emplace_back(size_t{42}, owners.back().get());
  }
  Table collide;
  ListAll(collide, same);
  for (size_t k = 0; k < 5; ++k) {
    bool undecided = false;
    CHECK_EQ(collide.Load()->Find(42, k, SameKey, &undecided)->key, k);
  }
  {
    LockGuard<StdMutex> lock(g_writer_mu);
    delete collide.Erase({same[1]}, g_writer_mu);  // 1 tombstone, 4 live: no rebuild
    CHECK_EQ(collide.size(g_writer_mu), size_t{4});
  }
  for (size_t k = 0; k < 5; ++k) {
    bool undecided = false;
    Item* found = collide.Load()->Find(42, k, SameKey, &undecided);
    CHECK_EQ(found != nullptr, k != 1);
    if (found) CHECK_EQ(found->key, k);
  }
  bool undecided = false;
  CHECK(collide.Load()->Find(42, size_t{9}, SameKey, &undecided) == nullptr);
  // kUnknown is reported, not taken for a match.
  auto unknown = [](const Item&, const size_t&) noexcept { return FastEq::kUnknown; };
  undecided = false;
  CHECK(collide.Load()->Find(42, size_t{2}, unknown, &undecided) == nullptr);
  CHECK(undecided);
  Table empty;
  undecided = false;
  CHECK(empty.Load()->Find(7, size_t{7}, SameKey, &undecided) == nullptr);
}

// A single-threaded owner that lists and unlists fresh items and counts what
// the table's rebuilds walk (the capacities of the arrays they replace).
struct Churn {
  Table table;
  std::vector<std::unique_ptr<Item>> owned;
  std::vector<Item*> listed;  // what the table lists
  size_t ops = 0, walked = 0, rebuilds = 0;

  void Took(Array* old) FTJIT_REQUIRES(g_writer_mu) {
    ++ops;
    if (!old) return;
    ++rebuilds;
    walked += old->capacity();
    delete old;
    // Right after a rebuild: at most 8 slots per item listed (or 8).
    CHECK(table.Load()->capacity() <= 8 * std::max<size_t>(listed.size(), 1));
  }
  void Insert() FTJIT_REQUIRES(g_writer_mu) {
    owned.push_back(std::make_unique<Item>(owned.size()));
    Item* it = owned.back().get();
    listed.push_back(it);
    Took(table.Insert(HashOf(it->key), it, g_writer_mu));
  }
  void EraseAt(size_t i) FTJIT_REQUIRES(g_writer_mu) {
    Item* it = listed[i];
    listed[i] = listed.back();
    listed.pop_back();
    Took(table.Erase({{HashOf(it->key), it}}, g_writer_mu));
  }
  // Lists exactly `listed`, at most half full.
  void CheckShape() FTJIT_REQUIRES(g_writer_mu) {
    CHECK_EQ(table.size(g_writer_mu), listed.size());
    CHECK(table.Load()->capacity() >= 2 * listed.size());
    for (Item* it : listed) {
      bool undecided = false;
      CHECK(table.Load()->Find(HashOf(it->key), it->key, SameKey, &undecided) == it);
    }
  }
};

// What the rebuilds cost, counted, not timed: over growth, churn, draining
// one by one and a batch erase, the slots they walk stay within a constant
// per insert or erase (the header's argument gives 16), so listing and
// unlisting are O(1) amortized whatever the number listed; an array right
// after a rebuild has at most 8 slots per item listed; and a single erase
// among many items does not rebuild.
void TestRebuildsCostAConstantPerOperation() {
  const size_t kMany = 20000;
  std::mt19937_64 rng(7);
  LockGuard<StdMutex> lock(g_writer_mu);
  Churn c;
  // Growth from empty to kMany.
  while (c.listed.size() < kMany) c.Insert();
  c.CheckShape();
  // One erase among kMany (an eviction): a tombstone, no rebuild.
  size_t before = c.rebuilds;
  c.EraseAt(rng() % c.listed.size());
  CHECK_EQ(c.rebuilds, before);
  // Churn at about kMany: evictions and misses alternate.
  for (size_t n = 0; n < 4 * kMany; ++n) {
    if (n % 2) {
      c.Insert();
    } else {
      c.EraseAt(rng() % c.listed.size());
    }
  }
  c.CheckShape();
  // Draining one by one (evictions in a loop): the array shrinks with it.
  while (c.listed.size() > 10) c.EraseAt(rng() % c.listed.size());
  c.CheckShape();
  CHECK(c.table.Load()->capacity() <= 8 * 16);
  // Refilled, then a batch erase (a clear) of all but 3: one rebuild.
  while (c.listed.size() < kMany / 2) c.Insert();
  std::vector<std::pair<size_t, Item*>> batch;
  while (c.listed.size() > 3) {
    batch.emplace_back(HashOf(c.listed.back()->key), c.listed.back());
    c.listed.pop_back();
  }
  before = c.rebuilds;
  c.Took(c.table.Erase(batch, g_writer_mu));
  CHECK_EQ(c.rebuilds, before + 1);
  c.CheckShape();
  std::fprintf(stderr, "  %zu operations, %zu rebuilds, %zu slots walked by them\n", c.ops, c.rebuilds, c.walked);
  CHECK(c.rebuilds > 20);
  CHECK(c.walked <= 16 * c.ops);
  delete c.table.Take(g_writer_mu);
  CHECK_EQ(c.table.size(g_writer_mu), size_t{0});
}

// Readers probe the current array in read sections while writers list,
// evict (unlist some) and clear (unlist all), rebuilding as they go and
// retiring what they replace. No reader may ever see an item freed; every
// retired array and every item no array lists is freed once the threads are
// done.
void TestReadersAgainstPublishersEvictorsAndClears() {
  const size_t kReaders = 6, kWriters = 2, kKeys = 64;
  const auto kRun = 1500ms;
  {
    Domain domain;
    Table table;
    StdMutex writer_mu;  // the owner's writer lock: serialises writes
    std::vector<std::shared_ptr<Item>> listed;  // what the table lists; guarded by writer_mu
    std::atomic<uint64_t> found{0}, probes{0}, writes{0};
    ftjit_test::RunThreads(kReaders + kWriters, [&](size_t i) {
      Domain::Record* rec = domain.Acquire();
      std::mt19937_64 rng(i);
      auto deadline = std::chrono::steady_clock::now() + kRun;
      if (i < kReaders) {
        while (std::chrono::steady_clock::now() < deadline) {
          size_t key = rng() % kKeys;
          domain.EnterRead(rec);
          const Array* t = table.Load();
          bool undecided = false;
          Item* it = t->Find(HashOf(key), key, SameKey, &undecided);
          if (it) {
            CHECK_EQ(it->canary.load(std::memory_order_relaxed), kAlive);
            CHECK_EQ(it->key, key);
            found.fetch_add(1, std::memory_order_relaxed);
          }
          domain.LeaveRead(rec);
          probes.fetch_add(1, std::memory_order_relaxed);
        }
      } else {
        while (std::chrono::steady_clock::now() < deadline) {
          {
            LockGuard<StdMutex> lock(writer_mu);
            std::vector<std::shared_ptr<Item>> before = listed;
            switch (rng() % 4) {
              case 0:  // clear
                listed.clear();
                break;
              case 1:  // evict a few
                for (int n = 0; n < 4 && !listed.empty(); ++n) {
                  listed.erase(listed.begin() + static_cast<long>(rng() % listed.size()));
                }
                break;
              default:  // publish new ones (fresh objects, even for listed keys)
                for (int n = 0; n < 8; ++n) {
                  size_t key = rng() % kKeys;
                  bool have = false;
                  for (auto& it : listed) have |= it->key == key;
                  if (!have) listed.push_back(std::make_shared<Item>(key));
                }
            }
            // (Retiring under the writer lock is fine here: the deleters run
            // no code that takes it.)
            PublishLockHeld(writer_mu, domain, table, before, listed);
          }
          writes.fetch_add(1, std::memory_order_relaxed);
        }
      }
      Domain::Release(rec);
    });
    CHECK(found.load() > 0);
    CHECK(writes.load() > 10);
    std::fprintf(stderr, "  %llu probes, %llu found, %llu writes\n",
                 static_cast<unsigned long long>(probes.load()),
                 static_cast<unsigned long long>(found.load()),
                 static_cast<unsigned long long>(writes.load()));
    // Nothing retired waits: what a reclaim kept for a reader was freed
    // when that reader left (no manual Reclaim here: that is the point).
    CHECK_EQ(domain.retired_count(), size_t{0});
    CHECK_EQ(g_live_items.load(), static_cast<int64_t>(listed.size()));
    Publish(domain, table, listed, {});  // the threads are done: the test's lock will do
    listed.clear();
    CHECK_EQ(g_live_items.load(), int64_t{0});
  }
  CHECK_EQ(g_live_items.load(), int64_t{0});
}

// The exact invariant, under concurrent rebuilds: a reader finds every item
// listed (Insert returned) and not being unlisted (no Erase of it begun)
// throughout its probe, never one whose unlisting ended before its probe
// began, and never a freed one. Each key's state is a generation and a phase,
// which the writers (one at a time, under the writer lock) set around every
// Insert and Erase; a reader reads it before and after its probe. Writers
// list up to kKeys items, evict single ones and clear in batches, so that the
// array grows, fills with tombstones and is rebuilt both ways while readers
// probe.
void TestReadersFindExactlyTheListedItemsAcrossRebuilds() {
  const size_t kReaders = 4, kWriters = 2, kKeys = 1024;
  const auto kRun = 1500ms;
  enum Phase : uint64_t { kAbsent = 0, kListed = 1, kInserting = 2, kErasing = 3 };
  struct Versioned : Item {
    Versioned(size_t k, uint64_t g) : Item(k), gen(g) {}
    const uint64_t gen;
  };
  struct Doomed {  // what an Erase retires: the items it unlisted, and the array replaced
    Array* array = nullptr;
    std::vector<std::unique_ptr<Versioned>> items;
    static void Delete(void* p) {
      auto* d = static_cast<Doomed*>(p);
      delete d->array;
      delete d;
    }
  };
  Domain domain;
  Table table;
  StdMutex writer_mu;
  std::vector<std::atomic<uint64_t>> state(kKeys);  // gen * 4 + phase; written under writer_mu
  std::vector<std::unique_ptr<Versioned>> owned(kKeys);  // the listed item of each key; guarded by writer_mu
  std::vector<size_t> listed_keys;                       // guarded by writer_mu
  std::atomic<uint64_t> must_find{0}, must_miss{0}, rebuilt_on_insert{0}, rebuilt_on_erase{0};
  auto gen_of = [](uint64_t s) { return s >> 2; };
  ftjit_test::RunThreads(kReaders + kWriters, [&](size_t i) {
    Domain::Record* rec = domain.Acquire();
    std::mt19937_64 rng(i + 100);
    auto deadline = std::chrono::steady_clock::now() + kRun;
    if (i < kReaders) {
      while (std::chrono::steady_clock::now() < deadline) {
        size_t key = rng() % kKeys;
        uint64_t s1 = state[key].load(std::memory_order_seq_cst);
        domain.EnterRead(rec);
        bool undecided = false;
        auto* it = static_cast<Versioned*>(table.Load()->Find(HashOf(key), key, SameKey, &undecided));
        if (it) {
          CHECK_EQ(it->canary.load(std::memory_order_relaxed), kAlive);
          CHECK_EQ(it->key, key);
        }
        uint64_t gen = it ? it->gen : 0;
        domain.LeaveRead(rec);
        uint64_t s2 = state[key].load(std::memory_order_seq_cst);
        CHECK(!undecided);
        if (it) CHECK(gen_of(s1) <= gen && gen <= gen_of(s2));  // never a stale or future item
        if (s1 == s2 && (s1 & 3) == kListed) {
          CHECK(it != nullptr);
          CHECK_EQ(gen, gen_of(s1));
          must_find.fetch_add(1, std::memory_order_relaxed);
        } else if (s1 == s2 && (s1 & 3) == kAbsent) {
          CHECK(it == nullptr);
          must_miss.fetch_add(1, std::memory_order_relaxed);
        }
      }
    } else {
      while (std::chrono::steady_clock::now() < deadline) {
        Doomed* doomed = new Doomed;
        Array* grown = nullptr;
        {
          LockGuard<StdMutex> lock(writer_mu);
          uint64_t op = rng() % 1024;  // about 370 listed between clears
          std::vector<size_t> gone;
          if (op == 0) {  // clear: all of them
            gone.swap(listed_keys);
          } else if (op < 400 && !listed_keys.empty()) {  // evict one
            size_t j = rng() % listed_keys.size();
            gone.push_back(listed_keys[j]);
            listed_keys[j] = listed_keys.back();
            listed_keys.pop_back();
          } else {  // list one, if not listed
            size_t key = rng() % kKeys;
            if (!owned[key]) {
              uint64_t g = gen_of(state[key].load(std::memory_order_relaxed));
              state[key].store(g * 4 + kInserting, std::memory_order_seq_cst);
              owned[key] = std::make_unique<Versioned>(key, g);
              grown = table.Insert(HashOf(key), owned[key].get(), writer_mu);
              state[key].store(g * 4 + kListed, std::memory_order_seq_cst);
              listed_keys.push_back(key);
            }
          }
          if (!gone.empty()) {
            std::vector<std::pair<size_t, Item*>> items;
            for (size_t key : gone) {
              uint64_t g = gen_of(state[key].load(std::memory_order_relaxed));
              state[key].store(g * 4 + kErasing, std::memory_order_seq_cst);
              items.emplace_back(HashOf(key), owned[key].get());
              doomed->items.push_back(std::move(owned[key]));
            }
            doomed->array = table.Erase(items, writer_mu);
            for (size_t key : gone) {
              uint64_t g = gen_of(state[key].load(std::memory_order_relaxed));
              state[key].store((g + 1) * 4 + kAbsent, std::memory_order_seq_cst);
            }
          }
        }
        if (grown) {
          rebuilt_on_insert.fetch_add(1, std::memory_order_relaxed);
          domain.Retire(grown, &Table::Delete);
        }
        if (doomed->array) rebuilt_on_erase.fetch_add(1, std::memory_order_relaxed);
        if (doomed->items.empty()) {
          delete doomed;
        } else {
          domain.Retire(doomed, &Doomed::Delete);
        }
      }
    }
    Domain::Release(rec);
  });
  std::fprintf(stderr, "  %llu probes had to find, %llu had to miss; rebuilt %llu times on insert, %llu on erase\n",
               static_cast<unsigned long long>(must_find.load()),
               static_cast<unsigned long long>(must_miss.load()),
               static_cast<unsigned long long>(rebuilt_on_insert.load()),
               static_cast<unsigned long long>(rebuilt_on_erase.load()));
  CHECK(must_find.load() > 0 && must_miss.load() > 0);
  CHECK(rebuilt_on_insert.load() > 0 && rebuilt_on_erase.load() > 0);
  CHECK_EQ(domain.retired_count(), size_t{0});
  LockGuard<StdMutex> lock(writer_mu);
  CHECK_EQ(table.size(writer_mu), listed_keys.size());
}

// A reader inside its section holds back exactly what was retired while it
// could see it, and frees it itself as it leaves, with no later write; what
// is retired after it leaves goes at once.
void TestReclaimWaitsForTheReaderOnly() {
  Domain domain;
  Table table;
  std::vector<std::shared_ptr<Item>> one{std::make_shared<Item>(1)};
  Publish(domain, table, {}, one);
  Domain::Record* reader = domain.Acquire();
  domain.EnterRead(reader);
  bool undecided = false;
  Item* it = table.Load()->Find(HashOf(1), size_t{1}, SameKey, &undecided);
  CHECK(it != nullptr);
  // A writer unlists the item the reader found (and retires the array it
  // probed, rebuilt empty): both must stay.
  Publish(domain, table, one, {});
  one.clear();
  CHECK_EQ(domain.retired_count(), size_t{1});
  CHECK_EQ(g_live_items.load(), int64_t{1});
  CHECK(it->canary.load() == kAlive);
  CHECK(table.Load()->Find(HashOf(1), size_t{1}, SameKey, &undecided) == nullptr);  // unlisted
  // Leaving frees it: nothing else is written, nobody calls Reclaim.
  domain.LeaveRead(reader);
  CHECK_EQ(domain.retired_count(), size_t{0});
  CHECK_EQ(g_live_items.load(), int64_t{0});
  // Retired while nobody reads: freed at once.
  std::vector<std::shared_ptr<Item>> three{std::make_shared<Item>(3)};
  Publish(domain, table, {}, three);
  Publish(domain, table, three, {});
  three.clear();
  CHECK_EQ(domain.retired_count(), size_t{0});
  CHECK_EQ(g_live_items.load(), int64_t{0});
  // A reader that enters after a retire never holds it back: r1 holds what
  // is retired while it reads; r2, entering later, does not.
  Domain::Record* r2 = domain.Acquire();
  std::vector<std::shared_ptr<Item>> two{std::make_shared<Item>(2)};
  Publish(domain, table, {}, two);
  domain.EnterRead(reader);
  Publish(domain, table, two, {});
  two.clear();
  domain.EnterRead(r2);
  CHECK_EQ(domain.Reclaim(), size_t{1});
  CHECK_EQ(g_live_items.load(), int64_t{1});
  domain.LeaveRead(reader);  // r2 still reads, and does not matter
  CHECK_EQ(domain.retired_count(), size_t{0});
  CHECK_EQ(g_live_items.load(), int64_t{0});
  domain.LeaveRead(r2);
  Domain::Release(r2);
  Domain::Release(reader);
}

// A section ended by ExitRead (the hit path's probe) is covered by the
// thread's next LeaveRead (its FinishCall), even when that next section
// began after the retirement its first one held back.
void TestLeaveReadCoversEarlierExitReads() {
  Domain domain;
  Table table;
  std::vector<std::shared_ptr<Item>> one{std::make_shared<Item>(1)};
  Publish(domain, table, {}, one);
  Domain::Record* reader = domain.Acquire();
  domain.EnterRead(reader);
  CHECK(table.Load() != nullptr);
  Publish(domain, table, one, {});  // kept: the reader reads
  one.clear();
  Domain::ExitRead(reader);
  CHECK_EQ(domain.retired_count(), size_t{1});  // ExitRead frees nothing
  domain.EnterRead(reader);  // a later section, entered after the retirement
  domain.LeaveRead(reader);
  CHECK_EQ(domain.retired_count(), size_t{0});
  CHECK_EQ(g_live_items.load(), int64_t{0});
  Domain::Release(reader);
}

// A thread that may not run deleters (the extension: no Python thread state,
// being unwound at interpreter shutdown) only queues what it retires; a
// reader that was reading then frees it as it leaves, on a thread that may.
thread_local bool t_may_not_free = false;
void TestRetireWhereFreeingIsNotAllowedOnlyQueues() {
  Domain domain([] { return !t_may_not_free; });
  Table table;
  std::vector<std::shared_ptr<Item>> one{std::make_shared<Item>(1)};
  Publish(domain, table, {}, one);
  Domain::Record* reader = domain.Acquire();
  domain.EnterRead(reader);
  std::thread([&] {
    t_may_not_free = true;
    Publish(domain, table, one, {});  // queued, not freed, even with no reader...
    one.clear();
    CHECK_EQ(domain.Reclaim(), size_t{1});  // ...and a reclaim here frees nothing
    CHECK_EQ(g_live_items.load(), int64_t{1});
  }).join();
  CHECK_EQ(domain.retired_count(), size_t{1});
  domain.LeaveRead(reader);  // this thread may free: it does, unasked
  CHECK_EQ(domain.retired_count(), size_t{0});
  CHECK_EQ(g_live_items.load(), int64_t{0});
  Domain::Release(reader);
}

// After fork, the records of the parent's other threads are released: an
// epoch one of them announced must not hold every reclaim back forever.
void TestAfterForkReleasesOtherThreadsRecords() {
  Domain domain;
  Table table;
  Domain::Record* mine = domain.Acquire();
  Domain::Record* lost = domain.Acquire();  // a thread that is not in the child
  domain.EnterRead(lost);
  domain.AfterForkInChild(mine);
  CHECK_EQ(domain.owned_records(), size_t{1});
  std::vector<std::shared_ptr<Item>> one{std::make_shared<Item>(1)};
  Publish(domain, table, {}, one);
  Publish(domain, table, one, {});
  one.clear();
  CHECK_EQ(domain.retired_count(), size_t{0});  // not held back by `lost`
  CHECK_EQ(g_live_items.load(), int64_t{0});
  CHECK(domain.Acquire() == lost);  // and it is reused
  Domain::Release(lost);
  Domain::Release(mine);
}

// Records are reused: threads that come and go do not grow the list.
void TestRecordsAreReused() {
  Domain domain;
  for (int round = 0; round < 50; ++round) {
    ftjit_test::RunThreads(4, [&](size_t) {
      Domain::Record* r = domain.Acquire();
      domain.EnterRead(r);
      domain.LeaveRead(r);
      Domain::Release(r);
    });
  }
  size_t n = 0;
  // Acquire every record there is (and one more): at most 4 + 1 exist.
  std::vector<Domain::Record*> all;
  for (int i = 0; i < 8; ++i) all.push_back(domain.Acquire());
  for (Domain::Record* r : all) {
    ++n;
    Domain::Release(r);
  }
  CHECK_EQ(n, size_t{8});
  // 8 acquired at once: 4 reused from the rounds, 4 new; no more were made.
  std::vector<Domain::Record*> again;
  for (int i = 0; i < 8; ++i) again.push_back(domain.Acquire());
  std::sort(all.begin(), all.end());
  std::sort(again.begin(), again.end());
  CHECK(all == again);
  for (Domain::Record* r : again) Domain::Release(r);
}

}  // namespace

int main() {
  RUN_TEST(TestFindAndMiss);
  RUN_TEST(TestRebuildsCostAConstantPerOperation);
  RUN_TEST(TestReadersAgainstPublishersEvictorsAndClears);
  RUN_TEST(TestReadersFindExactlyTheListedItemsAcrossRebuilds);
  RUN_TEST(TestReclaimWaitsForTheReaderOnly);
  RUN_TEST(TestLeaveReadCoversEarlierExitReads);
  RUN_TEST(TestRetireWhereFreeingIsNotAllowedOnlyQueues);
  RUN_TEST(TestAfterForkReleasesOtherThreadsRecords);
  RUN_TEST(TestRecordsAreReused);
  std::fprintf(stderr, "all ListingTable/EpochDomain tests passed\n");
  return 0;
}
