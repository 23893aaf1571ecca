// ftjit: a call signature as Python records (ftjit._signature): its
// arguments as trees of Node, Leaf and Static, its context, and each
// argument's texts from the one printer (PrintArguments). The one
// description of a signature that Python code reads (miss explanations,
// warmup_specs); nothing in Python flattens or prints arguments again.
//
// Shared state: none. The signature exported is immutable (a stored key) or
// the caller's own. Lock order: takes no lock; builds Python objects and
// prints (repr(), placement_label), so it never runs under a C++ lock.
#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "pyutil/collaborators.h"
#include "signature/signature.h"
#include "signature/signature_internal.h"

namespace ftjit {

namespace {

// Node.kind of each NodeKind that is a Node record (kLeaf and kStatic are
// Leaf and Static records).
const char* NodeKindName(NodeKind kind) {
  switch (kind) {
    case NodeKind::kNone: return "none";
    case NodeKind::kTuple: return "tuple";
    case NodeKind::kList: return "list";
    case NodeKind::kDict: return "dict";
    case NodeKind::kNamedTuple: return "namedtuple";
    case NodeKind::kCustom: return "custom";
    case NodeKind::kRegistered: return "registered";
    case NodeKind::kLeaf:
    case NodeKind::kStatic: break;
  }
  return nullptr;
}

// Exports the tree of a signature in preorder (a SignatureCursor's walk, as
// the printer's).
class Exporter {
 public:
  explicit Exporter(const CallSignature& s) : at_(s) {}

  nb::object Node() {
    uint32_t tok = at_.NextToken();
    size_t n = ArityOf(tok);
    switch (KindOf(tok)) {
      case NodeKind::kNone:
        return Make(NodeKind::kNone, nb::none(), 0);
      case NodeKind::kStatic:
        return nb::handle(kStatic.Get())(at_.NextStatic());
      case NodeKind::kLeaf:
        return Leaf();
      case NodeKind::kTuple:
      case NodeKind::kList:
        return Make(KindOf(tok), nb::none(), n);
      case NodeKind::kNamedTuple:
      case NodeKind::kRegistered:
      case NodeKind::kCustom: {
        const nb::object& key = *at_.NextAux();
        return Make(KindOf(tok), key, n);
      }
      case NodeKind::kDict: {
        nb::object keys = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(n)));
        if (!keys.is_valid()) throw nb::python_error();
        const nb::object* first = at_.NextAux(n);
        for (size_t i = 0; i < n; ++i) {
          PyTuple_SET_ITEM(keys.ptr(), static_cast<Py_ssize_t>(i), Py_NewRef(first[i].ptr()));
        }
        return Make(NodeKind::kDict, keys, n);
      }
    }
    throw nb::value_error("ftjit: an unknown node in a signature");
  }

 private:
  nb::object Make(NodeKind kind, nb::handle key, size_t n) {
    nb::object children = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(n)));
    if (!children.is_valid()) throw nb::python_error();
    for (size_t i = 0; i < n; ++i) {
      PyTuple_SET_ITEM(children.ptr(), static_cast<Py_ssize_t>(i), Node().release().ptr());
    }
    return nb::handle(kNode.Get())(NodeKindName(kind), key, children);
  }

  nb::object Leaf() {
    const LeafSignature& l = at_.NextLeaf();
    const char* kind = LeafKindName(l.kind);
    nb::object shape = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(l.ndim)));
    if (!shape.is_valid()) throw nb::python_error();
    for (uint32_t i = 0; i < l.ndim; ++i) {
      PyObject* d = PyLong_FromLongLong(at_.NextDim());
      if (!d) throw nb::python_error();
      PyTuple_SET_ITEM(shape.ptr(), i, d);
    }
    nb::handle dtype = l.dtype.is_valid() ? nb::handle(l.dtype.ptr()) : nb::none();
    nb::handle sharding = l.sharding.is_valid() ? nb::handle(l.sharding) : nb::none();
    return nb::handle(kLeaf.Get())(kind, dtype, shape, nb::bool_(l.weak_type), sharding);
  }

  SignatureCursor at_;
};

// A str of `text`.
nb::object Text(const std::string& text) {
  return StealOrThrow(PyUnicode_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size())));
}

// Signature.texts: per argument, (its tree with each leaf as "*", its leaves' texts).
nb::object ExportTexts(const CallSignature& sig, const SignatureSpec& spec) {
  std::vector<ArgumentTexts> texts = PrintArguments(sig, spec.placement_label.ptr());
  nb::object out = StealOrThrow(PyTuple_New(static_cast<Py_ssize_t>(texts.size())));
  for (size_t i = 0; i < texts.size(); ++i) {
    nb::object leaves = StealOrThrow(PyTuple_New(static_cast<Py_ssize_t>(texts[i].leaves.size())));
    for (size_t j = 0; j < texts[i].leaves.size(); ++j) {
      PyTuple_SET_ITEM(leaves.ptr(), static_cast<Py_ssize_t>(j), Text(texts[i].leaves[j]).release().ptr());
    }
    nb::object argument = nb::make_tuple(Text(texts[i].tree), leaves);
    PyTuple_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), argument.release().ptr());
  }
  return out;
}

}  // namespace

nb::object ExportSignature(const CallSignature& sig, const SignatureSpec& spec) {
  Exporter e(sig);
  nb::object args = nb::steal(PyTuple_New(sig.num_positional));
  if (!args.is_valid()) throw nb::python_error();
  for (uint32_t i = 0; i < sig.num_positional; ++i) PyTuple_SET_ITEM(args.ptr(), i, e.Node().release().ptr());
  nb::dict kwargs;
  for (const nb::object& name : sig.kwnames) kwargs[name] = e.Node();
  nb::handle context = sig.context.is_valid() ? nb::handle(sig.context.ptr()) : nb::none();
  return nb::handle(kSignature.Get())(args, kwargs, context, ExportTexts(sig, spec));
}

void RegisterSignatureRecords(nb::module_& m) {
  m.def(
      "_leaf_kinds",
      [] {
        nb::list kinds;
        for (const char* name : kLeafKindNames) kinds.append(nb::str(name));
        return nb::tuple(kinds);
      },
      nb::sig("def _leaf_kinds() -> tuple[str, ...]"),
      "The kinds of leaves the core exports (Leaf.kind), in its order.");
  m.attr("MAX_SPEC_RANK") = kMaxSpecRank;
}

}  // namespace ftjit
