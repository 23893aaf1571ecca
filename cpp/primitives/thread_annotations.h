// ftjit: Clang's thread-safety attributes as macros, so that "guarded by" is
// a fact the compiler checks (clang++ -Wthread-safety: bash dev.sh tsa).
// Modelled on abseil's absl/base/thread_annotations.h, prefixed FTJIT_ so as
// not to clash with another library's in the same translation unit. Under
// any compiler but Clang they expand to nothing. The vocabulary:
// https://clang.llvm.org/docs/ThreadSafetyAnalysis.html; each use of
// FTJIT_NO_THREAD_SAFETY_ANALYSIS says why the analysis cannot follow it.
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
