// ftjit tests: ftjit::EntryStore, the map + ready table + LRU + latch wired as the extension wires them, driven the way a jitted call drives them (run under TSAN).
#include "store/entry_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "check.h"
#include "primitives/locks.h"

// Built twice: with std::mutex (ftjit::StdMutex, its annotated wrapper),
// and (FTJIT_TEST_LEAF_MUTEX, by dev.sh tsan-ft against a
// ThreadSanitizer-built free-threaded CPython) with the extension's own
// lock, LeafMutex, which is a PyMutex there.
#ifdef FTJIT_TEST_LEAF_MUTEX
#include "pyutil/leaf_mutex.h"
// (FTJIT_TSA_ONLY: compiled, never run, by bash dev.sh tsa, for Clang's
// thread-safety analysis of the primitives over LeafMutex; any CPython's
// headers do, as the annotations are the same on GIL builds.)
#if !defined(Py_GIL_DISABLED) && !defined(FTJIT_TSA_ONLY)
#error "the LeafMutex build of this test needs a free-threaded CPython's headers"
#endif
using TestMutex = ftjit::LeafMutex;
#else
using TestMutex = ftjit::StdMutex;
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

// A probe of a thread that set t_pause_in_probe stops inside its read
// section (in FastEquals) until g_probe_go: a reader caught mid-probe.
thread_local bool t_pause_in_probe = false;
std::atomic<bool> g_in_probe{false}, g_probe_go{false};

// What a thread keeps in its slot of an entry: plain fields, so that
// ThreadSanitizer reports two threads using one slot at once.
struct TestLocal {
  const void* owner = nullptr;
  uint64_t uses = 0;
};

struct TestTraits {
  using Sig = TestSig;
  using Payload = TestPayload;
  using Mutex = TestMutex;
  using LocalExe = TestLocal;
  static size_t TableHash(const TestSig& s) { return s.hash; }
  static FastEq FastEquals(const TestSig& a, const TestSig& b) noexcept {
    if (t_pause_in_probe) {
      g_in_probe.store(true);
      while (!g_probe_go.load()) std::this_thread::yield();
    }
    return a.key == b.key ? FastEq::kEqual : FastEq::kNotEqual;
  }
  static bool Equals(const TestSig& a, const TestSig& b) { return a.key == b.key; }
  static ftjit::EpochDomain<TestMutex>& Epochs() {
    static auto* domain = new ftjit::EpochDomain<TestMutex>();
    return *domain;
  }
};
using Slot = ftjit::ThreadSlot<TestTraits>;
using Domain = ftjit::EpochDomain<TestMutex>;

using Store = ftjit::EntryStore<TestTraits>;
using Lru = Store::Lru;
using Entry = Store::Entry;
using State = ftjit::CompileLatch::State;

// A hit of this thread's index, as the entry found (FindReady, no redirect
// followed), and its end.
Entry* Find(Store& store, const TestSig& sig, Domain::Record* rec, size_t index) {
  return store.FindReady(sig, rec, index, /*follow_redirect=*/false).head;
}
void Finish(Entry* e, Domain::Record* rec, size_t index) { Store::FinishCall(e, *e->slots.Find(index), rec); }

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

// One call of key `key`, as the core's Call makes it: the lock-free
// hit path, else find-or-insert; the inserting thread "compiles" (the
// result is key * 2), publishes and lists it; others wait on the latch.
// Returns the value the call used (-1: a compile it waited for was
// abandoned and it looked again... never here) and checks the canary.
int CallOnce(Store& store, int key, Ledger& ledger, ftjit::EpochDomain<TestMutex>::Record* rec,
             size_t index, size_t hash = 0) {
  TestSig sig = hash ? TestSig{hash, key} : SigOf(key);
  if (Entry* e = Find(store, sig, rec, index)) {
    CHECK_EQ(e->payload.canary.load(std::memory_order_relaxed), kAlive);
    int v = e->payload.value;
    Finish(e, rec, index);
    return v;
  }
  Store::AfterMiss(rec);
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
  auto lru = std::make_shared<Lru>(kCapacity);
  std::vector<std::shared_ptr<Store>> stores;
  std::vector<std::unique_ptr<Ledger>> ledgers;
  for (int i = 0; i < kStores; ++i) {
    stores.push_back(std::make_shared<Store>(lru));
    ledgers.push_back(std::make_unique<Ledger>(kKeys, /*strict=*/clearers == 0));
  }
  std::atomic<uint64_t> calls{0}, clears{0};
  auto deadline = std::chrono::steady_clock::now() + 1500ms;
  ftjit_test::RunThreads(kCallers + clearers, [&](size_t i) {
    auto* rec = Slot::Get().rec;
    size_t index = Slot::Get().index;
    std::mt19937 rng(static_cast<unsigned>(i));
    while (std::chrono::steady_clock::now() < deadline) {
      int s = static_cast<int>(rng() % kStores);
      if (i < static_cast<size_t>(kCallers)) {
        int key = static_cast<int>(rng() % kKeys);
        CHECK_EQ(CallOnce(*stores[s], key, *ledgers[s], rec, index), key * 2);
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
  CHECK_EQ(lru->size(), in_stores);
  CHECK(in_stores <= kCapacity);
  uint64_t evictions = 0;
  for (auto& st : stores) evictions += st->counters().evictions.load();
  CHECK(evictions > 0);
  stores.clear();
  CHECK_EQ(TestTraits::Epochs().retired_count(), size_t{0});
  CHECK_EQ(lru->size(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

void TestCallsAgainstEvictions() { RunCallsAgainstEvictions(0); }
void TestCallsAgainstEvictionsAndClears() { RunCallsAgainstEvictions(1); }

// A clear racing a first call: an entry inserted after the clear emptied
// the map belongs to the map, so it keeps its LRU link (a clear unlinks
// exactly the entries it removed). Unlinking by store lost that link: the
// entry then held a slot outside the capacity bound (CI saw the LRU count
// 16 entries of 17 in TestCallsAgainstEvictionsAndClears). The window is
// held open here: the test holds the LRU's lock while a clearer empties the
// map and then waits for that lock; it inserts key 1 meanwhile, and links it
// as soon as it lets go (usually before the woken clearer unlinks; either
// order must leave the LRU holding exactly the store's entries).
void TestClearKeepsTheLruLinkOfAnEntryInsertedAfterIt() {
  auto lru = std::make_shared<Lru>(64);
  auto store = std::make_shared<Store>(lru);
  auto* rec = Slot::Get().rec;
  for (int round = 0; round < 300; ++round) {
    Ledger ledger(2, /*strict=*/true);
    CHECK_EQ(CallOnce(*store, 0, ledger, rec, 0), 0);  // something to clear
    lru->LockForTest();
    std::thread clearer([&] { store->Clear(); });
    while (store->size() != 0) std::this_thread::yield();  // the map is empty...
    std::this_thread::sleep_for(1ms);                      // ...and the clearer waits for the LRU
    TestSig sig = SigOf(1);
    Store::Lookup found = store->FindOrInsert(sig);
    CHECK(found.inserted);
    lru->UnlockForTest();
    store->AdmitLru(found.entry);
    clearer.join();
    found.entry->payload.value = 2;
    found.entry->latch.Publish(State::kReady);
    store->Published(found.entry);
    CHECK_EQ(store->size(), size_t{1});
    CHECK_EQ(lru->size(), size_t{1});  // key 1's link survived the clear
    CHECK_EQ(CallOnce(*store, 1, ledger, rec, 0), 2);  // and it is served
    CHECK_EQ(ledger.compiles[1].load(), 0);            // (the hit path: no second compile)
    store->Clear();
    CHECK_EQ(lru->size(), size_t{0});
  }
  store.reset();
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

// A thread in flight on an entry keeps it (and its payload) alive after
// every table, the map and the LRU let go of it; the last FinishCall frees it.
void TestInFlightEntryOutlivesItsUnlinking() {
  auto lru = std::make_shared<Lru>(8);
  auto store = std::make_shared<Store>(lru);
  Ledger ledger(4, /*strict=*/true);
  auto& epochs = TestTraits::Epochs();
  auto* rec = Slot::Get().rec;
  CHECK_EQ(CallOnce(*store, 1, ledger, rec, 0), 2);
  Entry* e = Find(*store, SigOf(1), rec, 0);  // a call in flight
  CHECK(e != nullptr);
  Entry* e2 = Find(*store, SigOf(1), rec, 3);  // and another, as index 3 (no thread holds it here)
  CHECK(e2 == e);
  store->Clear();  // unlinked from the map, the LRU and the table (retired, then freed)
  CHECK_EQ(epochs.retired_count(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{1});  // still alive: two calls in flight
  CHECK_EQ(e->payload.canary.load(), kAlive);
  CHECK(Find(*store, SigOf(1), rec, 0) == nullptr);  // no new call finds it
  Finish(e, rec, 3);
  CHECK_EQ(g_live_payloads.load(), int64_t{1});
  Finish(e, rec, 0);  // the last: frees it
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

// The same with threads: callers keep finding and finishing an entry that
// a clearer keeps replacing; nothing is used after it is freed and nothing
// leaks.
void TestInFlightRacesWithClears() {
  auto lru = std::make_shared<Lru>(8);
  auto store = std::make_shared<Store>(lru);
  Ledger ledger(2, /*strict=*/false);
  auto deadline = std::chrono::steady_clock::now() + 1000ms;
  ftjit_test::RunThreads(5, [&](size_t i) {
    auto* rec = Slot::Get().rec;
    size_t index = Slot::Get().index;
    while (std::chrono::steady_clock::now() < deadline) {
      if (i == 0) {
        store->Clear();
        std::this_thread::yield();
      } else {
        CHECK_EQ(CallOnce(*store, 1, ledger, rec, index), 2);
      }
    }
  });
  store.reset();
  CHECK_EQ(TestTraits::Epochs().retired_count(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

// A clear that races a reader mid-probe cannot free the array it probes
// (replaced: the clear unlisted every entry) nor the entry it is comparing
// while the reader reads: the reader frees them when its call ends (a hit:
// FinishCall) or, missing, before its slow path (AfterMiss). No later write
// and no Reclaim() call is needed.
void RunRetirementRacingAReader(bool hit) {
  auto lru = std::make_shared<Lru>(8);
  auto store = std::make_shared<Store>(lru);
  Ledger ledger(4, /*strict=*/true);
  auto& epochs = TestTraits::Epochs();
  CHECK_EQ(CallOnce(*store, 1, ledger, Slot::Get().rec, 0), 2);
  CHECK_EQ(g_live_payloads.load(), int64_t{1});
  g_in_probe.store(false);
  g_probe_go.store(false);
  std::thread reader([&] {
    const Slot::Ctx& t = Slot::Get();
    // A miss probes the same slot (equal hash) and finds another key there.
    TestSig probe{SigOf(1).hash, hit ? 1 : 3};
    t_pause_in_probe = true;
    Entry* e = Find(*store, probe, t.rec, t.index);
    t_pause_in_probe = false;
    CHECK_EQ(e != nullptr, hit);
    if (e) {
      CHECK_EQ(e->payload.canary.load(), kAlive);  // in flight: still alive
      CHECK_EQ(e->payload.value, 2);
      Finish(e, t.rec, t.index);
    } else {
      CHECK_EQ(epochs.retired_count(), size_t{1});  // still held back...
      Store::AfterMiss(t.rec);                      // ...until the caller may free
    }
  });
  while (!g_in_probe.load()) std::this_thread::yield();
  store->Clear();  // unlists while the reader probes: kept
  CHECK_EQ(epochs.retired_count(), size_t{1});
  CHECK_EQ(g_live_payloads.load(), int64_t{1});
  g_probe_go.store(true);
  reader.join();
  CHECK_EQ(epochs.retired_count(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}
void TestRetirementRacingAHitIsFreedWhenTheCallEnds() { RunRetirementRacingAReader(true); }
void TestRetirementRacingAMissIsFreedWhenTheProbeEnds() { RunRetirementRacingAReader(false); }

// A thread's record goes back to the domain at its exit and may be taken at
// once by another thread. A use after that, in a later thread-local
// destructor of the exiting thread, takes a fresh record, never the
// released one: announcing on a record another thread reads through would
// let a reclaim free what that thread reads. Here the other thread does read
// through the reused record, the late use enters and leaves a section and
// clears the store; the table the reader holds must survive until it
// leaves, and every record is given back once both threads are gone.
std::atomic<Domain::Record*> g_exited_rec{nullptr};
std::shared_ptr<Store> g_late_store;
struct LateUse {
  ~LateUse() {  // runs after the thread's Slot gave its record back
    while (!g_in_probe.load()) std::this_thread::yield();  // the reader reads on it now
    Domain::Record* rec = Slot::Get().rec;
    CHECK(rec != g_exited_rec.load());  // fresh: the released one is the reader's now
    CHECK(rec->owned.load());
    auto& epochs = TestTraits::Epochs();
    epochs.EnterRead(rec);
    epochs.LeaveRead(rec);
    g_late_store->Clear();  // unlists the table the reader holds: kept
    CHECK_EQ(epochs.retired_count(), size_t{1});
    CHECK_EQ(g_live_payloads.load(), int64_t{1});
    g_probe_go.store(true);
  }
};
thread_local LateUse t_late_use;

void TestLateUseAfterThreadExitTakesAFreshRecord() {
  auto& epochs = TestTraits::Epochs();
  auto lru = std::make_shared<Lru>(8);
  g_late_store = std::make_shared<Store>(lru);
  Ledger ledger(4, /*strict=*/true);
  CHECK_EQ(CallOnce(*g_late_store, 1, ledger, Slot::Get().rec, 0), 2);
  size_t owned_before = epochs.owned_records();
  g_in_probe.store(false);
  g_probe_go.store(false);
  std::thread exiting([] {
    (void)&t_late_use;  // constructed first, so destroyed after the Slot's holder
    g_exited_rec.store(Slot::Get().rec);
  });
  std::thread reader([&] {
    // Waits for the exiting thread's record to come back, and takes it.
    Domain::Record* want;
    while (!(want = g_exited_rec.load()) || want->owned.load()) std::this_thread::yield();
    std::vector<Domain::Record*> others;
    Domain::Record* rec;
    while ((rec = epochs.Acquire()) != want) others.push_back(rec);
    // Reads through it, stopping mid-probe while the late use runs.
    t_pause_in_probe = true;
    Entry* e = Find(*g_late_store, SigOf(1), rec, 5);
    t_pause_in_probe = false;
    CHECK(e != nullptr);
    CHECK_EQ(e->payload.canary.load(), kAlive);  // not freed under the reader
    Finish(e, rec, 5);  // frees it
    Domain::Release(rec);
    for (Domain::Record* r : others) Domain::Release(r);
  });
  exiting.join();
  reader.join();
  CHECK_EQ(epochs.retired_count(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
  CHECK_EQ(epochs.owned_records(), owned_before);  // the late record was given back too
  g_late_store.reset();
}

// Compiles and publishes `key` in `store`, where nothing else inserts it
// (the miss path of CallOnce, for a thread that owns the key), and returns
// its entry.
Store::EntryPtr CompileOwned(Store& store, int key) {
  TestSig sig = SigOf(key);
  Store::Lookup found = store.FindOrInsert(sig);
  CHECK(found.inserted);
  store.AdmitLru(found.entry);
  found.entry->payload.value = key * 2;
  found.entry->latch.Publish(State::kReady);
  store.Published(found.entry);
  return found.entry;
}

// The keys of NewestReady(limit), in its order.
std::vector<int> NewestKeys(const Store& store, size_t limit) {
  std::vector<int> keys;
  for (const auto& e : store.NewestReady(limit)) keys.push_back(e->sig->key);
  return keys;
}

// NewestReady lists the ready entries newest first, in publish order, across
// the table's rebuilds and whatever was discarded, cleared or published again
// meanwhile; a second Published of a listed entry changes nothing; the hit
// path finds exactly the listed entries.
void TestNewestReadyIsPublishOrderAcrossUnlistings() {
  auto lru = std::make_shared<Lru>(1 << 16);
  auto store = std::make_shared<Store>(lru);
  auto* rec = Slot::Get().rec;
  std::mt19937 rng(3);
  std::vector<int> order;  // listed keys, oldest first
  std::vector<Store::EntryPtr> entries(4000);
  auto check = [&](size_t limit) {
    std::vector<int> want(order.rbegin(), order.rbegin() + static_cast<long>(std::min(limit, order.size())));
    CHECK(NewestKeys(*store, limit) == want);
  };
  for (int k = 0; k < 3000; ++k) {
    entries[k] = CompileOwned(*store, k);
    order.push_back(k);
  }
  check(5);
  check(order.size() + 1);
  store->Published(entries[10]);  // listed already: stays where it was
  check(order.size());
  // Discards (evictions) of random entries, the newest among them.
  for (int n = 0; n < 1500; ++n) {
    size_t i = n == 0 ? order.size() - 1 : rng() % order.size();
    store->Discard(entries[order[i]]);
    entries[order[i]].reset();
    order.erase(order.begin() + static_cast<long>(i));
  }
  check(7);
  check(order.size());
  CHECK_EQ(store->ready_size(), order.size());
  // Published again after a discard: the newest now.
  int again = 2999;
  if (entries[again]) {
    store->Discard(entries[again]);
    order.erase(std::find(order.begin(), order.end(), again));
  }
  entries[again] = CompileOwned(*store, again);
  order.push_back(again);
  check(3);
  for (int k = 0; k < 3000; ++k) {
    Entry* e = Find(*store, SigOf(k), rec, 0);
    CHECK_EQ(e != nullptr, entries[k] != nullptr);
    if (e) {
      CHECK_EQ(e->payload.value, k * 2);
      Finish(e, rec, 0);
    } else {
      Store::AfterMiss(rec);
    }
  }
  // A clear unlists all of them; what is published after it is all there is.
  store->Clear();
  order.clear();
  check(10);
  for (int k = 3000; k < 3010; ++k) {
    entries[k - 3000] = CompileOwned(*store, k);
    order.push_back(k);
  }
  check(4);
  check(100);
  CHECK_EQ(store->ready_size(), size_t{10});
  entries.clear();
  store.reset();
  CHECK_EQ(TestTraits::Epochs().retired_count(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

// The hit path's exact invariant on the store, while the ready table grows,
// fills with tombstones and is rebuilt: owners (each the only one to compile
// or discard its keys) publish and discard, readers probe with FindReady. A
// key published (Published returned) and not being discarded throughout a
// probe is found, with its own payload; a key discarded (Discard returned)
// and not published again throughout a probe is not; nothing freed is read.
// Each key's state is a generation and a phase, set by its owner around
// every publish and discard and read by a reader before and after its probe.
void TestHitsFindExactlyTheListedEntriesWhilePublishingAndDiscarding() {
  const int kOwners = 2, kReaders = 3, kKeys = 3000;
  enum Phase : uint64_t { kAbsent = 0, kListed = 1, kPublishing = 2, kDiscarding = 3 };
  auto lru = std::make_shared<Lru>(1 << 16);
  auto store = std::make_shared<Store>(lru);
  std::vector<std::atomic<uint64_t>> state(kKeys);  // gen * 4 + phase; written by the key's owner
  std::atomic<uint64_t> must_find{0}, must_miss{0}, published{0}, discarded{0};
  auto deadline = std::chrono::steady_clock::now() + 1500ms;
  ftjit_test::RunThreads(kOwners + kReaders, [&](size_t i) {
    const Slot::Ctx& t = Slot::Get();
    std::mt19937 rng(static_cast<unsigned>(i) + 50);
    if (i < static_cast<size_t>(kOwners)) {
      std::vector<Store::EntryPtr> mine(kKeys);  // this owner's listed entries, by key
      std::vector<int> listed;
      while (std::chrono::steady_clock::now() < deadline) {
        if (rng() % 8 < 5) {  // publish one of its keys not listed
          int key = static_cast<int>(rng() % (kKeys / kOwners)) * kOwners + static_cast<int>(i);
          if (mine[key]) continue;
          uint64_t s = state[key].load(std::memory_order_relaxed);
          state[key].store((s & ~uint64_t{3}) | kPublishing, std::memory_order_seq_cst);
          mine[key] = CompileOwned(*store, key);
          state[key].store((s & ~uint64_t{3}) | kListed, std::memory_order_seq_cst);
          listed.push_back(key);
          published.fetch_add(1, std::memory_order_relaxed);
        } else if (!listed.empty()) {  // discard one (an eviction)
          size_t j = rng() % listed.size();
          int key = listed[j];
          listed[j] = listed.back();
          listed.pop_back();
          uint64_t s = state[key].load(std::memory_order_relaxed);
          state[key].store((s & ~uint64_t{3}) | kDiscarding, std::memory_order_seq_cst);
          store->Discard(mine[key]);
          mine[key].reset();
          state[key].store(((s >> 2) + 1) * 4 + kAbsent, std::memory_order_seq_cst);
          discarded.fetch_add(1, std::memory_order_relaxed);
        }
      }
    } else {
      while (std::chrono::steady_clock::now() < deadline) {
        int key = static_cast<int>(rng() % kKeys);
        uint64_t s1 = state[key].load(std::memory_order_seq_cst);
        Entry* e = Find(*store, SigOf(key), t.rec, t.index);
        if (e) {
          CHECK_EQ(e->payload.canary.load(std::memory_order_relaxed), kAlive);
          CHECK_EQ(e->payload.value, key * 2);
          Finish(e, t.rec, t.index);
        } else {
          Store::AfterMiss(t.rec);
        }
        uint64_t s2 = state[key].load(std::memory_order_seq_cst);
        if (s1 == s2 && (s1 & 3) == kListed) {
          CHECK(e != nullptr);
          must_find.fetch_add(1, std::memory_order_relaxed);
        } else if (s1 == s2 && (s1 & 3) == kAbsent) {
          CHECK(e == nullptr);
          must_miss.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
  });
  std::fprintf(stderr, "  %llu published, %llu discarded; %llu probes had to find, %llu had to miss\n",
               static_cast<unsigned long long>(published.load()),
               static_cast<unsigned long long>(discarded.load()),
               static_cast<unsigned long long>(must_find.load()),
               static_cast<unsigned long long>(must_miss.load()));
  CHECK(must_find.load() > 0 && must_miss.load() > 0);
  CHECK(published.load() > 200);  // past several rebuilds of the table
  // The owners' entries died with them (their vectors): the store holds and
  // lists exactly what they left published.
  CHECK_EQ(store->ready_size(), store->size());
  CHECK_EQ(store->NewestReady(kKeys).size(), store->size());
  CHECK_EQ(static_cast<uint64_t>(store->size()), published.load() - discarded.load());
  store.reset();
  CHECK_EQ(TestTraits::Epochs().retired_count(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

#ifdef FTJIT_TEST_LEAF_MUTEX
// The lock itself: 8 threads increment a plain counter under it, asserting
// it held (what the `...LockHeld` helpers do); any lost update, unordered
// access (a race TSAN would report) or failed assertion fails.
void TestLeafMutexExcludes() {
  TestMutex mu;
  long counter = 0;  // guarded by mu
  ftjit_test::RunThreads(8, [&](size_t) {
    for (int i = 0; i < 20000; ++i) {
      ftjit::LockGuard<TestMutex> lock(mu);
      mu.AssertHeld();
      ++counter;
    }
  });
  CHECK_EQ(counter, 8L * 20000);
}
#endif


// --- provisional entries (a saved spec warmed up ahead of traffic) ----------

// Warms `key` provisionally, as JitFunction._precompile_saved does: inserted,
// "compiled", marked provisional and published, but not listed. False if
// the key was in the map already.
bool WarmProvisional(Store& store, int key, int64_t limit = -1) {
  if (!store.ReserveProvisional(limit)) return false;
  TestSig sig = SigOf(key);
  Store::Lookup found = store.FindOrInsert(sig);
  if (!found.inserted) {
    store.ReleaseProvisional();
    return false;
  }
  store.AdmitLru(found.entry);
  found.entry->payload.value = key * 2;
  store.MarkProvisional(found.entry);
  found.entry->latch.Publish(State::kReady);
  return true;
}

// One call as the core's Resolve makes it when provisional entries may be in
// the map: as CallOnce, except that a provisional entry found ready is
// adopted (its slot gets a fresh entry this thread "compiles" from its
// payload, after Admit under `limit`: refused, the fresh entry fails and
// leaves, as a compile past max_signatures does). Returns the value used,
// or -1 when the limit refused it.
int CallAdopting(Store& store, int key, int64_t limit, std::atomic<int>& adoptions,
                 ftjit::EpochDomain<TestMutex>::Record* rec, size_t index) {
  TestSig sig = SigOf(key);
  if (Entry* e = Find(store, sig, rec, index)) {
    CHECK_EQ(e->payload.canary.load(std::memory_order_relaxed), kAlive);
    CHECK(e->provisional.load() == Entry::kNotProvisional);  // never listed while provisional
    int v = e->payload.value;
    Finish(e, rec, index);
    return v;
  }
  Store::AfterMiss(rec);
  for (;;) {
    Store::Lookup found = store.FindOrInsert(sig);
    std::shared_ptr<Entry> owned = found.entry;
    int value = key * 2;
    if (!found.inserted) {
      State s;
      while ((s = found.entry->latch.WaitFor(5ms)) == State::kCompiling) {
      }
      if (s != State::kReady) continue;  // a refused adoption: look again
      uint8_t p = found.entry->provisional.load();
      if (p == Entry::kAdopted) continue;  // adopted meanwhile: the map holds the fresh entry
      if (p == Entry::kNotProvisional) {
        CHECK_EQ(found.entry->payload.canary.load(), kAlive);
        return found.entry->payload.value;
      }
      owned = store.Adopt(found.entry);
      if (!owned) continue;
      adoptions.fetch_add(1);
      value = found.entry->payload.value;
    }
    if (!store.Admit(owned, limit, /*force=*/false)) {
      store.Discard(owned);
      owned->latch.Publish(State::kFailed);
      return -1;
    }
    store.AdmitLru(owned);
    owned->payload.value = value;
    owned->latch.Publish(State::kReady);
    store.Published(owned);
    return value;
  }
}

// One thread: provisional entries are in the map but neither counted nor
// listed; the first call adopts one (counted, listed, then a hit), the
// limit refuses an adoption past it exactly as a compile, and a removal of
// an unadopted one counts it down once.
void TestProvisionalEntriesAreAdoptedOnFirstUse() {
  auto lru = std::make_shared<Lru>(16);
  auto store = std::make_shared<Store>(lru);
  auto* rec = Slot::Get().rec;
  std::atomic<int> adoptions{0};
  for (int key = 0; key < 4; ++key) CHECK(WarmProvisional(*store, key));
  CHECK(!WarmProvisional(*store, 0));  // once per signature
  CHECK(!WarmProvisional(*store, 9, /*limit=*/4));  // no room: 4 provisional already
  CHECK_EQ(store->size(), size_t{4});
  CHECK_EQ(store->ProvisionalCount(), int64_t{4});
  CHECK_EQ(store->Count(), int64_t{0});
  CHECK_EQ(store->size(), size_t{4});
  CHECK_EQ(store->ready_size(), size_t{0});
  CHECK_EQ(lru->size(), size_t{4});
  CHECK(Find(*store, SigOf(0), rec, 0) == nullptr);  // unlisted: the hit path cannot see it
  Store::AfterMiss(rec);

  CHECK_EQ(CallAdopting(*store, 0, /*limit=*/2, adoptions, rec, 0), 0);
  CHECK_EQ(adoptions.load(), 1);
  CHECK_EQ(store->ProvisionalCount(), int64_t{3});
  CHECK_EQ(store->Count(), int64_t{1});
  CHECK_EQ(store->ready_size(), size_t{1});
  CHECK_EQ(store->size(), size_t{4});
  CHECK_EQ(lru->size(), size_t{4});  // the adopted entry left it, the fresh one joined
  CHECK_EQ(CallAdopting(*store, 0, 2, adoptions, rec, 0), 0);  // now a hit
  CHECK_EQ(adoptions.load(), 1);

  CHECK_EQ(CallAdopting(*store, 1, 2, adoptions, rec, 0), 2);
  CHECK_EQ(CallAdopting(*store, 2, 2, adoptions, rec, 0), -1);  // past the limit: refused, gone
  CHECK_EQ(adoptions.load(), 3);
  CHECK_EQ(store->Count(), int64_t{2});
  CHECK_EQ(store->ProvisionalCount(), int64_t{1});  // key 3
  CHECK_EQ(store->size(), size_t{3});
  CHECK_EQ(lru->size(), size_t{3});

  std::vector<std::shared_ptr<Entry>> entries = store->Entries();
  for (auto& e : entries) {
    if (e->provisional.load() == Entry::kProvisional) store->Discard(e);
  }
  entries.clear();
  CHECK_EQ(store->ProvisionalCount(), int64_t{0});
  CHECK_EQ(store->size(), size_t{2});
  CHECK(WarmProvisional(*store, 5));
  store->Clear();
  CHECK_EQ(store->ProvisionalCount(), int64_t{0});
  CHECK_EQ(store->Count(), int64_t{0});
  CHECK_EQ(lru->size(), size_t{0});
  store.reset();
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

// Threads: callers race to adopt provisional entries that a warmer keeps
// re-warming and a clearer keeps clearing. Each provisional entry is adopted
// at most once, every call gets key * 2, and at the end the books balance:
// the map holds exactly the listed entries plus the provisional ones, the
// LRU exactly the map's, and nothing leaks.
void TestProvisionalAdoptionsRaceWithClears() {
  const int kKeys = 16;
  auto lru = std::make_shared<Lru>(64);
  auto store = std::make_shared<Store>(lru);
  std::atomic<int> adoptions{0}, warmed{0};
  std::atomic<uint64_t> calls{0};
  auto deadline = std::chrono::steady_clock::now() + 1000ms;
  ftjit_test::RunThreads(6, [&](size_t i) {
    auto* rec = Slot::Get().rec;
    std::mt19937 rng(static_cast<unsigned>(i) + 17);
    while (std::chrono::steady_clock::now() < deadline) {
      int key = static_cast<int>(rng() % kKeys);
      if (i == 0) {
        if (WarmProvisional(*store, key)) warmed.fetch_add(1);
      } else if (i == 1) {
        if (rng() % 8 == 0) store->Clear();
        std::this_thread::yield();
      } else {
        // (No limit here: a clear uncounts what it removed just after emptying the
        // map, so a count racing it may briefly see more than kKeys.)
        CHECK_EQ(CallAdopting(*store, key, /*limit=*/1 << 20, adoptions, rec, static_cast<int>(i)), key * 2);
        calls.fetch_add(1, std::memory_order_relaxed);
      }
    }
  });
  std::fprintf(stderr, "  %llu calls, %d warmed, %d adopted\n", static_cast<unsigned long long>(calls.load()),
               warmed.load(), adoptions.load());
  CHECK(adoptions.load() <= warmed.load());
  int64_t provisional = 0;
  for (auto& e : store->Entries()) {
    CHECK(e->latch.state() == State::kReady);
    if (e->provisional.load() == Entry::kProvisional) ++provisional;
  }
  CHECK_EQ(store->ProvisionalCount(), provisional);
  CHECK_EQ(store->ready_size() + static_cast<size_t>(provisional), store->size());
  CHECK_EQ(lru->size(), store->size());
  CHECK_EQ(store->Count(), static_cast<int64_t>(store->ready_size()));
  store.reset();
  CHECK_EQ(lru->size(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}


// An eviction keeps its signature's count (max_signatures is not reset by the
// LRU): with an LRU of 4, a limit of 8 and 16 keys, exactly the first 8
// distinct keys ever admitted are served and the others refused, whatever
// the evictions; a returning key takes its kept count back. Then threads
// race calls against clears: the count stays the entries counted in the map
// plus the kept ones, and a clear empties both.
void TestEvictionsKeepTheirCountUntilAClear() {
  const int kKeys = 16;
  const int64_t kLimit = 8;
  auto lru = std::make_shared<Lru>(4);
  auto store = std::make_shared<Store>(lru);
  store->set_evicted_kept(static_cast<size_t>(kLimit));
  std::atomic<int> adoptions{0};
  auto* rec = Slot::Get().rec;
  for (int round = 0; round < 3; ++round) {
    for (int key = 0; key < kKeys; ++key) {
      int got = CallAdopting(*store, key, kLimit, adoptions, rec, 0);
      CHECK_EQ(got, key < kLimit ? key * 2 : -1);
    }
    CHECK_EQ(store->Count(), kLimit);
    CHECK(store->size() <= 4);
    CHECK_EQ(store->evicted_kept() + store->size(), static_cast<size_t>(kLimit));
  }
  store->Clear();
  CHECK_EQ(store->Count(), int64_t{0});
  CHECK_EQ(store->evicted_kept(), size_t{0});
  for (int key = kKeys - 1; key >= 0; --key) {  // the other half fits now
    CHECK_EQ(CallAdopting(*store, key, kLimit, adoptions, rec, 0), key >= kKeys - kLimit ? key * 2 : -1);
  }
  store->Clear();
  auto deadline = std::chrono::steady_clock::now() + 500ms;
  ftjit_test::RunThreads(6, [&](size_t i) {
    auto* r = Slot::Get().rec;
    std::mt19937 rng(static_cast<unsigned>(i) + 29);
    while (std::chrono::steady_clock::now() < deadline) {
      int key = static_cast<int>(rng() % kKeys);
      if (i == 0) {
        if (rng() % 16 == 0) store->Clear();
        std::this_thread::yield();
      } else {
        int got = CallAdopting(*store, key, /*limit=*/1 << 20, adoptions, r, static_cast<int>(i));
        CHECK_EQ(got, key * 2);
      }
    }
  });
  CHECK_EQ(store->Count(), static_cast<int64_t>(store->size() + store->evicted_kept()));
  store->Clear();
  CHECK_EQ(store->Count(), int64_t{0});
  CHECK_EQ(adoptions.load(), 0);
  store.reset();
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

// Live threads hold distinct indices, the lowest free ones, however many
// (no bound: all kThreads at once get one each); a thread that ends gives
// its index back to the next. Each thread then uses its slot's `copy` of
// one hot entry with plain writes: ThreadSanitizer would report two threads
// on one slot.
void TestIndicesAreExclusiveAmongLiveThreads() {
  auto lru = std::make_shared<Lru>(8);
  auto store = std::make_shared<Store>(lru);
  auto* main_rec = Slot::Get().rec;
  const size_t main_index = Slot::Get().index;
  Ledger ledger(1, /*strict=*/true);
  CHECK_EQ(CallOnce(*store, 0, ledger, main_rec, main_index), 0);  // compiles
  CHECK_EQ(CallOnce(*store, 0, ledger, main_rec, main_index), 0);  // a hit: the main thread's slot
  const int kThreads = 40;
  for (int round = 0; round < 3; ++round) {
    std::vector<size_t> indices(kThreads, SIZE_MAX);
    ftjit_test::Barrier all_in(kThreads);
    ftjit_test::RunThreads(kThreads, [&](size_t i) {
      const Slot::Ctx& t = Slot::Get();
      indices[i] = t.index;
      all_in.Arrive();  // every thread holds its index now
      for (int k = 0; k < 500; ++k) {
        Entry* e = Find(*store, SigOf(0), t.rec, t.index);
        CHECK(e != nullptr);
        TestLocal& local = e->slots.Get(t.index).copy;
        local.owner = &indices[i];
        ++local.uses;
        CHECK(local.owner == &indices[i]);
        Finish(e, t.rec, t.index);
      }
    });
    std::sort(indices.begin(), indices.end());
    CHECK(std::adjacent_find(indices.begin(), indices.end()) == indices.end());  // distinct
    CHECK(!std::binary_search(indices.begin(), indices.end(), main_index));      // not the main thread's
    // The lowest free ones: below kThreads + 1 (the main thread holds one).
    CHECK(indices.back() <= static_cast<size_t>(kThreads));
  }
  uint64_t uses = 0;
  size_t slots = 0;
  store->Entries()[0]->slots.ForEach([&](const Entry::Slot& s) {
    uses += s.copy.uses;
    ++slots;
  });
  CHECK_EQ(uses, static_cast<uint64_t>(3 * kThreads * 500));  // the main thread's slot has none
  CHECK_EQ(slots, static_cast<size_t>(kThreads + 1));  // each index's slot, handed on round to round
}

// A redirect (a thread's slot of the head sending its calls to another
// entry of the same TableHash) is followed by probes that ask for it, and
// holds until an entry of its bucket leaves the map: a removal elsewhere
// leaves it be, one in its bucket voids it (then forgotten).
void TestRedirectsLastUntilTheirBucketLosesAnEntry() {
  auto lru = std::make_shared<Lru>(16);
  auto store = std::make_shared<Store>(lru);
  Ledger ledger(8, /*strict=*/true);
  const ftjit::ThreadSlot<TestTraits>::Ctx& t = Slot::Get();
  const size_t h = SigOf(1).hash;  // keys 1 and 2 share it: one bucket, as one call's contexts do
  CHECK_EQ(CallOnce(*store, 1, ledger, t.rec, t.index, h), 2);
  CHECK_EQ(CallOnce(*store, 2, ledger, t.rec, t.index, h), 4);
  CHECK_EQ(CallOnce(*store, 3, ledger, t.rec, t.index), 6);  // another bucket (most likely: checked below)
  CHECK(SigOf(3).hash % 64 != h % 64);
  Store::EntryPtr two = store->Find(TestSig{h, 2});
  Store::EntryPtr three = store->Find(SigOf(3));
  const TestSig one{h, 1};
  Store::Held held = store->FindReady(one, t.rec, t.index, true);
  CHECK(held.head == held.target && held.head->payload.value == 2);
  const uint64_t gen = store->RedirectGen(one);
  Store::Redirect(held.head, *held.head_slot, two.get(), gen);
  Store::Release(held, t.rec);
  held = store->FindReady(one, t.rec, t.index, true);
  CHECK(held.target == two.get() && held.head->payload.value == 2);
  Store::Release(held, t.rec);
  held = store->FindReady(one, t.rec, t.index, false);  // a whole-signature probe: no redirect
  CHECK(held.target == held.head);
  Store::Release(held, t.rec);
  store->Discard(three);  // another bucket's removal
  held = store->FindReady(one, t.rec, t.index, true);
  CHECK(held.target == two.get());
  Store::Release(held, t.rec);
  store->Discard(two);  // the redirect's bucket
  held = store->FindReady(one, t.rec, t.index, true);
  CHECK(held.target == held.head);
  CHECK(held.head_slot->redirect == nullptr);  // forgotten
  Store::Release(held, t.rec);
  two.reset();
  three.reset();
  store.reset();
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

// Threads follow their redirects to an entry another thread keeps
// discarding and compiling again, set anew each time from a probe that
// found the target listed (as ContextMiss does): a thread never reaches a
// freed target (its canary), and nothing leaks.
void TestRedirectsRaceWithRemovalsOfTheirTarget() {
  auto lru = std::make_shared<Lru>(16);
  auto store = std::make_shared<Store>(lru);
  Ledger ledger(4, /*strict=*/false);
  const size_t h = SigOf(1).hash;
  CHECK_EQ(CallOnce(*store, 1, ledger, Slot::Get().rec, Slot::Get().index, h), 2);
  auto deadline = std::chrono::steady_clock::now() + 1000ms;
  std::atomic<uint64_t> followed{0};
  ftjit_test::RunThreads(5, [&](size_t i) {
    const Slot::Ctx& t = Slot::Get();
    while (std::chrono::steady_clock::now() < deadline) {
      if (i == 0) {
        if (Store::EntryPtr two = store->Find(TestSig{h, 2})) store->Discard(two);
        std::this_thread::yield();
        continue;
      }
      Store::Held held = store->FindReady(TestSig{h, 1}, t.rec, t.index, true);
      if (!held) {
        Store::AfterMiss(t.rec);
        continue;
      }
      CHECK_EQ(held.target->payload.canary.load(), kAlive);
      if (held.target != held.head) {
        CHECK_EQ(held.target->payload.value, 4);
        followed.fetch_add(1, std::memory_order_relaxed);
      } else {
        // Set the redirect as ContextMiss does: the count first, then a probe.
        const uint64_t gen = store->RedirectGen(TestSig{h, 2});
        Store::Held two = store->FindReady(TestSig{h, 2}, t.rec, t.index, false);
        if (two) {
          Store::Redirect(held.head, *held.head_slot, two.head, gen);
          Store::Release(two, t.rec);
        } else {
          Store::AfterMiss(t.rec);
          CHECK_EQ(CallOnce(*store, 2, ledger, t.rec, t.index, h), 4);
        }
      }
      Store::Release(held, t.rec);
    }
  });
  CHECK(followed.load() > 0);
  store.reset();
  CHECK_EQ(TestTraits::Epochs().retired_count(), size_t{0});
  CHECK_EQ(g_live_payloads.load(), int64_t{0});
}

}  // namespace

int main() {
#ifdef FTJIT_TEST_LEAF_MUTEX
  RUN_TEST(TestLeafMutexExcludes);
#endif
  RUN_TEST(TestCallsAgainstEvictions);
  RUN_TEST(TestCallsAgainstEvictionsAndClears);
  RUN_TEST(TestClearKeepsTheLruLinkOfAnEntryInsertedAfterIt);
  RUN_TEST(TestInFlightEntryOutlivesItsUnlinking);
  RUN_TEST(TestInFlightRacesWithClears);
  RUN_TEST(TestRetirementRacingAHitIsFreedWhenTheCallEnds);
  RUN_TEST(TestRetirementRacingAMissIsFreedWhenTheProbeEnds);
  RUN_TEST(TestLateUseAfterThreadExitTakesAFreshRecord);
  RUN_TEST(TestProvisionalEntriesAreAdoptedOnFirstUse);
  RUN_TEST(TestProvisionalAdoptionsRaceWithClears);
  RUN_TEST(TestEvictionsKeepTheirCountUntilAClear);
  RUN_TEST(TestIndicesAreExclusiveAmongLiveThreads);
  RUN_TEST(TestRedirectsLastUntilTheirBucketLosesAnEntry);
  RUN_TEST(TestRedirectsRaceWithRemovalsOfTheirTarget);
  RUN_TEST(TestNewestReadyIsPublishOrderAcrossUnlistings);
  RUN_TEST(TestHitsFindExactlyTheListedEntriesWhilePublishingAndDiscarding);
  std::fprintf(stderr, "all EntryStore tests passed\n");
  return 0;
}
