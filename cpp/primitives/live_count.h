// ftjit: LiveCount<Tag>, how many objects of a kind exist now: a member
// that counts itself in on construction and out on destruction, so that
// tests and the stress suite can assert that what follows the work (entries,
// stores, signatures, queues) is gone when the work is (_core._live_counts).
//
//   | Count()  | a relaxed atomic per Tag (a function-local static): its  |
//   |          | value is exact once the threads that change it are quiet |
//
// Costs one relaxed atomic add on construction and one on destruction,
// nothing on use. Python-free; never throws.
#pragma once

#include <atomic>
#include <cstdint>

namespace ftjit {

template <class Tag>
class LiveCount {
 public:
  LiveCount() noexcept { Counter().fetch_add(1, std::memory_order_relaxed); }
  LiveCount(const LiveCount&) noexcept : LiveCount() {}
  LiveCount& operator=(const LiveCount&) noexcept { return *this; }
  ~LiveCount() { Counter().fetch_sub(1, std::memory_order_relaxed); }

  // Objects of the kind alive now.
  static int64_t Count() noexcept { return Counter().load(std::memory_order_relaxed); }

 private:
  static std::atomic<int64_t>& Counter() noexcept {
    static std::atomic<int64_t> n{0};
    return n;
  }
};

}  // namespace ftjit
