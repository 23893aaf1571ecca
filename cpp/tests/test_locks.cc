// ftjit tests: LockGuard over StdMutex excludes, and AssertHeld (what every `...LockHeld` helper calls on entry) aborts, in debug builds, unless the calling thread holds the lock (run under TSAN).
#include "primitives/locks.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "check.h"

namespace {

using ftjit::LockGuard;
using ftjit::StdMutex;

// 8 threads increment a plain counter under the lock, asserting it held:
// a lost update, a race (TSAN) or a failed assertion fails.
void TestLockGuardExcludesAndAssertHeldPasses() {
  StdMutex mu;
  long counter = 0;  // guarded by mu (a local: the attribute applies to fields only)
  ftjit_test::RunThreads(8, [&](size_t) {
    for (int i = 0; i < 20000; ++i) {
      LockGuard<StdMutex> lock(mu);
      mu.AssertHeld();
      ++counter;
    }
  });
  CHECK_EQ(counter, 8L * 20000);
}

#ifndef NDEBUG
// Runs `fn` in a forked child (stderr silenced: the assertion's message is
// expected); returns whether the child died of SIGABRT. Fails the test if
// the child hangs or ends any other way than by exiting 0 or aborting.
template <class Fn>
bool AbortsInChild(Fn&& fn) {
  std::fflush(stderr);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    alarm(10);  // a hang ends the child with SIGALRM
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, STDERR_FILENO);
    fn();
    _exit(0);
  }
  int status = 0;
  CHECK_EQ(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status)) {
    CHECK_EQ(WEXITSTATUS(status), 0);
    return false;
  }
  CHECK(WIFSIGNALED(status));
  CHECK_EQ(WTERMSIG(status), SIGABRT);
  return true;
}
#endif

// AssertHeld passes for the holder only: never locked, locked and released,
// and held by another thread all abort.
void TestAssertHeldAbortsUnlessThisThreadHolds() {
#ifdef NDEBUG
  std::fprintf(stderr, "  NDEBUG: AssertHeld checks nothing; skipped\n");
#else
  StdMutex mu;
  CHECK(AbortsInChild([&] { mu.AssertHeld(); }));
  CHECK(!AbortsInChild([&] {
    LockGuard<StdMutex> lock(mu);
    mu.AssertHeld();
  }));
  CHECK(AbortsInChild([&] {
    { LockGuard<StdMutex> lock(mu); }
    mu.AssertHeld();
  }));

  std::atomic<bool> held{false}, release{false};
  std::thread holder([&] {
    LockGuard<StdMutex> lock(mu);
    held.store(true);
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!held.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(AbortsInChild([&] { mu.AssertHeld(); }));
  release.store(true);
  holder.join();
#endif
}

}  // namespace

int main() {
  RUN_TEST(TestLockGuardExcludesAndAssertHeldPasses);
  RUN_TEST(TestAssertHeldAbortsUnlessThisThreadHolds);
  std::fprintf(stderr, "all lock tests passed\n");
  return 0;
}
