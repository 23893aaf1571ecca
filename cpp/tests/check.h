// ftjit tests: minimal CHECK/CHECK_EQ macros and a barrier-released thread runner.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace ftjit_test {

template <class T, class = void>
struct IsStreamable : std::false_type {};
template <class T>
struct IsStreamable<T, std::void_t<decltype(std::declval<std::ostream&>()
                                            << std::declval<const T&>())>>
    : std::true_type {};

// Renders a value for a failure message; enums print their underlying value.
template <class T>
std::string Show(const T& v) {
  std::ostringstream os;
  if constexpr (std::is_same<T, bool>::value) {
    os << (v ? "true" : "false");
  } else if constexpr (std::is_enum<T>::value) {
    os << static_cast<long long>(v);
  } else if constexpr (IsStreamable<T>::value) {
    os << v;
  } else {
    os << "<unprintable>";
  }
  return os.str();
}

[[noreturn]] inline void Fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, what.c_str());
  std::fflush(stderr);
  std::abort();
}

template <class A, class B>
void CheckEq(const A& a, const B& b, const char* a_text, const char* b_text,
             const char* file, int line) {
  if (!(a == b)) {
    Fail(file, line,
         std::string("CHECK_EQ(") + a_text + ", " + b_text + "): " + Show(a) + " vs " + Show(b));
  }
}

// A one-shot barrier: Arrive() blocks until `count` threads have arrived.
class Barrier {
 public:
  explicit Barrier(size_t count) : count_(count) {}
  void Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    if (++arrived_ == count_) {
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [this] { return arrived_ >= count_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t count_;
  size_t arrived_ = 0;
};

// Starts n threads running fn(i) (i in [0, n)), released together by a
// barrier, joins them all, and rethrows the first exception any worker threw.
template <class Fn>
void RunThreads(size_t n, Fn&& fn) {
  Barrier barrier(n);
  std::mutex err_mu;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      barrier.Arrive();
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

// Aborts the process if not destroyed within `seconds` (a hung test).
class Watchdog {
 public:
  Watchdog(const char* name, int seconds)
      : thread_([this, name, seconds] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "watchdog: %s still running after %d s (hang?)\n", name, seconds);
            std::fflush(stderr);
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace ftjit_test

#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) ::ftjit_test::Fail(__FILE__, __LINE__, "CHECK(" #cond ")"); \
  } while (0)

// The operands are bound to the helper's reference parameters, so
// temporaries (and references into them) live until the check is done.
#define CHECK_EQ(a, b) ::ftjit_test::CheckEq((a), (b), #a, #b, __FILE__, __LINE__)

// Runs one test function under a watchdog, so that a hang fails fast and by name.
#define RUN_TEST(fn)                                  \
  do {                                                \
    std::fprintf(stderr, "[ RUN  ] %s\n", #fn);       \
    {                                                 \
      ::ftjit_test::Watchdog ftjit_watchdog_(#fn, 60);  \
      fn();                                           \
    }                                                 \
    std::fprintf(stderr, "[  OK  ] %s\n", #fn);       \
  } while (0)
