// ftjit: FunctionCache, per-function entry maps and the shared LRU wiring.
//
// Shared state here (the objects' own fields: function_cache.h's table):
//
//   | state                          | protection                              |
//   |--------------------------------|-----------------------------------------|
//   | Cores(): every live CacheCore  | guarded by g_cores_mu (weak pointers)   |
//   | AllEntries(): every live       | guarded by g_entries_mu (weak pointers) |
//   |   FunctionEntries              |                                         |
//   | FunctionCache::core            | fixed after construction                |
//   | g_epochs                       | set once at module init (InitCaches)    |
//   | each thread's ThreadCtx        | thread-local (ThisThreadSlow)           |
//
// Lock order: g_cores_mu and g_entries_mu are leaves, never held together
// nor with any other lock (callers copy the live pointers out, then work
// unlocked; expired weak pointers are dropped after unlocking). Only the
// test hook FunctionEntries::LockAllForTest nests locks, in this order: the
// store's publish_mu_, its map's lock, the LRU's, the function map's,
// shared_mu_, g_cores_mu, g_entries_mu.
#include "function_cache.h"

#include <limits>

#include <nanobind/stl/string.h>

#include <mutex>
#include <vector>

namespace ftjit {

namespace {

// Every live CacheCore, for clear_caches(). Guarded by g_cores_mu (a leaf;
// taken with the GIL held on GIL builds, a PyMutex on free-threaded ones).
LeafMutex g_cores_mu;
std::vector<std::weak_ptr<CacheCore>>& Cores() {
  static auto* cores = new std::vector<std::weak_ptr<CacheCore>>();  // guarded by g_cores_mu
  return *cores;
}

void RegisterCore(const std::shared_ptr<CacheCore>& core) {
  std::vector<std::weak_ptr<CacheCore>> dead;  // dropped after unlocking
  std::lock_guard<LeafMutex> lock(g_cores_mu);
  auto& cores = Cores();
  for (auto it = cores.begin(); it != cores.end();) {
    if (it->expired()) {
      dead.push_back(std::move(*it));
      it = cores.erase(it);
    } else {
      ++it;
    }
  }
  cores.push_back(core);
}

// Every live FunctionEntries, for ftjit.stats(). Guarded by g_entries_mu (a
// leaf, like g_cores_mu).
LeafMutex g_entries_mu;
std::vector<std::weak_ptr<FunctionEntries>>& AllEntries() {
  static auto* all = new std::vector<std::weak_ptr<FunctionEntries>>();  // guarded by g_entries_mu
  return *all;
}

void RegisterEntries(const std::shared_ptr<FunctionEntries>& fe) {
  std::vector<std::weak_ptr<FunctionEntries>> dead;  // dropped after unlocking
  std::lock_guard<LeafMutex> lock(g_entries_mu);
  auto& all = AllEntries();
  for (auto it = all.begin(); it != all.end();) {
    if (it->expired()) {
      dead.push_back(std::move(*it));
      it = all.erase(it);
    } else {
      ++it;
    }
  }
  all.push_back(fe);
}

class FunctionCache {
 public:
  explicit FunctionCache(long long capacity) {
    if (capacity < 1) {
      throw nb::value_error(
          ("FunctionCache capacity must be at least 1, got " + std::to_string(capacity)).c_str());
    }
    core = std::make_shared<CacheCore>(static_cast<size_t>(capacity));
    RegisterCore(core);
  }
  // The cache's map holds each function's entries, and those hold the core:
  // a cycle that, for a long-lived function, would keep the core, its LRU
  // and every executable in it alive after the cache object and all its
  // wrappers are gone. Nothing can look a function up in this cache once its
  // Python object is gone, so the map is emptied here; wrappers still alive
  // keep their own function's entries (and through them the core) usable.
  ~FunctionCache() {
    if (core) {
      auto removed = core->functions.Clear();
      // `removed` is dropped here, outside the map's lock.
    }
  }
  std::shared_ptr<CacheCore> core;  // fixed after construction
};

}  // namespace

ThreadCtx& ThisThreadSlow() {
  // The record goes back to the domain at thread exit; only atomics are
  // written then, so it is safe without a thread state (and at shutdown).
  struct Holder {
    ThreadCtx ctx{ThreadShard(), nullptr};
    ~Holder() {
      t_thread_ctx = nullptr;
      if (ctx.rec) EpochDomain<LeafMutex>::Release(ctx.rec);
    }
  };
  thread_local Holder holder;
  if (!holder.ctx.rec) holder.ctx.rec = g_epochs->Acquire();
  t_thread_ctx = &holder.ctx;
  return holder.ctx;
}

EpochDomain<LeafMutex>::Record* PyEntryTraits::ThreadRecord() { return ThisThread().rec; }

void InitCaches() {
  if (!g_epochs) g_epochs = new EpochDomain<LeafMutex>();  // process lifetime
}

void CacheCore::ClearAll() {
  std::vector<EntryPtr> all = lru.Clear();
  for (EntryPtr& e : all) {
    if (auto store = e->store.lock()) store->Discard(e);
  }
  all.clear();
  // Entries that were inserted but not yet linked into the LRU are caught by
  // their function's own clear; visit every function using this core, the
  // private ones (callables that cannot be weakly referenced, never in
  // `functions`) included.
  for (auto& fe : LiveEntries()) {
    if (fe->core().get() == this) fe->Clear();
  }
}

void CacheCore::ForgetFunction(const FunctionEntries* fe) {
  auto removed = functions.EraseIf(
      [fe](const FunKeyPtr&, const std::shared_ptr<FunctionEntries>& v) { return v.get() == fe; });
  for (auto& kv : removed) kv.second->Clear();
  // `removed` (and possibly the FunctionEntries itself) is dropped here.
}

nb::object FunctionEntries::SharedState(nb::handle offered) {
  std::lock_guard<LeafMutex> lock(shared_mu_);
  if (!shared_state_.is_valid()) shared_state_ = nb::borrow(offered);
  return shared_state_;  // a new reference, taken under the lock
}

nb::object Forgetter(const std::shared_ptr<FunctionEntries>& fe) {
  // Only weak pointers: it keeps neither the entries nor the cache alive.
  std::weak_ptr<CacheCore> weak_core = std::static_pointer_cast<CacheCore>(fe->core());
  std::weak_ptr<FunctionEntries> weak_fe = fe;
  return nb::cpp_function([weak_core, weak_fe](nb::args) {
    std::shared_ptr<CacheCore> c = weak_core.lock();
    std::shared_ptr<FunctionEntries> f = weak_fe.lock();
    if (c && f) c->ForgetFunction(f.get());
    if (f) f->Clear();
  });
}

std::shared_ptr<FunctionEntries> EntriesFor(nb::handle cache, nb::handle fun,
                                           nb::handle options, const std::string& name) {
  FunctionCache& fc = nb::cast<FunctionCache&>(cache);
  std::shared_ptr<CacheCore> core = fc.core;

  // Probe weak-referenceability first: a private FunctionEntries otherwise.
  if (!PyType_SUPPORTS_WEAKREFS(Py_TYPE(fun.ptr()))) {
    auto fe = std::make_shared<FunctionEntries>(core, name, /*is_private=*/true);
    RegisterEntries(fe);
    return fe;
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
  std::shared_ptr<FunctionEntries> fresh;
  auto make = [&]() {
    fresh = std::make_shared<FunctionEntries>(core, name, /*is_private=*/false);
    nb::object callback = Forgetter(fresh);
    nb::object ref = nb::steal(PyWeakref_NewRef(fun.ptr(), callback.ptr()));
    if (!ref.is_valid()) throw nb::python_error();
    fresh->set_weakref(std::move(ref));
    return std::make_pair(std::make_shared<const FunKey>(FunKey{fun.ptr(), nb::borrow(options)}),
                          fresh);
  };
  auto r = core->functions.FindOrInsert(hash, probe, eq, make);
  if (r.inserted) RegisterEntries(r.value);
  return r.value;
}

void ClearAllCaches() {
  std::vector<std::shared_ptr<CacheCore>> live;
  {
    std::lock_guard<LeafMutex> lock(g_cores_mu);
    for (auto& w : Cores()) {
      if (auto c = w.lock()) live.push_back(std::move(c));
    }
  }
  for (auto& c : live) c->ClearAll();
}

void FunctionEntries::LockAllForTest(bool lock) {
  if (lock) {
    LockStoreForTest(true);
    cache_core().lru.LockForTest();
    cache_core().functions.LockForTest();
    shared_mu_.lock();
    g_cores_mu.lock();
    g_entries_mu.lock();
  } else {
    g_entries_mu.unlock();
    g_cores_mu.unlock();
    shared_mu_.unlock();
    cache_core().functions.UnlockForTest();
    cache_core().lru.UnlockForTest();
    LockStoreForTest(false);
  }
}

void AfterForkInChildCaches() {
  ReinitInChild(g_cores_mu);
  ReinitInChild(g_entries_mu);
  std::vector<std::shared_ptr<CacheCore>> cores;
  {
    std::lock_guard<LeafMutex> lock(g_cores_mu);
    for (auto& w : Cores()) {
      if (auto c = w.lock()) cores.push_back(std::move(c));
    }
  }
  for (auto& c : cores) {
    c->lru.ReinitLockInChild();
    c->functions.ReinitLockInChild();
  }
  g_epochs->ReinitLockInChild();
  std::vector<std::shared_ptr<FunctionEntries>> all = LiveEntries();
  for (auto& fe : all) fe->ReinitLocksInChild();
  // Every lock is usable again: now the orphans can go.
  for (auto& fe : all) fe->DropOrphans();
}

std::vector<std::shared_ptr<FunctionEntries>> LiveEntries() {
  std::vector<std::shared_ptr<FunctionEntries>> live;
  std::lock_guard<LeafMutex> lock(g_entries_mu);
  for (auto& w : AllEntries()) {
    if (auto fe = w.lock()) live.push_back(std::move(fe));
  }
  return live;  // the last reference of one may drop later: no lock is held then
}

nb::object MakeCacheInfo(FunctionEntries& fe) {
  Counters& c = fe.counters();
  auto r = std::memory_order_relaxed;
  PyObject* info = PyObject_CallFunction(
      Types().cache_info, "KKKKKnKdd", static_cast<unsigned long long>(c.hits.Load()),
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
  nb::class_<FunctionCache>(
      m, "FunctionCache",
      "A cache of compiled entries shared by jitted functions, bounded by one\n"
      "LRU capacity across all of them. Entries of a function leave the cache\n"
      "when the function is garbage collected. Thread-safe.")
      .def(
          "__init__",
          [](FunctionCache* self, nb::handle capacity) {
            // An int (or numpy integer); not a bool, not a float.
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
      .def("size", [](const FunctionCache& c) { return c.core->lru.size(); },
           "Number of cached entries (all functions). A snapshot: may be stale\n"
           "as soon as it returns when other threads compile or evict.")
      .def("capacity", [](const FunctionCache& c) { return c.core->lru.capacity(); },
           "The LRU bound given at construction (fixed).")
      .def("clear", [](FunctionCache& c) { c.core->ClearAll(); },
           "Drops every entry. Compiles in progress finish and serve their\n"
           "waiters, but are not kept. Safe to call from any thread.")
      .def("_functions", [](const FunctionCache& c) { return c.core->functions.size(); },
           "Number of live (function, options) pairs registered (diagnostics).")
      .def("__repr__", [](const FunctionCache& c) {
        return "FunctionCache(capacity=" + std::to_string(c.core->lru.capacity()) +
               ", size=" + std::to_string(c.core->lru.size()) + ")";
      });
}

}  // namespace ftjit
