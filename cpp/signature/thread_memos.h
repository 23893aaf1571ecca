// ftjit: this thread's memos of Python objects (hashes of dtypes and
// shardings, recently read avals, the last compiler context), and their
// release when the thread ends.
//
// The memos hold references (so a remembered address cannot be reused by
// another object). They are released with the thread's Python state: the
// first use registers a capsule in the thread state's dict, which CPython
// clears, thread attached, when the thread ends (the main thread's at
// interpreter shutdown), whichever thread does the clearing; the next use
// registers again. A thread whose state is never cleared (a thread the
// interpreter never knew) keeps its memos: C++ thread exit, with no thread
// state, only frees memory, never a Python object.
//
//   | state                      | protection                                 |
//   |----------------------------|--------------------------------------------|
//   | a thread's ThreadMemos     | its owning thread only; released in        |
//   |                            | CPython's teardown of its thread state     |
//   | t_memos                    | thread-local                               |
//   | g_key (the thread-state    | made at module init (InitThreadMemos),     |
//   |   dict key)                | fixed afterwards                           |
//
// Lock order: takes no lock of its own. Dropping a hash or aval memo's
// reference may run Python (a finaliser); the context memo's weak reference
// runs none and takes no lock.
#pragma once

#include <Python.h>

#include <cstdint>
#include <vector>

#include "primitives/small_vector.h"
#include "signature/interned_context.h"

namespace ftjit {

// The last few (object, hash) pairs of long-lived immutable objects.
struct HashMemo {
  static constexpr int kSlots = 8;
  PyObject* keys[kSlots] = {};  // strong
  Py_hash_t values[kSlots] = {};
  int next = 0;
  // hash(obj), remembered; -1 with an error set on failure.
  Py_hash_t Hash(PyObject* obj);
  void Release();
};

// The last few abstract values (jax avals) read, with what was read from them.
struct AvalMemo {
  static constexpr int kSlots = 8;
  static constexpr int kMaxDims = 6;
  struct Slot {
    PyObject* aval = nullptr;   // strong
    PyObject* dtype = nullptr;  // strong
    int64_t dims[kMaxDims];
    uint8_t ndim = 0;
    bool weak = false;
    bool pinned = false;  // dtype is process-interned
    size_t hash = 0;
  };
  Slot slots[kSlots];
  int next = 0;
  void Release();
};

// The last interned context this thread looked up whose key is a tuple,
// held weakly (see InternedContext): the struct, its hash and the key's
// items as they were (uncounted pointers, compared by identity only).
// Python-free to update and to release.
struct ContextMemo {
  InternedContext* ctx = nullptr;  // weak reference, or null
  Py_hash_t hash = 0;
  SmallVector<PyObject*, 64> items;
  void Remember(InternedContext* c, Py_hash_t h);  // c's object: a tuple, alive
  void Release();
};

// Dtypes this thread found interned (InternDtype: kept until exit), which a
// signature may pin without a reference count. Never released.
struct PinnedDtypes {
  static constexpr int kSlots = 8;
  PyObject* items[kSlots] = {};
  int n = 0;
  bool Holds(PyObject* dtype) const {
    for (int i = 0; i < n; ++i) {
      if (items[i] == dtype) return true;
    }
    return false;
  }
  void Add(PyObject* dtype) {
    if (n < kSlots) items[n++] = dtype;
  }
};

struct ThreadMemos {
  PinnedDtypes pinned_dtypes;
  HashMemo dtype_hashes;
  HashMemo sharding_hashes;
  AvalMemo avals;
  ContextMemo context;
  bool registered = false;  // a capsule in the thread state's dict will release these
  void Release();
};

// Module init: makes the thread-state dict key (runs Python; call once).
void InitThreadMemos();

// A plain pointer to this thread's memos, read on every call (a trivially
// destructible thread_local: no guard); set by MemosSlow().
inline thread_local ThreadMemos* t_memos = nullptr;
ThreadMemos& MemosSlow();

// This thread's memos, registering their release on first use, or again
// after a release (which may run Python; a failure to register is ignored:
// the memos then live on).
inline ThreadMemos& Memos() {
  ThreadMemos* m = t_memos;
  return m && m->registered ? *m : MemosSlow();
}


}  // namespace ftjit
