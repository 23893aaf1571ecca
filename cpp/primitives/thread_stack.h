// ftjit: how much of the calling thread's C stack is left, read from the
// thread's own bounds (once per thread), so that a recursion through jitted
// functions ends in RecursionError before the stack runs out (StackGuard).
//
// Why: CPython 3.11-3.13 count Python frames against the recursion limit,
// and a Python-to-Python call uses no C stack; each level of a recursion
// through a C callable (a JitFunction's vectorcall, the executable's call,
// the eval loop it enters) does. With a raised limit or a small thread
// stack (threading.stack_size), the count allows more levels than the stack
// holds, and the process dies of SIGSEGV. CPython 3.14 checks the stack
// pointer itself; this does the same at a jitted call's entry.
//
// The bounds come from pthread_getattr_np (Linux: glibc and musl; for the
// main thread, from its rlimit and mapping), pthread_get_stack*_np (macOS)
// or GetCurrentThreadStackLimits (Windows); where none is known, Low() is
// 0 and every check passes (as before). The stack grows down on every
// platform ftjit builds for.
//
//   | state      | protection                                               |
//   |------------|----------------------------------------------------------|
//   | t_low,     | thread_local: the thread's own, read on its first use    |
//   |   t_limit  |                                                          |
//
// Python-free; takes no locks; never throws.
#pragma once

#if defined(_WIN32)
#include <windows.h>
#else
#include <pthread.h>
#endif

#include <cstddef>
#include <cstdint>

namespace ftjit {

class ThreadStack {
 public:
  // The lowest usable address of this thread's stack (its guard page
  // excluded), or 0 when it cannot be read. Read once per thread.
  static uintptr_t Low() noexcept {
    thread_local uintptr_t t_low = Read();
    return t_low;
  }

  // The address of a frame at the caller's depth (approximately its stack
  // pointer).
  static uintptr_t Here() noexcept {
#if defined(__GNUC__) || defined(__clang__)
    return reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
#else
    volatile char probe = 0;
    return reinterpret_cast<uintptr_t>(&probe);
#endif
  }

  // The bytes kept free below a jitted call: a call with less left raises
  // RecursionError (see JitFunction_vectorcall). A quarter of the stack on
  // a thread whose stack is smaller than four of them.
  static constexpr size_t kMargin = 64 * 1024;

  // Whether fewer than kMargin bytes (or a quarter of a small stack) are
  // left below the caller's frame. A frame below the thread's stack (code
  // on a stack of its own: a fiber, a coroutine library's) is not judged.
  // Two thread-local loads and two compares.
  static bool Exhausted() noexcept {
    uintptr_t here = Here();
    return here < Limit() && here >= Low();
  }

  // The address under which Exhausted() is true (0 when the bounds are
  // unknown: never). Computed once per thread.
  static uintptr_t Limit() noexcept {
    thread_local uintptr_t t_limit = ReadLimit();
    return t_limit;
  }

  // Bytes of stack left below the caller's frame (SIZE_MAX when unknown).
  static size_t Left() noexcept {
    uintptr_t low = Low(), here = Here();
    if (low == 0) return SIZE_MAX;
    return here > low ? static_cast<size_t>(here - low) : 0;
  }

  // Total size of this thread's stack as the system reports it (0 when
  // unknown): for tests and messages.
  static size_t Size() noexcept {
    uintptr_t low = 0, high = 0;
    if (!Bounds(&low, &high)) return 0;
    return static_cast<size_t>(high - low);
  }

 private:
  static uintptr_t Read() noexcept {
    uintptr_t low = 0, high = 0;
    return Bounds(&low, &high) ? low : 0;
  }

  static uintptr_t ReadLimit() noexcept {
    uintptr_t low = 0, high = 0;
    if (!Bounds(&low, &high)) return 0;
    size_t size = static_cast<size_t>(high - low);
    return low + (size >= 4 * kMargin ? kMargin : size / 4);
  }

  static bool Bounds(uintptr_t* low, uintptr_t* high) noexcept {
#if defined(_WIN32)
    ULONG_PTR lo = 0, hi = 0;
    GetCurrentThreadStackLimits(&lo, &hi);
    // The lowest pages are the guard and the stack-overflow reserve.
    *low = static_cast<uintptr_t>(lo) + 64 * 1024;
    *high = static_cast<uintptr_t>(hi);
    return hi > lo + 64 * 1024;
#elif defined(__APPLE__)
    pthread_t self = pthread_self();
    uintptr_t top = reinterpret_cast<uintptr_t>(pthread_get_stackaddr_np(self));
    size_t size = pthread_get_stacksize_np(self);
    *high = top;
    *low = top - size;
    return size != 0;
#elif defined(__linux__) || defined(__FreeBSD__)
    pthread_attr_t attr;
#if defined(__FreeBSD__)
    if (pthread_attr_init(&attr) != 0) return false;
    if (pthread_attr_get_np(pthread_self(), &attr) != 0) {
      pthread_attr_destroy(&attr);
      return false;
    }
#else
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return false;
#endif
    void* addr = nullptr;
    size_t size = 0, guard = 0;
    bool ok = pthread_attr_getstack(&attr, &addr, &size) == 0 && size != 0;
    // glibc reports a thread's stack without its guard; a main thread's
    // reported size is its rlimit's. The guard is skipped anyway, should a
    // libc count it in.
    pthread_attr_getguardsize(&attr, &guard);
    pthread_attr_destroy(&attr);
    if (!ok) return false;
    *low = reinterpret_cast<uintptr_t>(addr);
    *high = *low + size;
    if (guard < size) *low += guard;
    return true;
#else
    (void)low;
    (void)high;
    return false;
#endif
  }
};

}  // namespace ftjit
