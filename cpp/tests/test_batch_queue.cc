// ftjit tests: ftjit::BatchQueue, the protocol of ftjit.batched, with real threads (run under TSAN): roles,
// outcomes, give-ups and requeues step by step, then many threads whose every call must get its own result.
#include "primitives/batch_queue.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "check.h"

namespace {

using ftjit::BatchQueue;
using ftjit::BatchWaiter;
using ftjit::StdMutex;
using namespace std::chrono_literals;

struct TW : BatchWaiter {
  explicit TW(int v) : value(v) {}
  int value;
  int result = 0;  // written by its leader before kDone
};
using Queue = BatchQueue<StdMutex, TW>;
using Role = Queue::Role;
using Ptr = std::shared_ptr<TW>;

Ptr Make(int v) { return std::make_shared<TW>(v); }

// 1. A lone call, then a leader and followers while it runs; the batch takes max_batch at most, the leader first,
// and the first left over leads next.
void TestRolesAndTake() {
  Queue q(/*max_batch=*/2, /*max_running=*/2);
  Ptr a = Make(1), b = Make(2), c = Make(3), d = Make(4);
  CHECK(q.Join(a) == Role::kAlone);
  CHECK(q.Join(b) == Role::kLead);
  CHECK(q.Join(c) == Role::kFollow);
  CHECK(q.Join(d) == Role::kFollow);
  std::vector<Ptr> batch, wake;
  Ptr next;
  uint32_t seen = 0;
  // Two pending already (max_batch): the batch may start although `a` runs and max_wait has not passed.
  CHECK(q.TryTake(b.get(), /*waited=*/false, &batch, &next, &seen));
  CHECK_EQ(batch.size(), size_t{2});
  CHECK(batch[0] == b && batch[1] == c);
  CHECK_EQ(batch[1]->index, size_t{1});
  CHECK(next == d);
  CHECK_EQ(d->Load(), uint32_t{ftjit::kLead});
  CHECK_EQ(c->Load(), uint32_t{ftjit::kTaken});
  // d leads; two run (a alone, b's batch): it may not start before one ends, even once it waited.
  std::vector<Ptr> second;
  CHECK(!q.TryTake(d.get(), /*waited=*/true, &second, &next, &seen));
  CHECK(!q.Finish(nullptr, nullptr, ftjit::kDone, &wake));  // a ends
  CHECK(wake.empty());
  CHECK(q.TryTake(d.get(), /*waited=*/true, &second, &next, &seen));
  CHECK(next == nullptr && second.size() == 1);
  CHECK(!q.Finish(&batch, b.get(), ftjit::kDone, &wake));
  CHECK(wake.size() == 1 && wake[0] == c);
  CHECK_EQ(c->Load(), uint32_t{ftjit::kDone});
  CHECK(q.Finish(&second, d.get(), ftjit::kDone, &wake));  // idle: closed
  CHECK(q.Join(Make(5)) == Role::kClosed);
}

// 2. A failed batch hands kRetry to its members; a leader interrupted while its batch ran puts them back in front,
// behind a leader collecting, or leading themselves.
void TestRetryAndRequeue() {
  Queue q(4, 2);
  Ptr a = Make(1), l = Make(2), f1 = Make(3), f2 = Make(4);
  CHECK(q.Join(a) == Role::kAlone);
  CHECK(q.Join(l) == Role::kLead);
  CHECK(q.Join(f1) == Role::kFollow);
  CHECK(q.Join(f2) == Role::kFollow);
  std::vector<Ptr> batch, wake;
  Ptr next;
  uint32_t seen = 0;
  CHECK(q.TryTake(l.get(), true, &batch, &next, &seen));
  CHECK(next == nullptr && batch.size() == 3);
  CHECK(!q.Finish(&batch, l.get(), ftjit::kRetry, &wake));
  CHECK(wake.size() == 2 && f1->Load() == ftjit::kRetry && f2->Load() == ftjit::kRetry);
  CHECK_EQ(l->Load(), uint32_t{ftjit::kTaken});  // the leader's own outcome is its caller's

  Ptr l2 = Make(5), g1 = Make(6), g2 = Make(7), l3 = Make(8);
  CHECK(q.Join(l2) == Role::kLead);
  CHECK(q.Join(g1) == Role::kFollow);
  CHECK(q.Join(g2) == Role::kFollow);
  CHECK(q.TryTake(l2.get(), true, &batch, &next, &seen));
  CHECK(q.Join(l3) == Role::kLead);  // the next batch forms meanwhile
  wake.clear();
  CHECK(!q.Requeue(batch, l2.get(), &wake));
  CHECK(wake.empty());  // l3 still leads: g1, g2 queue behind it
  CHECK(g1->Load() == ftjit::kPending && g2->Load() == ftjit::kPending);
  std::vector<Ptr> again;
  CHECK(q.TryTake(l3.get(), true, &again, &next, &seen));
  CHECK(again.size() == 3 && again[0] == l3 && again[1] == g1 && again[2] == g2);
  wake.clear();
  CHECK(!q.Requeue(again, l3.get(), &wake));  // no leader collecting: g1 leads
  CHECK(wake.size() == 1 && wake[0] == g1 && g1->Load() == ftjit::kLead);
  CHECK_EQ(q.SnapshotForTest().pending, size_t{2});
}

// 3. Give-ups: a pending follower leaves; a leader hands the lead on; a taken member is marked gone (its leader
// skips it); a decided one changes nothing.
void TestGiveUp() {
  Queue q(8, 2);
  Ptr a = Make(1), l = Make(2), f = Make(3), g = Make(4);
  CHECK(q.Join(a) == Role::kAlone);
  CHECK(q.Join(l) == Role::kLead);
  CHECK(q.Join(f) == Role::kFollow);
  CHECK(q.Join(g) == Role::kFollow);
  Ptr next;
  bool closed = true;
  CHECK_EQ(q.GiveUp(f.get(), false, &next, &closed), uint32_t{ftjit::kPending});
  CHECK(next == nullptr && !closed && f->Load() == ftjit::kGone);
  CHECK_EQ(q.GiveUp(l.get(), false, &next, &closed), uint32_t{ftjit::kLead});  // not lead_too: kept
  CHECK_EQ(l->Load(), uint32_t{ftjit::kLead});
  CHECK_EQ(q.GiveUp(l.get(), true, &next, &closed), uint32_t{ftjit::kLead});
  CHECK(next == g && g->Load() == ftjit::kLead);
  std::vector<Ptr> batch, wake;
  uint32_t seen = 0;
  Ptr h = Make(5);
  CHECK(q.Join(h) == Role::kFollow);
  CHECK(q.TryTake(g.get(), true, &batch, &next, &seen));
  CHECK(batch.size() == 2);
  CHECK_EQ(q.GiveUp(h.get(), true, &next, &closed), uint32_t{ftjit::kTaken});
  CHECK_EQ(h->Load(), uint32_t{ftjit::kGone});
  CHECK(!q.Finish(&batch, g.get(), ftjit::kDone, &wake));
  CHECK(wake.empty());  // h left: not woken, not given the outcome
  CHECK(q.Finish(nullptr, nullptr, ftjit::kDone, &wake));  // a ends: idle
}

// 4. Many threads, each calling many times with its own values: every call gets exactly its own result (2x), no
// batch exceeds max_batch, and every call is one of: alone, or a member of exactly one batch. A queue closes when
// it is idle: a call that finds it closed makes the next one (as ftjit/_batched.py does).
void TestManyThreadsEachGetTheirOwn() {
  constexpr int kThreads = 16, kCalls = 300;
  constexpr size_t kMax = 8;
  std::mutex current_mu;
  auto current = std::make_shared<Queue>(kMax, 2);
  std::atomic<int> alone{0}, batched{0}, batches{0}, too_big{0}, queues{1};
  ftjit_test::RunThreads(kThreads, [&](size_t t) {
    for (int k = 0; k < kCalls; ++k) {
      const int v = static_cast<int>(t) * 100000 + k;
      Ptr w = Make(v);
      std::shared_ptr<Queue> q;
      Role role;
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(current_mu);
          q = current;
        }
        role = q->Join(w);
        if (role != Role::kClosed) break;
        std::lock_guard<std::mutex> lock(current_mu);
        if (current == q) {
          current = std::make_shared<Queue>(kMax, 2);
          queues.fetch_add(1);
        }
      }
      if (role == Role::kAlone) {
        std::this_thread::sleep_for(20us);  // the call runs: others queue meanwhile
        std::vector<Ptr> wake;
        q->Finish(nullptr, nullptr, ftjit::kDone, &wake);
        alone.fetch_add(1);
        continue;
      }
      for (;;) {
        uint32_t s = w->Load();
        if (s == ftjit::kDone) {
          CHECK_EQ(w->result, 2 * v);
          break;
        }
        if (s == ftjit::kLead) {
          auto until = std::chrono::steady_clock::now() + 200us;
          std::vector<Ptr> batch, wake;
          for (;;) {
            Ptr next;
            uint32_t seen = 0;
            if (q->TryTake(w.get(), std::chrono::steady_clock::now() >= until, &batch, &next, &seen)) {
              if (next) next->Wake();
              break;
            }
            q->WaitChanged(seen, 1ms);
          }
          if (batch.size() > kMax) too_big.fetch_add(1);
          std::this_thread::sleep_for(20us);  // the batch runs
          for (const Ptr& m : batch) m->result = 2 * m->value;
          q->Finish(&batch, w.get(), ftjit::kDone, &wake);
          for (const Ptr& m : wake) m->Wake();
          batches.fetch_add(1);
          batched.fetch_add(static_cast<int>(batch.size()));
          CHECK_EQ(w->result, 2 * v);
          break;
        }
        w->Wait(s, 5ms);
      }
    }
  });
  CHECK_EQ(too_big.load(), 0);
  CHECK_EQ(alone.load() + batched.load(), kThreads * kCalls);
  CHECK(batches.load() > 0);
  auto snap = current->SnapshotForTest();
  CHECK(snap.pending == 0 && !snap.leading && snap.running == 0);
  std::fprintf(stderr, "  %d alone, %d batched in %d batches, %d queues\n", alone.load(), batched.load(),
               batches.load(), queues.load());
}

}  // namespace

int main() {
  RUN_TEST(TestRolesAndTake);
  RUN_TEST(TestRetryAndRequeue);
  RUN_TEST(TestGiveUp);
  RUN_TEST(TestManyThreadsEachGetTheirOwn);
  std::fprintf(stderr, "all BatchQueue tests passed\n");
  return 0;
}
