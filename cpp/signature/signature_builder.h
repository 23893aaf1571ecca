// ftjit: the Builder, which walks one call's arguments into its
// CallSignature and hash (private to BuildSignature).
//
// Shared state: none. A Builder lives on the stack of one call, in one
// thread; the spec and hook it reads are fixed after the jitted function's
// construction; `memos_` is the calling thread's own.
//
// Lock order: a Builder holds no lock. StoreAval and ReadNumpyFields take
// g_dtypes.mu (InternDtype), a leaf, briefly; everything else may run Python
// (properties, __hash__, __lt__ of dict keys, the pytree hooks), so it must
// never run under a C++ lock.
//
// Inlining: the methods declared `inline` run once per node or per leaf.
// FlattenNode's translation unit defines them or includes their definitions
// (signature_leaf.h), so that they inline into the walk (the build uses no
// LTO). Flatten() is defined here: BuildSignature calls it per argument.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include <nanobind/nanobind.h>

#include "primitives/small_vector.h"
#include "signature/signature.h"
#include "signature/signature_internal.h"
#include "signature/thread_memos.h"

namespace ftjit {

// Where in the arguments the builder is, for error messages.
struct PathElem {
  PyObject* key;  // borrowed, alive while building; null means `index`
  Py_ssize_t index;
};

class Builder {
 public:
  Builder(const SignatureSpec& spec, const ContextHook& hook, CallSignature& out, ThreadMemos& memos,
          bool allow_specs, LeafObjects* leaf_objects, bool partial = false)
      : spec_(spec), hook_(hook), out_(out), memos_(memos), allow_specs_(allow_specs), partial_(partial),
        leaf_objects_(leaf_objects) {}

  // Records `obj` (an argument, or a node or leaf inside one) in `out_` and
  // mixes it into the hash. `SetTop` names the argument for messages.
  void Flatten(PyObject* obj) {
    if (Py_EnterRecursiveCall(" while flattening the arguments of a jitted function")) {
      throw nb::python_error();
    }
    // Not a destructor: a thread ended by CPython at interpreter shutdown
    // (pthread_exit when it takes the GIL back inside Python code run from
    // here) unwinds through this frame with no thread state, where
    // Py_LeaveRecursiveCall would crash (3.12+). Such an unwind is not a
    // std::exception, so it passes untouched.
    try {
      FlattenNode(obj);
    } catch (const std::exception&) {
      Py_LeaveRecursiveCall();
      throw;
    }
    Py_LeaveRecursiveCall();
  }

  // One node or leaf, by its type.
  void FlattenNode(PyObject* obj);

  size_t hash() const { return h_; }  // the arguments' without placements
  size_t placement_hash() const { return p_; }  // the placements' (0: none)
  void MixIn(size_t v) { h_ = Mix(h_, v); }

  void SetTop(PyObject* name, Py_ssize_t position) {
    top_name_ = name;
    top_position_ = position;
    path_.clear();
  }

 private:
  // dtype, shape and weak type of an array-like `obj`, with their hash.
  struct ArrayShape {
    PinnedRef dtype;
    SmallVector<int64_t, 8> dims;
    bool weak = false;
    size_t hash = 0;
  };

  // The pytree walk. TryCustom (called from FlattenNode only) and
  // TryRegistry (from TryCustom only) are forced inline: the compiler
  // inlines a function called once on its own only when it has internal
  // linkage, which members do not.
  inline void Scalar(PyObject* obj, LeafKind kind);
  // Keeps the leaf `obj` for an executable that takes leaves, when asked to.
  void KeepLeaf(PyObject* obj) {
    if (!leaf_objects_) return;
    if (held_) {
      leaf_objects_->PushBorrowed(obj);
    } else {
      leaf_objects_->PushOwned(nb::borrow(obj));
    }
  }
  // Flattens `obj`'s children, which the call's arguments hold for the call
  // (`held`: a tuple's items) or may not (a list's, a dict's, a node's).
  struct Holding {
    Builder& b;
    bool saved;
    Holding(Builder& builder, bool held) : b(builder), saved(builder.held_) { b.held_ = saved && held; }
    ~Holding() { b.held_ = saved; }
  };
  inline void Sequence(PyObject* obj, NodeKind kind);
  inline void Dict(PyObject* obj);
  inline bool IsCustomNamedTuple(PyTypeObject* type);
  __attribute__((always_inline)) inline bool TryRegistry(PyObject* obj);
  __attribute__((always_inline)) inline bool TryCustom(PyObject* obj);

  // Leaf signatures.
  inline bool IsKnownArrayType(PyTypeObject* type) const;
  static inline bool ReadArrayShape(PyObject* obj, ArrayShape& s, ThreadMemos& memos);
  static inline void ReadNumpyFields(PyObject* obj, ArrayShape& s, ThreadMemos& memos);
  static inline bool FindAval(const AvalMemo& memo, PyObject* aval, ArrayShape& s);
  static inline void StoreAval(AvalMemo& memo, PyObject* aval, const ArrayShape& s);
  inline bool TryArray(PyObject* obj);

  // Error messages naming the argument.
  [[noreturn]] void Unsupported(PyObject* obj);
  [[noreturn]] void NotAnArgument(PyObject* obj, const ArrayShape& s);
  // Raises ValueError when a spec's shape has a negative dimension, or more
  // elements or bytes than an int64 counts (no array can have it; XLA
  // would abort the process compiling it). Only where specs are allowed.
  void CheckSpecShape(const ArrayShape& s);
  static std::string ShapeText(const ArrayShape& s);  // "float32[8,128]"
  [[noreturn]] void UnsortableDictKeys();
  std::string PathText() const;
  std::string Where() const;

  const SignatureSpec& spec_;
  const ContextHook& hook_;
  CallSignature& out_;
  ThreadMemos& memos_;
  const bool allow_specs_;  // argument specs stand for arrays (precompile), or are refused (a call)
  const bool partial_;      // placements left out (BuildSignature's `partial`)
  LeafObjects* const leaf_objects_;  // the leaves themselves, or null when not asked for
  bool held_ = true;  // the object being flattened is held by the call's arguments (see LeafObjects)
  size_t h_ = 0;
  size_t p_ = 0;  // the committed placements', by leaf (see TryArray)
  PyObject* top_name_ = nullptr;  // borrowed
  Py_ssize_t top_position_ = -1;
  SmallVector<PathElem, 8> path_;
};

}  // namespace ftjit
