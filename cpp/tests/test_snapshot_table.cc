// ftjit tests: ftjit::SnapshotTable/SnapshotPtr read lock-free under ftjit::EpochDomain, against publishers, evictors and clears (run under TSAN).
#include "primitives/snapshot_table.h"

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

using Table = ftjit::SnapshotTable<Item>;
using Ptr = ftjit::SnapshotPtr<Item>;

// Tables hold raw pointers: the owner keeps what a table lists alive.
Table* MakeTable(const std::vector<std::shared_ptr<Item>>& items) {
  std::vector<std::pair<size_t, Item*>> v;
  for (auto& it : items) v.emplace_back(HashOf(it->key), it.get());
  return new Table(std::move(v));
}

// An unlinked table and the items only it still listed, freed together
// after the grace period (what entry_store.h's Unlisted does).
struct Retired {
  Table* table;
  std::vector<std::shared_ptr<Item>> items;
  static void Delete(void* p) {
    auto* r = static_cast<Retired*>(p);
    delete r->table;
    delete r;
  }
};

// Swaps in a table of `now`, retiring the old one with the items of `before`
// not in `now`, under the owner's writer lock `writer`.
void PublishLockHeld(const StdMutex& writer, Domain& domain, Ptr& ptr,
                     const std::vector<std::shared_ptr<Item>>& before,
                     const std::vector<std::shared_ptr<Item>>& now) FTJIT_REQUIRES(writer) {
  auto* r = new Retired{nullptr, {}};
  for (auto& it : before) {
    bool kept = false;
    for (auto& n : now) kept |= n == it;
    if (!kept) r->items.push_back(it);
  }
  r->table = ptr.Swap(MakeTable(now), writer);
  domain.Retire(r, &Retired::Delete);
}

// The writer lock of the single-threaded tests' owner.
StdMutex g_writer_mu;

// PublishLockHeld under g_writer_mu.
void Publish(Domain& domain, Ptr& ptr, const std::vector<std::shared_ptr<Item>>& before,
             const std::vector<std::shared_ptr<Item>>& now) FTJIT_EXCLUDES(g_writer_mu) {
  LockGuard<StdMutex> lock(g_writer_mu);
  PublishLockHeld(g_writer_mu, domain, ptr, before, now);
}

// Finds, probes and misses: every listed key is found, others are not, with
// colliding hashes (keys that share a bucket) too.
void TestFindAndMiss() {
  std::vector<std::shared_ptr<Item>> items;
  for (size_t k = 0; k < 100; ++k) items.push_back(std::make_shared<Item>(k * 3));
  std::unique_ptr<Table> t(MakeTable(items));
  CHECK_EQ(t->size(), size_t{100});
  for (size_t k = 0; k < 300; ++k) {
    bool undecided = false;
    Item* found = t->Find(HashOf(k), k, SameKey, &undecided);
    CHECK(!undecided);
    CHECK_EQ(found != nullptr, k % 3 == 0);
    if (found) CHECK_EQ(found->key, k);
  }
  // Same hash, different keys: the probe goes on past the first candidate.
  std::vector<std::shared_ptr<Item>> owners;
  std::vector<std::pair<size_t, Item*>> same;
  for (size_t k = 0; k < 5; ++k) {
    owners.push_back(std::make_shared<Item>(k));
    same.emplace_back(size_t{42}, owners.back().get());
  }
  Table collide(std::move(same));
  for (size_t k = 0; k < 5; ++k) {
    bool undecided = false;
    CHECK_EQ(collide.Find(42, k, SameKey, &undecided)->key, k);
  }
  bool undecided = false;
  CHECK(collide.Find(42, size_t{9}, SameKey, &undecided) == nullptr);
  // kUnknown is reported, not taken for a match.
  auto unknown = [](const Item&, const size_t&) noexcept { return FastEq::kUnknown; };
  undecided = false;
  CHECK(collide.Find(42, size_t{1}, unknown, &undecided) == nullptr);
  CHECK(undecided);
  Table empty({});
  undecided = false;
  CHECK(empty.Find(7, size_t{7}, SameKey, &undecided) == nullptr);
}

// Readers probe the current table in read sections while writers publish
// tables that add, evict (drop some) and clear (drop all) items, retiring
// the old ones. No reader may ever see an item freed; every retired table
// and every item no table lists is freed once the threads are done.
void TestReadersAgainstPublishersEvictorsAndClears() {
  const size_t kReaders = 6, kWriters = 2, kKeys = 64;
  const auto kRun = 1500ms;
  {
    Domain domain;
    Ptr ptr;
    StdMutex writer_mu;  // the owner's writer lock: serialises swaps
    std::vector<std::shared_ptr<Item>> listed;  // what the current table lists; guarded by writer_mu
    std::atomic<uint64_t> found{0}, probes{0}, swaps{0};
    ftjit_test::RunThreads(kReaders + kWriters, [&](size_t i) {
      Domain::Record* rec = domain.Acquire();
      std::mt19937_64 rng(i);
      auto deadline = std::chrono::steady_clock::now() + kRun;
      if (i < kReaders) {
        while (std::chrono::steady_clock::now() < deadline) {
          size_t key = rng() % kKeys;
          domain.EnterRead(rec);
          const Table* t = ptr.Load();
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
            PublishLockHeld(writer_mu, domain, ptr, before, listed);
          }
          swaps.fetch_add(1, std::memory_order_relaxed);
        }
      }
      Domain::Release(rec);
    });
    CHECK(found.load() > 0);
    CHECK(swaps.load() > 10);
    std::fprintf(stderr, "  %llu probes, %llu found, %llu swaps\n",
                 static_cast<unsigned long long>(probes.load()),
                 static_cast<unsigned long long>(found.load()),
                 static_cast<unsigned long long>(swaps.load()));
    // Nothing retired waits: what a reclaim kept for a reader was freed
    // when that reader left (no manual Reclaim here: that is the point).
    CHECK_EQ(domain.retired_count(), size_t{0});
    CHECK_EQ(g_live_items.load(), static_cast<int64_t>(listed.size()));
    Publish(domain, ptr, listed, {});  // the threads are done: the test's lock will do
    listed.clear();
    CHECK_EQ(g_live_items.load(), int64_t{0});
  }
  CHECK_EQ(g_live_items.load(), int64_t{0});
}

// A reader inside its section holds back exactly what was retired while it
// could see it, and frees it itself as it leaves, with no later write; what
// is retired after it leaves goes at once.
void TestReclaimWaitsForTheReaderOnly() {
  Domain domain;
  Ptr ptr;
  std::vector<std::shared_ptr<Item>> one{std::make_shared<Item>(1)};
  Publish(domain, ptr, {}, one);
  Domain::Record* reader = domain.Acquire();
  domain.EnterRead(reader);
  const Table* seen = ptr.Load();
  CHECK(seen->size() == 1);
  // A writer unlinks the table the reader holds (and the item only it listed): both must stay.
  Publish(domain, ptr, one, {});
  one.clear();
  CHECK_EQ(domain.retired_count(), size_t{1});
  CHECK_EQ(g_live_items.load(), int64_t{1});
  bool undecided = false;
  Item* it = seen->Find(HashOf(1), size_t{1}, SameKey, &undecided);
  CHECK(it != nullptr && it->canary.load() == kAlive);
  // Leaving frees it: nothing else is written, nobody calls Reclaim.
  domain.LeaveRead(reader);
  CHECK_EQ(domain.retired_count(), size_t{0});
  CHECK_EQ(g_live_items.load(), int64_t{0});
  // Retired while nobody reads: freed at once.
  std::vector<std::shared_ptr<Item>> three{std::make_shared<Item>(3)};
  Publish(domain, ptr, {}, three);
  Publish(domain, ptr, three, {});
  three.clear();
  CHECK_EQ(domain.retired_count(), size_t{0});
  CHECK_EQ(g_live_items.load(), int64_t{0});
  // A reader that enters after a retire never holds it back: r1 holds what
  // is retired while it reads; r2, entering later, does not.
  Domain::Record* r2 = domain.Acquire();
  std::vector<std::shared_ptr<Item>> two{std::make_shared<Item>(2)};
  Publish(domain, ptr, {}, two);
  domain.EnterRead(reader);
  Publish(domain, ptr, two, {});
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
  Ptr ptr;
  std::vector<std::shared_ptr<Item>> one{std::make_shared<Item>(1)};
  Publish(domain, ptr, {}, one);
  Domain::Record* reader = domain.Acquire();
  domain.EnterRead(reader);
  CHECK(ptr.Load()->size() == 1);
  Publish(domain, ptr, one, {});  // kept: the reader reads
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
  Ptr ptr;
  std::vector<std::shared_ptr<Item>> one{std::make_shared<Item>(1)};
  Publish(domain, ptr, {}, one);
  Domain::Record* reader = domain.Acquire();
  domain.EnterRead(reader);
  std::thread([&] {
    t_may_not_free = true;
    Publish(domain, ptr, one, {});  // queued, not freed, even with no reader...
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
  Ptr ptr;
  Domain::Record* mine = domain.Acquire();
  Domain::Record* lost = domain.Acquire();  // a thread that is not in the child
  domain.EnterRead(lost);
  domain.AfterForkInChild(mine);
  CHECK_EQ(domain.owned_records(), size_t{1});
  std::vector<std::shared_ptr<Item>> one{std::make_shared<Item>(1)};
  Publish(domain, ptr, {}, one);
  Publish(domain, ptr, one, {});
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
  RUN_TEST(TestReadersAgainstPublishersEvictorsAndClears);
  RUN_TEST(TestReclaimWaitsForTheReaderOnly);
  RUN_TEST(TestLeaveReadCoversEarlierExitReads);
  RUN_TEST(TestRetireWhereFreeingIsNotAllowedOnlyQueues);
  RUN_TEST(TestAfterForkReleasesOtherThreadsRecords);
  RUN_TEST(TestRecordsAreReused);
  std::fprintf(stderr, "all SnapshotTable/EpochDomain tests passed\n");
  return 0;
}
