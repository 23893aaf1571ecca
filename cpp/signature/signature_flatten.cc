// ftjit: the pytree walk of a call's arguments into its signature
// (Builder::FlattenNode), with the leaf methods included so that they
// inline into the walk.
//
// Shared state: none (see Builder). Containers being walked are read with
// strong references: another thread may mutate a list or dict meanwhile.
//
// Lock order: takes no lock of its own (leaves: InternDtype's). Every
// step may run Python (__hash__ and __lt__ of dict keys, the pytree hooks,
// array properties): never under a C++ lock.
#include <Python.h>

#include <string>
#include <utility>

#include <nanobind/nanobind.h>

#include "primitives/small_vector.h"
#include "pyutil/py_compat.h"
#include "signature/signature.h"
#include "signature/signature_builder.h"
#include "signature/signature_internal.h"
#include "signature/signature_leaf.h"

namespace ftjit {

void Builder::FlattenNode(PyObject* obj) {
  if (obj == Py_None) {
    out_.tree.push_back(Token(NodeKind::kNone, 0));
    h_ = Mix(h_, 0x11);
    return;
  }
  PyTypeObject* type = Py_TYPE(obj);
  if (type == &PyFloat_Type) return Scalar(obj, LeafKind::kFloat);
  if (type == &PyLong_Type) return Scalar(obj, LeafKind::kInt);
  if (type == &PyBool_Type) return Scalar(obj, LeafKind::kBool);
  if (type == &PyComplex_Type) return Scalar(obj, LeafKind::kComplex);
  if (type == &PyTuple_Type) return Sequence(obj, NodeKind::kTuple);
  if (type == &PyList_Type) return Sequence(obj, NodeKind::kList);
  if (type == &PyDict_Type) return Dict(obj);
  if (PyTuple_Check(obj)) {
    PyObject* fields = nullptr;
    int has = GetOptionalAttr(reinterpret_cast<PyObject*>(type), N().fields, &fields);
    if (has < 0) throw nb::python_error();
    Py_XDECREF(fields);
    if (has && !IsCustomNamedTuple(type)) {
      out_.aux.push_back(nb::borrow(reinterpret_cast<PyObject*>(type)));
      h_ = Mix(h_, std::hash<const void*>()(type));
      return Sequence(obj, NodeKind::kNamedTuple);
    }
  }
  // The exact array types the compiler names, numpy arrays and numpy
  // scalars: leaves, without asking the pytree registry (the fast path).
  if (IsKnownArrayType(type)) {
    if (TryArray(obj)) return;
    Unsupported(obj);
  }
  // Anything else: a tracer of an outer transformation defers; the pytree
  // registry comes first (a registered node may also have .dtype/.shape);
  // then duck-typed arrays; then subclasses of int/float/complex (IntEnum),
  // which are leaves of the base kind, as in jax.jit.
  if (spec_.fallback_types.is_valid()) {
    int r = PyObject_IsInstance(obj, spec_.fallback_types.ptr());
    if (r < 0) throw nb::python_error();
    if (r == 1) throw NeedsFallback{};
  }
  if ((spec_.pytree_flatten.is_valid() || spec_.registry_flatten.is_valid()) && TryCustom(obj)) return;
  if (TryArray(obj)) return;
  if (PyLong_Check(obj)) return Scalar(obj, LeafKind::kInt);  // bool cannot be subclassed
  if (PyFloat_Check(obj)) return Scalar(obj, LeafKind::kFloat);
  if (PyComplex_Check(obj)) return Scalar(obj, LeafKind::kComplex);
  Unsupported(obj);
}

inline void Builder::Scalar(PyObject* obj, LeafKind kind) {
  KeepLeaf(obj);
  out_.tree.push_back(Token(NodeKind::kLeaf, 0));
  out_.leaves.push_back(LeafSignature{kind, /*weak_type=*/true, 0, PinnedRef(), nb::object()});
  h_ = Mix(h_, 0x100 + static_cast<size_t>(kind));
}

inline void Builder::Sequence(PyObject* obj, NodeKind kind) {
  bool is_list = kind == NodeKind::kList;
  Py_ssize_t n = is_list ? PyList_GET_SIZE(obj) : PyTuple_GET_SIZE(obj);
  out_.tree.push_back(Token(kind, n));
  h_ = Mix(h_, Token(kind, n));
  Holding holding(*this, /*held=*/!is_list);  // a tuple's items cannot change; a list's can
  for (Py_ssize_t i = 0; i < n; ++i) {
    nb::object item;
    if (is_list) {
      item = nb::steal(ListGetItemRef(obj, i));
      if (!item.is_valid()) throw nb::python_error();  // list shrank meanwhile
    } else {
      item = nb::borrow(PyTuple_GET_ITEM(obj, i));  // tuples are immutable
    }
    path_.push_back(PathElem{nullptr, i});
    Flatten(item.ptr());
    path_.pop_back();
  }
}

inline void Builder::Dict(PyObject* obj) {
  // PyDict_Keys takes a consistent snapshot (it locks the dict on
  // free-threaded builds); sorting may call the keys' __lt__.
  nb::object keys = nb::steal(PyDict_Keys(obj));
  if (!keys.is_valid()) throw nb::python_error();
  if (PyList_Sort(keys.ptr()) < 0) UnsortableDictKeys();
  Py_ssize_t n = PyList_GET_SIZE(keys.ptr());
  out_.tree.push_back(Token(NodeKind::kDict, n));
  h_ = Mix(h_, Token(NodeKind::kDict, n));
  SmallVector<nb::object, 8> values;
  for (Py_ssize_t i = 0; i < n; ++i) {
    nb::object key = nb::borrow(PyList_GET_ITEM(keys.ptr(), i));  // our own list
    Py_hash_t kh = PyObject_Hash(key.ptr());
    if (kh == -1) throw nb::python_error();
    h_ = Mix(h_, static_cast<size_t>(kh));
    PyObject* value = nullptr;
    int found = DictGetItemRef(obj, key.ptr(), &value);
    if (found < 0) throw nb::python_error();
    if (found == 0) {
      PyErr_Format(PyExc_RuntimeError,
                   "a dict argument of %s() changed size while it was being read",
                   spec_.fun_name.c_str());
      throw nb::python_error();
    }
    values.push_back(nb::steal(value));
    out_.aux.push_back(std::move(key));
  }
  size_t first_key = out_.aux.size() - n;
  Holding holding(*this, /*held=*/false);  // the dict's values may be replaced meanwhile
  for (Py_ssize_t i = 0; i < n; ++i) {
    path_.push_back(PathElem{out_.aux[first_key + i].ptr(), 0});
    Flatten(values[i].ptr());
    path_.pop_back();
  }
}

// Whether namedtuple `type` is a custom node of the registry, asked every
// time (a registration is seen at once): a C lookup when the hook is a
// dict's __contains__ (JAX's registry), else a call of the hook.
inline bool Builder::IsCustomNamedTuple(PyTypeObject* type) {
  if (spec_.custom_namedtuple_dict.is_valid()) {
    int r = PyDict_Contains(spec_.custom_namedtuple_dict.ptr(), reinterpret_cast<PyObject*>(type));
    if (r < 0) throw nb::python_error();
    return r == 1;
  }
  if (!spec_.custom_namedtuple.is_valid()) return false;
  nb::object r = nb::steal(PyObject_CallOneArg(spec_.custom_namedtuple.ptr(), reinterpret_cast<PyObject*>(type)));
  if (!r.is_valid()) throw nb::python_error();
  int truth = PyObject_IsTrue(r.ptr());
  if (truth < 0) throw nb::python_error();
  return truth == 1;
}

// One level of a registry's flattening, called in C (JAX's
// PyTreeRegistry.flatten_one_level): None for a leaf, (children, node
// data) for a node, keyed by (type, node data) as jax keys its treedefs
// (node data compared with ==; its hash when it has one, as jax's treedef
// hash leaves node data out).
inline bool Builder::TryRegistry(PyObject* obj) {
  nb::object res = nb::steal(PyObject_CallOneArg(spec_.registry_flatten.ptr(), obj));
  if (!res.is_valid()) throw nb::python_error();
  if (res.is_none()) return false;
  if (!PyTuple_Check(res.ptr()) || PyTuple_GET_SIZE(res.ptr()) != 2) {
    PyErr_SetString(PyExc_TypeError, "a registry's flatten_one_level must return None or (children, node data)");
    throw nb::python_error();
  }
  nb::object children = nb::steal(PySequence_Fast(PyTuple_GET_ITEM(res.ptr(), 0),
                                                  "flatten_one_level's children must be a sequence"));
  if (!children.is_valid()) throw nb::python_error();
  nb::object key = nb::steal(PyTuple_Pack(2, reinterpret_cast<PyObject*>(Py_TYPE(obj)),
                                          PyTuple_GET_ITEM(res.ptr(), 1)));
  if (!key.is_valid()) throw nb::python_error();
  Py_hash_t kh = PyObject_Hash(PyTuple_GET_ITEM(res.ptr(), 1));
  if (kh == -1) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw nb::python_error();
    PyErr_Clear();  // unhashable node data: compared with == alone
    kh = 0;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(children.ptr());
  out_.tree.push_back(Token(NodeKind::kRegistered, n));
  out_.aux.push_back(std::move(key));
  h_ = Mix(Mix(Mix(h_, Token(NodeKind::kRegistered, n)), std::hash<const void*>()(Py_TYPE(obj))),
           static_cast<size_t>(kh));
  PyObject** items = PySequence_Fast_ITEMS(children.ptr());  // our own list or tuple
  Holding holding(*this, /*held=*/false);  // the node's children: `children` holds them, not the call
  for (Py_ssize_t i = 0; i < n; ++i) {
    path_.push_back(PathElem{nullptr, i});
    Flatten(items[i]);
    path_.pop_back();
  }
  return true;
}

inline bool Builder::TryCustom(PyObject* obj) {
  if (spec_.registry_flatten.is_valid()) return TryRegistry(obj);
  nb::object res = nb::steal(PyObject_CallOneArg(spec_.pytree_flatten.ptr(), obj));
  if (!res.is_valid()) throw nb::python_error();
  if (res.is_none()) return false;
  if (res.ptr() == Py_False) throw NeedsFallback{};  // the compiler's own path takes this call
  if (!PyTuple_Check(res.ptr()) || PyTuple_GET_SIZE(res.ptr()) != 2) {
    PyErr_SetString(PyExc_TypeError,
                    "pytree_flatten hook must return None or (node_key, children)");
    throw nb::python_error();
  }
  nb::object key = nb::borrow(PyTuple_GET_ITEM(res.ptr(), 0));
  nb::object children = nb::steal(PySequence_Tuple(PyTuple_GET_ITEM(res.ptr(), 1)));
  if (!children.is_valid()) throw nb::python_error();
  Py_hash_t kh = PyObject_Hash(key.ptr());
  if (kh == -1) throw nb::python_error();
  Py_ssize_t n = PyTuple_GET_SIZE(children.ptr());
  out_.tree.push_back(Token(NodeKind::kCustom, n));
  out_.aux.push_back(std::move(key));
  h_ = Mix(Mix(h_, Token(NodeKind::kCustom, n)), static_cast<size_t>(kh));
  Holding holding(*this, /*held=*/false);  // the node's children: `children` holds them, not the call
  for (Py_ssize_t i = 0; i < n; ++i) {
    path_.push_back(PathElem{nullptr, i});
    Flatten(PyTuple_GET_ITEM(children.ptr(), i));
    path_.pop_back();
  }
  return true;
}

}  // namespace ftjit
