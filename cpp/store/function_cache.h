// ftjit: compiled-entry caches, the Python-facing side of EntryStore. A
// FunctionCache owns one capacity-bounded LRU shared by every function using
// it, and a map from (weakref-identified function, options) to that
// function's entries, so two jit(f) wrappers of one f share compiles and
// everything of f leaves the cache when f dies.
//
//   Cache (one per FunctionCache; shared_ptr held by the Python object and by
//   every FunctionStore using it; listed, not held, by Caches())
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
//   | thread_calls_   | PerThread: each ThreadCall written by the thread  |
//   |                 | holding its index; `calls` and `to_core` read by  |
//   |                 | any thread (relaxed atomics)                      |
//   | call_refs_      | FTJIT_GUARDED_BY(calls_mu_), a leaf lock; weak    |
//   |                 | references dropped after unlocking                |
//
// Lock order: no two of these locks are ever held at once, except
// EntryStore's publish lock around its map's. Each critical section is
// Python-free; no Python object is destroyed under any of them.
#pragma once

#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "primitives/compile_latch.h"
#include "primitives/epoch.h"
#include "primitives/live_count.h"
#include "primitives/reentrant_map.h"
#include "pyutil/leaf_mutex.h"
#include "signature/signature.h"
#include "store/entry_store.h"

namespace ftjit {

namespace nb = nanobind;

struct CompiledPayload {
  // What calls run: the compiled executable; null for ThreadExecutables,
  // whose make_local(miss, eager) makes each thread's own copy (kept in its
  // EntrySlot), and own_miss runs the program for that copy's miss in this
  // entry's own context (both null otherwise).
  nb::object executable;
  nb::object make_local;
  nb::object own_miss;
  // `executable` is called with the call's leaves alone (the hooks'
  // executable_for chose so), not with its arguments.
  bool takes_leaves = false;
  nb::object error;            // the compile's exception, when it failed
  double compile_seconds = 0;
  uint64_t compiled_order = 0;  // g_compile_order's count when written
};

// Finished compiles, process-wide: orders signatures() newest first.
inline std::atomic<uint64_t> g_compile_order{0};

// Every entry store's epoch domain (made at module init, never freed).
inline EpochDomain<LeafMutex>* g_epochs = nullptr;

struct PyEntryTraits {
  using Sig = CallSignature;
  using Payload = CompiledPayload;
  using Mutex = LeafMutex;
  using LocalExe = nb::object;  // this thread's ThreadExecutables copy
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

using ThreadCtx = ThreadSlot<PyEntryTraits>::Ctx;
inline const ThreadCtx& ThisThread() { return ThreadSlot<PyEntryTraits>::Get(); }

class FunctionStore;

// A thread's call object of the whole function (the hooks' `thread_call`:
// jaxlib's C++ call of the function, with its own cache of signatures),
// its first-level cache: a hit is one call into it; what it does not hold
// it asks the core for (ThreadCallMiss, call.cc), whose store is the
// shared second level. One per (store, thread index), on a cache line of
// its own; only the thread holding the index writes it (the next thread to
// take the index inherits it, as it does an entry's copy).
struct alignas(64) ThreadCall {
  static constexpr uint32_t kMaxDrops = 8;
  static constexpr uint32_t kSampleEvery = 64;
  nb::object call;     // made at the thread's first call through it; null after a miss raised
  uint64_t clears = 0;  // the store's Clears() when `call` was made: an older one is replaced
  int depth = 0;        // this thread's calls through `call` in progress (a re-entrant one takes the store's path)
  uint32_t drops = 0;   // signatures its miss would not let it keep (ThreadCallMiss)
  bool bypass = false;  // after kMaxDrops drops: every call of this thread takes the store's path
  // Calls until the next one also finds its entry in the store (recency, and
  // kSampleEvery hits: the calls since the last sample, an estimate).
  uint32_t until_sample = kSampleEvery;
  // Calls through `call`, and of them those that reached the core (its miss
  // or eager callback): the rest are hits served by `call` alone. Plain
  // adds by the holding thread; relaxed loads by readers.
  std::atomic<uint64_t> calls{0}, to_core{0};
};

struct FunKey {
  PyObject* fun_id;     // identity of the function; never dereferenced
  nb::object options;   // hashable options key (tuple)
};
using FunKeyPtr = std::shared_ptr<const FunKey>;

struct Cache : std::enable_shared_from_this<Cache> {
  explicit Cache(size_t capacity) : lru(capacity) {}
  ~Cache();  // leaves Caches()
  EntryStore<PyEntryTraits>::Lru lru;
  ReentrantMap<FunKeyPtr, std::shared_ptr<FunctionStore>, LeafMutex> functions;

  void ClearAll();
  // Removes a dead function's store (the weakref callback).
  void ForgetFunction(const FunctionStore* fs);
  LiveCount<Cache> live;  // caches not yet destroyed
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
      // Aliasing: a store keeps its whole cache alive.
      : EntryStore<PyEntryTraits>(std::shared_ptr<Lru>(cache, &cache->lru)),
        cache_(std::move(cache)),
        name_(std::move(name)),
        private_(is_private),
        limit_(limit) {
    // Evictions keep their signatures' counts (EntryStore::KeepEvicted).
    if (limit.max > 0) set_evicted_kept(static_cast<size_t>(limit.max));
  }
  ~FunctionStore();  // leaves AllStores()

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
  PerThread<ThreadCall>& thread_calls() { return thread_calls_; }
  // Registers a thread's new call object, weakly, for Clear().
  void AddThreadCall(const nb::object& call) FTJIT_EXCLUDES(calls_mu_);
  // EntryStore::Clear(), then every live call object's own cache is
  // emptied from here (its `_clear_cache()`, where it has one: jaxlib's
  // takes its cache's lock), so that what they kept goes now, not at each
  // thread's next call (a thread that ended might never call again); each
  // thread also replaces its object at its next call (Clears()). Runs
  // Python: no lock held.
  void Clear();
  // Hits: the store's own count, and the calls the threads' call objects
  // served without the core. Exact once the calls counted have returned.
  uint64_t Hits() const;

  // Tests only (_core._debug_hold_locks): takes or releases every lock a
  // call of this function may take (its map, its cache's LRU and function
  // map and the registries), as a thread lost at fork may hold them.
  void LockAllForTest(bool lock) FTJIT_NO_THREAD_SAFETY_ANALYSIS;

 private:
  const std::shared_ptr<Cache> cache_;
  const std::string name_;
  const bool private_;
  const SignatureLimit limit_;
  std::atomic<bool> warned_{false};
  nb::object weakref_;  // weakref(fun, callback)
  PerThread<ThreadCall> thread_calls_;
  LeafMutex calls_mu_;
  std::vector<nb::object> call_refs_ FTJIT_GUARDED_BY(calls_mu_);  // weakrefs to the threads' call objects
  size_t pruned_size_ FTJIT_GUARDED_BY(calls_mu_) = 0;  // call_refs_'s size after the last pruning
};

// A callable (with any arguments: a weakref callback) that removes `fe` from
// its cache and drops its entries, as when its function dies.
nb::object Forgetter(const std::shared_ptr<FunctionStore>& fe);

// Finds or creates the entries of (fun, options) in `cache`; falls back to a
// private FunctionStore when fun cannot be weakly referenced.
std::shared_ptr<FunctionStore> StoreFor(nb::handle cache, nb::handle fun, nb::handle options,
                                        const std::string& name, SignatureLimit limit);

void ClearAllCaches();

// For a forked child's only thread, before anything else touches the caches:
// re-initialises every lock of every cache and function and of the epoch
// domain, then drops the entries whose compile was in flight in a thread of
// the parent: nobody would ever publish them, and, pinned as compiling, they
// would hold their LRU slots forever. The forking thread's own compiles
// carry on (it may have forked from inside one) and stay.
void AfterForkInChildCaches();

std::vector<std::shared_ptr<FunctionStore>> LiveStores();

nb::object MakeCacheInfo(FunctionStore& fe);

void InitCaches();

void RegisterFunctionCache(nb::module_& m);
bool IsFunctionCache(nb::handle h);

}  // namespace ftjit
