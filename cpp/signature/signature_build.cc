// ftjit: BuildSignature: the order of a call's work, its static arguments
// and its context's hash.
//
// Shared state: this thread's memos (ThreadMemos); the spec is fixed after
// construction; the signature being built is the caller's own.
//
// Lock order: takes no lock itself. CanonicalContext takes g_contexts.mu
// and array leaves g_dtypes.mu, leaves both, around Python-free steps only.
// Everything else may run Python (hooks, __hash__): never under a C++ lock.
#include <Python.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>

#include "primitives/small_vector.h"
#include "signature/interned_context.h"
#include "signature/signature.h"
#include "signature/signature_builder.h"
#include "signature/signature_internal.h"
#include "signature/thread_memos.h"

namespace ftjit {

namespace {

PyObject* ArgName(const SignatureSpec& spec, size_t i) {
  if (spec.arg_names.is_valid() && PyTuple_Check(spec.arg_names.ptr()) &&
      static_cast<Py_ssize_t>(i) < PyTuple_GET_SIZE(spec.arg_names.ptr())) {
    return PyTuple_GET_ITEM(spec.arg_names.ptr(), i);
  }
  return nullptr;
}

// `describe()` names the argument for the error message; it runs only when
// hashing fails (it may call str() on the argument's name).
template <class Describe>
size_t HashStatic(const SignatureSpec& spec, PyObject* value, Describe&& describe) {
  Py_hash_t h = PyObject_Hash(value);
  if (h == -1) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      std::string which = WithErrorAside(describe);
      UnhashableStatic(spec, value, which);
    }
    throw nb::python_error();
  }
  return Mix(std::hash<const void*>()(Py_TYPE(value)), static_cast<size_t>(h));
}

// Hash of the call's context, and its canonical object. Hashing and
// canonicalising the fresh tuple a context hook builds is the expensive
// part: when its items (and extras) are the very objects of this thread's
// last context, that context's canonical object and hash are reused. With
// extras, the key is one tuple of the context's items (or the context
// itself, if not a tuple) followed by the extras; a tuple context's items
// at the hook's unkeyed positions are None in the key (and not compared
// with the memo's).
//
// On return `ctx` either borrows its canonical object from this thread's
// memo, or owns a counted reference (or the object itself, past the table's
// bound). A borrowing `ctx` keeps the fresh context and extras as its
// anchor, and no Python code may run until the signature is probed or
// adopted (CallSignature::AdoptContext): nothing here drops an object once
// it borrows.
Py_hash_t ContextHash(const ContextHook& hook, ContextRef& ctx, SmallVector<nb::object, 4>& extras,
                      ContextMemo& memo) {
  PyObject* c = ctx.ptr();
  size_t num_extras = extras.size();
  bool is_tuple = PyTuple_CheckExact(c);
  PyObject* const* head = is_tuple ? reinterpret_cast<PyTupleObject*>(c)->ob_item : &c;
  size_t num_head = is_tuple ? static_cast<size_t>(PyTuple_GET_SIZE(c)) : 1;
  const bool projected = is_tuple && !hook.unkeyed.empty();
  if (memo.ctx && (is_tuple || num_extras > 0) && memo.items.size() == num_head + num_extras) {
    // Item by item, identity only; then whether the context still has users
    // (after the comparison: see InternedContext, Lifetime).
    bool same;
    if (!projected) {
      same = std::memcmp(head, memo.items.data(), sizeof(PyObject*) * num_head) == 0;
    } else {
      same = true;
      for (size_t i = 0; same && i < num_head; ++i) same = hook.Unkeyed(i) || head[i] == memo.items[i];
    }
    for (size_t i = 0; same && i < num_extras; ++i) same = extras[i].ptr() == memo.items[num_head + i];
    if (same && memo.ctx->users.load(std::memory_order_acquire) > 0) {
      // The anchor keeps what the fresh context and the extras hold until
      // the signature is adopted (or dropped, after the call): moved, not
      // counted again.
      SmallVector<PyObject*, 5> anchor;
      anchor.push_back(Py_NewRef(c));
      for (size_t i = 0; i < num_extras; ++i) anchor.push_back(extras[i].release().ptr());
      extras.clear();
      ctx = ContextRef::Borrowed(memo.ctx, std::move(anchor));  // drops the fresh reference: the anchor has it
      return memo.hash;
    }
  }
  nb::object key = nb::borrow(c);
  if (num_extras > 0 || projected) {
    key = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(num_head + num_extras)));
    if (!key.is_valid()) throw nb::python_error();
    for (size_t i = 0; i < num_head; ++i) {
      PyTuple_SET_ITEM(key.ptr(), i, Py_NewRef(projected && hook.Unkeyed(i) ? Py_None : head[i]));
    }
    for (size_t i = 0; i < num_extras; ++i) {
      PyTuple_SET_ITEM(key.ptr(), num_head + i, Py_NewRef(extras[i].ptr()));
    }
  }
  Py_hash_t h = PyObject_Hash(key.ptr());
  if (h == -1) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      ThrowWithCause(PyExc_TypeError,
                     "the compiler's context() returned an unhashable value; it is part of every "
                     "call's signature, so it must be hashable (e.g. a tuple instead of a list)");
    }
    throw nb::python_error();
  }
  ContextRef canonical = CanonicalContext(key.ptr(), h);  // counted (or owned)
  // A tuple key is remembered (weakly) for the next call of this thread.
  if (InternedContext* interned = canonical.interned(); interned && PyTuple_CheckExact(interned->obj)) {
    memo.Remember(interned, h);
  }
  key = nb::object();
  extras.clear();
  ctx = std::move(canonical);  // counted: drops the fresh context (may run Python)
  return h;
}

// The probe, the context and its extras (new references, alive until the
// key is built) into `out`; throws NeedsFallback when the call must defer.
void ReadContext(const ContextHook& hook, CallSignature& out, SmallVector<nb::object, 4>& extras) {
  hook.CheckProbe();
  if (hook.context) {
    out.context = ContextRef::Owned(PyObject_CallNoArgs(hook.context));
    if (!out.context.is_valid()) throw nb::python_error();
    hook.CheckRequires(out.context.ptr());
  }
  for (size_t i = 0; i < hook.num_extras; ++i) {
    extras.push_back(nb::steal(PyObject_CallOneArg(hook.extra_getters[i], hook.extra_args[i])));
    if (!extras.back().is_valid()) throw nb::python_error();
  }
}

// The full hash: the arguments', the placements' (0: none), then the
// context's (when there is one).
void FinishHash(const ContextHook& hook, CallSignature& out, size_t placements, SmallVector<nb::object, 4>& extras,
                ThreadMemos& memos) {
  size_t h = placements ? Mix(out.args_hash, placements) : out.args_hash;
  // Last: nothing may run Python once the context borrows (see ContextHash).
  out.hash = out.context.is_valid() ? Mix(h, static_cast<size_t>(ContextHash(hook, out.context, extras, memos.context)))
                                    : h;
}

}  // namespace

void BuildSignature(const SignatureSpec& spec, PyObject* const* args, size_t nargs,
                    PyObject* kwnames, CallSignature& out, bool allow_specs, LeafObjects* leaf_objects,
                    bool partial) {
  // The context first (see the declaration); a partial signature reads none.
  const ContextHook& hook = spec.hook;  // read once, by SignatureSpec::ReadHooks
  SmallVector<nb::object, 4> extras;
  if (!partial) ReadContext(hook, out, extras);
  out.partial = partial;
  ThreadMemos& memos = Memos();
  Builder b(spec, hook, out, memos, allow_specs, leaf_objects, partial);
  out.num_positional = static_cast<uint32_t>(nargs);
  b.MixIn(nargs);
  for (size_t i = 0; i < nargs; ++i) {
    if (!spec.static_argnums.empty() && spec.IsStaticPosition(i, nargs)) {
      b.MixIn(HashStatic(spec, args[i], [&spec, i] {
        PyObject* name = ArgName(spec, i);
        std::string which = std::to_string(i);
        if (name) which += " ('" + Str(name) + "')";
        return which;
      }));
      out.tree.push_back(Token(NodeKind::kStatic, 0));
      out.statics.push_back(nb::borrow(args[i]));
      continue;
    }
    b.SetTop(ArgName(spec, i), static_cast<Py_ssize_t>(i));
    b.Flatten(args[i]);
  }
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nkw > 0) {
    // Sort keyword arguments by name (insertion sort: there are few).
    SmallVector<Py_ssize_t, 8> order;
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      order.push_back(k);
      for (size_t j = order.size() - 1; j > 0; --j) {
        PyObject* a = PyTuple_GET_ITEM(kwnames, order[j - 1]);
        PyObject* c = PyTuple_GET_ITEM(kwnames, order[j]);
        if (CompareNames(a, c) <= 0) break;
        std::swap(order[j - 1], order[j]);
      }
    }
    for (Py_ssize_t k : order) {
      PyObject* name = PyTuple_GET_ITEM(kwnames, k);
      PyObject* value = args[nargs + k];
      Py_hash_t nh = PyObject_Hash(name);  // str hashes are cached
      if (nh == -1) throw nb::python_error();
      b.MixIn(static_cast<size_t>(nh));
      out.kwnames.push_back(nb::borrow(name));
      if (!spec.static_argnames.empty() && spec.IsStaticName(name)) {
        b.MixIn(HashStatic(spec, value, [name] { return "'" + Str(name) + "'"; }));
        out.tree.push_back(Token(NodeKind::kStatic, 0));
        out.statics.push_back(nb::borrow(value));
        continue;
      }
      b.SetTop(name, -1);
      b.Flatten(value);
    }
  }
  out.args_hash = b.hash();
  out.jax_style_errors = spec.jax_style_errors;
  FinishHash(hook, out, b.placement_hash(), extras, memos);
  out.table_hash = spec.context_in_executable ? out.args_hash : out.hash;
}

bool ContextHook::Defers() const {
  CallSignature probe;
  SmallVector<nb::object, 4> extras;
  try {
    ReadContext(*this, probe, extras);
  } catch (const NeedsFallback&) {
    return true;
  }
  return false;
}

}  // namespace ftjit
