// ftjit tests: ftjit::CompileLatch publication and ftjit::WaitForGraph cycle detection with real threads (run under TSAN).
#include "primitives/compile_latch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

using ftjit::CompileLatch;
using ftjit::WaitForGraph;
using ftjit_test::Barrier;
using ftjit_test::RunThreads;
using State = CompileLatch::State;
using namespace std::chrono_literals;

constexpr auto kHangLimit = std::chrono::seconds(10);

// Waits in 10 ms slices until `latch` is published; a wait past kHangLimit is
// reported as a hang. Returns the final state.
State WaitUntilDone(CompileLatch& latch, int* slices = nullptr) {
  auto deadline = std::chrono::steady_clock::now() + kHangLimit;
  State s;
  while ((s = latch.WaitFor(10ms)) == State::kCompiling) {
    if (slices) ++*slices;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "hang: latch never published\n");
      std::abort();
    }
  }
  return s;
}

// Spins (sleeping) until pred() holds; past kHangLimit it is reported as a hang.
template <class Pred>
void SpinUntil(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + kHangLimit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "hang: condition never became true\n");
      std::abort();
    }
    std::this_thread::sleep_for(1ms);
  }
}

// A step counter for forcing the order in which threads act.
class Steps {
 public:
  void Await(int step) {
    std::unique_lock<std::mutex> lock(mu_);
    bool ok = cv_.wait_for(lock, kHangLimit, [&] { return step_ >= step; });
    CHECK(ok);
  }
  void Set(int step) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      step_ = step;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int step_ = 0;
};

// One owner and 31 waiters: a plain (non-atomic) result written before Publish is seen by every waiter.
void RunHerd(State final_state) {
  const size_t kThreads = 32;
  for (int round = 0; round < 3; ++round) {
    std::unique_ptr<CompileLatch> holder;  // written by the owner before latch_ptr's release store
    std::atomic<CompileLatch*> latch_ptr{nullptr};
    int value = 0;      // plain: published by the latch's release/acquire
    std::string error;  // plain, likewise
    WaitForGraph graph;
    std::atomic<int> registered{0};
    std::atomic<int> saw_final{0};
    std::atomic<int> slices_total{0};
    RunThreads(kThreads, [&](size_t t) {
      if (t == 0) {
        holder = std::make_unique<CompileLatch>(ftjit::ThisThreadOwner());
        latch_ptr.store(holder.get(), std::memory_order_release);
        SpinUntil([&] { return registered.load() == static_cast<int>(kThreads - 1); });
        std::this_thread::sleep_for(50ms);
        // Nobody can stop waiting before Publish: all 31 are registered.
        CHECK_EQ(graph.waiting(), kThreads - 1);
        CHECK(holder->compiling());
        value = 42 + round;
        if (final_state == State::kFailed) error = "compile failed in round " + std::to_string(round);
        holder->Publish(final_state);
        return;
      }
      CompileLatch* latch;
      while ((latch = latch_ptr.load(std::memory_order_acquire)) == nullptr) std::this_thread::yield();
      const auto self = ftjit::ThisThreadOwner();
      CHECK(latch->owner() != self);
      CHECK(graph.BeginWait(self, latch));
      registered.fetch_add(1);
      State s;
      if (t % 4 == 0) {
        // Polling path: an acquire load alone must make the result visible.
        SpinUntil([&] { return !latch->compiling(); });
        s = latch->state();
      } else {
        int slices = 0;
        s = WaitUntilDone(*latch, &slices);
        slices_total.fetch_add(slices);
      }
      CHECK_EQ(s, final_state);
      CHECK_EQ(value, 42 + round);
      if (final_state == State::kFailed) {
        CHECK_EQ(error, "compile failed in round " + std::to_string(round));
      } else {
        CHECK(error.empty());
      }
      // Later waits return at once with the same state.
      CHECK_EQ(latch->WaitFor(0ms), final_state);
      CHECK(!latch->compiling());
      graph.EndWait(self);
      saw_final.fetch_add(1);
    });
    CHECK_EQ(saw_final.load(), static_cast<int>(kThreads - 1));
    CHECK_EQ(registered.load(), static_cast<int>(kThreads - 1));
    CHECK_EQ(graph.waiting(), size_t{0});
    CHECK_EQ(holder->state(), final_state);
    CHECK(slices_total.load() > 0);  // the slice waiters did block: the owner slept 50 ms
  }
}

// Herd of 31 waiters on a latch published kReady.
void TestHerdReady() { RunHerd(State::kReady); }

// Herd of 31 waiters on a latch published kFailed: every waiter sees the failure and its message.
void TestHerdFailed() { RunHerd(State::kFailed); }

// Waiting on a latch the caller itself owns is refused while it compiles, and nothing is registered.
void TestSelfWait() {
  WaitForGraph graph;
  const auto self = ftjit::ThisThreadOwner();
  CompileLatch mine(self);
  CHECK(mine.owner() == self);
  CHECK(mine.compiling());
  CHECK(!graph.BeginWait(self, &mine));
  CHECK_EQ(graph.waiting(), size_t{0});
  CHECK(!graph.BeginWait(self, &mine));  // refused every time
  CHECK_EQ(graph.waiting(), size_t{0});
  mine.Publish(State::kReady);
  // Once published, "waiting" on it cannot block, so it is allowed.
  CHECK(graph.BeginWait(self, &mine));
  CHECK_EQ(graph.waiting(), size_t{1});
  graph.EndWait(self);
  CHECK_EQ(graph.waiting(), size_t{0});
  graph.EndWait(self);  // ending a wait that is not registered is harmless
  CHECK_EQ(graph.waiting(), size_t{0});

  // The same from another thread, whose latch is owned by itself.
  std::thread other([&] {
    const auto me = ftjit::ThisThreadOwner();
    CompileLatch own(me);
    CHECK(!graph.BeginWait(me, &own));
    CHECK_EQ(graph.waiting(), size_t{0});
    own.Publish(State::kFailed);
  });
  other.join();
}

// A and B each own a latch and then wait on the other's: exactly one BeginWait is refused, and nobody hangs.
void TestMutualWait() {
  for (int iter = 0; iter < 200; ++iter) {
    WaitForGraph graph;
    std::unique_ptr<CompileLatch> latches[2];  // written before `made`, read after it
    Barrier made(2);
    std::atomic<int> refused{0};
    bool began[2] = {false, false};
    State seen[2] = {State::kCompiling, State::kCompiling};
    RunThreads(2, [&](size_t t) {
      const auto self = ftjit::ThisThreadOwner();
      latches[t] = std::make_unique<CompileLatch>(self);
      made.Arrive();
      CompileLatch& other = *latches[1 - t];
      began[t] = graph.BeginWait(self, &other);
      if (!began[t]) {
        // The deadlock is turned into a compile error for this thread.
        refused.fetch_add(1);
        latches[t]->Publish(State::kFailed);
        return;
      }
      seen[t] = WaitUntilDone(other);
      graph.EndWait(self);
      latches[t]->Publish(State::kReady);
    });
    CHECK_EQ(refused.load(), 1);
    CHECK(began[0] != began[1]);
    size_t winner = began[0] ? 0 : 1;
    CHECK_EQ(seen[winner], State::kFailed);
    CHECK_EQ(latches[winner]->state(), State::kReady);
    CHECK_EQ(latches[1 - winner]->state(), State::kFailed);
    CHECK_EQ(graph.waiting(), size_t{0});
  }
}

// Three threads whose waits form a ring: only the one that would close it is refused (tried with each closer).
void TestThreeCycle() {
  for (int closer = 0; closer < 3; ++closer) {
    WaitForGraph graph;
    std::unique_ptr<CompileLatch> latches[3];
    Barrier made(3);
    Steps steps;
    bool began[3] = {false, false, false};
    State seen[3] = {State::kCompiling, State::kCompiling, State::kCompiling};
    RunThreads(3, [&](size_t t) {
      const auto self = ftjit::ThisThreadOwner();
      latches[t] = std::make_unique<CompileLatch>(self);
      made.Arrive();
      // Thread k waits on k+1's latch; registration order ends with `closer`.
      int turn = (static_cast<int>(t) - closer + 2) % 3;  // closer gets turn 2
      CompileLatch& target = *latches[(t + 1) % 3];
      steps.Await(turn);
      if (turn == 2) CHECK_EQ(graph.waiting(), size_t{2});
      began[t] = graph.BeginWait(self, &target);
      if (turn == 2) CHECK_EQ(graph.waiting(), size_t{2});  // refusal registers nothing
      steps.Set(turn + 1);
      if (!began[t]) {
        latches[t]->Publish(State::kFailed);
        return;
      }
      seen[t] = WaitUntilDone(target);
      graph.EndWait(self);
      latches[t]->Publish(seen[t]);  // a failed dependency fails this compile too
    });
    for (int t = 0; t < 3; ++t) {
      CHECK_EQ(began[t], t != closer);
      CHECK_EQ(latches[t]->state(), State::kFailed);
      if (t != closer) CHECK_EQ(seen[t], State::kFailed);
    }
    CHECK_EQ(graph.waiting(), size_t{0});
  }
}

// A chain 0 -> 1 -> 2 -> 3 (3 waits on nobody) is allowed in any registration order and unwinds in order.
void TestChainWithoutCycle() {
  for (int iter = 0; iter < 30; ++iter) {
    WaitForGraph graph;
    std::unique_ptr<CompileLatch> latches[4];
    Barrier made(4);
    std::atomic<int> registered{0};
    bool began[3] = {false, false, false};
    int result[4] = {0, 0, 0, 0};  // plain: each compile's "output"
    RunThreads(4, [&](size_t t) {
      const auto self = ftjit::ThisThreadOwner();
      latches[t] = std::make_unique<CompileLatch>(self);
      made.Arrive();
      if (t == 3) {
        SpinUntil([&] { return registered.load() == 3; });
        CHECK_EQ(graph.waiting(), size_t{3});
        result[3] = 1;
        latches[3]->Publish(State::kReady);
        return;
      }
      CompileLatch& target = *latches[t + 1];
      began[t] = graph.BeginWait(self, &target);
      registered.fetch_add(1);
      if (!began[t]) return;  // reported below; would hang the chain otherwise
      CHECK_EQ(WaitUntilDone(target), State::kReady);
      graph.EndWait(self);
      result[t] = result[t + 1] + 1;  // depends on what the target published
      latches[t]->Publish(State::kReady);
    });
    for (int t = 0; t < 3; ++t) CHECK(began[t]);
    CHECK_EQ(result[0], 4);
    CHECK_EQ(graph.waiting(), size_t{0});
  }
}

// A stale registration on an already-published latch must not make a later wait look like a cycle.
void TestPublishedLatchNoFalseCycle() {
  for (int iter = 0; iter < 20; ++iter) {
    WaitForGraph graph;
    std::unique_ptr<CompileLatch> latches[2];  // 0: A's, 1: B's
    Barrier made(2);
    Steps steps;
    bool b_began = false;
    RunThreads(2, [&](size_t t) {
      const auto self = ftjit::ThisThreadOwner();
      latches[t] = std::make_unique<CompileLatch>(self);
      made.Arrive();
      if (t == 0) {  // A
        CHECK(graph.BeginWait(self, latches[1].get()));
        steps.Set(1);
        steps.Await(2);  // B has published LB and registered on LA
        CHECK_EQ(WaitUntilDone(*latches[1]), State::kReady);
        graph.EndWait(self);
        latches[0]->Publish(State::kReady);
      } else {  // B
        steps.Await(1);
        latches[1]->Publish(State::kReady);
        // A -> LB is still registered, but LB is done: no cycle.
        b_began = graph.BeginWait(self, latches[0].get());
        CHECK_EQ(graph.waiting(), size_t{b_began ? 2u : 1u});
        steps.Set(2);
        if (!b_began) return;
        CHECK_EQ(WaitUntilDone(*latches[0]), State::kReady);
        graph.EndWait(self);
      }
    });
    CHECK(b_began);
    CHECK_EQ(graph.waiting(), size_t{0});
  }
}

// Random "wait on another thread's latch" graphs: refusals equal the number of cycles, and nobody hangs.
void TestRandomWaitGraphs() {
  const size_t kThreads = 6;
  uint32_t rng = 2024u;
  auto next = [&] { rng = rng * 1664525u + 1013904223u; return rng >> 8; };
  for (int round = 0; round < 40; ++round) {
    size_t target[kThreads];
    for (size_t i = 0; i < kThreads; ++i) target[i] = (i + 1 + next() % (kThreads - 1)) % kThreads;
    // Cycles of the functional graph i -> target[i], each counted once at its
    // smallest member.
    int cycles = 0;
    for (size_t i = 0; i < kThreads; ++i) {
      bool on_cycle = false;
      size_t c = target[i];
      for (size_t s = 0; s < kThreads && !on_cycle; ++s, c = target[c]) on_cycle = (c == i);
      if (!on_cycle) continue;
      bool smallest = true;
      for (c = target[i]; c != i; c = target[c]) smallest &= (c > i);
      if (smallest) ++cycles;
    }
    WaitForGraph graph;
    std::unique_ptr<CompileLatch> latches[kThreads];
    Barrier made(kThreads);
    std::atomic<int> refused{0};
    RunThreads(kThreads, [&](size_t t) {
      const auto self = ftjit::ThisThreadOwner();
      latches[t] = std::make_unique<CompileLatch>(self);
      made.Arrive();
      CompileLatch& dep = *latches[target[t]];
      if (!graph.BeginWait(self, &dep)) {
        refused.fetch_add(1);
        latches[t]->Publish(State::kFailed);
        return;
      }
      State s = WaitUntilDone(dep);
      graph.EndWait(self);
      latches[t]->Publish(s);
    });
    CHECK(cycles >= 1);
    CHECK_EQ(refused.load(), cycles);
    CHECK_EQ(graph.waiting(), size_t{0});
    for (size_t t = 0; t < kThreads; ++t) CHECK_EQ(latches[t]->state(), State::kFailed);
  }
}

// EndWait removes exactly the caller's registration: the count climbs with each waiter and returns to 0.
void TestEndWaitCounts() {
  const size_t kWaiters = 8;
  WaitForGraph graph;
  std::unique_ptr<CompileLatch> latch;
  Barrier made(kWaiters + 1);
  Steps steps;
  std::atomic<int> registered{0};
  RunThreads(kWaiters + 1, [&](size_t t) {
    const auto self = ftjit::ThisThreadOwner();
    if (t == 0) latch = std::make_unique<CompileLatch>(self);
    made.Arrive();
    if (t == 0) {
      SpinUntil([&] { return registered.load() == static_cast<int>(kWaiters); });
      CHECK_EQ(graph.waiting(), kWaiters);
      steps.Set(1);  // let waiters end their waits one at a time, in index order
      SpinUntil([&] { return registered.load() == 0; });
      CHECK_EQ(graph.waiting(), size_t{0});
      latch->Publish(State::kReady);
      return;
    }
    CHECK(graph.BeginWait(self, latch.get()));
    CHECK(graph.BeginWait(self, latch.get()));  // a nested wait: still one waiting thread
    registered.fetch_add(1);
    steps.Await(static_cast<int>(t));
    CHECK_EQ(graph.waiting(), kWaiters - (t - 1));
    graph.EndWait(self);  // the inner wait: the outer one stays registered
    CHECK_EQ(graph.waiting(), kWaiters - (t - 1));
    graph.EndWait(self);
    CHECK_EQ(graph.waiting(), kWaiters - t);
    registered.fetch_sub(1);
    steps.Set(static_cast<int>(t) + 1);
  });
  CHECK_EQ(graph.waiting(), size_t{0});
  CHECK_EQ(latch->state(), State::kReady);
}

// Nested waits (Python run during a wait waits on another latch). Threads
// A, B, C own LA, LB, LC. B waits on LA (outer), and inside that on LC
// (inner). After the inner wait ends, B's outer edge must still be there:
// A then waiting on LB closes the cycle A -> LB -> B -> LA -> A and is refused.
void TestNestedWaitKeepsOuterEdge() {
  for (int iter = 0; iter < 20; ++iter) {
    WaitForGraph graph;
    std::unique_ptr<CompileLatch> latches[3];  // A's, B's, C's
    Barrier made(3);
    Steps steps;
    bool a_began = true;
    RunThreads(3, [&](size_t t) {
      const auto self = ftjit::ThisThreadOwner();
      latches[t] = std::make_unique<CompileLatch>(self);
      made.Arrive();
      if (t == 1) {  // B
        CHECK(graph.BeginWait(self, latches[0].get()));  // outer: LA
        CHECK(graph.BeginWait(self, latches[2].get()));  // inner: LC
        CHECK_EQ(graph.waiting(), size_t{1});
        steps.Set(1);
        steps.Await(2);  // C published LC
        CHECK_EQ(WaitUntilDone(*latches[2]), State::kReady);
        graph.EndWait(self);  // inner done: B waits on LA again
        CHECK_EQ(graph.waiting(), size_t{1});
        CHECK(graph.StillSafe(self));  // nobody waits on B yet
        steps.Set(3);
        CHECK_EQ(WaitUntilDone(*latches[0]), State::kFailed);
        graph.EndWait(self);
        latches[1]->Publish(State::kReady);
      } else if (t == 2) {  // C
        steps.Await(1);
        latches[2]->Publish(State::kReady);
        steps.Set(2);
      } else {  // A
        steps.Await(3);
        a_began = graph.BeginWait(self, latches[1].get());
        latches[0]->Publish(State::kFailed);  // A gives up its compile: B's wait ends
      }
    });
    CHECK(!a_began);
    CHECK_EQ(graph.waiting(), size_t{0});
  }
}

// A cycle can close unseen while an inner wait hides an outer edge: B waits on
// LA, and inside that on LC; A's BeginWait on LB follows B's innermost edge
// (to C, who waits on nothing) and is allowed. When B's inner wait ends, the
// cycle A -> LB -> B -> LA -> A exists; StillSafe (called by every waiter
// between slices) refuses exactly one of A and B, and unregisters it.
void TestHiddenCycleCaughtBetweenSlices() {
  for (int iter = 0; iter < 20; ++iter) {
    WaitForGraph graph;
    std::unique_ptr<CompileLatch> latches[3];  // A's, B's, C's
    Barrier made(3);
    Barrier checked(2);  // A and B
    Steps steps;
    std::atomic<int> refused{0};
    RunThreads(3, [&](size_t t) {
      const auto self = ftjit::ThisThreadOwner();
      latches[t] = std::make_unique<CompileLatch>(self);
      made.Arrive();
      if (t == 1) {  // B
        CHECK(graph.BeginWait(self, latches[0].get()));  // outer: LA
        CHECK(graph.BeginWait(self, latches[2].get()));  // inner: LC
        steps.Set(1);
        CHECK_EQ(WaitUntilDone(*latches[2]), State::kReady);  // C publishes after A registered
        graph.EndWait(self);  // the cycle is now closed
        checked.Arrive();
        bool safe = graph.StillSafe(self);
        if (!safe) {
          refused.fetch_add(1);
          latches[1]->Publish(State::kFailed);  // B's caller raises: its compile fails
          return;
        }
        CHECK_EQ(WaitUntilDone(*latches[0]), State::kFailed);
        graph.EndWait(self);
        latches[1]->Publish(State::kReady);
      } else if (t == 0) {  // A
        steps.Await(1);
        CHECK(graph.BeginWait(self, latches[1].get()));  // the walk stops at C
        CHECK_EQ(graph.waiting(), size_t{2});
        steps.Set(2);
        checked.Arrive();
        bool safe = graph.StillSafe(self);
        if (!safe) {
          refused.fetch_add(1);
          latches[0]->Publish(State::kFailed);
          return;
        }
        WaitUntilDone(*latches[1]);
        graph.EndWait(self);
        latches[0]->Publish(State::kFailed);
      }
      if (t == 2) {  // C: waits on nothing
        steps.Await(2);
        latches[2]->Publish(State::kReady);
      }
    });
    CHECK_EQ(refused.load(), 1);
    CHECK_EQ(graph.waiting(), size_t{0});
  }
}

// A thread waits on a latch; the process forks; the child, where that
// waiter does not exist, destroys the latch (as clearing a cache or the
// after-fork hook's drop of orphans does). Nothing may block: the latch holds
// no mutex or condition variable that a vanished thread could be using.
void TestDestroyInForkedChildAfterWaiters() {
  auto latch = std::make_unique<CompileLatch>(ftjit::ThisThreadOwner());
  std::atomic<bool> waiting{false};
  std::thread waiter([&] {
    waiting.store(true);
    WaitUntilDone(*latch);
  });
  SpinUntil([&] { return waiting.load(); });
  std::this_thread::sleep_for(20ms);  // the waiter is asleep on the latch
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    alarm(10);  // a hang ends the child with SIGALRM
    latch.reset();
    _exit(0);
  }
  int status = 0;
  CHECK_EQ(waitpid(pid, &status, 0), pid);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  latch->Publish(State::kReady);
  waiter.join();
}

// Owner ids and fork generations (the fork simulated: NoteForkInChild() run
// by one thread, as the after-fork hook runs it in the child): a compile in
// flight in another thread is orphaned; the forking thread's own compile is
// not, nor is anything made after the fork; a thread started later never
// has the id of a thread of before.
void TestForkGenerationOwnership() {
  std::unique_ptr<CompileLatch> other, mine_before, mine_after, later;
  ftjit::OwnerId other_id = 0, forker_id = 0, later_id = 0;
  std::thread([&] {
    other_id = ftjit::ThisThreadOwner();
    other = std::make_unique<CompileLatch>(other_id);
  }).join();
  std::thread([&] {
    forker_id = ftjit::ThisThreadOwner();
    mine_before = std::make_unique<CompileLatch>(forker_id);
    CHECK(!other->OrphanedByFork());
    CHECK(!mine_before->OrphanedByFork());
    ftjit::NoteForkInChild();
    CHECK(other->OrphanedByFork());
    CHECK(!mine_before->OrphanedByFork());
    mine_after = std::make_unique<CompileLatch>(forker_id);
    CHECK(!mine_after->OrphanedByFork());
  }).join();
  std::thread([&] {
    later_id = ftjit::ThisThreadOwner();
    later = std::make_unique<CompileLatch>(later_id);
  }).join();
  CHECK(later_id != other_id && later_id != forker_id && other_id != forker_id);
  CHECK(!later->OrphanedByFork());
  // A published latch is never orphaned, whoever made it.
  other->Publish(State::kReady);
  CHECK(!other->OrphanedByFork());
  // A second fork, by the later thread: the first forker's compiles are now
  // the lost ones, the later thread's are not.
  ftjit::g_fork_survivor.store(later_id);  // NoteForkInChild() as the later thread runs it
  ftjit::g_fork_generation.fetch_add(1);
  CHECK(mine_before->OrphanedByFork());
  CHECK(mine_after->OrphanedByFork());
  CHECK(!later->OrphanedByFork());
  for (auto* l : {mine_before.get(), mine_after.get(), later.get()}) l->Publish(State::kReady);
}

}  // namespace

int main() {
  RUN_TEST(TestHerdReady);
  RUN_TEST(TestHerdFailed);
  RUN_TEST(TestSelfWait);
  RUN_TEST(TestMutualWait);
  RUN_TEST(TestThreeCycle);
  RUN_TEST(TestChainWithoutCycle);
  RUN_TEST(TestPublishedLatchNoFalseCycle);
  RUN_TEST(TestRandomWaitGraphs);
  RUN_TEST(TestEndWaitCounts);
  RUN_TEST(TestNestedWaitKeepsOuterEdge);
  RUN_TEST(TestHiddenCycleCaughtBetweenSlices);
  RUN_TEST(TestDestroyInForkedChildAfterWaiters);
  RUN_TEST(TestForkGenerationOwnership);  // last: it leaves the fork bookkeeping advanced
  std::fprintf(stderr, "all CompileLatch/WaitForGraph tests passed\n");
  return 0;
}
