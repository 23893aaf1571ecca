// ftjit: PerThread<T>, one T for each thread index (ThreadIndices), made
// by that thread on first use and never moved: state that one thread
// writes on every call and others only read (hit counts, in-flight counts,
// a thread's own executable), on a cache line of its own, for any number
// of threads. Python-free, lock-free.
//
//   | member        | protection                                            |
//   |---------------|-------------------------------------------------------|
//   | chunks_[k]    | atomic, written once (CAS) by whichever thread first  |
//   |               | needs chunk k; freed by the destructor                |
//   | a chunk's     | atomic, written once (release) by the thread holding  |
//   |   slots       | that index; read (acquire) by ForEach in any thread   |
//   | a T's fields  | T's own: the thread holding the index writes them;    |
//   |               | what others read (ForEach) must be atomic             |
//
// Index i lives in chunk k = floor(log2(i / kBase + 1)), which holds kBase
// << k indices: a directory of kChunks pointers covers kBase * (2^kChunks -
// 1) threads (over 10^9) and grows with the highest index used, never
// reallocating. Memory: the directory, plus one chunk of pointers per
// doubling of the highest index, plus one T per index that used it.
//
// Lock order: takes no lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ftjit {

template <class T>
class PerThread {
 public:
  static constexpr size_t kBase = 16;
  static constexpr size_t kChunks = 26;

  PerThread() = default;
  PerThread(const PerThread&) = delete;
  PerThread& operator=(const PerThread&) = delete;
  // Only once no thread can use it any more.
  ~PerThread() {
    for (size_t k = 0; k < kChunks; ++k) {
      std::atomic<T*>* chunk = chunks_[k].load(std::memory_order_acquire);
      if (!chunk) continue;
      for (size_t i = 0; i < (kBase << k); ++i) delete chunk[i].load(std::memory_order_acquire);
      delete[] chunk;
    }
  }

  // Index `index`'s T, made now if it has none; only the thread holding
  // `index` may call it (it alone makes and writes its T).
  T& Get(size_t index) {
    std::atomic<T*>& slot = Slot(index);
    T* t = slot.load(std::memory_order_relaxed);  // written only by this thread
    return t ? *t : Make(slot);
  }

  // Index `index`'s T, or null if it made none. Any thread.
  T* Find(size_t index) const {
    size_t k = ChunkOf(index);
    std::atomic<T*>* chunk = chunks_[k].load(std::memory_order_acquire);
    return chunk ? chunk[index - First(k)].load(std::memory_order_acquire) : nullptr;
  }

  // f(T&) for every T made so far. Any thread; a T made meanwhile may be
  // missed.
  template <class F>
  void ForEach(F&& f) const {
    ForEachIndexed([&](size_t, T& t) { f(t); });
  }
  // f(index, T&) for every T made so far, as ForEach. Writing a T that
  // another thread holds is the caller's to rule out (a forked child's only
  // thread may).
  template <class F>
  void ForEachIndexed(F&& f) const {
    for (size_t k = 0; k < kChunks; ++k) {
      std::atomic<T*>* chunk = chunks_[k].load(std::memory_order_acquire);
      if (!chunk) continue;  // chunks are made as indices need them, in any order
      for (size_t i = 0; i < (kBase << k); ++i) {
        if (T* t = chunk[i].load(std::memory_order_acquire)) f(First(k) + i, *t);
      }
    }
  }

  static size_t ChunkOf(size_t index) {
    size_t q = index / kBase + 1;  // >= 1
    return static_cast<size_t>(63 - __builtin_clzll(static_cast<unsigned long long>(q)));
  }
  static size_t First(size_t k) { return kBase * ((size_t{1} << k) - 1); }

 private:
  std::atomic<T*>& Slot(size_t index) {
    size_t k = ChunkOf(index);
    std::atomic<T*>* chunk = chunks_[k].load(std::memory_order_acquire);
    if (!chunk) chunk = MakeChunk(k);
    return chunk[index - First(k)];
  }

  std::atomic<T*>* MakeChunk(size_t k) {
    auto* fresh = new std::atomic<T*>[kBase << k]();
    std::atomic<T*>* expected = nullptr;
    if (chunks_[k].compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) return fresh;
    delete[] fresh;
    return expected;  // another thread's, made first
  }

  T& Make(std::atomic<T*>& slot) {
    T* t = new T();
    slot.store(t, std::memory_order_release);
    return *t;
  }

  std::atomic<std::atomic<T*>*> chunks_[kChunks] = {};
};

// A counter each thread index adds to on a line of its own (PerThread),
// summed when read. An add is a plain load and store, not a lock-prefixed
// read-modify-write (which drains the store buffer: tens of cycles on a hit
// path): only the thread holding the index writes its line, and the next
// thread to take the index inherits the line after ThreadIndices' lock
// ordered the two. Relaxed atomics: a read while threads add sees each
// line's latest store, never a torn one; adds that happen-before the read
// are all in it.
class PerThreadCounter {
 public:
  // Only the thread holding `index`.
  void Add(size_t index, uint64_t n = 1) {
    std::atomic<uint64_t>& v = lines_.Get(index).n;
    v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  // Any thread.
  uint64_t Load() const {
    uint64_t total = 0;
    lines_.ForEach([&](const Line& l) { total += l.n.load(std::memory_order_relaxed); });
    return total;
  }

 private:
  struct alignas(64) Line {
    std::atomic<uint64_t> n{0};
  };
  PerThread<Line> lines_;
};

}  // namespace ftjit
