// ftjit: the Python objects the core raises, builds and calls but does not
// define, handed to it once by ftjit's import (_core._set_collaborators,
// one keyword each), as jaxlib's pjit() is handed its cache_miss: the core
// imports nothing of ftjit's by name.
//
//   | Collaborator::obj_ | set once: null until HandCollaborators stores it |
//   |                    | (release), then fixed for the process's life;    |
//   |                    | Get() loads it (acquire)                         |
//   | g_handed (.cc)     | atomic flag: the one hand-off claims it first    |
//
// Happens-before: ftjit's import hands every collaborator before it returns,
// so before any user code can reach the core; a thread's acquire load of a
// slot sees the object the release store put there. The references are never
// dropped: a borrowed pointer any thread read stays valid. A use before the
// hand-off (ftjit._core loaded without ftjit's import) is a RuntimeError.
//
// Lock order: takes no lock.
#pragma once

#include <Python.h>

#include <atomic>

#include <nanobind/nanobind.h>

namespace ftjit {

class Collaborator {
 public:
  // Constant-initialised: a namespace-scope `inline Collaborator x{...}` has
  // no guard, so a stop-the-world never waits on one.
  constexpr explicit Collaborator(const char* name) : name_(name) {}
  Collaborator(const Collaborator&) = delete;
  Collaborator& operator=(const Collaborator&) = delete;

  // Borrowed (kept for the process's life), or RuntimeError before the hand-off.
  PyObject* Get() const {
    PyObject* p = obj_.load(std::memory_order_acquire);
    if (!p) NotHanded();
    return p;
  }
  const char* name() const { return name_; }  // the keyword ftjit hands it under

 private:
  friend void HandCollaborators(nanobind::kwargs given);
  [[noreturn]] void NotHanded() const;

  const char* name_;
  std::atomic<PyObject*> obj_{nullptr};
};

// ftjit.errors: what a call, a compile or an argument raises.
inline Collaborator kRecursiveCompileError{"RecursiveCompileError"};
inline Collaborator kCompileCycleError{"CompileCycleError"};
inline Collaborator kCompileTimeoutError{"CompileTimeoutError"};
inline Collaborator kRecompileLimitError{"RecompileLimitError"};
inline Collaborator kUnhashableStaticArgumentError{"UnhashableStaticArgumentError"};
inline Collaborator kUnsupportedArgumentError{"UnsupportedArgumentError"};
// The hooks' records, read at jit() (ftjit.ContextHooks, ftjit.RegistryFlatten).
inline Collaborator kContextHooks{"ContextHooks"};
inline Collaborator kRegistryFlatten{"RegistryFlatten"};
// Records the core builds: ftjit._signature's (ExportSignature), CacheInfo and SignatureInfo.
inline Collaborator kLeaf{"Leaf"};
inline Collaborator kNode{"Node"};
inline Collaborator kStatic{"Static"};
inline Collaborator kSignature{"Signature"};
inline Collaborator kCacheInfo{"CacheInfo"};
inline Collaborator kSignatureInfo{"SignatureInfo"};
// Python code a JitFunction calls: unpickling (ftjit._jit._rebuild), its
// __globals__ (ftjit._jit's namespace), warm-up, logging hooks
// (on_compile(name, signature, seconds, error or None), on_wait(name,
// signature, seconds)), miss explanations and the max_signatures message.
inline Collaborator kRebuild{"rebuild"};
inline Collaborator kJitModule{"jit_globals"};
inline Collaborator kWarmup{"warmup"};
inline Collaborator kWarmupSpecs{"warmup_specs"};
inline Collaborator kOnCompile{"on_compile"};
inline Collaborator kOnWait{"on_wait"};
inline Collaborator kOnMiss{"on_miss"};
// The standard library's, handed too (one mechanism; nothing imported at a
// call): copy.copy (a failed compile's exception, per waiter) and
// functools.partial (__getstate__ looks through it).
inline Collaborator kCopy{"copy"};
inline Collaborator kPartial{"partial"};

// Every collaborator, each once: what HandCollaborators requires.
inline Collaborator* const kCollaborators[] = {
    &kRecursiveCompileError, &kCompileCycleError, &kCompileTimeoutError, &kRecompileLimitError,
    &kUnhashableStaticArgumentError, &kUnsupportedArgumentError, &kContextHooks, &kRegistryFlatten,
    &kLeaf, &kNode, &kStatic, &kSignature, &kCacheInfo, &kSignatureInfo, &kRebuild, &kJitModule,
    &kWarmup, &kWarmupSpecs, &kOnCompile, &kOnWait, &kOnMiss, &kCopy, &kPartial};

// Stores `given` (keyword: object, one for each of kCollaborators), once per
// process; TypeError for a missing or unknown keyword, RuntimeError when
// they were handed already (nothing is stored then).
void HandCollaborators(nanobind::kwargs given);

// Registers _set_collaborators (HandCollaborators).
void RegisterCollaborators(nanobind::module_& m);

}  // namespace ftjit
