// ftjit: FunctionCache, per-function entry maps and the shared LRU wiring.
// (The objects' own fields: the header's tables.)
//
//   | state                         | protection                              |
//   |-------------------------------|-----------------------------------------|
//   | Caches(): every live Cache    | Caches().mu (raw pointers: each object  |
//   |                               | removes itself as it dies)              |
//   | AllStores(): every live       | AllStores().mu (likewise)               |
//   |   FunctionStore               |                                         |
//   | FunctionCache::cache          | fixed after construction                |
//   | g_epochs                      | set once at module init (InitCaches)    |
//   | each thread's ThreadCtx       | thread-local (ThreadSlot)               |
//
// Lock order: the two registries' locks are leaves, never held together
// nor with any other lock (callers take strong references out, then work
// unlocked, and drop them unlocked). Only the test hook
// FunctionStore::LockAllForTest nests locks, in this order: the store's
// publish_mu_, its map's lock, the LRU's, the function map's, Caches().mu,
// AllStores().mu.
#include "store/function_cache.h"

#include <limits>
#include <mutex>
#include <unordered_set>
#include <vector>

#include <nanobind/stl/string.h>

#include "pyutil/collaborators.h"
#include "pyutil/py_compat.h"

namespace ftjit {

namespace {

// Every live object of one kind (Cache, FunctionStore), for
// clear_caches(), stats() and the after-fork hook. Each object adds itself
// once a shared_ptr owns it and removes itself in its destructor, so the
// registry never holds a dead one. `mu` is a leaf; only Python-free steps
// run under it.
template <class T>
class LiveRegistry {
 public:
  void Add(T* p) FTJIT_EXCLUDES(mu) {
    LockGuard<LeafMutex> lock(mu);
    items_.insert(p);
  }
  void Remove(T* p) FTJIT_EXCLUDES(mu) {
    LockGuard<LeafMutex> lock(mu);
    items_.erase(p);
  }
  // An object whose last reference is gone (its destructor waits for `mu`
  // to remove it) is skipped. The references may be the last ones: the
  // caller drops them with no lock held.
  std::vector<std::shared_ptr<T>> Live() FTJIT_EXCLUDES(mu) {
    std::vector<std::shared_ptr<T>> live;
    LockGuard<LeafMutex> lock(mu);
    live.reserve(items_.size());
    for (T* p : items_) {
      if (auto strong = std::static_pointer_cast<T>(p->weak_from_this().lock())) {
        live.push_back(std::move(strong));
      }
    }
    return live;
  }
  LeafMutex mu;

 private:
  std::unordered_set<T*> items_ FTJIT_GUARDED_BY(mu);
};

// Never destroyed: threads may use them at exit.
LiveRegistry<Cache>& Caches() {
  static auto* cores = new LiveRegistry<Cache>();
  return *cores;
}
LiveRegistry<FunctionStore>& AllStores() {
  static auto* all = new LiveRegistry<FunctionStore>();
  return *all;
}

class FunctionCache {
 public:
  explicit FunctionCache(long long capacity) {
    if (capacity < 1) {
      throw nb::value_error(
          ("FunctionCache capacity must be at least 1, got " + std::to_string(capacity)).c_str());
    }
    cache = std::make_shared<Cache>(static_cast<size_t>(capacity));
    Caches().Add(cache.get());
  }
  // The cache's map holds each function's entries, and those hold the
  // cache: a cycle that would keep every executable alive after the cache
  // object and all its wrappers are gone. Nothing can look a function up
  // here once the Python object is gone, so the map is emptied; wrappers
  // still alive keep their own function's entries (and the cache) usable.
  ~FunctionCache() {
    if (cache) {
      auto removed = cache->functions.Clear();
      // Dropped here, outside the map's lock.
    }
  }
  std::shared_ptr<Cache> cache;
};

}  // namespace

void InitCaches() {
  if (!g_epochs) g_epochs = new EpochDomain<LeafMutex>(&ThreadIsAttached);
}

void Cache::ClearAll() {
  std::vector<EntryPtr> all = lru.Clear();
  for (EntryPtr& e : all) {
    if (auto store = e->store.lock()) store->Discard(e);
  }
  all.clear();
  // Entries inserted but not yet linked into the LRU are caught by their
  // function's own clear; the private stores (never in `functions`) too.
  for (auto& fe : LiveStores()) {
    if (&fe->cache() == this) fe->Clear();
  }
}

void Cache::ForgetFunction(const FunctionStore* fe) {
  auto removed = functions.EraseIf(
      [fe](const FunKeyPtr&, const std::shared_ptr<FunctionStore>& v) { return v.get() == fe; });
  for (auto& kv : removed) kv.second->Clear();
}

Cache::~Cache() { Caches().Remove(this); }

FunctionStore::~FunctionStore() { AllStores().Remove(this); }

void FunctionStore::AddThreadCall(const nb::object& call) {
  nb::object ref = nb::steal(PyWeakref_NewRef(call.ptr(), nullptr));
  if (!ref.is_valid()) {  // not weakly referenceable: cleared by its thread only
    PyErr_Clear();
    return;
  }
  std::vector<nb::object> refs;
  {
    LockGuard<LeafMutex> lock(calls_mu_);
    call_refs_.push_back(std::move(ref));
    // Dead ones go when the list doubled since the last pruning: O(1)
    // amortized, and the list stays O(the objects alive: one per thread
    // index at most). Pruned with no lock held (weak references are called).
    if (call_refs_.size() < 8 || call_refs_.size() < 2 * pruned_size_) return;
    refs.swap(call_refs_);
  }
  std::vector<nb::object> kept;
  for (nb::object& r : refs) {
    nb::object target = nb::steal(PyObject_CallNoArgs(r.ptr()));
    if (!target.is_valid()) PyErr_Clear();
    if (target.is_valid() && !target.is_none()) kept.push_back(std::move(r));
  }
  LockGuard<LeafMutex> lock(calls_mu_);
  for (nb::object& r : call_refs_) kept.push_back(std::move(r));  // added meanwhile
  call_refs_.swap(kept);
  pruned_size_ = call_refs_.size();
  // `kept` (now the old, emptied list) is dropped after unlocking: nothing left in it.
}

void FunctionStore::Clear() {
  EntryStore<PyEntryTraits>::Clear();
  std::vector<nb::object> refs;
  {
    LockGuard<LeafMutex> lock(calls_mu_);
    refs = call_refs_;
  }
  for (const nb::object& r : refs) {
    nb::object call = nb::steal(PyObject_CallNoArgs(r.ptr()));  // a strong reference, or None
    if (!call.is_valid()) {
      PyErr_Clear();
      continue;
    }
    if (call.is_none() || !PyObject_HasAttrString(call.ptr(), "_clear_cache")) continue;
    nb::object out = nb::steal(PyObject_CallMethod(call.ptr(), "_clear_cache", nullptr));
    if (!out.is_valid()) PyErr_WriteUnraisable(call.ptr());  // the clear itself went through
  }
  // A thread that read Clears() before the entries left (and kept a
  // program of one it found still in the map) replaces its object again.
  BumpClears();
}

uint64_t FunctionStore::Hits() const {
  uint64_t hits = const_cast<FunctionStore*>(this)->counters().hits.Load();
  thread_calls_.ForEach([&](const ThreadCall& t) {
    // `to_core` is added (release) after `calls`, by the same thread: read
    // first (acquire), it is never ahead of the `calls` read after it.
    uint64_t to_core = t.to_core.load(std::memory_order_acquire);
    hits += t.calls.load(std::memory_order_relaxed) - to_core;
  });
  return hits;
}

namespace {
// Forgetter's callable (also _IdentityKey's forget hook). An instance of a
// bound class, not a function object: nanobind makes every function it
// creates immortal on free-threaded builds, which would keep one per jitted
// function (and what it refers to) for the life of the process. Holds only
// weak pointers. Fixed after construction.
struct StoreForgetter {
  std::weak_ptr<Cache> core;
  std::weak_ptr<FunctionStore> entries;
  void operator()() const {
    std::shared_ptr<Cache> c = core.lock();
    std::shared_ptr<FunctionStore> f = entries.lock();
    if (c && f) c->ForgetFunction(f.get());
    if (f) f->Clear();
  }
};
}  // namespace

nb::object Forgetter(const std::shared_ptr<FunctionStore>& fe) {
  return nb::cast(StoreForgetter{fe->shared_cache(), fe});
}

std::shared_ptr<FunctionStore> MakeFunctionStore(std::shared_ptr<Cache> core, const std::string& name,
                                                 bool is_private, SignatureLimit limit) {
  // Not make_shared: a weak pointer that outlives the store (an entry's
  // back pointer while a call is in flight) keeps only the control block.
  std::shared_ptr<FunctionStore> fe(new FunctionStore(std::move(core), name, is_private, limit));
  AllStores().Add(fe.get());
  return fe;
}

std::shared_ptr<FunctionStore> StoreFor(nb::handle cache, nb::handle fun, nb::handle options,
                                        const std::string& name, SignatureLimit limit) {
  FunctionCache& fc = nb::cast<FunctionCache&>(cache);
  std::shared_ptr<Cache> core = fc.cache;

  if (!PyType_SUPPORTS_WEAKREFS(Py_TYPE(fun.ptr()))) {
    return MakeFunctionStore(core, name, /*is_private=*/true, limit);
  }

  Py_hash_t oh = PyObject_Hash(options.ptr());
  if (oh == -1) throw nb::python_error();
  size_t hash = std::hash<const void*>()(fun.ptr()) ^ (static_cast<size_t>(oh) * 31);
  FunKey probe{fun.ptr(), nb::borrow(options)};
  auto eq = [](const FunKeyPtr& stored, const FunKey& p) {
    if (stored->fun_id != p.fun_id) return false;
    int r = PyObject_RichCompareBool(stored->options.ptr(), p.options.ptr(), Py_EQ);
    if (r < 0) throw nb::python_error();
    return r == 1;
  };
  std::shared_ptr<FunctionStore> fresh;
  auto make = [&]() {
    fresh = MakeFunctionStore(core, name, /*is_private=*/false, limit);
    nb::object callback = Forgetter(fresh);
    nb::object ref = nb::steal(PyWeakref_NewRef(fun.ptr(), callback.ptr()));
    if (!ref.is_valid()) throw nb::python_error();
    fresh->set_weakref(std::move(ref));
    return std::make_pair(std::make_shared<const FunKey>(FunKey{fun.ptr(), nb::borrow(options)}),
                          fresh);
  };
  return core->functions.FindOrInsert(hash, probe, eq, make).value;
}

void ClearAllCaches() {
  for (auto& c : Caches().Live()) c->ClearAll();
}

void FunctionStore::LockAllForTest(bool lock) FTJIT_NO_THREAD_SAFETY_ANALYSIS {
  if (lock) {
    LockStoreForTest(true);
    cache().lru.LockForTest();
    cache().functions.LockForTest();
    Caches().mu.lock();
    AllStores().mu.lock();
  } else {
    AllStores().mu.unlock();
    Caches().mu.unlock();
    cache().functions.UnlockForTest();
    cache().lru.UnlockForTest();
    LockStoreForTest(false);
  }
}

namespace {

// In a forked child's only thread: no thread of the parent but this one
// exists here, so no entry keeps another thread index's copy (a call object
// a parent thread may have been inside: the child's thread that takes the
// index would wait on it forever, or take it for its own recursion),
// redirect or in-flight count. A copy is leaked, not dropped: its
// destructor could take a lock a parent thread held.
void ForgetOtherThreadsInChild(FunctionStore& fe, size_t survivor) {
  for (const EntryPtr& e : fe.Entries()) {
    e->slots.ForEachIndexed([&](size_t index, Entry::Slot& s) {
      if (index == survivor) return;
      s.copy.release();
      s.redirect = nullptr;
      s.in_flight.store(0, std::memory_order_seq_cst);
    });
  }
  // The same for the threads' call objects of the whole function: leaked,
  // and the index starts afresh (its counts stay, as an entry's do).
  fe.thread_calls().ForEachIndexed([&](size_t index, ThreadCall& t) {
    if (index == survivor) return;
    t.call.release();
    t.depth = 0;
  });
}

}  // namespace

void AfterForkInChildCaches() {
  ReinitInChild(Caches().mu);
  ReinitInChild(AllStores().mu);
  for (auto& c : Caches().Live()) {
    c->lru.ReinitLockInChild();
    c->functions.ReinitLockInChild();
  }
  g_epochs->AfterForkInChild(ThisThread().rec);
  ThreadSlot<PyEntryTraits>::AfterForkInChild();
  std::vector<std::shared_ptr<FunctionStore>> all = LiveStores();
  for (auto& fe : all) fe->ReinitLocksInChild();
  // Every lock is usable again: the orphans can go, and what other threads left.
  const size_t survivor = ThisThread().index;
  for (auto& fe : all) {
    fe->DropOrphans();
    ForgetOtherThreadsInChild(*fe, survivor);
  }
}

std::vector<std::shared_ptr<FunctionStore>> LiveStores() { return AllStores().Live(); }

nb::object MakeCacheInfo(FunctionStore& fe) {
  Counters& c = fe.counters();
  auto r = std::memory_order_relaxed;
  PyObject* cache_info = kCacheInfo.Get();
  PyObject* info = PyObject_CallFunction(
      cache_info, "KKKKKnKdd", static_cast<unsigned long long>(fe.Hits()),
      static_cast<unsigned long long>(c.misses.load(r)),
      static_cast<unsigned long long>(c.compiles.load(r)),
      static_cast<unsigned long long>(c.waits.load(r)),
      static_cast<unsigned long long>(c.evictions.load(r)), static_cast<Py_ssize_t>(fe.size()),
      static_cast<unsigned long long>(c.failures.load(r)),
      static_cast<double>(c.compile_nanos.load(r)) * 1e-9,
      static_cast<double>(c.wait_nanos.load(r)) * 1e-9);
  if (!info) throw nb::python_error();
  return nb::steal(info);
}

bool IsFunctionCache(nb::handle h) { return nb::isinstance<FunctionCache>(h); }

void RegisterFunctionCache(nb::module_& m) {
  nb::class_<StoreForgetter>(m, "_EntriesForgetter",
                               "Drops one function's compiled entries from its cache when called\n"
                               "(with any arguments: it is a weakref callback); holds them weakly.")
      .def("__call__", [](const StoreForgetter& f, nb::args) { f(); });

  nb::class_<FunctionCache>(
      m, "FunctionCache",
      "A cache of compiled entries shared by jitted functions, bounded by one\n"
      "LRU capacity across all of them. Entries of a function leave the cache\n"
      "when the function is garbage collected. Thread-safe.")
      .def(
          "__init__",
          [](FunctionCache* self, nb::handle capacity) {
            if (PyBool_Check(capacity.ptr()) || !PyIndex_Check(capacity.ptr())) {
              throw nb::type_error(("FunctionCache capacity must be an int, got " +
                                    std::string(Py_TYPE(capacity.ptr())->tp_name))
                                       .c_str());
            }
            nb::object index = nb::steal(PyNumber_Index(capacity.ptr()));
            if (!index.is_valid()) throw nb::python_error();
            int overflow = 0;
            long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
            if (value == -1 && PyErr_Occurred()) throw nb::python_error();
            if (overflow > 0) value = std::numeric_limits<long long>::max();
            if (overflow < 0) {
              nb::object text = nb::steal(PyObject_Str(index.ptr()));
              if (!text.is_valid()) throw nb::python_error();
              throw nb::value_error(("FunctionCache capacity must be at least 1, got " +
                                     std::string(PyUnicode_AsUTF8(text.ptr())))
                                        .c_str());
            }
            new (self) FunctionCache(value);
          },
          nb::arg("capacity").none() = 4096,
          nb::sig("def __init__(self, capacity: int = 4096) -> None"))
      .def("size", [](const FunctionCache& c) { return c.cache->lru.size(); },
           "Number of cached entries (all functions). A snapshot: may be stale\n"
           "as soon as it returns when other threads compile or evict.")
      .def("capacity", [](const FunctionCache& c) { return c.cache->lru.capacity(); },
           "The LRU bound given at construction (fixed).")
      .def("clear", [](FunctionCache& c) { c.cache->ClearAll(); },
           "Drops every entry. Compiles in progress finish and serve their\n"
           "waiters, but are not kept. Safe to call from any thread.")
      .def("_functions", [](const FunctionCache& c) { return c.cache->functions.size(); },
           "Number of live (function, options) pairs registered (diagnostics).")
      .def("__repr__", [](const FunctionCache& c) {
        return "FunctionCache(capacity=" + std::to_string(c.cache->lru.capacity()) +
               ", size=" + std::to_string(c.cache->lru.size()) + ")";
      });
}

}  // namespace ftjit
