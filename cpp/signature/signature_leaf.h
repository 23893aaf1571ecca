// ftjit: leaf signatures: an array leaf's dtype, shape, weak type and
// placement. Inline definitions of Builder methods, for the pytree walk's
// translation unit only (see Builder).
//
// Shared state: none of its own. The memos are this thread's; the spec and
// hook are fixed after the jitted function's construction; Numpy() and N()
// after module init.
//
// Lock order: StoreAval and ReadNumpyFields take g_dtypes.mu (InternDtype),
// a leaf; nothing else here takes a lock. Reading attributes runs Python (properties,
// __hash__ of dtypes and shardings): never under a C++ lock.
#pragma once

#include <Python.h>

#include <cstdint>
#include <utility>

#include <nanobind/nanobind.h>

#include "pyutil/py_compat.h"
#include "signature/signature.h"
#include "signature/signature_builder.h"
#include "signature/signature_internal.h"
#include "signature/thread_memos.h"

namespace ftjit {

// Hash of a long-lived, immutable object (a dtype, a sharding), remembered
// per thread: their hashes walk Python-level state (numpy's dtype hash walks
// the descriptor, a sharding's __hash__ is Python code).
inline Py_hash_t MemoHash(HashMemo& memo, PyObject* obj) {
  Py_hash_t h = memo.Hash(obj);
  if (h == -1) throw nb::python_error();
  return h;
}

inline bool Builder::IsKnownArrayType(PyTypeObject* type) const {
  for (PyTypeObject* t : spec_.plain_types) {
    if (t == type) return true;
  }
  for (const AvalType& t : spec_.aval_types) {
    if (t.type == type) return true;
  }
  const NumpyTypes& t = Numpy();
  return (t.ndarray && type == reinterpret_cast<PyTypeObject*>(t.ndarray)) ||
         (t.generic && PyType_IsSubtype(type, reinterpret_cast<PyTypeObject*>(t.generic)));
}

// An exact numpy.ndarray's dtype and shape, from its C struct (see
// NumpyTypes::read_fields): the dtype is borrowed (the array holds it) and
// pinned once interned, so no reference count is written.
inline void Builder::ReadNumpyFields(PyObject* obj, ArrayShape& s, ThreadMemos& memos) {
  const auto* f = reinterpret_cast<const NumpyArrayFields*>(obj);
  PyObject* dtype = f->descr;
  s.dtype = memos.pinned_dtypes.Holds(dtype) ? PinnedRef::Pinned(dtype) : PinnedRef::Owned(nb::borrow(dtype));
  if (!s.dtype.is_pinned() && InternDtype(dtype)) {
    memos.pinned_dtypes.Add(dtype);
    s.dtype = PinnedRef::Pinned(dtype);
  }
  size_t h = Mix(0x200, static_cast<size_t>(MemoHash(memos.dtype_hashes, dtype)));
  for (int i = 0; i < f->nd; ++i) {
    s.dims.push_back(static_cast<int64_t>(f->dimensions[i]));
    h = Mix(h, static_cast<size_t>(f->dimensions[i]));
  }
  s.hash = Mix(h, 0);  // numpy arrays are never weakly typed
}

// Reads `obj`'s .dtype, .shape (a tuple of ints) and .weak_type into `s`.
// False if `obj` is not array-like; nothing is recorded in `out_` either way.
inline bool Builder::ReadArrayShape(PyObject* obj, ArrayShape& s, ThreadMemos& memos) {
  const NumpyTypes& np = Numpy();
  if (np.read_fields && Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(np.ndarray)) {
    ReadNumpyFields(obj, s, memos);
    return true;
  }
  PyObject* dtype_raw = nullptr;
  int has = GetOptionalAttr(obj, N().dtype, &dtype_raw);
  if (has < 0) throw nb::python_error();
  if (!has) return false;
  s.dtype = PinnedRef::Owned(nb::steal(dtype_raw));
  PyObject* shape_raw = nullptr;
  has = GetOptionalAttr(obj, N().shape, &shape_raw);
  if (has < 0) throw nb::python_error();
  if (!has) return false;
  nb::object shape = nb::steal(shape_raw);
  if (!PyTuple_Check(shape.ptr())) return false;
  Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  size_t h = Mix(0x200, static_cast<size_t>(MemoHash(memos.dtype_hashes, s.dtype.ptr())));
  // Read every dimension before recording any: a symbolic or non-integer
  // dimension means "not an array leaf" and must leave no partial state.
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape.ptr(), i));
    if (d == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    s.dims.push_back(static_cast<int64_t>(d));
    h = Mix(h, static_cast<size_t>(d));
  }
  const NumpyTypes& t = Numpy();
  bool is_numpy = (t.ndarray && PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(t.ndarray))) ||
                  (t.generic && PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(t.generic)));
  if (!is_numpy) {
    PyObject* weak_raw = nullptr;
    int has_weak = GetOptionalAttr(obj, N().weak_type, &weak_raw);
    if (has_weak < 0) throw nb::python_error();
    if (has_weak) {
      int truth = PyObject_IsTrue(weak_raw);
      Py_DECREF(weak_raw);
      if (truth < 0) throw nb::python_error();
      s.weak = truth == 1;
    }
  }
  s.hash = Mix(h, s.weak ? 1 : 0);
  return true;
}

// What ReadArrayShape found in an aval this thread read lately. An aval is
// immutable and shared by every output array of one compiled computation,
// so chained calls (outputs fed back as inputs) skip re-reading them.
// `aval` may be borrowed with no reference held (TryArray's peek): it is
// only compared, and a slot holds its own reference, so a match is that
// live object.
inline bool Builder::FindAval(const AvalMemo& memo, PyObject* aval, ArrayShape& s) {
  for (const AvalMemo::Slot& slot : memo.slots) {
    if (slot.aval != aval) continue;
    s.dtype = slot.pinned ? PinnedRef::Pinned(slot.dtype) : PinnedRef::Owned(nb::borrow(slot.dtype));
    for (int i = 0; i < slot.ndim; ++i) s.dims.push_back(slot.dims[i]);
    s.weak = slot.weak;
    s.hash = slot.hash;
    return true;
  }
  return false;
}

inline void Builder::StoreAval(AvalMemo& memo, PyObject* aval, const ArrayShape& s) {
  if (s.dims.size() > static_cast<size_t>(AvalMemo::kMaxDims)) return;
  AvalMemo::Slot& slot = memo.slots[memo.next];
  memo.next = (memo.next + 1) % AvalMemo::kSlots;
  PyObject* old_aval = slot.aval;
  PyObject* old_dtype = slot.dtype;
  slot.aval = Py_NewRef(aval);
  slot.dtype = Py_NewRef(s.dtype.ptr());
  slot.pinned = InternDtype(s.dtype.ptr());
  slot.ndim = static_cast<uint8_t>(s.dims.size());
  for (size_t i = 0; i < s.dims.size(); ++i) slot.dims[i] = s.dims[i];
  slot.weak = s.weak;
  slot.hash = s.hash;
  // The slot is consistent before any finaliser can run.
  Py_XDECREF(old_aval);
  Py_XDECREF(old_dtype);
}

// An array leaf: dtype, shape, weak type and placement. False, leaving
// `out_` untouched, if `obj` is not array-like.
inline bool Builder::TryArray(PyObject* obj) {
  ArrayShape s;
  const AvalType* via_aval = nullptr;
  for (const AvalType& t : spec_.aval_types) {
    if (t.type == Py_TYPE(obj)) {
      via_aval = &t;
      break;
    }
  }
  if (via_aval) {
    // For types whose .dtype/.shape are slow properties over an abstract
    // value (jax Arrays), read that value's plain attributes instead. One
    // this thread read lately is found by its pointer where the array's
    // field is learned (StoredField::Peek: compared, never dereferenced; the
    // memo holds its own references): no call and no reference count
    // written. Otherwise the getter's reference is held: reading the aval
    // runs Python, which may set the field.
    PyObject* peeked = via_aval->aval.Peek(obj);
    if (!peeked || !FindAval(memos_.avals, peeked, s)) {
      nb::object aval = nb::steal(via_aval->aval.Get(obj));
      if (!aval.is_valid()) throw nb::python_error();
      if (!FindAval(memos_.avals, aval.ptr(), s)) {
        if (!ReadArrayShape(aval.ptr(), s, memos_)) return false;
        StoreAval(memos_.avals, aval.ptr(), s);
      }
    }
  } else if (!ReadArrayShape(obj, s, memos_)) {
    return false;
  }
  // A committed array runs where it lives, so its placement is part of the
  // signature (as jax.jit keys it); an uncommitted one may be moved and
  // shares the signature of a numpy array. Placements are hashed apart (p_,
  // by leaf). An aval type's committed getter was resolved at jit()
  // (AddAvalType).
  nb::object sharding;
  if (partial_) {
    // The executable checks placements (context_in_executable).
  } else if (via_aval ? via_aval->committed.name != nullptr : hook_.IsCommittedType(Py_TYPE(obj))) {
    nb::object committed = nb::steal(via_aval ? via_aval->committed.Get(obj)
                                              : PyObject_GetAttr(obj, hook_.committed_attr));
    if (!committed.is_valid()) throw nb::python_error();
    int truth = PyObject_IsTrue(committed.ptr());
    if (truth < 0) throw nb::python_error();
    if (truth == 1) {
      sharding = nb::steal(via_aval ? via_aval->sharding.Get(obj) : PyObject_GetAttr(obj, hook_.sharding_attr));
      if (!sharding.is_valid()) throw nb::python_error();
      p_ = Mix(Mix(p_, out_.leaves.size()), static_cast<size_t>(MemoHash(memos_.sharding_hashes, sharding.ptr())));
    }
  } else if (!via_aval && hook_.IsSpecType(Py_TYPE(obj))) {
    // A spec describes an argument (precompile, warmup); it cannot be one.
    if (!allow_specs_) NotAnArgument(obj, s);
    // A spec with a sharding stands for arrays committed to it.
    nb::object placed = nb::steal(PyObject_GetAttr(obj, N().sharding));
    if (!placed.is_valid()) throw nb::python_error();
    if (!placed.is_none()) {
      sharding = std::move(placed);
      p_ = Mix(Mix(p_, out_.leaves.size()), static_cast<size_t>(MemoHash(memos_.sharding_hashes, sharding.ptr())));
    }
  }
  if (allow_specs_) CheckSpecShape(s);  // precompile and warm-up only: off the hit path
  for (int64_t d : s.dims) out_.dims.push_back(d);
  KeepLeaf(obj);
  out_.tree.push_back(Token(NodeKind::kLeaf, 0));
  out_.leaves.push_back(LeafSignature{LeafKind::kArray, s.weak, static_cast<uint32_t>(s.dims.size()),
                                      std::move(s.dtype), std::move(sharding)});
  h_ = Mix(h_, s.hash);
  return true;
}

}  // namespace ftjit
