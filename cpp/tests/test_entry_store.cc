// ftjit tests: ftjit::EntryStore, the map + ready table + LRU + latch wired as the extension wires them, driven the way a jitted call drives them (run under TSAN).
#include "entry_store.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "check.h"

// Built twice: with std::mutex, and (FTJIT_TEST_LEAF_MUTEX, by dev.sh
// tsan-ft against a ThreadSanitizer-built free-threaded CPython) with the
// extension's own lock, LeafMutex, which is a PyMutex there.
#ifdef FTJIT_TEST_LEAF_MUTEX
#include "leaf_mutex.h"
#ifndef Py_GIL_DISABLED
#error "the LeafMutex build of this test needs a free-threaded CPython's headers"
#endif
using TestMutex = ftjit::LeafMutex;
#else
using TestMutex = std::mutex;
#endif

namespace {

using namespace std::chrono_literals;

constexpr int kAlive = 0x5eed;
std::atomic<int64_t> g_live_payloads{0};

struct TestSig {
  size_t hash;
  int key;
};

// What a "compile" leaves: the key's result, and a canary a caller checks
// while it uses the payload (a freed entry reads dead, or races under TSAN).
struct TestPayload {
  TestPayload() { g_live_payloads.fetch_add(1); }
  ~TestPayload() {
    canary.store(-1, std::memory_order_relaxed);
    g_live_payloads.fetch_sub(1);
  }
  int value = 0;
  std::atomic<int> canary{kAlive};
};

enum class FastEq { kEqual, kNotEqual, kUnknown };

struct TestTraits {
  using Sig = TestSig;
  using Payload = TestPayload;
  using Mutex = TestMutex;
  static FastEq FastEquals(const TestSig& a, const TestSig& b) noexcept {
    return a.key == b.key ? FastEq::kEqual : FastEq::kNotEqual;
  }
  static bool Equals(const TestSig& a, const TestSig& b) { return a.key == b.key; }
  static ftjit::EpochDomain<TestMutex>& Epochs() {
    static auto* domain = new ftjit::EpochDomain<TestMutex>();
    return *domain;
  }
  static ftjit::EpochDomain<TestMutex>::Record* ThreadRecord() {
    struct Holder {
      ftjit::EpochDomain<TestMutex>::Record* rec = Epochs().Acquire();
      ~Holder() { ftjit::EpochDomain<TestMutex>::Release(rec); }
    };
    thread_local Holder holder;
    return holder.rec;
  }
};

using Store = ftjit::EntryStore<TestTraits>;
using Core = ftjit::StoreCore<TestTraits>;
using Entry = Store::Entry;
using State = ftjit::CompileLatch::State;

TestSig SigOf(int key) { return TestSig{static_cast<size_t>(key) * 0x9e3779b97f4a7c15ULL, key}; }

// Per key: how many compiles ran, and how many run now. With `strict`, a
// second compile of a key while one runs is a failure: compile-once holds
// as long as nothing clears the store (a clear drops a compiling entry: its
// compile finishes and serves its waiters, and the next caller compiles
// afresh meanwhile, by design).
struct Ledger {
  Ledger(int keys, bool strict) : compiles(keys), running(keys), strict(strict) {}
  std::vector<std::atomic<int>> compiles;
  std::vector<std::atomic<int>> running;
  const bool strict;
};

// One call of key `key`, as jit_function.cc's Call makes it: the lock-free
// hit path, else find-or-insert; the inserting thread "compiles" (the
// result is key * 2), publishes and lists it; others wait on the latch.
// Returns the value the call used (-1: a compile it waited for was
// abandoned and it looked again... never here) and checks the canary.
int CallOnce(Store& store, int key, Ledger& ledger, ftjit::EpochDomain<TestMutex>::Record* rec,
             int shard) {
  TestSig sig = SigOf(key);
  if (Entry* e = store.FindReady(sig, rec, shard)) {
    CHECK_EQ(e->payload.canary.load(std::memory_order_relaxed), kAlive);
    int v = e->payload.value;
    Store::FinishCall(e, rec, shard);
    return v;
  }
  for (;;) {
    Store::Lookup found = store.FindOrInsert(sig);
    if (found.inserted) {
      store.counters().misses.fetch_add(1);
      store.AdmitLru(found.entry);
      int others = ledger.running[key].fetch_add(1);
      if (ledger.strict) CHECK_EQ(others, 0);  // never two compiles of one key at once
      ledger.compiles[key].fetch_add(1);
      std::this_thread::yield();  // a compile takes a while: let others pile up on it
      found.entry->payload.value = key * 2;
      ledger.running[key].fetch_sub(1);
      found.entry->latch.Publish(State::kReady);
      store.Published(found.entry);
      return found.entry->payload.value;
    }
    State s;
    while ((s = found.entry->latch.WaitFor(5ms)) == State::kCompiling) {
    }
    CHECK(s == State::kReady);
    CHECK_EQ(found.entry->payload.canary.load(), kAlive);
    return found.entry->payload.value;
  }
}

// Threads call a few keys of several stores sharing one small LRU, while
// (with `clearers`) other threads clear stores: every call gets key * 2
// from a live payload; without clears no key is ever compiled twice at
// once; and the books balance at the end: the LRU holds exactly the stores'
// entries, within capacity, the ready tables list exactly the ready entries,
// and once the stores are gone every payload is freed.
void RunCallsAgainstEvictions(int clearers) {
  const int kKeys = 24, kStores = 3, kCallers = 6;
  const size_t kCapacity = 16;
  auto core = std::make_shared<Core>(kCapacity);
  std::vector<std::shared_ptr<Store>> stores;
  std::vector<std::unique_ptr<Ledger>> ledgers;
  for (int i = 0; i < kStores; ++i) {
    stores.push_back(std::make_shared<Store>(core));
    ledgers.push_back(std::make_unique<Ledger>(kKeys, /*strict=*/clearers == 0));
  }
  std::atomic<uint64_t> calls{0}, clears{0};
  auto deadline = std::chrono::steady_clock::now() + 1500ms;
  ftjit_test::RunThreads(kCallers + clearers, [&](size_t i) {
    auto* rec = TestTraits::ThreadRecord();
    int shard = static_cast<int>(i) % ftjit::kMaxThreadShards;
    std::mt19937 rng(static_cast<unsigned>(i));
    while (std::chrono::steady_clock::now() < deadline) {
      int s = static_cast<int>(rng() % kStores);
      if (i < static_cast<size_t>(kCallers)) {
        int key = static_cast<int>(rng() % kKeys);
        CHECK_EQ(CallOnce(*stores[s], key, *ledgers[s], rec, shard), key * 2);
        calls.fetch_add(1, std::memory_order_relaxed);
      } else {
        stores[s]->Clear();
        clears.fetch_add(1, std::memory_order_relaxed);
        std::this_thread::sleep_for(1ms);
      }
    }
  });
  std::fprintf(stderr, "  %llu calls, %llu clears\n", static_cast<unsigned long long>(calls.load()),
               static_cast<unsigned long long>(clears.load()));
  size_t in_stores = 0;
  for (auto& st : stores) {
    in_stores += st->size();
    for (auto& e : st->Entries()) CHECK(e->latch.state() == State::kReady);
    CHECK_EQ(st->ready_size(), st->size());  // the table lists exactly the map's ready entries
  }
  CHECK_EQ(core->lru.size(), in_stores);
  CHECK(in_stores <= kCapacity);
  uint64_t evictions = 0;
  for (auto& st : stores) evictions += st->counters().evictions.load();
  CHECK(evictions > 0);
  stores.clear();
  TestTraits::Epochs().Reclaim();
  CHECK_EQ(TestTraits::Epochs().retired_count(), size_t{0});
  CHECK_EQ(core->lru.size(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

void TestCallsAgainstEvictions() { RunCallsAgainstEvictions(0); }
void TestCallsAgainstEvictionsAndClears() { RunCallsAgainstEvictions(1); }

// A thread in flight on an entry keeps it (and its payload) alive after
// every table, the map and the LRU let go of it; the last FinishCall frees it.
void TestInFlightEntryOutlivesItsUnlinking() {
  auto core = std::make_shared<Core>(8);
  auto store = std::make_shared<Store>(core);
  Ledger ledger(4, /*strict=*/true);
  auto& epochs = TestTraits::Epochs();
  auto* rec = TestTraits::ThreadRecord();
  CHECK_EQ(CallOnce(*store, 1, ledger, rec, 0), 2);
  Entry* e = store->FindReady(SigOf(1), rec, 0);  // a call in flight
  CHECK(e != nullptr);
  Entry* e2 = store->FindReady(SigOf(1), rec, 3);  // and another, on another shard
  CHECK(e2 == e);
  store->Clear();  // unlinked from the map, the LRU and the table (retired, then freed)
  CHECK_EQ(epochs.retired_count(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{1});  // still alive: two calls in flight
  CHECK_EQ(e->payload.canary.load(), kAlive);
  CHECK(store->FindReady(SigOf(1), rec, 0) == nullptr);  // no new call finds it
  Store::FinishCall(e, rec, 3);
  CHECK_EQ(g_live_payloads.load(), int64_t{1});
  Store::FinishCall(e, rec, 0);  // the last: frees it
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

// The same with threads: callers keep finding and finishing an entry that
// a clearer keeps replacing; nothing is used after it is freed and nothing
// leaks.
void TestInFlightRacesWithClears() {
  auto core = std::make_shared<Core>(8);
  auto store = std::make_shared<Store>(core);
  Ledger ledger(2, /*strict=*/false);
  auto deadline = std::chrono::steady_clock::now() + 1000ms;
  ftjit_test::RunThreads(5, [&](size_t i) {
    auto* rec = TestTraits::ThreadRecord();
    int shard = static_cast<int>(i);
    while (std::chrono::steady_clock::now() < deadline) {
      if (i == 0) {
        store->Clear();
        std::this_thread::yield();
      } else {
        CHECK_EQ(CallOnce(*store, 1, ledger, rec, shard), 2);
      }
    }
  });
  store.reset();
  TestTraits::Epochs().Reclaim();
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

#ifdef FTJIT_TEST_LEAF_MUTEX
// The lock itself: 8 threads increment a plain counter under it; any lost
// update or unordered access (a race TSAN would report) fails.
void TestLeafMutexExcludes() {
  TestMutex mu;
  long counter = 0;  // guarded by mu
  ftjit_test::RunThreads(8, [&](size_t) {
    for (int i = 0; i < 20000; ++i) {
      std::lock_guard<TestMutex> lock(mu);
      ++counter;
    }
  });
  CHECK_EQ(counter, 8L * 20000);
}
#endif

}  // namespace

int main() {
#ifdef FTJIT_TEST_LEAF_MUTEX
  RUN_TEST(TestLeafMutexExcludes);
#endif
  RUN_TEST(TestCallsAgainstEvictions);
  RUN_TEST(TestCallsAgainstEvictionsAndClears);
  RUN_TEST(TestInFlightEntryOutlivesItsUnlinking);
  RUN_TEST(TestInFlightRacesWithClears);
  std::fprintf(stderr, "all EntryStore tests passed\n");
  return 0;
}
