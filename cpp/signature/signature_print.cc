// ftjit: the readable form of a call signature, e.g. "f(float32[8,128],
// int, n=3)": the one printer of signatures (messages, cache listings, and
// the texts of exported records, which miss explanations show); Repr and
// Str.
//
// Shared state: none (a signature printed is immutable or the caller's own;
// the spec's placement_label is fixed). Lock order: takes no locks.
// Printing runs Python (__repr__, __str__, placement_label): never under a
// C++ lock.
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>

#include "pyutil/errors.h"
#include "signature/signature.h"
#include "signature/signature_internal.h"

namespace ftjit {

std::string Repr(PyObject* o) {
  PyObject* r = PyObject_Repr(o);
  if (!r) {
    ClearErrorKeepingInterrupt();
    return "<unprintable " + std::string(Py_TYPE(o)->tp_name) + ">";
  }
  const char* s = PyUnicode_AsUTF8(r);
  std::string out = s ? s : "?";
  if (!s) PyErr_Clear();
  Py_DECREF(r);
  return out;
}

std::string Str(PyObject* o) {
  PyObject* r = PyObject_Str(o);
  if (!r) {
    ClearErrorKeepingInterrupt();
    return Repr(o);
  }
  const char* s = PyUnicode_AsUTF8(r);
  std::string out = s ? s : "?";
  if (!s) PyErr_Clear();
  Py_DECREF(r);
  return out;
}

namespace {

// How a committed leaf's placement prints: the spec's placement_label hook
// (e.g. "cpu:1" for a single-device sharding), else str(sharding).
std::string PlacementLabel(PyObject* label, PyObject* sharding) {
  if (label) {
    PyObject* r = PyObject_CallOneArg(label, sharding);
    if (r && PyUnicode_Check(r)) {
      const char* s = PyUnicode_AsUTF8(r);
      if (s) {
        std::string out = s;
        Py_DECREF(r);
        return out;
      }
    }
    Py_XDECREF(r);
    if (PyErr_Occurred()) ClearErrorKeepingInterrupt();
  }
  return Str(sharding);
}

// Prints the tree of a signature in preorder (a SignatureCursor's walk).
// With `leaf_texts`, each leaf prints as "*" and its own text goes there.
class Printer {
 public:
  Printer(const CallSignature& s, PyObject* placement_label, std::vector<std::string>* leaf_texts = nullptr)
      : at_(s), label_(placement_label), leaf_texts_(leaf_texts) {}

  std::string Node() {
    uint32_t tok = at_.NextToken();
    size_t n = ArityOf(tok);
    switch (KindOf(tok)) {
      case NodeKind::kNone:
        return "None";
      case NodeKind::kStatic:
        return Repr(at_.NextStatic().ptr());
      case NodeKind::kLeaf:
        return Leaf();
      case NodeKind::kTuple:
        return Children("(", n, n == 1 ? ",)" : ")");
      case NodeKind::kList:
        return Children("[", n, "]");
      case NodeKind::kNamedTuple: {
        PyObject* type = at_.NextAux()->ptr();
        return Children(std::string(reinterpret_cast<PyTypeObject*>(type)->tp_name) + "(", n, ")");
      }
      case NodeKind::kRegistered: {
        // As jax prints a one-level treedef: PyTreeDef(CustomNode(T[data], [*, *]))
        PyObject* key = at_.NextAux()->ptr();
        PyObject* type = PyTuple_GET_ITEM(key, 0);
        std::string head = "PyTreeDef(CustomNode(" +
                           std::string(reinterpret_cast<PyTypeObject*>(type)->tp_name) + "[" +
                           Str(PyTuple_GET_ITEM(key, 1)) + "], [";
        for (size_t i = 0; i < n; ++i) head += i ? ", *" : "*";
        return Children(head + "]))(", n, ")");
      }
      case NodeKind::kCustom: {
        std::string head = Repr(at_.NextAux()->ptr());
        return Children(head + "(", n, ")");
      }
      case NodeKind::kDict: {
        const nb::object* keys = at_.NextAux(n);
        std::string out = "{";
        for (size_t i = 0; i < n; ++i) {
          if (i) out += ", ";
          out += Repr(keys[i].ptr()) + ": " + Node();
        }
        return out + "}";
      }
    }
    return "?";
  }

 private:
  std::string Children(const std::string& open, size_t n, const char* close) {
    std::string out = open;
    for (size_t i = 0; i < n; ++i) {
      if (i) out += ", ";
      out += Node();
    }
    return out + close;
  }

  std::string Leaf() {
    std::string text = LeafText();
    if (!leaf_texts_) return text;
    leaf_texts_->push_back(std::move(text));
    return "*";
  }

  std::string LeafText() {
    const LeafSignature& l = at_.NextLeaf();
    if (l.kind != LeafKind::kArray) return LeafKindName(l.kind);  // a Python scalar
    std::string out = Str(l.dtype.ptr()) + "[";
    for (uint32_t i = 0; i < l.ndim; ++i) {
      if (i) out += ",";
      out += std::to_string(at_.NextDim());
    }
    out += "]";
    if (l.weak_type) out += "{weak}";
    if (l.sharding.is_valid()) out += "@" + PlacementLabel(label_, l.sharding.ptr());
    return out;
  }

  SignatureCursor at_;
  PyObject* label_;  // borrowed (the spec's), or null
  std::vector<std::string>* leaf_texts_;
};

}  // namespace

std::vector<ArgumentTexts> PrintArguments(const CallSignature& sig, PyObject* placement_label) {
  std::vector<ArgumentTexts> out(sig.num_positional + sig.kwnames.size());
  std::vector<std::string> leaves;
  Printer p(sig, placement_label, &leaves);
  for (ArgumentTexts& argument : out) {
    argument.tree = p.Node();
    argument.leaves = std::move(leaves);
    leaves.clear();  // moved from: valid, emptied for the next argument
  }
  return out;
}

std::string CallSignature::ToString(const SignatureSpec& spec) const {
  const std::string& fun_name = spec.fun_name;
  Printer p(*this, spec.placement_label.ptr());
  std::string out = fun_name + "(";
  size_t total = num_positional + kwnames.size();
  for (size_t i = 0; i < total; ++i) {
    if (i) out += ", ";
    if (i >= num_positional) out += Str(kwnames[i - num_positional].ptr()) + "=";
    out += p.Node();
  }
  return out + ")";
}

}  // namespace ftjit
