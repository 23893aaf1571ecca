// ftjit: what a thread brings to every call of every function: its epoch
// record (EpochDomain) and its index (ThreadIndices), which names its slot
// in each entry and its line of a store's hit counter (PerThread,
// PerThreadCounter). Python-free: the types come from `Traits`, as for
// EntryStore.
//
//   | t_ctx_, t_ready_,| thread-local; written by the thread itself only    |
//   |   t_exited_      |                                                    |
//   | Indices()        | ThreadIndices (its own lock)                       |
//
// Lock order: Indices()' lock is a leaf, taken once when a thread starts
// using ftjit and once when it ends.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>

#include "primitives/epoch.h"
#include "primitives/thread_indices.h"

namespace ftjit {

// This thread's epoch record and index, taken on first use and read on every
// call from trivially destructible thread-locals (no guard, no
// registration). Both go back when the thread's C++ thread-locals are
// destroyed (Holder), and the thread is marked exited: a use after that (a
// later destructor dropping a jitted function) takes a fresh record, never
// the released one, which another thread may hold by then (two threads
// announcing on one record would let a reclaim free what one of them
// reads). A POSIX thread-specific key gives that late record back (a record
// taken in the last round of key destructors stays held, never shared).
template <class Traits>
class ThreadSlot {
 public:
  using Domain = EpochDomain<typename Traits::Mutex>;
  struct Ctx {
    typename Domain::Record* rec;
    size_t index;
    // The extension's innermost call of a thread's own executable (call.cc's
    // CopyFrame), here so that a call that already holds its Ctx reaches it
    // without another thread-local lookup. The thread's own only.
    mutable void* frame;
    // Its innermost call through a thread's call object of a whole function
    // (call.cc's ThreadCallFrame), for that object's callbacks. The
    // thread's own only.
    mutable void* call_frame;
  };
  static const Ctx& Get() {
    const Ctx* p = t_ready_;  // one thread-local read on every call
    return p ? *p : Slow();
  }
  static ThreadIndices& Indices() {
    static ThreadIndices* indices = new ThreadIndices();  // never destroyed: threads use it at exit
    return *indices;
  }
  // In a forked child's only thread: the parent's other threads' indices
  // are free again.
  static void AfterForkInChild() { Indices().ResetInChild(t_ready_ ? t_ctx_.index : SIZE_MAX); }

 private:
  struct Holder {
    ~Holder() {
      if (t_ctx_.rec) Domain::Release(t_ctx_.rec);
      Indices().Release(t_ctx_.index);
      t_ctx_.rec = nullptr;
      t_ready_ = nullptr;
      t_exited_ = true;
    }
  };
  static const Ctx& Slow() {
    t_ctx_.index = Indices().Acquire();
    if (t_exited_) {
      static const pthread_key_t late_key = [] {
        pthread_key_t k;
        pthread_key_create(&k, [](void* rec) {
          Domain::Release(static_cast<typename Domain::Record*>(rec));
          Indices().Release(t_ctx_.index);
          t_ctx_.rec = nullptr;
          t_ready_ = nullptr;
        });
        return k;
      }();
      t_ctx_.rec = Traits::Epochs().Acquire();
      pthread_setspecific(late_key, t_ctx_.rec);
      t_ready_ = &t_ctx_;
      return t_ctx_;
    }
    thread_local Holder holder;  // constructed once: gives the record and index back at exit
    t_ctx_.rec = Traits::Epochs().Acquire();
    t_ready_ = &t_ctx_;
    return t_ctx_;
  }
  static inline thread_local Ctx t_ctx_{nullptr, 0, nullptr, nullptr};
  static inline thread_local const Ctx* t_ready_ = nullptr;  // &t_ctx_ while it holds a record
  static inline thread_local bool t_exited_ = false;
};

}  // namespace ftjit
