// ftjit: Clang's thread-safety attributes as macros, so that "guarded by"
// is a fact a compiler checks, not only a comment. Modelled on abseil's
// absl/base/thread_annotations.h; prefixed FTJIT_ so as not to clash with
// another library's (these headers share translation units with Python.h
// and nanobind).
//
// Under Clang they expand to the attributes, which `clang++ -Wthread-safety`
// checks (`bash dev.sh tsa` builds the C++ tests so, with -Werror); under
// any other compiler (g++ builds the extension) to nothing: no code changes.
// The vocabulary (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html):
//   FTJIT_CAPABILITY("mutex")     on a lock type (locks.h's StdMutex, LeafMutex)
//   FTJIT_SCOPED_CAPABILITY       on an RAII guard (locks.h's LockGuard)
//   FTJIT_GUARDED_BY(mu)          a field read or written only with mu held
//   FTJIT_REQUIRES(mu)            a function called only with mu held (the
//                                 `...LockHeld` helpers; they also assert it)
//   FTJIT_EXCLUDES(mu)            a function that takes mu itself: calling it
//                                 with mu held would self-deadlock
//   FTJIT_ACQUIRE/RELEASE(mu)     a function that takes / gives back mu
//   FTJIT_ASSERT_CAPABILITY(mu)   a function that checks mu is held (at run
//                                 time, in debug builds: AssertHeld)
//   FTJIT_RETURN_CAPABILITY(mu)   a function that returns (a reference to) mu
//   FTJIT_NO_THREAD_SAFETY_ANALYSIS  a function the analysis cannot follow;
//                                 each use says why
//
// Shared state: none (macros only).
#pragma once

#if defined(__clang__)
#define FTJIT_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define FTJIT_THREAD_ANNOTATION_(x)
#endif

#define FTJIT_CAPABILITY(name) FTJIT_THREAD_ANNOTATION_(capability(name))
#define FTJIT_SCOPED_CAPABILITY FTJIT_THREAD_ANNOTATION_(scoped_lockable)
#define FTJIT_GUARDED_BY(x) FTJIT_THREAD_ANNOTATION_(guarded_by(x))
#define FTJIT_PT_GUARDED_BY(x) FTJIT_THREAD_ANNOTATION_(pt_guarded_by(x))
#define FTJIT_REQUIRES(...) FTJIT_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define FTJIT_EXCLUDES(...) FTJIT_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define FTJIT_ACQUIRE(...) FTJIT_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define FTJIT_RELEASE(...) FTJIT_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define FTJIT_ASSERT_CAPABILITY(x) FTJIT_THREAD_ANNOTATION_(assert_capability(x))
#define FTJIT_RETURN_CAPABILITY(x) FTJIT_THREAD_ANNOTATION_(lock_returned(x))
#define FTJIT_NO_THREAD_SAFETY_ANALYSIS FTJIT_THREAD_ANNOTATION_(no_thread_safety_analysis)
