// ftjit: compiled-entry caches. A FunctionCache (Python-visible) owns one
// capacity-bounded LRU shared by every function using it, and a map from
// (weakref-identified function, options) to that function's entries, so two
// jit(f) wrappers of one f share compiles and everything of f leaves the
// cache when f dies.
//
// Objects, their lifetimes and their guards:
//
//   CacheCore (one per FunctionCache; shared_ptr held by the Python object,
//   by every FunctionEntries using it, and weakly by the live-core registry)
//   | lru        | SharedLru: its own leaf mutex                           |
//   | functions  | ReentrantMap: its own leaf mutex                        |
//
//   FunctionEntries (one per (function, options); shared_ptr held by the
//   JitFunctions of that function and by CacheCore::functions while the
//   function lives; weakly by each Entry)
//   | core_, name_, private_  | fixed after construction                    |
//   | map_       | ReentrantMap: its own leaf mutex                         |
//   | weakref_   | set once at registration, before publication            |
//   | counters   | relaxed atomics (hits sharded per thread)               |
//
//   Entry (one per signature; shared_ptr held by its map slot, the LRU and
//   any thread using it)
//   | sig, owner cache | fixed after construction                          |
//   | latch            | see compile_latch.h                               |
//   | executable/error | written by the compiling thread before Publish(); |
//   |                  | read only after observing the published state     |
//   | hits             | ShardedCounter: relaxed atomics, one line a shard |
//
// Lock order: there is none to get wrong, because no two of these locks are
// ever held at once: each critical section is Python-free and takes exactly
// one leaf lock; on GIL builds these are no-op LeafMutexes and the GIL (held
// throughout, never released inside) serialises them. No Python object is
// destroyed under any of them: removed entries are handed back and dropped
// by the caller after unlocking.
#pragma once

#include <nanobind/nanobind.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>

#include "compile_latch.h"
#include "leaf_mutex.h"
#include "reentrant_map.h"
#include "shared_lru.h"
#include "signature.h"

namespace ftjit {

namespace nb = nanobind;

class FunctionEntries;

// This thread's index among kMaxThreadShards, assigned round-robin on the
// thread's first use: threads mostly land on different shards, so counters
// bumped on every hit are written on different cache lines.
constexpr int kMaxThreadShards = 16;
inline int ThreadShard() {
  static std::atomic<int> next{0};
  thread_local int shard = next.fetch_add(1, std::memory_order_relaxed) % kMaxThreadShards;
  return shard;
}

// A relaxed counter split over cache-line-sized shards (one per thread
// shard, modulo kShards); the total is their sum.
template <int kShards>
class ShardedCounter {
 public:
  // `shard` is ThreadShard(), which a caller bumping several counters reads once.
  void Add(int shard = ThreadShard()) {
    shards_[shard % kShards].n.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t Load() const {
    uint64_t total = 0;
    for (const Shard& s : shards_) total += s.n.load(std::memory_order_relaxed);
    return total;
  }

 private:
  struct alignas(64) Shard {
    std::atomic<uint64_t> n{0};
  };
  std::array<Shard, kShards> shards_;
};

struct Entry {
  Entry(std::shared_ptr<const CallSignature> s, std::weak_ptr<FunctionEntries> c,
        FunctionEntries* raw)
      : sig(std::move(s)), cache(std::move(c)), cache_raw(raw),
        latch(ThisThreadOwner()) {}

  const std::shared_ptr<const CallSignature> sig;
  const std::weak_ptr<FunctionEntries> cache;  // for eviction
  FunctionEntries* const cache_raw;            // identity only, never dereferenced
  CompileLatch latch;
  nb::object executable;  // see the table above
  nb::object error;       // the compile's exception, when it failed
  double compile_seconds = 0;  // written with `executable`
  // Hits of this signature, sharded: threads hitting one entry write
  // different lines, and never the read-mostly fields above.
  ShardedCounter<4> hits;
  LruHook<std::shared_ptr<Entry>> lru;
};

using EntryPtr = std::shared_ptr<Entry>;
using SigPtr = std::shared_ptr<const CallSignature>;

struct FunKey {
  PyObject* fun_id;     // identity of the function; never dereferenced
  nb::object options;   // hashable options key (tuple)
};
using FunKeyPtr = std::shared_ptr<const FunKey>;

struct CacheCore {
  explicit CacheCore(size_t capacity) : lru(capacity) {}
  SharedLru<EntryPtr, LeafMutex> lru;
  ReentrantMap<FunKeyPtr, std::shared_ptr<FunctionEntries>, LeafMutex> functions;

  // Drops every entry of every function (FunctionCache.clear()).
  void ClearAll();
  // Removes a dead function's entries (the weakref callback).
  void ForgetFunction(const FunctionEntries* fe);
};

// Counters of one function; a snapshot is what cache_info() returns.
struct Counters {
  ShardedCounter<kMaxThreadShards> hits;
  std::atomic<uint64_t> misses{0}, compiles{0}, waits{0}, evictions{0}, failures{0};
  std::atomic<uint64_t> compile_nanos{0}, wait_nanos{0};

  void Hit(int shard = ThreadShard()) { hits.Add(shard); }
  uint64_t Hits() const { return hits.Load(); }
};

class FunctionEntries : public std::enable_shared_from_this<FunctionEntries> {
 public:
  FunctionEntries(std::shared_ptr<CacheCore> core, std::string name, bool is_private)
      : core_(std::move(core)), name_(std::move(name)), private_(is_private) {}
  ~FunctionEntries();

  struct Lookup {
    EntryPtr entry;
    bool inserted;  // this thread owns the compile
  };
  // The hot path: when the entry of `sig` is ready and a lock-held,
  // Python-free probe decides equality (CallSignature::FastEquals), counts
  // the hit and returns a new reference to its executable, touching no
  // shared_ptr. Null otherwise (a miss, a compile in progress, or keys that
  // need __eq__): the caller then takes FindOrInsert. Never runs Python.
  PyObject* FindReady(const CallSignature& sig);

  // Finds or inserts the entry for `sig`; moves `sig` into a new entry only
  // if inserting (otherwise `sig` is intact on return, whatever raced). May
  // run Python (__eq__) and throw nb::python_error (`sig` is then unusable).
  Lookup FindOrInsert(CallSignature& sig);

  // Links a freshly inserted entry into the shared LRU and evicts.
  void AdmitLru(const EntryPtr& e);
  // Re-applies the LRU bound after a compile finished (pinned entries).
  void TrimLru();
  // Removes a failed entry from the map and the LRU.
  void Discard(const EntryPtr& e);
  // Drops every entry of this function.
  void Clear();

  size_t size() const { return map_.size(); }
  std::vector<EntryPtr> Entries() const;
  const std::string& name() const { return name_; }
  const std::shared_ptr<CacheCore>& core() const { return core_; }
  bool is_private() const { return private_; }
  Counters& counters() { return counters_; }

  void set_weakref(nb::object w) { weakref_ = std::move(w); }

  // In a forked child's only thread (see AfterForkInChildCaches).
  void ReinitLocksInChild() {
    map_.ReinitLockInChild();
    ReinitInChild(shared_mu_);
  }
  // Drops the entries whose compile was running in a thread of the parent
  // that does not exist here (CompileLatch::OrphanedByFork).
  void DropOrphans();
  // Tests only (_core._debug_hold_locks): takes or releases every lock a
  // call of this function may take (its map, its cache's LRU and function
  // map, shared_mu_ and the registries), as a thread lost at fork may hold them.
  void LockAllForTest(bool lock);

  // One Python object shared by every wrapper of this (function, options),
  // for as long as these entries live (the max_signatures guard's state, so
  // that the limit counts what the shared entries hold, whatever wrappers
  // come and go): the first one offered is kept and returned to every later
  // caller. Held here, outside the GC's view, so it must never refer (even
  // indirectly) to the function, a wrapper or user objects: GuardState keys
  // static arguments and non-plain context values by (weak reference to
  // their type, hash) and pytrees by their printed form and hash.
  nb::object SharedState(nb::handle offered);

 private:
  const std::shared_ptr<CacheCore> core_;
  const std::string name_;
  const bool private_;
  ReentrantMap<SigPtr, EntryPtr, LeafMutex> map_;
  nb::object weakref_;  // weakref(fun, callback); set once before sharing
  Counters counters_;
  // Guards shared_state_. A leaf lock, taken with the thread attached (the
  // GIL held on GIL builds, where it is a no-op); no Python code runs under
  // it (only a reference count is taken).
  LeafMutex shared_mu_;
  nb::object shared_state_;  // set once, by the first SharedState() call
};

// Drops the evicted entries' map slots (outside the LRU lock).
void ReleaseEvicted(std::vector<EntryPtr>& evicted);

// A callable (any arguments, so it can be a weakref callback) that removes
// `fe` from its cache and drops its entries, as when its function dies.
nb::object Forgetter(const std::shared_ptr<FunctionEntries>& fe);

// Finds or creates the entries of (fun, options) in `cache`; falls back to a
// private FunctionEntries when fun cannot be weakly referenced.
std::shared_ptr<FunctionEntries> EntriesFor(nb::handle cache, nb::handle fun,
                                           nb::handle options, const std::string& name);

// Clears every live FunctionCache (ftjit.clear_caches()).
void ClearAllCaches();

// For a forked child's only thread, before anything else touches the caches
// (os.register_at_fork): re-initialises every lock of every cache and
// function (leaf_mutex.h), then drops the entries whose compile was in
// flight in a thread of the parent that does not exist here: nobody would
// ever publish them, and, pinned as compiling, they would hold their LRU
// slots forever. The forking thread's own compiles carry on (it may have
// forked from inside one) and stay.
void AfterForkInChildCaches();

// Every live FunctionEntries (for ftjit.stats()); a snapshot.
std::vector<std::shared_ptr<FunctionEntries>> LiveEntries();

// CacheInfo(...) snapshot of one function's counters (a new reference).
nb::object MakeCacheInfo(FunctionEntries& fe);

// Python-visible FunctionCache; registered by RegisterFunctionCache.
void RegisterFunctionCache(nb::module_& m);
bool IsFunctionCache(nb::handle h);

}  // namespace ftjit
