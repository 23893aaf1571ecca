// ftjit tests: ftjit::PerThread (one T per thread index, made on first use, any number of indices) and ftjit::ThreadIndices (the lowest free index), under TSAN.
#include "primitives/per_thread.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "check.h"
#include "primitives/thread_indices.h"

namespace {

struct alignas(64) Counter {
  std::atomic<uint64_t> n{0};
  uint64_t plain = 0;  // written by its index's thread only: TSAN reports a second writer
};

// Index i lives in chunk k with First(k) <= i < First(k + 1), chunks double.
void TestChunksCoverEveryIndexOnce() {
  using P = ftjit::PerThread<Counter>;
  CHECK_EQ(P::ChunkOf(0), size_t{0});
  CHECK_EQ(P::ChunkOf(P::kBase - 1), size_t{0});
  CHECK_EQ(P::ChunkOf(P::kBase), size_t{1});
  CHECK_EQ(P::ChunkOf(3 * P::kBase - 1), size_t{1});
  CHECK_EQ(P::ChunkOf(3 * P::kBase), size_t{2});
  for (size_t i = 0; i < 100000; i += 7) {
    size_t k = P::ChunkOf(i);
    CHECK(P::First(k) <= i);
    CHECK(i < P::First(k + 1));
    CHECK_EQ(P::First(k + 1) - P::First(k), P::kBase << k);
  }
  // The last chunk reaches past a billion indices.
  CHECK(P::First(P::kChunks) > size_t{1000000000});
}

// Scattered indices (chunks made out of order) each get their own T, which
// Find and ForEach see; untouched indices have none.
void TestScatteredIndicesGetTheirOwn() {
  ftjit::PerThread<Counter> p;
  const std::vector<size_t> used = {5000, 0, 17, 16, 15, 100000, 48, 3};
  for (size_t i : used) p.Get(i).plain = i + 1;
  for (size_t i : used) {
    CHECK(p.Find(i) != nullptr);
    CHECK_EQ(p.Find(i)->plain, i + 1);
    CHECK(&p.Get(i) == p.Find(i));  // made once
  }
  CHECK(p.Find(1) == nullptr);
  CHECK(p.Find(4999) == nullptr);
  std::multiset<uint64_t> seen;
  p.ForEach([&](const Counter& c) { seen.insert(c.plain); });
  CHECK_EQ(seen.size(), used.size());
  for (size_t i : used) CHECK_EQ(seen.count(i + 1), size_t{1});
  // ForEachIndexed passes each T's own index (a forked child forgets every index but its thread's by it).
  std::multiset<size_t> indices;
  p.ForEachIndexed([&](size_t i, const Counter& c) {
    CHECK_EQ(c.plain, i + 1);
    indices.insert(i);
  });
  CHECK(indices == std::multiset<size_t>(used.begin(), used.end()));
}

// Threads with distinct indices (more than one chunk's worth) make and
// count in their own T while a reader sums them with ForEach: no race, and
// the sum at the end is exact.
void TestThreadsCountInTheirOwnWhileOthersRead() {
  ftjit::PerThread<Counter> p;
  ftjit::ThreadIndices indices;
  constexpr int kThreads = 40;
  constexpr uint64_t kAdds = 2000;
  std::atomic<int> finished{0};
  ftjit_test::RunThreads(kThreads + 1, [&](size_t t) {
    if (t == kThreads) {
      while (finished.load() < kThreads) {
        uint64_t total = 0;
        p.ForEach([&](const Counter& c) { total += c.n.load(std::memory_order_relaxed); });
        CHECK(total <= kThreads * kAdds);
      }
      return;
    }
    size_t i = indices.Acquire();
    for (uint64_t k = 0; k < kAdds; ++k) {
      Counter& c = p.Get(i);
      ++c.plain;
      c.n.fetch_add(1, std::memory_order_relaxed);
    }
    finished.fetch_add(1);
  });
  uint64_t total = 0;
  size_t made = 0;
  p.ForEach([&](const Counter& c) {
    total += c.n.load();
    CHECK_EQ(c.plain, kAdds);
    ++made;
  });
  CHECK_EQ(total, static_cast<uint64_t>(kThreads) * kAdds);
  CHECK_EQ(made, static_cast<size_t>(kThreads));
}

// PerThreadCounter: threads that come and go, each adding under an index
// it holds (a released index goes to the next thread, which goes on adding
// on the same line), while a reader sums: every add is counted, none twice,
// and no two threads write one line at once (TSAN would see it).
void TestPerThreadCounterCountsEveryAddAcrossInheritedIndices() {
  ftjit::PerThreadCounter counter;
  ftjit::ThreadIndices indices;
  constexpr int kThreads = 24;
  constexpr int kRounds = 50;
  constexpr uint64_t kAdds = 100;
  std::atomic<int> finished{0};
  ftjit_test::RunThreads(kThreads + 1, [&](size_t t) {
    if (t == kThreads) {
      while (finished.load() < kThreads) {
        CHECK(counter.Load() <= static_cast<uint64_t>(kThreads) * kRounds * kAdds);
      }
      return;
    }
    for (int round = 0; round < kRounds; ++round) {
      size_t i = indices.Acquire();
      for (uint64_t k = 0; k < kAdds; ++k) counter.Add(i);
      indices.Release(i);
    }
    finished.fetch_add(1);
  });
  CHECK_EQ(counter.Load(), static_cast<uint64_t>(kThreads) * kRounds * kAdds);
  CHECK(indices.HighWater() <= static_cast<size_t>(kThreads));
  counter.Add(0, 5);  // n at once
  CHECK_EQ(counter.Load(), static_cast<uint64_t>(kThreads) * kRounds * kAdds + 5);
}

// The lowest free index first; released ones are reused lowest first; no
// bound; a forked child keeps only its own.
void TestIndicesAreTheLowestFree() {
  ftjit::ThreadIndices ix;
  std::vector<size_t> got;
  for (int i = 0; i < 100; ++i) got.push_back(ix.Acquire());
  for (size_t i = 0; i < 100; ++i) CHECK_EQ(got[i], i);
  ix.Release(70);
  ix.Release(3);
  ix.Release(50);
  CHECK_EQ(ix.Acquire(), size_t{3});
  CHECK_EQ(ix.Acquire(), size_t{50});
  CHECK_EQ(ix.Acquire(), size_t{70});
  CHECK_EQ(ix.Acquire(), size_t{100});
  CHECK_EQ(ix.HighWater(), size_t{101});
  ix.ResetInChild(42);
  CHECK_EQ(ix.Acquire(), size_t{0});
  for (size_t want = 1; want < 42; ++want) CHECK_EQ(ix.Acquire(), want);
  CHECK_EQ(ix.Acquire(), size_t{43});  // 42 stays the forking thread's
}

// Threads coming and going: live ones never share an index.
void TestLiveThreadsNeverShareAnIndex() {
  ftjit::ThreadIndices ix;
  constexpr int kThreads = 24;
  std::vector<std::atomic<int>> holders(kThreads * 4);
  ftjit_test::RunThreads(kThreads, [&](size_t) {
    for (int round = 0; round < 300; ++round) {
      size_t i = ix.Acquire();
      CHECK(i < holders.size());
      CHECK_EQ(holders[i].fetch_add(1), 0);
      std::this_thread::yield();
      CHECK_EQ(holders[i].fetch_sub(1), 1);
      ix.Release(i);
    }
  });
  CHECK(ix.HighWater() <= static_cast<size_t>(kThreads));
}

}  // namespace

int main() {
  RUN_TEST(TestChunksCoverEveryIndexOnce);
  RUN_TEST(TestScatteredIndicesGetTheirOwn);
  RUN_TEST(TestThreadsCountInTheirOwnWhileOthersRead);
  RUN_TEST(TestPerThreadCounterCountsEveryAddAcrossInheritedIndices);
  RUN_TEST(TestIndicesAreTheLowestFree);
  RUN_TEST(TestLiveThreadsNeverShareAnIndex);
  std::fprintf(stderr, "all PerThread tests passed\n");
  return 0;
}
