// ftjit: the lock of the core's short, Python-free critical sections, and how
// a forked child gets its locks back.
//
// LeafMutex is a PyMutex on free-threaded builds (one byte; a contended
// lock() parks the thread *detached*, so a stop-the-world or the GC never
// waits for it) and a no-op on GIL builds, where the GIL, held throughout
// every critical section it guards (they never release it), serialises them.
// AssertHeld() checks the holder in debug builds on both (DebugOwner).
//
// Fork: CPython stops the world before fork(), but a PyMutex unlocked with
// waiters may have been handed straight to a parked (detached) waiter,
// which the stop-the-world does not wait for. In the child that waiter does
// not exist and the lock stays held forever. The data behind it is intact
// (the waiter had not entered its critical section, and a thread inside one
// is attached, so the stop-the-world waited for it to leave), so a child
// re-initialises every such lock before using it (ReinitInChild, from the
// after-fork hook in the child's only thread), as CPython does for its own.
//
//   | member      | protection                                              |
//   |-------------|---------------------------------------------------------|
//   | mu_         | the lock itself (free-threaded builds only)             |
//   | DebugOwner  | debug builds only (see DebugOwner)                      |
//
// Lock order: every LeafMutex is a leaf: nothing else is locked while it is
// held, and no Python code runs under it (reference counts may be taken; no
// object is destroyed). Its users name what it guards and the few test
// hooks that hold two at once.
#pragma once

#include <Python.h>

#include <new>

#include "primitives/locks.h"
#include "primitives/thread_annotations.h"

namespace ftjit {

class FTJIT_CAPABILITY("mutex") LeafMutex : private DebugOwner {
 public:
  constexpr LeafMutex() = default;
  LeafMutex(const LeafMutex&) = delete;
  LeafMutex& operator=(const LeafMutex&) = delete;

#ifdef Py_GIL_DISABLED
  void lock() FTJIT_ACQUIRE() {
    PyMutex_Lock(&mu_);
    NoteAcquired();
  }
  void unlock() FTJIT_RELEASE() {
    NoteReleasing();
    PyMutex_Unlock(&mu_);
  }
#else
  void lock() FTJIT_ACQUIRE() { NoteAcquired(); }
  void unlock() FTJIT_RELEASE() { NoteReleasing(); }
#endif
  void AssertHeld() const FTJIT_ASSERT_CAPABILITY(this) {
#ifndef NDEBUG
    assert(HeldByMe() && "the LeafMutex is not held by this thread");
#endif
  }

#ifdef Py_GIL_DISABLED
 private:
  PyMutex mu_{0};
#endif
};

}  // namespace ftjit
