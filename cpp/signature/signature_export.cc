// ftjit: a call signature as Python records (ftjit._signature): its
// arguments as trees of Node, Leaf and Static, and its context. The one
// description of a signature that Python code reads (miss explanations,
// warmup_specs); nothing in Python flattens arguments again. And back: a
// record tree read into a signature's tokens, so that the one printer
// (PrintArgument) prints the texts of miss explanations (RecordTexts).
//
// Shared state: none. The signature exported is immutable (a stored key) or
// the caller's own. Lock order: takes no lock; builds Python objects, so it
// never runs under a C++ lock.
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
constexpr NodeKind kNodeKinds[] = {NodeKind::kNone,       NodeKind::kTuple,  NodeKind::kList,      NodeKind::kDict,
                                   NodeKind::kNamedTuple, NodeKind::kCustom, NodeKind::kRegistered};

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

namespace {

// Reads a record tree (what Exporter::Node made, or a record a specs file
// read back) into `out`'s tokens, aux objects, leaves, dims and statics, as
// the builder records an argument. TypeError for what is no record.
class Importer {
 public:
  explicit Importer(CallSignature& out) : out_(out) {}

  void Tree(nb::handle tree) {
    if (Is(tree, kStatic)) {
      out_.tree.push_back(Token(NodeKind::kStatic, 0));
      out_.statics.push_back(nb::object(tree.attr("value")));
      return;
    }
    if (Is(tree, kLeaf)) return Leaf(tree);
    if (!Is(tree, kNode)) Wrong("an ftjit._signature Leaf, Node or Static", tree);
    NodeKind kind = NodeKindNamed(tree.attr("kind"));
    nb::object key = tree.attr("key");
    nb::object children = tree.attr("children");
    if (!PyTuple_Check(children.ptr())) Wrong("a tuple of children", children);
    size_t n = static_cast<size_t>(PyTuple_GET_SIZE(children.ptr()));
    switch (kind) {
      case NodeKind::kNone:
        if (n != 0) Wrong("a none node without children", tree);
        break;
      case NodeKind::kDict:
        if (!PyTuple_Check(key.ptr()) || static_cast<size_t>(PyTuple_GET_SIZE(key.ptr())) != n) {
          Wrong("a dict node's keys (one per child)", key);
        }
        for (nb::handle k : key) out_.aux.push_back(nb::borrow(k));
        break;
      case NodeKind::kNamedTuple:
        if (!PyType_Check(key.ptr())) Wrong("a namedtuple node's type", key);
        out_.aux.push_back(key);
        break;
      case NodeKind::kRegistered:
        if (!PyTuple_Check(key.ptr()) || PyTuple_GET_SIZE(key.ptr()) != 2 ||
            !PyType_Check(PyTuple_GET_ITEM(key.ptr(), 0))) {
          Wrong("a registered node's (type, node data)", key);
        }
        out_.aux.push_back(key);
        break;
      case NodeKind::kCustom:
        out_.aux.push_back(key);
        break;
      default:
        break;
    }
    out_.tree.push_back(Token(kind, n));
    for (nb::handle child : children) Tree(child);
  }

 private:
  static bool Is(nb::handle o, const Collaborator& type) {
    int r = PyObject_IsInstance(o.ptr(), type.Get());
    if (r < 0) throw nb::python_error();
    return r == 1;
  }
  [[noreturn]] static void Wrong(const char* what, nb::handle got) {
    throw nb::type_error((std::string(what) + " expected, got " + Repr(got.ptr())).c_str());
  }
  static NodeKind NodeKindNamed(nb::handle name) {
    if (PyUnicode_Check(name.ptr())) {
      for (NodeKind kind : kNodeKinds) {
        if (PyUnicode_CompareWithASCIIString(name.ptr(), NodeKindName(kind)) == 0) return kind;
      }
    }
    Wrong("a node kind", name);
  }
  static LeafKind LeafKindNamed(nb::handle name) {
    if (PyUnicode_Check(name.ptr())) {
      for (size_t i = 0; i < sizeof(kLeafKindNames) / sizeof(kLeafKindNames[0]); ++i) {
        if (PyUnicode_CompareWithASCIIString(name.ptr(), kLeafKindNames[i]) == 0) return static_cast<LeafKind>(i);
      }
    }
    Wrong("a leaf kind", name);
  }

  void Leaf(nb::handle leaf) {
    LeafKind kind = LeafKindNamed(leaf.attr("kind"));
    nb::object dtype = leaf.attr("dtype");
    nb::object shape = leaf.attr("shape");
    nb::object sharding = leaf.attr("sharding");
    int weak = PyObject_IsTrue(nb::object(leaf.attr("weak_type")).ptr());
    if (weak < 0) throw nb::python_error();
    if (!PyTuple_Check(shape.ptr())) Wrong("a tuple shape", shape);
    for (nb::handle d : shape) {
      long long v = PyLong_Check(d.ptr()) ? PyLong_AsLongLong(d.ptr()) : -1;
      if (v == -1 && PyErr_Occurred()) PyErr_Clear();
      if (v < 0) Wrong("a dim (an int >= 0)", d);
      out_.dims.push_back(static_cast<int64_t>(v));
    }
    if (kind == LeafKind::kArray && dtype.is_none()) Wrong("an array leaf's dtype", dtype);
    out_.tree.push_back(Token(NodeKind::kLeaf, 0));
    out_.leaves.push_back(LeafSignature{kind, weak == 1, static_cast<uint32_t>(PyTuple_GET_SIZE(shape.ptr())),
                                        dtype.is_none() ? PinnedRef() : PinnedRef::Owned(dtype),
                                        sharding.is_none() ? nb::object() : sharding});
  }

  CallSignature& out_;
};

}  // namespace

nb::object RecordTexts(nb::handle tree, nb::handle placement_label) {
  CallSignature sig;
  Importer(sig).Tree(tree);
  std::vector<std::string> leaf_texts;
  PyObject* label = placement_label.is_none() ? nullptr : placement_label.ptr();
  std::string text = PrintArgument(sig, label, leaf_texts);
  nb::object leaves = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(leaf_texts.size())));
  if (!leaves.is_valid()) throw nb::python_error();
  for (size_t i = 0; i < leaf_texts.size(); ++i) {
    PyObject* t = PyUnicode_FromStringAndSize(leaf_texts[i].data(), static_cast<Py_ssize_t>(leaf_texts[i].size()));
    if (!t) throw nb::python_error();
    PyTuple_SET_ITEM(leaves.ptr(), static_cast<Py_ssize_t>(i), t);
  }
  return nb::make_tuple(nb::str(text.data(), text.size()), leaves);
}

void RegisterSignatureRecords(nb::module_& m) {
  m.def("_record_texts", &RecordTexts, nb::arg("tree"), nb::arg("placement_label").none(),
        nb::sig("def _record_texts(tree: object, placement_label: collections.abc.Callable[[typing.Any], str] | "
                "None) -> tuple[str, tuple[str, ...]]"),
        "(text, leaf texts) of a record tree of ftjit._signature (a Leaf, Node or Static), printed as\n"
        "signatures() prints an argument, by the same printer: the tree with each leaf shown as '*', and\n"
        "each leaf's own text in order. Placements print through placement_label (None: str()).");
  m.def(
      "_leaf_kinds",
      [] {
        nb::list kinds;
        for (const char* name : kLeafKindNames) kinds.append(nb::str(name));
        return nb::tuple(kinds);
      },
      nb::sig("def _leaf_kinds() -> tuple[str, ...]"),
      "The kinds of leaves the core exports (Leaf.kind), in its order.");
}

}  // namespace ftjit
