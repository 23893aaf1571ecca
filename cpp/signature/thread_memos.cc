// ftjit: per-thread memos and their release with the thread's Python state.
// State: see ThreadMemos. Lock order: takes no lock of its own (releasing a
// context may take g_contexts.mu, a leaf).
#include "signature/thread_memos.h"

#include <memory>
#include <utility>

namespace ftjit {

namespace {

constexpr const char* kCapsuleName = "ftjit.thread_memos";

void ReleaseCapsule(PyObject* capsule) {
  auto* memos = static_cast<std::shared_ptr<ThreadMemos>*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (!memos) {
    PyErr_Clear();
    return;
  }
  (*memos)->Release();
  (*memos)->registered = false;  // a later use by this thread registers again
  delete memos;
}

// The dict key, made once at module init: interning a key string per
// thread races inside CPython 3.13.5t's string interning (TSAN:
// immortalize_interned against a concurrent lookup).
PyObject* g_key = nullptr;

void Register(const std::shared_ptr<ThreadMemos>& memos) {
  memos->registered = true;  // tried once per registration, whatever happens
  PyObject* dict = PyThreadState_GetDict();  // borrowed; null if unavailable
  if (!dict || !g_key) return;
  auto* owner = new std::shared_ptr<ThreadMemos>(memos);
  PyObject* capsule = PyCapsule_New(owner, kCapsuleName, ReleaseCapsule);
  if (!capsule) {
    delete owner;
    PyErr_Clear();
    return;
  }
  if (PyDict_SetItem(dict, g_key, capsule) != 0) PyErr_Clear();
  Py_DECREF(capsule);  // the dict holds it (or, on failure, it dies: its destructor releases nothing held yet)
}

}  // namespace

void InitThreadMemos() {
  if (!g_key) {
    g_key = PyUnicode_InternFromString(kCapsuleName);  // kept for the process's lifetime
    if (!g_key) PyErr_Clear();  // memos then live on with their threads
  }
}

Py_hash_t HashMemo::Hash(PyObject* obj) {
  for (int i = 0; i < kSlots; ++i) {
    if (keys[i] == obj) return values[i];
  }
  Py_hash_t h = PyObject_Hash(obj);
  if (h == -1) return -1;
  int slot = next;
  next = (next + 1) % kSlots;
  PyObject* old = keys[slot];
  keys[slot] = Py_NewRef(obj);
  values[slot] = h;
  Py_XDECREF(old);  // may run a finaliser: the slot is consistent already
  return h;
}

void HashMemo::Release() {
  for (PyObject*& k : keys) {
    PyObject* old = k;
    k = nullptr;
    Py_XDECREF(old);
  }
}

void AvalMemo::Release() {
  for (Slot& s : slots) {
    PyObject* aval = s.aval;
    PyObject* dtype = s.dtype;
    s.aval = s.dtype = nullptr;
    Py_XDECREF(aval);
    Py_XDECREF(dtype);
  }
}

void ContextMemo::Remember(InternedContext* c, Py_hash_t h) {
  RetainWeak(c);
  Release();
  ctx = c;
  hash = h;
  PyObject* const* key = reinterpret_cast<PyTupleObject*>(c->obj)->ob_item;
  for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(c->obj); i < n; ++i) items.push_back(key[i]);
}

void ContextMemo::Release() {
  InternedContext* old = ctx;
  ctx = nullptr;
  items.clear();
  if (old) ReleaseWeak(old);
}

void ThreadMemos::Release() {
  dtype_hashes.Release();
  sharding_hashes.Release();
  avals.Release();
  context.Release();
}

ThreadMemos& MemosSlow() {
  // Freed (memory only) at C++ thread exit if the capsule has let go of it
  // by then; its Python references were dropped by the capsule, or leak.
  struct Holder {
    std::shared_ptr<ThreadMemos> memos = std::make_shared<ThreadMemos>();
    ~Holder() {
      t_memos = nullptr;
      if (memos.use_count() == 1 && memos->registered) {
        // Never released (no thread state cleared the capsule): no thread
        // state to drop references with now either, so they leak.
        new std::shared_ptr<ThreadMemos>(std::move(memos));
      }
    }
  };
  thread_local Holder holder;
  if (!holder.memos->registered) Register(holder.memos);
  t_memos = holder.memos.get();
  return *holder.memos;
}

}  // namespace ftjit
