// ftjit tests: ftjit::SharedLru capacity, CLOCK second chance, pinning, removal and concurrent use (run under TSAN).
#include "primitives/shared_lru.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "primitives/locks.h"

namespace {

using ftjit_test::RunThreads;

struct Node;
using Item = std::shared_ptr<Node>;

struct Node {
  explicit Node(int i) : id(i) {}
  int id;
  std::atomic<bool> pinned{false};  // unevictable while true (e.g. still compiling)
  std::atomic<int> links{0};        // test bookkeeping: times linked minus times unlinked
  ftjit::LruHook<Item> lru;
};

using Lru = ftjit::SharedLru<Item, ftjit::StdMutex>;

bool Evictable(const Item& item) { return !item->pinned.load(std::memory_order_relaxed); }

Item NewNode(int id, bool pinned = false) {
  auto n = std::make_shared<Node>(id);
  n->pinned.store(pinned);
  return n;
}

std::vector<int> Ids(const std::vector<Item>& items) {
  std::vector<int> ids;
  for (const auto& it : items) ids.push_back(it->id);
  return ids;
}

std::string Join(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

#define CHECK_IDS(items, ...) CHECK_EQ(Join(Ids(items)), Join(std::vector<int>{__VA_ARGS__}))

// Inserting evictable items never leaves size above capacity; the oldest untouched item goes first and is unlinked.
void TestCapacityBound() {
  Lru lru(4);
  CHECK_EQ(lru.capacity(), size_t{4});
  std::vector<Item> nodes;
  std::vector<int> evicted_ids;
  for (int i = 1; i <= 10; ++i) {
    nodes.push_back(NewNode(i));
    auto evicted = lru.Insert(nodes.back(), Evictable);
    CHECK(lru.size() <= lru.capacity());
    CHECK_EQ(lru.size(), static_cast<size_t>(std::min(i, 4)));
    CHECK_EQ(evicted.size(), size_t{i > 4 ? 1u : 0u});
    for (const auto& e : evicted) {
      evicted_ids.push_back(e->id);
      CHECK(!lru.Remove(e));  // already unlinked
    }
  }
  CHECK_EQ(Join(evicted_ids), Join({1, 2, 3, 4, 5, 6}));
  // The LRU still holds exactly one reference to each survivor.
  for (int i = 7; i <= 10; ++i) CHECK_EQ(nodes[i - 1].use_count(), 2L);
  for (int i = 1; i <= 6; ++i) CHECK_EQ(nodes[i - 1].use_count(), 1L);
  CHECK(lru.Trim(Evictable).empty());
  auto all = lru.Clear();
  CHECK_IDS(all, 10, 9, 8, 7);  // front (newest) to back
  CHECK_EQ(lru.size(), size_t{0});

  // Capacity 0: every insert evicts the item straight back.
  Lru none(0);
  Item x = NewNode(1);
  auto ev = none.Insert(x, Evictable);
  CHECK_IDS(ev, 1);
  CHECK_EQ(none.size(), size_t{0});
  CHECK(!none.Remove(x));
}

// A Touch'ed item survives exactly one eviction pass (its bit is spent), and Insert clears a stale bit.
void TestSecondChance() {
  Lru lru(3);
  Item a = NewNode(1), b = NewNode(2), c = NewNode(3), d = NewNode(4);
  Item e = NewNode(5), f = NewNode(6), g = NewNode(7);
  CHECK(lru.Insert(a, Evictable).empty());
  CHECK(lru.Insert(b, Evictable).empty());
  CHECK(lru.Insert(c, Evictable).empty());
  Lru::Touch(a);
  Lru::Touch(a);  // a bit, not a counter: still one chance
  CHECK_IDS(lru.Insert(d, Evictable), 2);  // a moved to the front, b evicted
  CHECK_IDS(lru.Insert(e, Evictable), 3);
  CHECK_IDS(lru.Insert(f, Evictable), 4);
  CHECK_IDS(lru.Insert(g, Evictable), 1);  // a's chance was spent
  CHECK_EQ(lru.size(), size_t{3});

  // Touch before Insert does not count: Insert resets the bit.
  Lru lru2(1);
  Item p = NewNode(10), q = NewNode(11);
  Lru::Touch(p);
  CHECK(lru2.Insert(p, Evictable).empty());
  CHECK_IDS(lru2.Insert(q, Evictable), 10);

  // Everything touched: one full pass clears all bits, then the oldest goes.
  Lru lru3(2);
  std::vector<Item> ns;
  for (int i = 1; i <= 2; ++i) {
    ns.push_back(NewNode(i));
    lru3.Insert(ns.back(), Evictable);
    Lru::Touch(ns.back());
  }
  ns.push_back(NewNode(3));
  Lru::Touch(ns.back());  // reset by Insert
  CHECK_IDS(lru3.Insert(ns.back(), Evictable), 3);
  Item r = NewNode(4);
  CHECK_IDS(lru3.Insert(r, Evictable), 1);  // 1 and 2 lost their bits above
  CHECK_EQ(lru3.size(), size_t{2});
}

// Pinned items are never evicted, so the LRU runs over capacity until Trim after unpinning.
void TestPinned() {
  Lru lru(2);
  std::vector<Item> pinned;
  for (int i = 1; i <= 4; ++i) {
    pinned.push_back(NewNode(i, /*pinned=*/true));
    CHECK(lru.Insert(pinned.back(), Evictable).empty());
  }
  CHECK_EQ(lru.size(), size_t{4});
  CHECK(lru.Trim(Evictable).empty());
  CHECK_EQ(lru.size(), size_t{4});

  Item e = NewNode(5);
  CHECK_IDS(lru.Insert(e, Evictable), 5);  // the only evictable one goes
  CHECK_EQ(lru.size(), size_t{4});

  pinned[0]->pinned.store(false);
  pinned[1]->pinned.store(false);
  Lru::Touch(pinned[3]);  // pinned and touched: still not evictable
  auto trimmed = lru.Trim(Evictable);
  std::vector<int> ids = Ids(trimmed);
  std::sort(ids.begin(), ids.end());
  CHECK_EQ(Join(ids), Join({1, 2}));
  CHECK_EQ(lru.size(), size_t{2});
  CHECK(lru.Trim(Evictable).empty());
  CHECK(!lru.Remove(pinned[0]));
  CHECK(lru.Remove(pinned[2]));
  CHECK(lru.Remove(pinned[3]));
  CHECK_EQ(lru.size(), size_t{0});
}

// Remove, RemoveEach, RemoveIf and Clear unlink exactly the requested items and leave them re-insertable.
void TestRemove() {
  Lru lru(100);
  std::vector<Item> ns;
  for (int i = 0; i < 10; ++i) {
    ns.push_back(NewNode(i));
    CHECK(lru.Insert(ns.back(), Evictable).empty());
  }
  CHECK(lru.Remove(ns[3]));
  CHECK(!lru.Remove(ns[3]));
  CHECK_EQ(lru.size(), size_t{9});
  CHECK_EQ(ns[3].use_count(), 1L);
  auto odd = lru.RemoveIf([](const Item& it) { return it->id % 2 == 1; });
  CHECK_IDS(odd, 9, 7, 5, 1);
  CHECK_EQ(lru.size(), size_t{5});
  for (const auto& it : odd) CHECK(!lru.Remove(it));
  CHECK(lru.RemoveIf([](const Item&) { return false; }).empty());
  // RemoveEach unlinks the linked ones among those given (2 and 4 here;
  // 5 is already out), and only those.
  std::vector<std::pair<int, Item>> some{{0, ns[2]}, {1, ns[5]}, {2, ns[4]}};
  lru.RemoveEach(some, [](const std::pair<int, Item>& p) -> const Item& { return p.second; });
  CHECK_EQ(lru.size(), size_t{3});
  CHECK(!lru.Remove(ns[2]));
  CHECK(!lru.Remove(ns[4]));
  CHECK_EQ(ns[2].use_count(), 2L);  // ns and `some`: the LRU's reference is gone
  some.clear();
  CHECK(lru.Insert(ns[2], Evictable).empty());
  CHECK(lru.Insert(ns[4], Evictable).empty());
  CHECK_EQ(lru.size(), size_t{5});
  // Re-insert a removed item: it links again, at the front.
  CHECK(lru.Insert(ns[3], Evictable).empty());
  CHECK_EQ(lru.size(), size_t{6});
  // Inserting an already-linked item does not link it twice.
  CHECK(lru.Insert(ns[3], Evictable).empty());
  CHECK_EQ(lru.size(), size_t{6});
  auto all = lru.Clear();
  CHECK_IDS(all, 3, 4, 2, 8, 6, 0);  // 4 and 2 re-inserted at the front before 3
  CHECK_EQ(lru.size(), size_t{0});
  for (const auto& it : all) CHECK(!lru.Remove(it));
  CHECK(lru.Clear().empty());
  all.clear();
  odd.clear();
  for (const auto& n : ns) CHECK_EQ(n.use_count(), 1L);  // the LRU kept no reference
}

// Threads insert, touch, remove, trim and clear one LRU at once; every unlink is reported exactly once.
void TestConcurrent() {
  const size_t kThreads = 6;
  const size_t kCapacity = 16;
  const int kItemsPerThread = 24;
  const int kRounds = 20000;
  Lru lru(kCapacity);
  std::atomic<long> linked_total{0};
  std::atomic<long> unlinked_total{0};

  // Every item returned by the LRU (evicted or removed) must have been linked.
  auto account = [&](const std::vector<Item>& out) {
    for (const auto& it : out) {
      int before = it->links.fetch_sub(1, std::memory_order_acq_rel);
      CHECK_EQ(before, 1);  // linked once, unlinked once
    }
    unlinked_total.fetch_add(static_cast<long>(out.size()));
  };

  std::vector<std::vector<Item>> owned(kThreads);
  for (size_t t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kItemsPerThread; ++i) {
      owned[t].push_back(NewNode(static_cast<int>(t) * 1000 + i, /*pinned=*/i % 5 == 0));
    }
  }

  RunThreads(kThreads, [&](size_t t) {
    uint32_t rng = 99u + static_cast<uint32_t>(t) * 31u;
    auto next = [&] { rng = rng * 1664525u + 1013904223u; return rng >> 8; };
    auto& mine = owned[t];
    for (int round = 0; round < kRounds; ++round) {
      Item& it = mine[next() % mine.size()];
      switch (next() % 8) {
        case 0:
        case 1:
        case 2: {
          // Only the owner links its items, and only once their last unlink
          // has been accounted for, so Insert always really links.
          if (it->links.load(std::memory_order_acquire) == 0) {
            it->links.fetch_add(1, std::memory_order_acq_rel);
            linked_total.fetch_add(1);
            account(lru.Insert(it, Evictable));
          }
          break;
        }
        case 3: {
          // Touch any thread's item, linked or not: lock-free and always safe.
          const auto& other = owned[next() % kThreads];
          Lru::Touch(other[next() % other.size()]);
          Lru::Touch(it);
          break;
        }
        case 4: {
          if (lru.Remove(it)) account({it});
          break;
        }
        case 5:
          it->pinned.store(!it->pinned.load());
          account(lru.Trim(Evictable));
          break;
        case 6:
          account(lru.RemoveIf([t](const Item& x) { return x->id / 1000 == static_cast<int>(t) &&
                                                           x->id % 7 == 0; }));
          break;
        case 7:
          if (next() % 8 == 0) {
            account(lru.Clear());
          } else {
            CHECK(lru.size() <= kCapacity + kThreads * kItemsPerThread);
          }
          break;
      }
    }
  });

  // Everything evictable and untouched by now-finished threads: Trim restores the bound.
  for (auto& mine : owned) {
    for (auto& it : mine) it->pinned.store(false);
  }
  size_t before = lru.size();
  auto trimmed = lru.Trim(Evictable);
  account(trimmed);
  CHECK_EQ(lru.size(), std::min(before, kCapacity));
  CHECK(lru.size() <= kCapacity);
  CHECK_EQ(linked_total.load(), unlinked_total.load() + static_cast<long>(lru.size()));

  // Exactly the items still counted as linked are in the LRU, each once.
  auto rest = lru.Clear();
  std::set<int> rest_ids;
  for (const auto& it : rest) CHECK(rest_ids.insert(it->id).second);
  long still_linked = 0;
  for (auto& mine : owned) {
    for (auto& it : mine) {
      int links = it->links.load();
      CHECK(links == 0 || links == 1);
      CHECK_EQ(links == 1, rest_ids.count(it->id) == 1);
      still_linked += links;
    }
  }
  CHECK_EQ(still_linked, static_cast<long>(rest.size()));
  account(rest);
  CHECK_EQ(lru.size(), size_t{0});
  CHECK_EQ(linked_total.load(), unlinked_total.load());
  CHECK(linked_total.load() > static_cast<long>(kCapacity));
  std::fprintf(stderr, "  %ld links, %ld unlinks reported\n", linked_total.load(),
               unlinked_total.load());
  rest.clear();
  trimmed.clear();
  for (auto& mine : owned) {
    for (auto& it : mine) CHECK_EQ(it.use_count(), 1L);  // the LRU kept no reference
  }
}

// Two "caches" share one LRU bound: inserts from one evict the other's cold items, not its touched hot ones.
void TestSharedAcrossCaches() {
  Lru lru(4);
  std::vector<Item> hot, cold;
  for (int i = 0; i < 2; ++i) {
    hot.push_back(NewNode(1000 + i));  // cold ids stay below 1000
    lru.Insert(hot.back(), Evictable);
  }
  const size_t kThreads = 2;
  std::atomic<int> evicted_hot{0};
  std::atomic<int> evicted_total{0};
  std::atomic<bool> stop{false};
  RunThreads(kThreads, [&](size_t t) {
    if (t == 0) {
      // Cache A: keeps touching its two hot entries.
      while (!stop.load()) {
        for (const auto& h : hot) Lru::Touch(h);
        std::this_thread::yield();
      }
    } else {
      // Cache B: streams cold entries through the shared bound.
      for (int i = 0; i < 200; ++i) {
        Item c = NewNode(i);
        auto ev = lru.Insert(c, Evictable);
        for (const auto& e : ev) {
          if (e->id >= 1000) evicted_hot.fetch_add(1);
        }
        evicted_total.fetch_add(static_cast<int>(ev.size()));
        CHECK(lru.size() <= lru.capacity());
        for (const auto& h : hot) Lru::Touch(h);  // cache A also hit meanwhile
      }
      stop.store(true);
    }
  });
  CHECK_EQ(evicted_hot.load(), 0);
  CHECK_EQ(evicted_total.load(), 200 + 2 - 4);
  CHECK_EQ(lru.size(), size_t{4});
  auto all = lru.Clear();
  std::set<int> ids;
  for (const auto& it : all) ids.insert(it->id);
  CHECK_EQ(ids.count(1000), size_t{1});
  CHECK_EQ(ids.count(1001), size_t{1});
}

}  // namespace

int main() {
  RUN_TEST(TestCapacityBound);
  RUN_TEST(TestSecondChance);
  RUN_TEST(TestPinned);
  RUN_TEST(TestRemove);
  RUN_TEST(TestConcurrent);
  RUN_TEST(TestSharedAcrossCaches);
  std::fprintf(stderr, "all SharedLru tests passed\n");
  return 0;
}
