// ftjit: a call signature as Python records (ftjit/_signature.py): its
// arguments as trees of Node, Leaf and Static, and its context. The one
// description of a signature that Python code reads (miss explanations,
// warmup_specs); nothing in Python flattens arguments again.
//
// Shared state: none. The signature exported is immutable (a stored key) or
// the caller's own. Lock order: takes no lock; builds Python objects, so it
// never runs under a C++ lock.
#include <Python.h>
#include <nanobind/nanobind.h>

#include "signature/imports.h"
#include "signature/signature.h"
#include "signature/signature_internal.h"

namespace ftjit {

namespace {

// Walks the tree tokens in preorder, consuming aux objects, leaves, dims and
// statics in the order the builder recorded them (as the printer does).
class Exporter {
 public:
  explicit Exporter(const CallSignature& s) : s_(s) {}

  nb::object Node() {
    uint32_t tok = s_.tree[t_++];
    size_t n = ArityOf(tok);
    switch (KindOf(tok)) {
      case NodeKind::kNone:
        return Make("none", nb::none(), 0);
      case NodeKind::kStatic:
        return nb::handle(kStatic.Get())(s_.statics[st_++]);
      case NodeKind::kLeaf:
        return Leaf();
      case NodeKind::kTuple:
        return Make("tuple", nb::none(), n);
      case NodeKind::kList:
        return Make("list", nb::none(), n);
      case NodeKind::kNamedTuple: {
        nb::object type = s_.aux[a_++];
        return Make("namedtuple", type, n);
      }
      case NodeKind::kRegistered: {
        nb::object key = s_.aux[a_++];
        return Make("registered", key, n);
      }
      case NodeKind::kCustom: {
        nb::object key = s_.aux[a_++];
        return Make("custom", key, n);
      }
      case NodeKind::kDict: {
        nb::object keys = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(n)));
        if (!keys.is_valid()) throw nb::python_error();
        for (size_t i = 0; i < n; ++i) {
          PyTuple_SET_ITEM(keys.ptr(), static_cast<Py_ssize_t>(i), Py_NewRef(s_.aux[a_++].ptr()));
        }
        return Make("dict", keys, n);
      }
    }
    throw nb::value_error("ftjit: an unknown node in a signature");
  }

 private:
  nb::object Make(const char* kind, nb::handle key, size_t n) {
    nb::object children = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(n)));
    if (!children.is_valid()) throw nb::python_error();
    for (size_t i = 0; i < n; ++i) {
      PyTuple_SET_ITEM(children.ptr(), static_cast<Py_ssize_t>(i), Node().release().ptr());
    }
    return nb::handle(kNode.Get())(kind, key, children);
  }

  nb::object Leaf() {
    const LeafSignature& l = s_.leaves[l_++];
    const char* kind = "array";
    switch (l.kind) {
      case LeafKind::kBool: kind = "bool"; break;
      case LeafKind::kInt: kind = "int"; break;
      case LeafKind::kFloat: kind = "float"; break;
      case LeafKind::kComplex: kind = "complex"; break;
      case LeafKind::kArray: break;
    }
    nb::object shape = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(l.ndim)));
    if (!shape.is_valid()) throw nb::python_error();
    for (uint32_t i = 0; i < l.ndim; ++i) {
      PyObject* d = PyLong_FromLongLong(s_.dims[d_++]);
      if (!d) throw nb::python_error();
      PyTuple_SET_ITEM(shape.ptr(), i, d);
    }
    nb::handle dtype = l.dtype.is_valid() ? nb::handle(l.dtype.ptr()) : nb::none();
    nb::handle sharding = l.sharding.is_valid() ? nb::handle(l.sharding) : nb::none();
    return nb::handle(kLeaf.Get())(kind, dtype, shape, nb::bool_(l.weak_type), sharding);
  }

  const CallSignature& s_;
  size_t t_ = 0, a_ = 0, l_ = 0, d_ = 0, st_ = 0;
};

}  // namespace

nb::object ExportSignature(const CallSignature& sig) {
  Exporter e(sig);
  nb::object args = nb::steal(PyTuple_New(sig.num_positional));
  if (!args.is_valid()) throw nb::python_error();
  for (uint32_t i = 0; i < sig.num_positional; ++i) PyTuple_SET_ITEM(args.ptr(), i, e.Node().release().ptr());
  nb::dict kwargs;
  for (const nb::object& name : sig.kwnames) kwargs[name] = e.Node();
  nb::handle context = sig.context.is_valid() ? nb::handle(sig.context.ptr()) : nb::none();
  return nb::handle(kSignature.Get())(args, kwargs, context);
}

}  // namespace ftjit
