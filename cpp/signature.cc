// ftjit: building, hashing, comparing and printing call signatures.
#include "signature.h"

#include <algorithm>
#include <cstring>
#ifdef __GLIBCXX__
#include <cxxabi.h>  // abi::__forced_unwind
#endif
#include <mutex>
#include <utility>
#include <vector>

#include "interned_context.h"
#include "leaf_mutex.h"
#include "py_compat.h"
#include "thread_memos.h"

namespace ftjit {

namespace {

inline size_t Mix(size_t h, size_t v) {
  // 64-bit variant of boost::hash_combine's mixing step.
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

inline uint32_t Token(NodeKind kind, size_t arity) {
  return static_cast<uint32_t>(kind) | (static_cast<uint32_t>(arity) << 8);
}
inline NodeKind KindOf(uint32_t token) { return static_cast<NodeKind>(token & 0xff); }
inline size_t ArityOf(uint32_t token) { return token >> 8; }

PyObject* Interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) throw nb::python_error();
  return o;  // immortal for our purposes: kept for the module's lifetime
}

struct Names {
  PyObject* dtype = Interned("dtype");
  PyObject* sharding = Interned("sharding");
  PyObject* shape = Interned("shape");
  PyObject* weak_type = Interned("weak_type");
  PyObject* fields = Interned("_fields");
  PyObject* aval = Interned("aval");
  PyObject* jax_array = Interned("__jax_array__");
};
// Made by InitSignatures() at module init, never lazily: interning calls
// Python, and a function-local static whose initialiser calls Python can
// deadlock a free-threaded interpreter (thread A holds the C++ init guard
// and detaches waiting for the intern lock; thread B blocks on the guard
// still attached; a stop-the-world then waits for B forever; jax#28385).
// Fixed after module init.
const Names* g_names = nullptr;
inline const Names& N() { return *g_names; }

// Hash of a long-lived, immutable object (a dtype, a sharding), remembered
// per thread (thread_memos.h): their hashes walk Python-level state (numpy's
// dtype hash walks the descriptor, a sharding's __hash__ is Python code), and
// they are mostly long-lived singletons.
Py_hash_t MemoHash(HashMemo& memo, PyObject* obj) {
  Py_hash_t h = memo.Hash(obj);
  if (h == -1) throw nb::python_error();
  return h;
}
// Process-wide interned dtypes: the few dtype objects a program's arrays
// use, kept alive until the process exits, so that signatures may pin them
// (PinnedRef) instead of counting references. Identity only (Python-free);
// bounded: past kMaxDtypes a dtype is simply not interned. Guarded by a leaf
// ft_mutex taken with the thread attached, under which no Python code runs
// (Py_NewRef only); a no-op on GIL builds, where the GIL serialises it.
constexpr size_t kMaxDtypes = 256;
LeafMutex g_dtypes_mu;
bool InternDtype(PyObject* dtype) {
  static auto* table = new std::vector<PyObject*>();  // strong refs, process lifetime; guarded by g_dtypes_mu
  std::lock_guard<LeafMutex> lock(g_dtypes_mu);
  for (PyObject* d : *table) {
    if (d == dtype) return true;
  }
  if (table->size() >= kMaxDtypes) return false;
  table->push_back(Py_NewRef(dtype));
  return true;
}


// Same type and (identical or __eq__). Type equality keeps 1, True and 1.0
// apart, as three different static values.
bool StrictEqual(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (Py_TYPE(a) != Py_TYPE(b)) return false;
  int r = PyObject_RichCompareBool(a, b, Py_EQ);
  if (r < 0) throw nb::python_error();
  return r == 1;
}

bool SameObjectOrEqual(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (!a || !b) return false;
  int r = PyObject_RichCompareBool(a, b, Py_EQ);
  if (r < 0) throw nb::python_error();
  return r == 1;
}

std::string Str(PyObject* o);

// Raises jax.jit's report of a static argument whose __eq__ raised, as jax
// raises it: jaxlib's C++ throws std::invalid_argument with this message,
// whose tail is nanobind's rendering of the original error (its stack, frame
// by frame, then "Type: message"); nanobind turns it into a plain ValueError
// with no __cause__ (and no __context__ beyond an exception being handled).
// The original exception is dropped with `err`.
[[noreturn]] void RaiseStaticComparisonError(nb::python_error& err, PyObject* a, PyObject* b) {
  std::string message =
      "static arguments should be comparable using __eq__.The following error was raised when "
      "comparing two objects of types " +
      Str(reinterpret_cast<PyObject*>(Py_TYPE(a))) + " and " +
      Str(reinterpret_cast<PyObject*>(Py_TYPE(b))) + ". The error was:\n" + err.what();
  PyErr_SetString(PyExc_ValueError, message.c_str());
  throw nb::python_error();
}

// build() (a message part that may run repr()/str()) with the pending error
// set aside, so that no Python code runs with an exception set; the error is
// restored afterwards.
template <class Build>
std::string WithErrorAside(Build&& build) {
  PyObject *type, *exc, *tb;
  PyErr_Fetch(&type, &exc, &tb);
  std::string out = build();
  PyErr_Restore(type, exc, tb);
  return out;
}

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

// How a committed leaf's placement prints: the Python placement_label hook
// (e.g. "cpu:1" for a single-device sharding), else str(sharding).
std::string PlacementLabel(PyObject* sharding) {
  if (PyObject* fn = Types().placement_label) {
    PyObject* r = PyObject_CallOneArg(fn, sharding);
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

// Where in the arguments the builder is, for error messages.
struct PathElem {
  PyObject* key;  // borrowed, alive while building; null means `index`
  Py_ssize_t index;
};

}  // namespace

ContextHook ContextHook::Unpack(const nb::object& hook_obj) {
  ContextHook h;
  PyObject* hook = hook_obj.ptr();
  if (!hook) return h;
  if (!PyTuple_Check(hook)) {
    h.context = hook;
    return h;
  }
  auto bad = [] {
    PyErr_SetString(PyExc_TypeError,
                    "ftjit: a tuple context hook must be (context, probe, probe_arg, probe_ok, "
                    "requires, committed_types, committed_attr, sharding_attr[, extras[, "
                    "spec_types]]), extras a tuple of at most 8 (getter, arg) pairs, spec_types "
                    "a tuple of types");
    throw nb::python_error();
  };
  Py_ssize_t size = PyTuple_GET_SIZE(hook);
  if (size < 8 || size > 10) bad();
  auto item = [&](Py_ssize_t i) -> PyObject* {
    PyObject* o = PyTuple_GET_ITEM(hook, i);
    return o == Py_None ? nullptr : o;
  };
  h.context = item(0);
  h.probe = item(1);
  h.probe_arg = PyTuple_GET_ITEM(hook, 2);
  h.probe_ok = PyTuple_GET_ITEM(hook, 3);
  h.requires = item(4);
  h.committed_types = item(5);
  h.committed_attr = item(6);
  h.sharding_attr = item(7);
  if (size == 10) {
    h.spec_types = item(9);
    if (h.spec_types) {
      if (!PyTuple_Check(h.spec_types)) bad();
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(h.spec_types); ++i) {
        if (!PyType_Check(PyTuple_GET_ITEM(h.spec_types, i))) bad();
      }
    }
  }
  if (PyObject* extras = size >= 9 ? item(8) : nullptr) {
    if (!PyTuple_Check(extras) || static_cast<size_t>(PyTuple_GET_SIZE(extras)) > kMaxExtras) bad();
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(extras); ++i) {
      PyObject* pair = PyTuple_GET_ITEM(extras, i);
      if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
          !PyCallable_Check(PyTuple_GET_ITEM(pair, 0))) {
        bad();
      }
      h.extra_getters[h.num_extras] = PyTuple_GET_ITEM(pair, 0);
      h.extra_args[h.num_extras] = PyTuple_GET_ITEM(pair, 1);
      ++h.num_extras;
    }
    if (h.num_extras > 0 && !h.context) bad();
  }
  if ((h.requires && !PyTuple_Check(h.requires)) ||
      (h.committed_types && (!PyTuple_Check(h.committed_types) || !h.committed_attr ||
                             !h.sharding_attr || !PyUnicode_Check(h.committed_attr) ||
                             !PyUnicode_Check(h.sharding_attr)))) {
    bad();
  }
  return h;
}

void ContextHook::CheckProbe() const {
  if (!probe) return;
  PyObject* r = PyObject_CallOneArg(probe, probe_arg);
  if (!r) throw nb::python_error();
  bool ok = r == probe_ok;
  Py_DECREF(r);
  if (!ok) throw NeedsFallback{};
}

void ContextHook::CheckRequires(PyObject* ctx) const {
  if (!requires) return;
  for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(requires); i < n; ++i) {
    PyObject* pair = PyTuple_GET_ITEM(requires, i);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyTuple_Check(ctx)) {
      PyErr_SetString(PyExc_TypeError,
                      "ftjit: context hook 'requires' needs (index, value) pairs and a tuple context");
      throw nb::python_error();
    }
    Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
    if (index == -1 && PyErr_Occurred()) throw nb::python_error();
    if (index < 0 || index >= PyTuple_GET_SIZE(ctx) ||
        PyTuple_GET_ITEM(ctx, index) != PyTuple_GET_ITEM(pair, 1)) {
      throw NeedsFallback{};
    }
  }
}

bool ContextHook::IsCommittedType(PyTypeObject* type) const {
  if (!committed_types) return false;
  // Exact matches first (the common case: jax's one array type), without
  // walking any MRO.
  for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(committed_types); i < n; ++i) {
    if (PyTuple_GET_ITEM(committed_types, i) == reinterpret_cast<PyObject*>(type)) return true;
  }
  for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(committed_types); i < n; ++i) {
    PyObject* t = PyTuple_GET_ITEM(committed_types, i);
    if (PyType_Check(t) && PyType_IsSubtype(type, reinterpret_cast<PyTypeObject*>(t))) return true;
  }
  return false;
}

bool ContextHook::IsSpecType(PyTypeObject* type) const {
  if (!spec_types) return false;
  for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(spec_types); i < n; ++i) {
    if (PyTuple_GET_ITEM(spec_types, i) == reinterpret_cast<PyObject*>(type)) return true;
  }
  return false;
}

DirectGetter DirectGetter::Resolve(PyTypeObject* type, PyObject* name) {
  DirectGetter g;
  g.type = type;
  g.name = name;
  // Reading the attribute through the type both finds the descriptor along
  // the MRO (property.__get__(None, type) is the property itself) and makes
  // CPython assign the type a version tag, which is read afterwards.
  nb::object descr = nb::steal(PyObject_GetAttr(reinterpret_cast<PyObject*>(type), name));
  if (!descr.is_valid()) {
    PyErr_Clear();
    return g;
  }
  if (Py_TYPE(descr.ptr()) != &PyProperty_Type || type->tp_getattro != PyObject_GenericGetAttr) {
    return g;
  }
  nb::object fget = nb::steal(PyObject_GetAttrString(descr.ptr(), "fget"));
  if (!fget.is_valid()) {
    PyErr_Clear();
    return g;
  }
  if (fget.is_none() || !PyCallable_Check(fget.ptr())) return g;
  g.version = __atomic_load_n(&type->tp_version_tag, __ATOMIC_RELAXED);
  if (g.version != 0) g.fget = std::move(fget);
  return g;
}

PyObject* DirectGetter::Get(PyObject* obj) const {
  if (version != 0 && __atomic_load_n(&type->tp_version_tag, __ATOMIC_RELAXED) == version) {
    return PyObject_CallOneArg(fget.ptr(), obj);
  }
  return PyObject_GetAttr(obj, name);
}

void SignatureSpec::AddAvalType(PyTypeObject* type) {
  AvalType t;
  t.type = type;
  t.aval = DirectGetter::Resolve(type, N().aval);
  if (hook.IsCommittedType(type)) t.committed = DirectGetter::Resolve(type, hook.committed_attr);
  aval_types.push_back(std::move(t));
}

void SignatureSpec::SetContextFn(nb::object fn) {
  ContextHook unpacked = ContextHook::Unpack(fn);  // validates; may throw
  context_fn = std::move(fn);
  hook = unpacked;  // borrows from context_fn, which the spec now owns
}

namespace {

class Builder {
 public:
  Builder(const SignatureSpec& spec, const ContextHook& hook, CallSignature& out, ThreadMemos& memos,
          bool allow_specs)
      : spec_(spec), hook_(hook), out_(out), memos_(memos), allow_specs_(allow_specs) {}

  // `top` names the argument (position or keyword) for messages.
  void Flatten(PyObject* obj) {
    if (Py_EnterRecursiveCall(" while flattening the arguments of a jitted function")) {
      throw nb::python_error();
    }
    // Not a destructor: a thread ended by CPython at interpreter shutdown
    // (pthread_exit when it takes the GIL back inside Python code run from
    // here) unwinds through this frame with no thread state, where
    // Py_LeaveRecursiveCall would crash (3.12+). Such an unwind is rethrown
    // untouched.
    try {
      FlattenNode(obj);
#ifdef __GLIBCXX__
    } catch (abi::__forced_unwind&) {
      throw;
#endif
    } catch (...) {
      Py_LeaveRecursiveCall();
      throw;
    }
    Py_LeaveRecursiveCall();
  }

  void FlattenNode(PyObject* obj) {
    if (obj == Py_None) {
      out_.tree.push_back(Token(NodeKind::kNone, 0));
      h_ = Mix(h_, 0x11);
      return;
    }
    PyTypeObject* type = Py_TYPE(obj);
    if (type == &PyFloat_Type) return Scalar(LeafKind::kFloat);
    if (type == &PyLong_Type) return Scalar(LeafKind::kInt);
    if (type == &PyBool_Type) return Scalar(LeafKind::kBool);
    if (type == &PyComplex_Type) return Scalar(LeafKind::kComplex);
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
    if (PyLong_Check(obj)) return Scalar(LeafKind::kInt);  // bool cannot be subclassed
    if (PyFloat_Check(obj)) return Scalar(LeafKind::kFloat);
    if (PyComplex_Check(obj)) return Scalar(LeafKind::kComplex);
    Unsupported(obj);
  }

  size_t hash() const { return h_; }
  void MixIn(size_t v) { h_ = Mix(h_, v); }

  void SetTop(PyObject* name, Py_ssize_t position) {
    top_name_ = name;
    top_position_ = position;
    path_.clear();
  }

 private:
  void Scalar(LeafKind kind) {
    out_.tree.push_back(Token(NodeKind::kLeaf, 0));
    out_.leaves.push_back(LeafSignature{kind, /*weak_type=*/true, 0, PinnedRef(), nb::object()});
    h_ = Mix(h_, 0x100 + static_cast<size_t>(kind));
  }

  void Sequence(PyObject* obj, NodeKind kind) {
    bool is_list = kind == NodeKind::kList;
    Py_ssize_t n = is_list ? PyList_GET_SIZE(obj) : PyTuple_GET_SIZE(obj);
    out_.tree.push_back(Token(kind, n));
    h_ = Mix(h_, Token(kind, n));
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

  void Dict(PyObject* obj) {
    // PyDict_Keys takes a consistent snapshot (it locks the dict on
    // free-threaded builds); sorting may call the keys' __lt__.
    nb::object keys = nb::steal(PyDict_Keys(obj));
    if (!keys.is_valid()) throw nb::python_error();
    if (PyList_Sort(keys.ptr()) < 0) {
      std::string where = WithErrorAside([this] { return Where(); });  // repr() of keys
      // jax.jit says ValueError ("Comparator raised exception while sorting
      // pytree dictionary keys."); other compilers get a TypeError.
      ThrowWithCause(spec_.jax_style_errors ? PyExc_ValueError : PyExc_TypeError,
                     std::string(spec_.jax_style_errors
                                     ? "Comparator raised exception while sorting pytree "
                                       "dictionary keys: "
                                     : "") +
                         "the keys of a dict argument " + where +
                         " cannot be sorted; dict keys of a jitted function's "
                         "arguments must be mutually comparable (e.g. all str)");
    }
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
    for (Py_ssize_t i = 0; i < n; ++i) {
      path_.push_back(PathElem{out_.aux[first_key + i].ptr(), 0});
      Flatten(values[i].ptr());
      path_.pop_back();
    }
  }

  bool IsKnownArrayType(PyTypeObject* type) const {
    for (PyTypeObject* t : spec_.plain_types) {
      if (t == type) return true;
    }
    for (const AvalType& t : spec_.aval_types) {
      if (t.type == type) return true;
    }
    const PythonTypes& t = Types();
    return (t.ndarray && type == reinterpret_cast<PyTypeObject*>(t.ndarray)) ||
           (t.generic && PyType_IsSubtype(type, reinterpret_cast<PyTypeObject*>(t.generic)));
  }

  // dtype, shape and weak type of an array-like `obj`, with their hash.
  struct ArrayShape {
    PinnedRef dtype;
    SmallVector<int64_t, 8> dims;
    bool weak = false;
    size_t hash = 0;
  };

  // Reads `obj`'s .dtype, .shape (a tuple of ints) and .weak_type into `s`.
  // False if `obj` is not array-like; nothing is recorded in `out_` either way.
  static bool ReadArrayShape(PyObject* obj, ArrayShape& s, ThreadMemos& memos) {
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
    const PythonTypes& t = Types();
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

  // The last few abstract values (jax avals) this thread read, with what
  // ReadArrayShape found in them (thread_memos.h). An aval is immutable and
  // shared by every output array of one compiled computation, so chained
  // calls (outputs fed back as inputs) skip re-reading dtype/shape/weak_type.
  static bool FindAval(const AvalMemo& memo, PyObject* aval, ArrayShape& s) {
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
  static void StoreAval(AvalMemo& memo, PyObject* aval, const ArrayShape& s) {
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

  // An array leaf: dtype, shape, weak type (and placement, for committed
  // arrays of the hook's committed_types). False, leaving `out_` untouched,
  // if `obj` is not array-like (no .dtype, or a shape that is not a tuple of
  // ints).
  bool TryArray(PyObject* obj) {
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
      // value (jax Arrays), read that value's plain attributes instead.
      nb::object aval = nb::steal(via_aval->aval.Get(obj));
      if (!aval.is_valid()) throw nb::python_error();
      if (!FindAval(memos_.avals, aval.ptr(), s)) {
        if (!ReadArrayShape(aval.ptr(), s, memos_)) return false;
        StoreAval(memos_.avals, aval.ptr(), s);
      }
    } else if (!ReadArrayShape(obj, s, memos_)) {
      return false;
    }
    size_t h = s.hash;
    // A committed array runs where it lives, so its placement is part of the
    // signature (what jax.jit keys on); an uncommitted one may be moved and
    // shares the signature of a numpy array.
    // For an aval type, whether it is a committed type was settled (and its
    // getter resolved) when the function was jitted (AddAvalType).
    nb::object sharding;
    if (via_aval ? via_aval->committed.name != nullptr : hook_.IsCommittedType(Py_TYPE(obj))) {
      nb::object committed = nb::steal(via_aval ? via_aval->committed.Get(obj)
                                                : PyObject_GetAttr(obj, hook_.committed_attr));
      if (!committed.is_valid()) throw nb::python_error();
      int truth = PyObject_IsTrue(committed.ptr());
      if (truth < 0) throw nb::python_error();
      if (truth == 1) {
        sharding = nb::steal(PyObject_GetAttr(obj, hook_.sharding_attr));
        if (!sharding.is_valid()) throw nb::python_error();
        h = Mix(h, static_cast<size_t>(MemoHash(memos_.sharding_hashes, sharding.ptr())));
      }
    } else if (!via_aval && hook_.IsSpecType(Py_TYPE(obj))) {
      // A spec describes an argument (precompile, warmup); it cannot be one.
      if (!allow_specs_) NotAnArgument(obj, s);
      // A spec with a sharding stands for arrays committed to it.
      nb::object placed = nb::steal(PyObject_GetAttr(obj, N().sharding));
      if (!placed.is_valid()) throw nb::python_error();
      if (!placed.is_none()) {
        sharding = std::move(placed);
        h = Mix(h, static_cast<size_t>(MemoHash(memos_.sharding_hashes, sharding.ptr())));
      }
    }
    for (int64_t d : s.dims) out_.dims.push_back(d);
    out_.tree.push_back(Token(NodeKind::kLeaf, 0));
    out_.leaves.push_back(LeafSignature{LeafKind::kArray, s.weak, static_cast<uint32_t>(s.dims.size()),
                                        std::move(s.dtype), std::move(sharding)});
    h_ = Mix(h_, h);
    return true;
  }

  // Whether namedtuple `type` is a custom node of the registry (see
  // SignatureSpec::custom_namedtuple), asked every time (registrations made
  // at any time are seen): when the hook is a dict's __contains__ (JAX's
  // registry), a C lookup in that dict; otherwise a call of the hook.
  bool IsCustomNamedTuple(PyTypeObject* type) {
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
  bool TryRegistry(PyObject* obj) {
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
    for (Py_ssize_t i = 0; i < n; ++i) {
      path_.push_back(PathElem{nullptr, i});
      Flatten(items[i]);
      path_.pop_back();
    }
    return true;
  }

  bool TryCustom(PyObject* obj) {
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
    for (Py_ssize_t i = 0; i < n; ++i) {
      path_.push_back(PathElem{nullptr, i});
      Flatten(PyTuple_GET_ITEM(children.ptr(), i));
      path_.pop_back();
    }
    return true;
  }

  // jax.jit's TypeError for an argument spec (jax.ShapeDtypeStruct) passed
  // in a call, in its words: "Argument 'x['a']' of shape float32[2] of type
  // <class 'jax.ShapeDtypeStruct'> is not a valid JAX type."
  [[noreturn]] void NotAnArgument(PyObject* obj, const ArrayShape& s) {
    std::string shape = Str(s.dtype.ptr()) + "[";
    for (size_t i = 0; i < s.dims.size(); ++i) shape += (i ? "," : "") + std::to_string(s.dims[i]);
    std::string msg = "Argument " + PathText() + " of shape " + shape + "] of type " +
                      Repr(reinterpret_cast<PyObject*>(Py_TYPE(obj))) +
                      " is not a valid JAX type. (A jax.ShapeDtypeStruct describes an argument: "
                      "pass it to precompile() or warmup(), and call with an array.)";
    PyErr_SetString(PyExc_TypeError, msg.c_str());
    throw nb::python_error();
  }

  // The argument's path, quoted: 'x', 'x['a'][0]', 'args[2]'.
  std::string PathText() const {
    std::string s = "'";
    if (top_name_) {
      s += Str(top_name_);
    } else {
      s += "args[" + std::to_string(top_position_) + "]";
    }
    for (const PathElem& p : path_) {
      s += "[" + (p.key ? Repr(p.key) : std::to_string(p.index)) + "]";
    }
    return s + "'";
  }

  std::string Where() const {
    std::string s = "'";
    if (top_name_) {
      s += Str(top_name_);
    } else {
      s += "args[" + std::to_string(top_position_) + "]";
    }
    for (const PathElem& p : path_) {
      s += "[" + (p.key ? Repr(p.key) : std::to_string(p.index)) + "]";
    }
    s += "'";
    if (top_position_ >= 0) s += " (positional argument " + std::to_string(top_position_) + ")";
    return s;
  }

  [[noreturn]] void Unsupported(PyObject* obj) {
    if (spec_.defer_leaf.is_valid()) {
      // A leaf only the compiler's own path handles (JAX: a hijax value, a token)?
      nb::object r = nb::steal(PyObject_CallOneArg(spec_.defer_leaf.ptr(), obj));
      if (!r.is_valid()) throw nb::python_error();
      int truth = PyObject_IsTrue(r.ptr());
      if (truth < 0) throw nb::python_error();
      if (truth) throw NeedsFallback{};
    }
    if (spec_.jax_style_errors) {
      // jax.jit no longer converts objects through __jax_array__ and says so
      // with a ValueError; so does ftjit, naming the argument.
      PyObject* convert = nullptr;
      int has = GetOptionalAttr(reinterpret_cast<PyObject*>(Py_TYPE(obj)), N().jax_array, &convert);
      Py_XDECREF(convert);
      if (has < 0) throw nb::python_error();
      if (has) {
        std::string msg = "argument " + Where() + " of " + spec_.fun_name + "() is of type " +
                          Py_TYPE(obj)->tp_name + ", which defines __jax_array__: JAX no longer "
                          "converts such objects implicitly. Convert it with "
                          "jax.numpy.asarray() before the call, or register its type as a pytree.";
        PyErr_SetString(PyExc_ValueError, msg.c_str());
        throw nb::python_error();
      }
    }
    std::string msg = "argument " + Where() + " of " + spec_.fun_name + "() is of type " +
                      Py_TYPE(obj)->tp_name + ", which is not a valid argument type for a "
                      "jitted function: dynamic arguments must be arrays (objects with "
                      ".dtype and .shape), numpy scalars, Python bool/int/float/complex, "
                      "None, or tuples, lists and dicts of them. To pass this value as is, "
                      "mark the argument static with static_argnums or static_argnames.";
    if (spec_.jax_style_errors) {
      // jax.jit's own words first (code and tests match on them), then ours.
      std::string path = PathText();
      path = path.substr(1, path.size() - 2);  // unquoted, as jax prints it
      msg = "Error interpreting argument to " + spec_.fun_name + "() as an abstract array. The "
            "problematic value is of type " + Py_TYPE(obj)->tp_name + " and was passed to the "
            "function at path " + path + ". (ftjit: " + msg + ")";
    }
    PyErr_SetString(Types().unsupported_argument, msg.c_str());
    throw nb::python_error();
  }

  const SignatureSpec& spec_;
  const ContextHook& hook_;
  CallSignature& out_;
  ThreadMemos& memos_;
  const bool allow_specs_;  // argument specs stand for arrays (precompile), or are refused (a call)
  size_t h_ = 0;
  PyObject* top_name_ = nullptr;  // borrowed
  Py_ssize_t top_position_ = -1;
  SmallVector<PathElem, 8> path_;
};

PyObject* ArgName(const SignatureSpec& spec, size_t i) {
  if (spec.arg_names.is_valid() && PyTuple_Check(spec.arg_names.ptr()) &&
      static_cast<Py_ssize_t>(i) < PyTuple_GET_SIZE(spec.arg_names.ptr())) {
    return PyTuple_GET_ITEM(spec.arg_names.ptr(), i);
  }
  return nullptr;
}

[[noreturn]] void UnhashableStatic(const SignatureSpec& spec, PyObject* value,
                                   const std::string& which) {
  std::string msg = "static argument " + which + " of " + spec.fun_name +
                    "() is not hashable (type " + Py_TYPE(value)->tp_name +
                    "). Non-hashable static arguments are not supported: static "
                    "arguments are cache keys, so they need __hash__ and __eq__. "
                    "Pass a hashable value (e.g. a tuple instead of a list), or make "
                    "the argument dynamic by removing it from static_argnums/"
                    "static_argnames.";
  ThrowWithCause(Types().unhashable_static, msg);
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

// Hash of the call's context, and its canonical object (interned_context.h).
// A context hook typically builds a fresh tuple of the same config objects
// on every call, and hashing and canonicalising it is the expensive part:
// when the items (and extras) are the very objects of this thread's last
// context, that context's canonical object and hash are reused.
//
// With extras (values of the hook's extra getters), the key is one tuple of
// the context's items (or the context itself, if not a tuple) followed by
// the extras.
//
// On return `ctx` borrows its canonical object from this thread's memo (or
// owns it, past the table's bound), and no Python code may run until the
// signature is probed or adopted (CallSignature::AdoptContext). So every
// Python-owned temporary here (the fresh context, the extras, the key) is
// dropped before `ctx` borrows: dropping them may run a finaliser, which may
// call jitted functions, which may move this thread's memo on.
Py_hash_t ContextHash(ContextRef& ctx, SmallVector<nb::object, 4>& extras, ContextMemo& memo) {
  // Contexts the memo moved on from: no probe of this thread borrows them
  // now (see above), so they may go (which may run Python).
  if (!memo.retired.empty()) {
    std::vector<ContextRef> old = std::move(memo.retired);
    memo.retired.clear();
  }
  PyObject* c = ctx.ptr();
  size_t num_extras = extras.size();
  bool is_tuple = PyTuple_CheckExact(c);
  PyObject* const* head = is_tuple ? reinterpret_cast<PyTupleObject*>(c)->ob_item : &c;
  size_t num_head = is_tuple ? static_cast<size_t>(PyTuple_GET_SIZE(c)) : 1;
  PyObject* last = memo.last.ptr();
  if (last && (is_tuple || num_extras > 0) && PyTuple_CheckExact(last) &&
      static_cast<size_t>(PyTuple_GET_SIZE(last)) == num_head + num_extras) {
    // Item by item, identity only.
    PyObject* const* items = reinterpret_cast<PyTupleObject*>(last)->ob_item;
    bool same = std::memcmp(head, items, sizeof(PyObject*) * num_head) == 0;
    for (size_t i = 0; same && i < num_extras; ++i) same = extras[i].ptr() == items[num_head + i];
    if (same) {
      // The fresh context and the extras hold the very objects the memo's
      // key holds: dropping them destroys nothing, runs no Python.
      extras.clear();
      ctx = memo.last.interned() ? ContextRef::Borrowed(memo.last.interned()) : memo.last.CountedCopy();
      return memo.hash;
    }
  }
  nb::object key = nb::borrow(c);
  if (num_extras > 0) {
    key = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(num_head + num_extras)));
    if (!key.is_valid()) throw nb::python_error();
    for (size_t i = 0; i < num_head; ++i) PyTuple_SET_ITEM(key.ptr(), i, Py_NewRef(head[i]));
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
  // Python-owned temporaries go first (see above); `canonical` is counted
  // meanwhile, so nothing run here can free it.
  ctx.Reset();
  key = nb::object();
  extras.clear();
  memo.retired.push_back(std::move(memo.last));
  memo.last = std::move(canonical);
  memo.hash = h;
  ctx = memo.last.interned() ? ContextRef::Borrowed(memo.last.interned()) : memo.last.CountedCopy();
  return h;
}

int CompareNames(PyObject* a, PyObject* b) {
  if (a == b) return 0;
  return PyUnicode_Compare(a, b);  // exact content comparison; no user code
}

}  // namespace

PythonTypes& Types() {
  static PythonTypes types;
  return types;
}

void InitSignatures() {
  if (!g_names) g_names = new Names();  // kept for the process's lifetime
}

void ReinitSignatureLocksInChild() {
  ReinitInChild(g_dtypes_mu);
  ReinitContextLockInChild();
}

void LockSignatureLocksForTest(bool lock) {
  if (lock) {
    g_dtypes_mu.lock();
    LockContextsForTest(true);
  } else {
    LockContextsForTest(false);
    g_dtypes_mu.unlock();
  }
}

void ClearErrorKeepingInterrupt() {
  bool interrupt = PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
  PyErr_Clear();
  if (!interrupt) return;
  // Rare (a Ctrl-C while a message is built): plain Python calls are fine.
  bool rearm = false;
  nb::object threading = nb::steal(PyImport_ImportModule("threading"));
  nb::object signal = nb::steal(PyImport_ImportModule("signal"));
  if (threading.is_valid() && signal.is_valid()) {
    nb::object current = nb::steal(PyObject_CallMethod(threading.ptr(), "current_thread", nullptr));
    nb::object main = nb::steal(PyObject_CallMethod(threading.ptr(), "main_thread", nullptr));
    nb::object sigint = nb::steal(PyObject_GetAttrString(signal.ptr(), "SIGINT"));
    nb::object handler = sigint.is_valid() ? nb::steal(PyObject_CallMethod(
                                                 signal.ptr(), "getsignal", "O", sigint.ptr()))
                                           : nb::object();
    nb::object default_handler = nb::steal(PyObject_GetAttrString(signal.ptr(), "default_int_handler"));
    rearm = current.is_valid() && main.is_valid() && current.ptr() == main.ptr() && handler.is_valid() &&
            default_handler.is_valid() && handler.ptr() == default_handler.ptr();
  }
  // These are Python calls, which check for signals: a second Ctrl-C landing
  // in them is re-armed whatever they were about to say.
  if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) rearm = true;
  PyErr_Clear();
  if (rearm) PyErr_SetInterrupt();
}

void ThrowWithCause(PyObject* type, const std::string& message) {
  PyObject *et = nullptr, *ev = nullptr, *tb = nullptr;
  PyErr_Fetch(&et, &ev, &tb);
  if (et) {
    PyErr_NormalizeException(&et, &ev, &tb);
    if (tb && ev) PyException_SetTraceback(ev, tb);
  }
  PyObject* exc = PyObject_CallFunction(type, "s", message.c_str());
  if (exc) {
    if (ev) PyException_SetCause(exc, Py_NewRef(ev));  // steals the new ref
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
  }
  Py_XDECREF(et);
  Py_XDECREF(ev);
  Py_XDECREF(tb);
  throw nb::python_error();
}

bool SignatureSpec::IsStaticName(PyObject* name) const {
  for (const nb::object& s : static_argnames) {
    if (s.ptr() == name) return true;
  }
  for (const nb::object& s : static_argnames) {
    if (PyUnicode_Compare(s.ptr(), name) == 0) return true;
  }
  return false;
}

void BuildSignature(const SignatureSpec& spec, PyObject* const* args, size_t nargs,
                    PyObject* kwnames, CallSignature& out, bool allow_specs) {
  // The context first: a call that must defer (a JAX trace is active, jit is
  // disabled) defers before its arguments are looked at, whatever they are.
  const ContextHook& hook = spec.hook;  // unpacked once, by SetContextFn
  hook.CheckProbe();
  if (hook.context) {
    out.context = ContextRef::Owned(PyObject_CallNoArgs(hook.context));
    if (!out.context.is_valid()) throw nb::python_error();
    hook.CheckRequires(out.context.ptr());
  }
  // Extra context parts (new references, alive until the key is built).
  SmallVector<nb::object, 4> extras;
  for (size_t i = 0; i < hook.num_extras; ++i) {
    extras.push_back(nb::steal(PyObject_CallOneArg(hook.extra_getters[i], hook.extra_args[i])));
    if (!extras.back().is_valid()) throw nb::python_error();
  }
  ThreadMemos& memos = Memos();
  Builder b(spec, hook, out, memos, allow_specs);
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
  // Last: nothing may run Python after the context borrows (see ContextHash).
  if (out.context.is_valid()) b.MixIn(static_cast<size_t>(ContextHash(out.context, extras, memos.context)));
  out.hash = b.hash();
  out.jax_style_errors = spec.jax_style_errors;
}

namespace {

using FastEq = CallSignature::FastEq;

// Python-free equality of two objects, as StrictEqual would decide it, for
// exact builtin value types whose comparison runs no user code.
FastEq FastObjectEquals(PyObject* a, PyObject* b, int depth = 0) noexcept {
  if (a == b) return FastEq::kEqual;
  PyTypeObject* t = Py_TYPE(a);
  if (t != Py_TYPE(b)) return FastEq::kNotEqual;  // StrictEqual: types differ
  if (t == &PyLong_Type) {
    // long_richcompare itself, not PyObject_RichCompareBool: that one
    // enters a recursive call, which fails (leaving an error set) at the
    // recursion limit. long_richcompare is C only and cannot fail for two
    // exact ints; should it ever, "unknown" sends the caller to Equals().
    PyObject* r = PyLong_Type.tp_richcompare(a, b, Py_EQ);
    if (!r) {
      PyErr_Clear();
      return FastEq::kUnknown;
    }
    bool equal = r == Py_True;
    Py_DECREF(r);  // a bool singleton: no destructor runs
    return equal ? FastEq::kEqual : FastEq::kNotEqual;
  }
  if (t == &PyUnicode_Type) {
    return PyUnicode_Compare(a, b) == 0 ? FastEq::kEqual : FastEq::kNotEqual;
  }
  if (t == &PyFloat_Type) {
    return PyFloat_AS_DOUBLE(a) == PyFloat_AS_DOUBLE(b) ? FastEq::kEqual : FastEq::kNotEqual;
  }
  if (t == &PyBytes_Type) {
    return PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b) &&
                   std::memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b),
                               static_cast<size_t>(PyBytes_GET_SIZE(a))) == 0
               ? FastEq::kEqual
               : FastEq::kNotEqual;
  }
  if (t == &PyBool_Type || a == Py_None) return FastEq::kNotEqual;  // singletons
  if (t == &PyTuple_Type && depth < 4) {
    Py_ssize_t n = PyTuple_GET_SIZE(a);
    if (n != PyTuple_GET_SIZE(b)) return FastEq::kNotEqual;
    FastEq result = FastEq::kEqual;
    for (Py_ssize_t i = 0; i < n; ++i) {
      // Items are compared with == (not by type) inside a tuple: 1 == 1.0
      // there, so only items of one exact type are decided here.
      PyObject* x = PyTuple_GET_ITEM(a, i);
      PyObject* y = PyTuple_GET_ITEM(b, i);
      if (x != y && Py_TYPE(x) != Py_TYPE(y)) return FastEq::kUnknown;
      FastEq item = FastObjectEquals(x, y, depth + 1);
      if (item == FastEq::kNotEqual) return FastEq::kNotEqual;
      if (item == FastEq::kUnknown) result = FastEq::kUnknown;
    }
    return result;
  }
  return FastEq::kUnknown;
}

// Identity decides; a distinct object needs __eq__.
FastEq FastIdentity(PyObject* a, PyObject* b) noexcept {
  return a == b ? FastEq::kEqual : FastEq::kUnknown;
}

}  // namespace

const char* DebugFastEqualsAtRecursionLimit(PyObject* a, PyObject* b, bool* error_set) {
  // Use up the recursion budget, as a call at the limit finds it.
  int depth = 0;
  while (depth < 1000000 && !Py_EnterRecursiveCall(" (test)")) ++depth;
  PyErr_Clear();
  FastEq r = FastObjectEquals(a, b);
  *error_set = PyErr_Occurred() != nullptr;
  PyErr_Clear();
  while (depth-- > 0) Py_LeaveRecursiveCall();
  return r == FastEq::kEqual ? "equal" : r == FastEq::kNotEqual ? "not equal" : "unknown";
}

CallSignature::FastEq CallSignature::FastEquals(const CallSignature& o) const noexcept {
  if (hash != o.hash || num_positional != o.num_positional || !(tree == o.tree) ||
      !(dims == o.dims) || leaves.size() != o.leaves.size() ||
      statics.size() != o.statics.size() || kwnames.size() != o.kwnames.size() ||
      aux.size() != o.aux.size() || context.is_valid() != o.context.is_valid()) {
    return FastEq::kNotEqual;
  }
  FastEq result = FastEq::kEqual;
  auto meet = [&result](FastEq part) {
    if (part == FastEq::kUnknown) result = FastEq::kUnknown;
    return part != FastEq::kNotEqual;
  };
  for (size_t i = 0; i < leaves.size(); ++i) {
    const LeafSignature& a = leaves[i];
    const LeafSignature& b = o.leaves[i];
    if (a.kind != b.kind || a.weak_type != b.weak_type || a.ndim != b.ndim ||
        a.sharding.is_valid() != b.sharding.is_valid()) {
      return FastEq::kNotEqual;
    }
    if (a.kind == LeafKind::kArray) {
      meet(FastIdentity(a.dtype.ptr(), b.dtype.ptr()));
      if (a.sharding.is_valid()) meet(FastIdentity(a.sharding.ptr(), b.sharding.ptr()));
    }
  }
  for (size_t i = 0; i < kwnames.size(); ++i) {
    if (CompareNames(kwnames[i].ptr(), o.kwnames[i].ptr()) != 0) return FastEq::kNotEqual;
  }
  for (size_t i = 0; i < aux.size(); ++i) {
    if (!meet(FastObjectEquals(aux[i].ptr(), o.aux[i].ptr()))) return FastEq::kNotEqual;
  }
  for (size_t i = 0; i < statics.size(); ++i) {
    if (!meet(FastObjectEquals(statics[i].ptr(), o.statics[i].ptr()))) return FastEq::kNotEqual;
  }
  if (context.is_valid()) meet(FastIdentity(context.ptr(), o.context.ptr()));
  return result;
}

bool CallSignature::Equals(const CallSignature& o) const {
  // Cheap, Python-free parts first.
  if (hash != o.hash || num_positional != o.num_positional || !(tree == o.tree) ||
      !(dims == o.dims) || leaves.size() != o.leaves.size() ||
      statics.size() != o.statics.size() || kwnames.size() != o.kwnames.size() ||
      aux.size() != o.aux.size() || context.is_valid() != o.context.is_valid()) {
    return false;
  }
  for (size_t i = 0; i < leaves.size(); ++i) {
    const LeafSignature& a = leaves[i];
    const LeafSignature& b = o.leaves[i];
    if (a.kind != b.kind || a.weak_type != b.weak_type || a.ndim != b.ndim ||
        a.sharding.is_valid() != b.sharding.is_valid()) {
      return false;
    }
  }
  for (size_t i = 0; i < kwnames.size(); ++i) {
    if (CompareNames(kwnames[i].ptr(), o.kwnames[i].ptr()) != 0) return false;
  }
  // Then the parts whose comparison may run Python code.
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (leaves[i].kind == LeafKind::kArray &&
        (!SameObjectOrEqual(leaves[i].dtype.ptr(), o.leaves[i].dtype.ptr()) ||
         (leaves[i].sharding.is_valid() &&
          !SameObjectOrEqual(leaves[i].sharding.ptr(), o.leaves[i].sharding.ptr())))) {
      return false;
    }
  }
  for (size_t i = 0; i < aux.size(); ++i) {
    if (!StrictEqual(aux[i].ptr(), o.aux[i].ptr())) return false;
  }
  for (size_t i = 0; i < statics.size(); ++i) {
    bool equal;
    try {
      equal = StrictEqual(statics[i].ptr(), o.statics[i].ptr());
    } catch (nb::python_error& err) {
      if (!jax_style_errors) throw;
      RaiseStaticComparisonError(err, statics[i].ptr(), o.statics[i].ptr());
    }
    if (!equal) return false;
  }
  if (context.is_valid() && !SameObjectOrEqual(context.ptr(), o.context.ptr())) return false;
  return true;
}

namespace {

class Printer {
 public:
  explicit Printer(const CallSignature& s) : s_(s) {}

  std::string Node() {
    uint32_t tok = s_.tree[t_++];
    size_t n = ArityOf(tok);
    switch (KindOf(tok)) {
      case NodeKind::kNone:
        return "None";
      case NodeKind::kStatic:
        return Repr(s_.statics[st_++].ptr());
      case NodeKind::kLeaf:
        return Leaf();
      case NodeKind::kTuple:
        return Children("(", n, n == 1 ? ",)" : ")");
      case NodeKind::kList:
        return Children("[", n, "]");
      case NodeKind::kNamedTuple: {
        PyObject* type = s_.aux[a_++].ptr();
        return Children(std::string(reinterpret_cast<PyTypeObject*>(type)->tp_name) + "(", n, ")");
      }
      case NodeKind::kRegistered: {
        // As jax prints a one-level treedef: PyTreeDef(CustomNode(T[data], [*, *]))
        PyObject* key = s_.aux[a_++].ptr();
        PyObject* type = PyTuple_GET_ITEM(key, 0);
        std::string head = "PyTreeDef(CustomNode(" +
                           std::string(reinterpret_cast<PyTypeObject*>(type)->tp_name) + "[" +
                           Str(PyTuple_GET_ITEM(key, 1)) + "], [";
        for (size_t i = 0; i < n; ++i) head += i ? ", *" : "*";
        return Children(head + "]))(", n, ")");
      }
      case NodeKind::kCustom: {
        std::string head = Repr(s_.aux[a_++].ptr());
        return Children(head + "(", n, ")");
      }
      case NodeKind::kDict: {
        size_t first = a_;
        a_ += n;
        std::string out = "{";
        for (size_t i = 0; i < n; ++i) {
          if (i) out += ", ";
          out += Repr(s_.aux[first + i].ptr()) + ": " + Node();
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
    const LeafSignature& l = s_.leaves[l_++];
    switch (l.kind) {
      case LeafKind::kBool: return "bool";
      case LeafKind::kInt: return "int";
      case LeafKind::kFloat: return "float";
      case LeafKind::kComplex: return "complex";
      case LeafKind::kArray: break;
    }
    std::string out = Str(l.dtype.ptr()) + "[";
    for (uint32_t i = 0; i < l.ndim; ++i) {
      if (i) out += ",";
      out += std::to_string(s_.dims[d_++]);
    }
    out += "]";
    if (l.weak_type) out += "{weak}";
    if (l.sharding.is_valid()) out += "@" + PlacementLabel(l.sharding.ptr());
    return out;
  }

  const CallSignature& s_;
  size_t t_ = 0, a_ = 0, l_ = 0, d_ = 0, st_ = 0;
};

}  // namespace

std::string CallSignature::ToString(const std::string& fun_name) const {
  Printer p(*this);
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
