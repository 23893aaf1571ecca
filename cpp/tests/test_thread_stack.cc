// ftjit tests: ftjit::ThreadStack (the calling thread's stack bounds, read once per thread, and the margin kept
// below a jitted call), on the main thread and on threads of chosen stack sizes.
#include "primitives/thread_stack.h"

#include <pthread.h>

#include <cstddef>
#include <cstdint>

#include "check.h"

namespace {

using ftjit::ThreadStack;

struct Seen {
  size_t size = 0;
  uintptr_t low = 0, limit = 0, here = 0;
  size_t left_top = 0, left_deep = 0;
  bool exhausted_top = true, exhausted_deep = false;
};

// Recurses with a frame of ~1 KiB until Exhausted() says so; returns the depth reached.
__attribute__((noinline)) size_t Dive(Seen* s, size_t depth) {
  volatile char pad[1024];
  pad[0] = static_cast<char>(depth);
  if (ThreadStack::Exhausted()) {
    s->exhausted_deep = true;
    s->left_deep = ThreadStack::Left();
    return depth;
  }
  size_t reached = Dive(s, depth + 1);
  pad[1] = static_cast<char>(reached);  // the frame is live after the call: no tail call
  return reached + static_cast<size_t>(pad[1] - pad[1]);
}

void* Probe(void* arg) {
  auto* s = static_cast<Seen*>(arg);
  s->size = ThreadStack::Size();
  s->low = ThreadStack::Low();
  s->limit = ThreadStack::Limit();
  s->here = ThreadStack::Here();
  s->left_top = ThreadStack::Left();
  s->exhausted_top = ThreadStack::Exhausted();
  Dive(s, 0);
  return nullptr;
}

Seen OnThreadWithStack(size_t bytes) {
  Seen s;
  pthread_attr_t attr;
  CHECK_EQ(pthread_attr_init(&attr), 0);
  CHECK_EQ(pthread_attr_setstacksize(&attr, bytes), 0);
  pthread_t t;
  CHECK_EQ(pthread_create(&t, &attr, Probe, &s), 0);
  CHECK_EQ(pthread_join(t, nullptr), 0);
  pthread_attr_destroy(&attr);
  return s;
}

// A thread's bounds are its own stack's: its frames lie inside, the size is the one it was made with (less a guard
// page or so), and the limit sits kMargin above the low end; a recursion is stopped there, never past it.
void TestThreadOfOneMiB() {
  Seen s = OnThreadWithStack(size_t{1} << 20);
  CHECK(s.size <= size_t{1} << 20);
  CHECK(s.size > (size_t{1} << 20) - 64 * 1024);
  CHECK(s.low < s.here);
  CHECK(s.here < s.low + s.size);
  CHECK_EQ(s.limit, s.low + ThreadStack::kMargin);
  CHECK(!s.exhausted_top);
  CHECK(s.left_top > ThreadStack::kMargin);  // (TSAN itself takes much of the top of a thread's stack)
  CHECK(s.exhausted_deep);
  CHECK(s.left_deep < ThreadStack::kMargin);
  CHECK(s.left_deep > ThreadStack::kMargin - 4 * 1024);  // one ~1 KiB frame below the limit, not more
}

// A stack smaller than four margins keeps a quarter of itself (TSAN may round a small stack up: its size is read).
void TestSmallStackKeepsAQuarter() {
  Seen s = OnThreadWithStack(size_t{128} << 10);
  CHECK(s.size >= size_t{96} << 10);
  const size_t kept = s.size >= 4 * ThreadStack::kMargin ? ThreadStack::kMargin : s.size / 4;
  CHECK_EQ(s.limit, s.low + kept);
  CHECK(s.exhausted_deep);
  CHECK(s.left_deep < kept);
}

// The main thread's bounds are known too (its rlimit's).
void TestMainThread() {
  Seen s;
  Probe(&s);
  CHECK(s.size >= size_t{256} << 10);
  CHECK(s.low < s.here);
  CHECK(!s.exhausted_top);
  CHECK(s.exhausted_deep);
}

}  // namespace

int main() {
  RUN_TEST(TestThreadOfOneMiB);
  RUN_TEST(TestSmallStackKeepsAQuarter);
  RUN_TEST(TestMainThread);
  std::fprintf(stderr, "all ThreadStack tests passed\n");
  return 0;
}
