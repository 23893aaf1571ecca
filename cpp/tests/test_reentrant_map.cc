// ftjit tests: ftjit::ReentrantMap under real threads, re-entrant and throwing equality (run under TSAN).
#include "primitives/reentrant_map.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "primitives/locks.h"

namespace {

using ftjit_test::RunThreads;

struct KeyObj {
  int id;
};
struct ValObj {
  int key_id;
  int tag;  // who made it (thread index, or a test-chosen marker)
};
using Key = std::shared_ptr<const KeyObj>;
using Value = std::shared_ptr<const ValObj>;
using Map = ftjit::ReentrantMap<Key, Value, ftjit::StdMutex>;

// Non-reentrant, non-throwing equality: stored key vs integer probe.
bool PlainEq(const Key& stored, const int& probe) { return stored->id == probe; }

std::pair<Key, Value> MakePair(int id, int tag) {
  return {std::make_shared<const KeyObj>(KeyObj{id}),
          std::make_shared<const ValObj>(ValObj{id, tag})};
}

// Inserts `id` with PlainEq (must be absent); returns the value.
Value InsertFresh(Map& m, size_t hash, int id, int tag = 0) {
  auto r = m.FindOrInsert(hash, id, PlainEq, [&] { return MakePair(id, tag); });
  CHECK(r.inserted);
  CHECK_EQ(r.value->key_id, id);
  return r.value;
}

// Counts key ids in a snapshot; CHECKs every pair's value belongs to its key.
std::map<int, int> CountIds(const std::vector<std::pair<Key, Value>>& pairs) {
  std::map<int, int> counts;
  for (const auto& kv : pairs) {
    CHECK(kv.first != nullptr);
    CHECK(kv.second != nullptr);
    CHECK_EQ(kv.first->id, kv.second->key_id);
    ++counts[kv.first->id];
  }
  return counts;
}

// Single-threaded contract of Find/FindOrInsert/Erase/EraseIf/Snapshot/Clear, including colliding hashes.
void TestBasic() {
  Map m;
  const size_t kH = 7;  // every key below shares this hash
  CHECK_EQ(m.size(), size_t{0});
  CHECK(m.Find(kH, 1, PlainEq) == nullptr);

  int makes = 0;
  auto make1 = [&] { ++makes; return MakePair(1, 11); };
  auto r1 = m.FindOrInsert(kH, 1, PlainEq, make1);
  CHECK(r1.inserted);
  CHECK_EQ(r1.value->key_id, 1);
  CHECK_EQ(r1.value->tag, 11);
  CHECK_EQ(makes, 1);
  auto r1b = m.FindOrInsert(kH, 1, PlainEq, make1);
  CHECK(!r1b.inserted);
  CHECK(r1b.value == r1.value);
  CHECK_EQ(makes, 1);  // make() is not called when the key is found

  std::vector<Value> vals(6);
  vals[1] = r1.value;
  for (int id = 2; id <= 5; ++id) vals[id] = InsertFresh(m, kH, id);
  CHECK_EQ(m.size(), size_t{5});
  for (int id = 1; id <= 5; ++id) CHECK(m.Find(kH, id, PlainEq) == vals[id]);
  CHECK(m.Find(kH, 6, PlainEq) == nullptr);
  CHECK(m.Find(kH + 1, 1, PlainEq) == nullptr);  // same key, other hash

  // ContainsValue and Erase match on (hash, value identity) only.
  auto stranger = MakePair(1, 99).second;
  CHECK(m.ContainsValue(kH, vals[1]));
  CHECK(!m.ContainsValue(kH, stranger));
  CHECK(!m.ContainsValue(kH + 1, vals[1]));
  CHECK(m.Erase(kH, stranger) == nullptr);
  CHECK(m.Erase(kH + 1, vals[1]) == nullptr);
  CHECK_EQ(m.size(), size_t{5});
  CHECK(m.Erase(kH, vals[1]) == vals[1]);
  CHECK_EQ(m.size(), size_t{4});
  CHECK(m.Find(kH, 1, PlainEq) == nullptr);
  CHECK(!m.ContainsValue(kH, vals[1]));
  CHECK(m.Erase(kH, vals[1]) == nullptr);
  CHECK_EQ(vals[1].use_count(), 3L);  // vals[1], r1.value, r1b.value: the map kept none

  auto again = m.FindOrInsert(kH, 1, PlainEq, [] { return MakePair(1, 12); });
  CHECK(again.inserted);
  CHECK(again.value != vals[1]);
  CHECK_EQ(again.value->tag, 12);
  vals[1] = again.value;

  auto evens = m.EraseIf([](const Key& k, const Value&) { return k->id % 2 == 0; });
  auto even_ids = CountIds(evens);
  CHECK_EQ(even_ids.size(), size_t{2});
  CHECK_EQ(even_ids[2], 1);
  CHECK_EQ(even_ids[4], 1);
  CHECK_EQ(m.size(), size_t{3});
  CHECK(m.Find(kH, 2, PlainEq) == nullptr);
  CHECK(m.Find(kH, 4, PlainEq) == nullptr);

  auto snap = m.Snapshot();
  auto snap_ids = CountIds(snap);
  CHECK_EQ(snap_ids.size(), size_t{3});
  for (int id : {1, 3, 5}) CHECK_EQ(snap_ids[id], 1);
  for (const auto& kv : snap) CHECK(kv.second == vals[kv.first->id]);
  snap.clear();

  long before = vals[3].use_count();
  auto cleared = m.Clear();
  CHECK_EQ(cleared.size(), size_t{3});
  CHECK_EQ(m.size(), size_t{0});
  CHECK_EQ(vals[3].use_count(), before);  // moved out of the map, not copied
  cleared.clear();
  CHECK_EQ(vals[3].use_count(), before - 1);  // the map holds nothing now
  CHECK(m.Find(kH, 3, PlainEq) == nullptr);
  CHECK(m.Clear().empty());
  CHECK(m.Snapshot().empty());
}

// N threads race FindOrInsert on one key: exactly one inserts and every thread gets that same value.
void TestRaceSameKey() {
  const size_t kThreads = 8;
  for (int round = 0; round < 60; ++round) {
    Map m;
    // A few pre-existing colliding keys so that eq runs (unlocked) before the insert.
    for (int id = 100; id < 103; ++id) InsertFresh(m, 5, id);
    std::atomic<int> inserted{0};
    std::atomic<int> makes{0};
    std::vector<Value> got(kThreads);
    std::vector<int> inserted_by(kThreads, 0);
    RunThreads(kThreads, [&](size_t t) {
      auto eq = [](const Key& k, const int& p) {
        std::this_thread::yield();
        return k->id == p;
      };
      int my_makes = 0;
      auto r = m.FindOrInsert(5, 42, eq, [&] {
        ++my_makes;
        makes.fetch_add(1);
        return MakePair(42, static_cast<int>(t));
      });
      CHECK(my_makes <= 1);
      got[t] = r.value;
      inserted_by[t] = r.inserted ? 1 : 0;
      if (r.inserted) inserted.fetch_add(1);
    });
    CHECK_EQ(inserted.load(), 1);
    CHECK(makes.load() >= 1);
    CHECK(makes.load() <= static_cast<int>(kThreads));
    for (size_t t = 0; t < kThreads; ++t) {
      CHECK(got[t] == got[0]);
      if (inserted_by[t]) CHECK_EQ(got[t]->tag, static_cast<int>(t));
    }
    CHECK_EQ(got[0]->key_id, 42);
    CHECK_EQ(m.size(), size_t{4});
    CHECK(m.Find(5, 42, PlainEq) == got[0]);
  }
}

// Many threads x many keys hashed into 4 buckets: each key is inserted exactly once and all agree on its value.
void TestManyKeysCollidingHashes() {
  const size_t kThreads = 8;
  const int kKeys = 256;
  auto hash = [](int id) { return static_cast<size_t>(id % 4) * 0x9E3779B9u; };
  Map m;
  std::vector<std::atomic<int>> inserted(kKeys);
  for (auto& a : inserted) a.store(0);
  std::vector<std::vector<Value>> got(kThreads, std::vector<Value>(kKeys));
  RunThreads(kThreads, [&](size_t t) {
    for (int n = 0; n < kKeys; ++n) {
      // Each thread walks the keys in a different order.
      int id = (t % 2 == 0) ? (n + static_cast<int>(t) * 37) % kKeys
                            : (kKeys - 1 - n + static_cast<int>(t) * 53) % kKeys;
      auto r = m.FindOrInsert(hash(id), id, PlainEq,
                              [&] { return MakePair(id, static_cast<int>(t)); });
      CHECK_EQ(r.value->key_id, id);
      if (r.inserted) inserted[id].fetch_add(1);
      got[t][id] = r.value;
    }
  });
  CHECK_EQ(m.size(), static_cast<size_t>(kKeys));
  for (int id = 0; id < kKeys; ++id) {
    CHECK_EQ(inserted[id].load(), 1);
    Value v = m.Find(hash(id), id, PlainEq);
    CHECK(v != nullptr);
    for (size_t t = 0; t < kThreads; ++t) CHECK(got[t][id] == v);
  }
  auto counts = CountIds(m.Snapshot());
  CHECK_EQ(counts.size(), static_cast<size_t>(kKeys));
  for (const auto& c : counts) CHECK_EQ(c.second, 1);
}

// Eq re-enters the map (nested inserts, an insert of the probed key, Erase, Clear, Find) on the same thread.
void TestReentrantEqSingleThread() {
  const size_t kH = 0;
  // (a) eq inserts other keys: the outer insert still happens once, and each
  // stored key is compared exactly once (the re-check covers only newcomers).
  {
    Map m;
    InsertFresh(m, kH, 1);
    InsertFresh(m, kH, 2);
    std::map<int, int> compared;
    bool nested_done = false;
    auto eq = [&](const Key& k, const int& p) {
      ++compared[k->id];
      if (!nested_done) {
        nested_done = true;
        InsertFresh(m, kH, 4);    // same hash: a newcomer to re-check
        InsertFresh(m, 1, 100);   // other hash: bumps the version only
      }
      return k->id == p;
    };
    int makes = 0;
    auto r = m.FindOrInsert(kH, 3, eq, [&] { ++makes; return MakePair(3, 33); });
    CHECK(r.inserted);
    CHECK_EQ(r.value->key_id, 3);
    CHECK_EQ(r.value->tag, 33);
    CHECK_EQ(makes, 1);
    CHECK_EQ(compared.size(), size_t{3});
    CHECK_EQ(compared[1], 1);
    CHECK_EQ(compared[2], 1);
    CHECK_EQ(compared[4], 1);
    CHECK_EQ(m.size(), size_t{5});
    CHECK(m.Find(kH, 3, PlainEq) == r.value);
    CHECK(m.Find(1, 100, PlainEq) != nullptr);
  }
  // (b) eq inserts a key equal to the probe: the outer call must return that
  // one (inserted == false) and never add a duplicate.
  {
    Map m;
    InsertFresh(m, kH, 1);
    InsertFresh(m, kH, 2);
    bool nested_done = false;
    Value nested;
    auto eq = [&](const Key& k, const int& p) {
      if (!nested_done) {
        nested_done = true;
        nested = InsertFresh(m, kH, 5, /*tag=*/999);
      }
      return k->id == p;
    };
    int makes = 0;
    auto r = m.FindOrInsert(kH, 5, eq, [&] { ++makes; return MakePair(5, 1); });
    CHECK(!r.inserted);
    CHECK(r.value == nested);
    CHECK_EQ(r.value->tag, 999);
    CHECK_EQ(makes, 1);  // made after the first pass, then dropped on the re-check
    CHECK_EQ(m.size(), size_t{3});
    CHECK_EQ(CountIds(m.Snapshot())[5], 1);
  }
  // (c) eq erases the very slot it is comparing against.
  {
    Map m;
    std::map<int, Value> vals;
    for (int id = 1; id <= 3; ++id) vals[id] = InsertFresh(m, kH, id);
    int erased = 0;
    auto eq = [&](const Key& k, const int& p) {
      Value gone = m.Erase(kH, vals[k->id]);
      CHECK(gone == vals[k->id]);
      ++erased;
      return k->id == p;
    };
    auto r = m.FindOrInsert(kH, 9, eq, [] { return MakePair(9, 0); });
    CHECK(r.inserted);
    CHECK_EQ(erased, 3);
    CHECK_EQ(m.size(), size_t{1});
    CHECK(m.Find(kH, 9, PlainEq) == r.value);
  }
  // (d) eq calls Clear(): a present probe is still found on the copied
  // candidates; an absent probe is inserted into the now-empty map.
  {
    Map m;
    Value v1 = InsertFresh(m, kH, 1);
    InsertFresh(m, kH, 2);
    size_t cleared = 0;
    bool done = false;
    auto eq = [&](const Key& k, const int& p) {
      if (!done) {
        done = true;
        cleared = m.Clear().size();
      }
      return k->id == p;
    };
    auto r = m.FindOrInsert(kH, 1, eq, [] { return MakePair(1, 0); });
    CHECK(!r.inserted);
    CHECK(r.value == v1);
    CHECK_EQ(cleared, size_t{2});
    CHECK_EQ(m.size(), size_t{0});

    InsertFresh(m, kH, 1);
    InsertFresh(m, kH, 2);
    done = false;
    auto r3 = m.FindOrInsert(kH, 3, eq, [] { return MakePair(3, 0); });
    CHECK(r3.inserted);
    CHECK_EQ(cleared, size_t{2});
    CHECK_EQ(m.size(), size_t{1});
    CHECK(m.Find(kH, 3, PlainEq) == r3.value);
  }
  // (e) eq calls Find (and a nested Find that itself re-enters) on the same map.
  {
    Map m;
    Value v1 = InsertFresh(m, kH, 1);
    InsertFresh(m, kH, 2);
    int depth = 0;
    int nested_finds = 0;
    std::function<bool(const Key&, const int&)> eq = [&](const Key& k, const int& p) {
      if (depth < 2) {
        ++depth;
        ++nested_finds;
        Value inner = m.Find(kH, 1, eq);
        CHECK(inner == v1);
        --depth;
      }
      return k->id == p;
    };
    CHECK(m.Find(kH, 2, eq) != nullptr);
    CHECK(nested_finds > 0);
    CHECK_EQ(depth, 0);
    CHECK_EQ(m.size(), size_t{2});
  }
}

// Threads whose eq re-enters the map (side inserts, erases, EraseIf) while they FindOrInsert shared keys.
void TestReentrantEqThreads() {
  const size_t kThreads = 6;
  const int kKeys = 48;
  const size_t kSideHash = 1000;  // side keys never collide with main keys
  Map m;
  std::vector<std::atomic<int>> inserted(kKeys);
  for (auto& a : inserted) a.store(0);
  std::atomic<int> reentries{0};
  RunThreads(kThreads, [&](size_t t) {
    thread_local int depth = 0;
    uint32_t rng = 12345u + static_cast<uint32_t>(t) * 7919u;
    auto next = [&] { rng = rng * 1664525u + 1013904223u; return rng >> 8; };
    auto eq = [&](const Key& k, const int& p) {
      if (depth == 0 && next() % 3 == 0) {
        ++depth;
        reentries.fetch_add(1);
        int side = 10000 + static_cast<int>(next() % 64);
        auto r = m.FindOrInsert(kSideHash, side, PlainEq, [&] { return MakePair(side, -1); });
        CHECK_EQ(r.value->key_id, side);
        if (next() % 2) m.Erase(kSideHash, r.value);
        if (next() % 8 == 0) {
          auto side_gone = m.EraseIf([](const Key& key, const Value&) { return key->id >= 10000; });
          for (const auto& kv : side_gone) CHECK(kv.first->id >= 10000);
        }
        CHECK(m.Find(static_cast<size_t>(p % 3), p, PlainEq) == nullptr ||
              m.Find(static_cast<size_t>(p % 3), p, PlainEq)->key_id == p);
        --depth;
      }
      return k->id == p;
    };
    for (int n = 0; n < kKeys; ++n) {
      int id = (n * 5 + static_cast<int>(t) * 11) % kKeys;
      auto r = m.FindOrInsert(static_cast<size_t>(id % 3), id, eq,
                              [&] { return MakePair(id, static_cast<int>(t)); });
      CHECK_EQ(r.value->key_id, id);
      if (r.inserted) inserted[id].fetch_add(1);
    }
  });
  CHECK(reentries.load() > 0);
  for (int id = 0; id < kKeys; ++id) CHECK_EQ(inserted[id].load(), 1);
  auto all = m.Snapshot();
  auto counts = CountIds(all);
  int main_keys = 0;
  for (const auto& c : counts) {
    CHECK_EQ(c.second, 1);  // no duplicate, main or side
    if (c.first < 10000) ++main_keys;
  }
  CHECK_EQ(main_keys, kKeys);
}

// An eq (or make) that throws: the exception reaches the caller and the map stays consistent and usable.
void TestThrowingEq() {
  const size_t kH = 3;
  {
    Map m;
    Value v1 = InsertFresh(m, kH, 1);
    Value v2 = InsertFresh(m, kH, 2);
    int makes = 0;
    auto throwing = [](const Key& k, const int&) -> bool {
      if (k->id == 2) throw std::runtime_error("eq boom");
      return false;
    };
    bool caught = false;
    try {
      m.FindOrInsert(kH, 3, throwing, [&] { ++makes; return MakePair(3, 0); });
    } catch (const std::runtime_error& e) {
      caught = std::string(e.what()) == "eq boom";
    }
    CHECK(caught);
    CHECK_EQ(makes, 0);  // eq runs before make
    CHECK_EQ(m.size(), size_t{2});
    caught = false;
    try {
      m.Find(kH, 3, throwing);
    } catch (const std::runtime_error&) {
      caught = true;
    }
    CHECK(caught);
    CHECK(m.Find(kH, 1, PlainEq) == v1);
    CHECK(m.Find(kH, 2, PlainEq) == v2);
    Value v3 = InsertFresh(m, kH, 3);
    CHECK_EQ(m.size(), size_t{3});
    CHECK(m.Find(kH, 3, PlainEq) == v3);

    // make() throwing: nothing inserted, and a later insert works.
    caught = false;
    try {
      m.FindOrInsert(kH, 7, PlainEq,
                     []() -> std::pair<Key, Value> { throw std::logic_error("make boom"); });
    } catch (const std::logic_error&) {
      caught = true;
    }
    CHECK(caught);
    CHECK_EQ(m.size(), size_t{3});
    InsertFresh(m, kH, 7);
    CHECK_EQ(m.size(), size_t{4});

    // eq that re-enters (inserts) and then throws: the nested insert stays.
    bool nested = false;
    auto reenter_then_throw = [&](const Key&, const int&) -> bool {
      if (!nested) {
        nested = true;
        InsertFresh(m, kH, 8);
      }
      throw std::runtime_error("after reentry");
    };
    caught = false;
    try {
      m.FindOrInsert(kH, 9, reenter_then_throw, [] { return MakePair(9, 0); });
    } catch (const std::runtime_error&) {
      caught = true;
    }
    CHECK(caught);
    CHECK_EQ(m.size(), size_t{5});
    CHECK(m.Find(kH, 8, PlainEq) != nullptr);
    CHECK(m.Find(kH, 9, PlainEq) == nullptr);
    auto counts = CountIds(m.Snapshot());
    for (const auto& c : counts) CHECK_EQ(c.second, 1);
  }
  // Threads whose eq throws now and then and who retry: each key still inserted once.
  {
    const size_t kThreads = 6;
    const int kKeys = 64;
    Map m;
    std::vector<std::atomic<int>> inserted(kKeys);
    for (auto& a : inserted) a.store(0);
    std::atomic<int> throws{0};
    RunThreads(kThreads, [&](size_t t) {
      uint32_t calls = static_cast<uint32_t>(t);
      auto eq = [&](const Key& k, const int& p) {
        if (++calls % 23 == 0) throw std::runtime_error("flaky eq");
        return k->id == p;
      };
      for (int n = 0; n < kKeys; ++n) {
        int id = (n + static_cast<int>(t) * 13) % kKeys;
        for (;;) {
          try {
            auto r = m.FindOrInsert(static_cast<size_t>(id % 16), id, eq,
                                    [&] { return MakePair(id, static_cast<int>(t)); });
            CHECK_EQ(r.value->key_id, id);
            if (r.inserted) inserted[id].fetch_add(1);
            break;
          } catch (const std::runtime_error&) {
            throws.fetch_add(1);
          }
        }
      }
    });
    CHECK(throws.load() > 0);
    CHECK_EQ(m.size(), static_cast<size_t>(kKeys));
    for (int id = 0; id < kKeys; ++id) CHECK_EQ(inserted[id].load(), 1);
  }
}

// Erase and Clear (also from inside eq) race FindOrInsert: no duplicates ever, and inserts == removals + survivors.
void TestConcurrentEraseClear() {
  const size_t kInserters = 4;
  const size_t kThreads = kInserters + 2;  // + one eraser, one clearer
  const int kKeys = 64;
  const int kOpsPerInserter = 20000;
  auto hash = [](int id) { return static_cast<size_t>(id % 4); };
  Map m;
  std::atomic<long> inserted_total{0};
  std::atomic<long> removed_total{0};
  std::atomic<int> inserters_left{static_cast<int>(kInserters)};
  std::atomic<int> snapshots{0};
  RunThreads(kThreads, [&](size_t t) {
    if (t < kInserters) {
      uint32_t rng = 777u + static_cast<uint32_t>(t);
      for (int n = 0; n < kOpsPerInserter; ++n) {
        rng = rng * 1664525u + 1013904223u;
        int id = static_cast<int>((rng >> 8) % kKeys);
        bool reenter_clear = (t == 0 && n % 500 == 250);
        auto eq = [&](const Key& k, const int& p) {
          if (reenter_clear) {
            reenter_clear = false;
            auto gone = m.Clear();
            CountIds(gone);
            removed_total.fetch_add(static_cast<long>(gone.size()));
          }
          return k->id == p;
        };
        auto r = m.FindOrInsert(hash(id), id, eq,
                                [&] { return MakePair(id, static_cast<int>(t)); });
        CHECK_EQ(r.value->key_id, id);
        if (r.inserted) inserted_total.fetch_add(1);
      }
      inserters_left.fetch_sub(1);
    } else if (t == kInserters) {  // eraser
      int id = 0;
      while (inserters_left.load() > 0) {
        id = (id + 7) % kKeys;
        Value v = m.Find(hash(id), id, PlainEq);
        if (!v) {
          std::this_thread::yield();
          continue;
        }
        CHECK_EQ(v->key_id, id);
        Value gone = m.Erase(hash(id), v);
        if (gone) {
          CHECK(gone == v);
          removed_total.fetch_add(1);
        }
      }
    } else {  // clearer
      int n = 0;
      while (inserters_left.load() > 0) {
        auto counts = CountIds(m.Snapshot());
        for (const auto& c : counts) CHECK_EQ(c.second, 1);
        snapshots.fetch_add(1);
        if (++n % 4 == 0) {
          auto gone = m.Clear();
          CountIds(gone);
          removed_total.fetch_add(static_cast<long>(gone.size()));
        } else {
          auto gone = m.EraseIf([&](const Key& k, const Value&) { return k->id % 5 == n % 5; });
          for (const auto& kv : gone) CHECK_EQ(kv.first->id % 5, n % 5);
          removed_total.fetch_add(static_cast<long>(gone.size()));
        }
        std::this_thread::yield();
      }
    }
  });
  CHECK(snapshots.load() > 0);
  auto counts = CountIds(m.Snapshot());
  for (const auto& c : counts) CHECK_EQ(c.second, 1);
  CHECK_EQ(inserted_total.load(), removed_total.load() + static_cast<long>(m.size()));
  CHECK(inserted_total.load() >= static_cast<long>(m.size()));
  std::fprintf(stderr, "  %ld inserts, %ld removals, %zu survivors, %d snapshots\n",
               inserted_total.load(), removed_total.load(), m.size(), snapshots.load());
}

}  // namespace

// ReplaceValueIf swaps one slot's value (keeping its key) only when the
// claim agrees; racing claimers: exactly one wins, and every FindOrInsert of
// the key, before or after, sees exactly one value (old, then the new one).
void TestReplaceValueIf() {
  const size_t kH = 3;
  {
    Map m;
    Value old = InsertFresh(m, kH, 1, 10);
    InsertFresh(m, kH, 2, 20);  // a colliding neighbour, untouched
    Value fresh = MakePair(1, 11).second;
    int claims = 0;
    CHECK(!m.ReplaceValueIf(kH, fresh, [&] { ++claims; return true; }, old));  // `fresh` is in no slot
    CHECK(!m.ReplaceValueIf(kH + 1, old, [&] { ++claims; return true; }, fresh));  // other hash
    CHECK_EQ(claims, 0);  // the claim is asked only of the slot holding `old`
    CHECK(!m.ReplaceValueIf(kH, old, [&] { ++claims; return false; }, fresh));  // refused
    CHECK_EQ(claims, 1);
    CHECK(m.Find(kH, 1, PlainEq) == old);
    CHECK(m.ReplaceValueIf(kH, old, [&] { ++claims; return true; }, fresh));
    CHECK_EQ(claims, 2);
    CHECK(m.Find(kH, 1, PlainEq) == fresh);
    CHECK(!m.ContainsValue(kH, old));
    CHECK_EQ(m.size(), size_t{2});
    CHECK_EQ(m.Find(kH, 2, PlainEq)->tag, 20);
    CHECK(!m.FindOrInsert(kH, 1, PlainEq, [] { return MakePair(1, 99); }).inserted);
    CHECK(m.Erase(kH, fresh) == fresh);  // an ordinary slot afterwards
    CHECK(m.Find(kH, 1, PlainEq) == nullptr);
  }
  const size_t kThreads = 8;
  for (int round = 0; round < 60; ++round) {
    Map m;
    Value old = InsertFresh(m, kH, 7, -1);
    std::atomic<bool> claimed{false};
    std::atomic<int> winners{0};
    std::vector<Value> seen(kThreads);
    RunThreads(kThreads, [&](size_t t) {
      if (t % 2 == 0) {
        Value mine = MakePair(7, static_cast<int>(t)).second;
        bool won = m.ReplaceValueIf(kH, old, [&] { return !claimed.exchange(true); }, mine);
        if (won) winners.fetch_add(1);
      } else {
        auto eq = [](const Key& k, const int& p) {
          std::this_thread::yield();
          return k->id == p;
        };
        auto r = m.FindOrInsert(kH, 7, eq, [&] { return MakePair(7, 1000 + static_cast<int>(t)); });
        CHECK(!r.inserted);  // the key never leaves the map
        seen[t] = r.value;
      }
    });
    CHECK_EQ(winners.load(), 1);
    CHECK_EQ(m.size(), size_t{1});
    Value now = m.Find(kH, 7, PlainEq);
    CHECK(now != old);
    CHECK(now->tag >= 0 && now->tag % 2 == 0);  // one of the claimers' values
    for (size_t t = 1; t < kThreads; t += 2) CHECK(seen[t] == old || seen[t] == now);
  }
}

int main() {
  RUN_TEST(TestBasic);
  RUN_TEST(TestRaceSameKey);
  RUN_TEST(TestManyKeysCollidingHashes);
  RUN_TEST(TestReentrantEqSingleThread);
  RUN_TEST(TestReentrantEqThreads);
  RUN_TEST(TestThrowingEq);
  RUN_TEST(TestConcurrentEraseClear);
  RUN_TEST(TestReplaceValueIf);
  std::fprintf(stderr, "all ReentrantMap tests passed\n");
  return 0;
}
