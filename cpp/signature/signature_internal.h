// ftjit: private to the signature floor: hash mixing, tree tokens,
// interned names, message text.
//
// Shared state: g_names, made at module init by InitSignatures and fixed
// afterwards: read without a lock.
//
// Lock order: InternDtype takes g_dtypes.mu, a leaf; nothing else declared
// here takes a lock. Repr, Str and the error raisers run Python: never
// under a C++ lock.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "pyutil/errors.h"
#include "signature/signature.h"

namespace ftjit {

namespace nb = nanobind;

inline size_t Mix(size_t h, size_t v) {
  // 64-bit variant of boost::hash_combine's mixing step.
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

// Tree tokens (see NodeKind).
inline uint32_t Token(NodeKind kind, size_t arity) {
  return static_cast<uint32_t>(kind) | (static_cast<uint32_t>(arity) << 8);
}
inline NodeKind KindOf(uint32_t token) { return static_cast<NodeKind>(token & 0xff); }
inline size_t ArityOf(uint32_t token) { return token >> 8; }

// Attribute names the builder looks up, interned once.
struct Names {
  PyObject* dtype;
  PyObject* sharding;
  PyObject* shape;
  PyObject* weak_type;
  PyObject* fields;
  PyObject* aval;
  PyObject* jax_array;
};
// Made by InitSignatures() at module init, never lazily: interning calls
// Python, and a function-local static whose initialiser calls Python can
// deadlock a free-threaded interpreter (thread A holds the C++ init guard
// and detaches waiting for the intern lock; thread B blocks on the guard
// still attached; a stop-the-world then waits for B forever; jax#28385).
inline const Names* g_names = nullptr;
inline const Names& N() { return *g_names; }

// Interns `dtype` in the process-wide table (g_dtypes), so signatures may
// pin it (PinnedRef); false past the table's bound. Identity only,
// Python-free; takes g_dtypes.mu.
bool InternDtype(PyObject* dtype);

// Keyword names compared by content (no user code runs).
inline int CompareNames(PyObject* a, PyObject* b) {
  if (a == b) return 0;
  return PyUnicode_Compare(a, b);
}

// A preorder walk's place in a signature (the printer's, the exporter's):
// its tree tokens, aux objects, leaves, dims and statics, each taken in the
// order the builder recorded them.
class SignatureCursor {
 public:
  explicit SignatureCursor(const CallSignature& s) : s_(s) {}
  uint32_t NextToken() { return s_.tree[t_++]; }
  // The next `n` aux objects (a dict's keys are recorded together).
  const nb::object* NextAux(size_t n = 1) {
    const nb::object* first = &s_.aux[a_];
    a_ += n;
    return first;
  }
  const LeafSignature& NextLeaf() { return s_.leaves[l_++]; }
  int64_t NextDim() { return s_.dims[d_++]; }
  const nb::object& NextStatic() { return s_.statics[st_++]; }

 private:
  const CallSignature& s_;
  size_t t_ = 0, a_ = 0, l_ = 0, d_ = 0, st_ = 0;
};

// Text of an object for a message: repr(o) / str(o),
// or a placeholder when that fails (the error cleared, a KeyboardInterrupt
// kept: ClearErrorKeepingInterrupt). They run __repr__/__str__.
std::string Repr(PyObject* o);
std::string Str(PyObject* o);

// An argument as miss explanations show it (ExportSignature's texts).
struct ArgumentTexts {
  std::string tree;                 // as ToString prints it, but each leaf shown as "*"
  std::vector<std::string> leaves;  // each leaf's own text, in preorder
};
// Each argument of `sig` (positional, then keyword) as ToString prints it
// with `placement_label` (borrowed, or null: str()).
std::vector<ArgumentTexts> PrintArguments(const CallSignature& sig, PyObject* placement_label);

// build() (a message part that may run repr()/str()) with the pending error
// set aside, so that no Python code runs with an exception set; the error is
// restored afterwards.
template <class Build>
std::string WithErrorAside(Build&& build) {
  SavedError aside;
  return build();
}

// UnhashableStaticArgumentError for static argument `which` (its position
// or name, as the message says it), caused by the pending TypeError.
[[noreturn]] void UnhashableStatic(const SignatureSpec& spec, PyObject* value,
                                   const std::string& which);

// Raises jax.jit's report of a static argument whose __eq__ raised `err`,
// as jaxlib raises it: a ValueError whose message ends with nanobind's
// rendering of the original error, with no __cause__ (the original is
// dropped with `err`).
[[noreturn]] void RaiseStaticComparisonError(nb::python_error& err, PyObject* a, PyObject* b);

}  // namespace ftjit
