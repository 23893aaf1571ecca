// ftjit: compiled-entry caches, the Python-facing side of entry_store.h. A
// FunctionCache (Python-visible) owns one capacity-bounded LRU shared by
// every function using it, and a map from (weakref-identified function,
// options) to that function's entries, so two jit(f) wrappers of one f share
// compiles and everything of f leaves the cache when f dies.
//
// Objects, their lifetimes and their guards (the entries themselves, their
// ready table and the hit path: entry_store.h):
//
//   Cache (one per FunctionCache; shared_ptr held by the Python object,
//   by every FunctionStore using it; listed, not held, by the live-core
//   registry)
//   | lru        | SharedLru: its own leaf lock                            |
//   | functions  | ReentrantMap: its own leaf lock                         |
//
//   FunctionStore (one per (function, options); an EntryStore; shared_ptr
//   held by the JitFunctions of that function and by Cache::functions
//   while the function lives; weakly by each Entry)
//   | name_, private_ | fixed after construction                          |
//   | weakref_        | set once at registration, before publication      |
//   | limit_          | fixed after construction                          |
//   | warned_         | relaxed atomic                                    |
//
//   The registries of live cores and functions (function_cache.cc): each
//   guarded by its own leaf lock.
//
// Lock order: no two of these locks are ever held at once, except
// EntryStore's publish lock around its map's (entry_store.h). Each critical
// section is Python-free; on GIL builds the locks are no-ops and the GIL
// (held throughout, never released inside) serialises them. No Python object
// is destroyed under any of them.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <string>
#include <vector>

#include "primitives/compile_latch.h"
#include "store/entry_store.h"
#include "primitives/epoch.h"
#include "pyutil/leaf_mutex.h"
#include "primitives/reentrant_map.h"
#include "signature/signature.h"

namespace ftjit {

namespace nb = nanobind;

// What a compile leaves in an entry.
struct CompiledPayload {
  // What calls run: the compiled executable, or (ThreadExecutables) the
  // copy shared by threads past the exclusive shards (kSharedShard).
  nb::object executable;
  // ThreadExecutables (ftjit/_hooks.py): make_local(miss, eager) makes a
  // thread's own copy (StoreEntry::Shard::local), own_miss runs the program
  // for that copy's miss in this entry's own context; null otherwise.
  // Written with `executable`.
  nb::object make_local;
  nb::object own_miss;
  // Whether `executable` is called with the call's leaves alone (the
  // hooks' executable_for chose so), not with its arguments. Written with it.
  bool takes_leaves = false;
  nb::object error;            // the compile's exception, when it failed
  double compile_seconds = 0;  // written with `executable`
  uint64_t compiled_order = 0;  // written with `executable`: g_compile_order's count then
};

// Finished compiles, process-wide: orders signatures() newest first.
inline std::atomic<uint64_t> g_compile_order{0};

// The process-wide epoch domain of every entry store (made at module init;
// process lifetime).
inline EpochDomain<LeafMutex>* g_epochs = nullptr;

struct PyEntryTraits {
  using Sig = CallSignature;
  using Payload = CompiledPayload;
  using Mutex = LeafMutex;
  using LocalExe = nb::object;  // this thread's ThreadExecutables copy (cpp/jit/call.cc)
  static size_t TableHash(const CallSignature& s) { return s.table_hash; }
  static CallSignature::FastEq FastEquals(const CallSignature& stored,
                                          const CallSignature& probe) noexcept {
    return stored.FastEquals(probe);
  }
  static bool Equals(const CallSignature& stored, const CallSignature& probe) {
    return stored.Equals(probe);
  }
  static EpochDomain<LeafMutex>& Epochs() { return *g_epochs; }
};

using Entry = StoreEntry<PyEntryTraits>;
using EntryPtr = std::shared_ptr<Entry>;
using SigPtr = std::shared_ptr<const CallSignature>;
using Counters = StoreCounters;

// This thread's epoch record and shard (entry_store.h's ThreadSlot).
using ThreadCtx = ThreadSlot<PyEntryTraits>::Ctx;
inline const ThreadCtx& ThisThread() { return ThreadSlot<PyEntryTraits>::Get(); }

class FunctionStore;

struct FunKey {
  PyObject* fun_id;     // identity of the function; never dereferenced
  nb::object options;   // hashable options key (tuple)
};
using FunKeyPtr = std::shared_ptr<const FunKey>;

// One FunctionCache's shared state: the capacity bound of every store using
// it, and the map from functions to their stores.
struct Cache : std::enable_shared_from_this<Cache> {
  explicit Cache(size_t capacity) : lru(capacity) {}
  ~Cache();  // leaves the registry of live caches
  EntryStore<PyEntryTraits>::Lru lru;
  ReentrantMap<FunKeyPtr, std::shared_ptr<FunctionStore>, LeafMutex> functions;

  // Drops every entry of every function (FunctionCache.clear()).
  void ClearAll();
  // Removes a dead function's store (the weakref callback).
  void ForgetFunction(const FunctionStore* fs);
};

// The max_signatures guard of a store: part of its (function, options) key,
// so every wrapper that shares the store shares the guard.
struct SignatureLimit {
  int64_t max = -1;      // at most this many signatures counted (Admit); -1: no limit
  bool raising = false;  // past it: refuse (RecompileLimitError); else warn once, and compile
};

class FunctionStore : public EntryStore<PyEntryTraits> {
 public:
  FunctionStore(std::shared_ptr<Cache> cache, std::string name, bool is_private, SignatureLimit limit)
      // The LRU pointer shares the cache's ownership (aliasing): a store
      // keeps its whole cache alive.
      : EntryStore<PyEntryTraits>(std::shared_ptr<Lru>(cache, &cache->lru)),
        cache_(std::move(cache)),
        name_(std::move(name)),
        private_(is_private),
        limit_(limit) {}
  ~FunctionStore();  // leaves the registry of live stores

  const std::string& name() const { return name_; }
  Cache& cache() const { return *cache_; }
  const std::shared_ptr<Cache>& shared_cache() const { return cache_; }
  bool is_private() const { return private_; }
  const SignatureLimit& limit() const { return limit_; }
  // The once-only warning of on_excess="warn": true for the one caller that
  // warns; Unwarn() when that warning was not shown (it raised).
  bool TakeWarning() { return !warned_.exchange(true, std::memory_order_relaxed); }
  void Unwarn() { warned_.store(false, std::memory_order_relaxed); }

  void set_weakref(nb::object w) { weakref_ = std::move(w); }

  // Tests only (_core._debug_hold_locks): takes or releases every lock a
  // call of this function may take (its map, its cache's LRU and function
  // map and the registries), as a thread lost at fork may hold them.
  void LockAllForTest(bool lock) FTJIT_NO_THREAD_SAFETY_ANALYSIS;

 private:
  const std::shared_ptr<Cache> cache_;
  const std::string name_;
  const bool private_;
  const SignatureLimit limit_;
  std::atomic<bool> warned_{false};  // relaxed atomic (see TakeWarning)
  nb::object weakref_;  // weakref(fun, callback); set once before sharing
};

// A callable (any arguments, so it can be a weakref callback) that removes
// `fe` from its cache and drops its entries, as when its function dies.
nb::object Forgetter(const std::shared_ptr<FunctionStore>& fe);

// Finds or creates the entries of (fun, options) in `cache`; falls back to a
// private FunctionStore when fun cannot be weakly referenced.
std::shared_ptr<FunctionStore> StoreFor(nb::handle cache, nb::handle fun, nb::handle options,
                                        const std::string& name, SignatureLimit limit);

// Clears every live FunctionCache (ftjit.clear_caches()).
void ClearAllCaches();

// For a forked child's only thread, before anything else touches the caches
// (os.register_at_fork): re-initialises every lock of every cache and
// function (leaf_mutex.h) and of the epoch domain, then drops the entries
// whose compile was in flight in a thread of the parent that does not exist
// here: nobody would ever publish them, and, pinned as compiling, they would
// hold their LRU slots forever. The forking thread's own compiles carry on
// (it may have forked from inside one) and stay.
void AfterForkInChildCaches();

// Every live FunctionStore (for ftjit.stats()); a snapshot.
std::vector<std::shared_ptr<FunctionStore>> LiveStores();

// CacheInfo(...) snapshot of one function's counters (a new reference).
nb::object MakeCacheInfo(FunctionStore& fe);

// Module init: the epoch domain.
void InitCaches();

// Python-visible FunctionCache; registered by RegisterFunctionCache.
void RegisterFunctionCache(nb::module_& m);
bool IsFunctionCache(nb::handle h);

}  // namespace ftjit
