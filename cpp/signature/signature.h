// ftjit: the signature of one call of a jitted function (pytree structure,
// leaf dtype/shape/weak type, static arguments, context) and its builder.
//
// A CallSignature is built on the caller's stack, hashed once, and becomes an
// immutable cache key (shared, read by many threads) once inserted. Building
// and comparing may run Python code (`__hash__`, `__eq__`, properties, the
// pytree hook), so they must never run under a C++ lock. The few helpers
// defined in this header run per call or per leaf: defined here, they
// inline into the builder (the build uses no LTO).
//
//   | object                  | protection                                   |
//   |-------------------------|----------------------------------------------|
//   | CallSignature           | the building thread's own until inserted;    |
//   |                         | immutable afterwards (read by many threads)  |
//   | SignatureSpec and its   | fixed after the jitted function's            |
//   |   ContextHook,          |   construction (until the GC's tp_clear      |
//   |   DirectGetters         |   empties an unreachable one), but for a     |
//   |                         |   StoredField's atomics (learned on first    |
//   |                         |   calls, any thread; see StoredField)        |
//   | Numpy()                 | set once at module init, fixed afterwards    |
//   | g_names, g_dtypes       | InitSignatures, InternDtype                  |
//
// Lock order: building takes two leaf locks, each briefly and never both at
// once: g_dtypes.mu (InternDtype) when a dtype is interned (an aval
// remembered, a numpy array's dtype first pinned by this thread), and
// g_contexts.mu (CanonicalContext, ReleaseContext) when a context is
// canonicalised or let go (also when a signature holding one is destroyed).
// Comparing and printing take none.
#pragma once

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "primitives/small_vector.h"
#include "signature/interned_context.h"

namespace ftjit {

namespace nb = nanobind;

// kLast: the last kind (a new one goes before it, and kLast names it; see
// docs/design.md, "Adding a hook, adding a leaf kind").
enum class LeafKind : uint8_t { kArray, kBool, kInt, kFloat, kComplex, kLast = kComplex };
// Each kind's name, indexed by LeafKind: the `kind` of an exported record
// (ftjit._signature.LEAF_KINDS is the core's _leaf_kinds()), and how a
// scalar leaf prints.
inline constexpr const char* kLeafKindNames[] = {"array", "bool", "int", "float", "complex"};

// The highest rank of an array a spec (warm-up, precompile, a specs file)
// may have: numpy's own limit (NPY_MAXDIMS). Programs stay far below it,
// and XLA takes minutes to compile ranks in the thousands.
inline constexpr size_t kMaxSpecRank = 64;
static_assert(sizeof(kLeafKindNames) / sizeof(kLeafKindNames[0]) == static_cast<size_t>(LeafKind::kLast) + 1,
              "one name per LeafKind, in its order");
inline const char* LeafKindName(LeafKind kind) { return kLeafKindNames[static_cast<size_t>(kind)]; }

// A reference that is either owned (a strong reference) or pinned: borrowed
// from an object that a process-wide intern table keeps alive until exit
// (InternDtype). Pinned references write no reference count, so threads
// building signatures of the same dtype do not bounce its count (an atomic
// on free-threaded builds) between cores. Move-only.
class PinnedRef {
 public:
  PinnedRef() = default;
  static PinnedRef Owned(nb::object o) {
    PinnedRef r;
    r.p_ = o.release().ptr();
    r.owned_ = true;
    return r;
  }
  static PinnedRef Pinned(PyObject* p) {  // `p` must be interned (see above)
    PinnedRef r;
    r.p_ = p;
    return r;
  }
  PinnedRef(PinnedRef&& o) noexcept : p_(o.p_), owned_(o.owned_) { o.p_ = nullptr; }
  PinnedRef& operator=(PinnedRef&& o) noexcept {
    if (this != &o) {
      PyObject* old = owned_ ? p_ : nullptr;
      p_ = o.p_;
      owned_ = o.owned_;
      o.p_ = nullptr;
      Py_XDECREF(old);  // after the swap: a finaliser sees a consistent object
    }
    return *this;
  }
  PinnedRef(const PinnedRef&) = delete;
  PinnedRef& operator=(const PinnedRef&) = delete;
  ~PinnedRef() {
    if (owned_) Py_XDECREF(p_);
  }
  PyObject* ptr() const { return p_; }
  bool is_valid() const { return p_ != nullptr; }
  bool is_pinned() const { return p_ != nullptr && !owned_; }

 private:
  PyObject* p_ = nullptr;
  bool owned_ = false;
};

struct LeafSignature {
  LeafKind kind;
  bool weak_type;
  uint32_t ndim;     // the dims live in CallSignature::dims, in leaf order
  PinnedRef dtype;      // null for Python scalars
  nb::object sharding;  // a committed array's placement (see ContextHook); else null
};

// Tree tokens, in preorder: low 8 bits the NodeKind, the rest the arity.
enum class NodeKind : uint8_t {
  kLeaf,        // one entry in `leaves`
  kNone,
  kTuple,
  kList,
  kDict,        // `arity` keys in `aux`, sorted; then the values
  kNamedTuple,  // the type in `aux`; then the fields
  kCustom,      // the hook's node key in `aux`; then the children
  kRegistered,  // (type, node data) in `aux`, from a registry's flatten_one_level; then the children
  kStatic,      // a static argument: one entry in `statics`
};

struct SignatureSpec;

struct CallSignature {
  CallSignature() = default;
  CallSignature(const CallSignature&) = delete;
  CallSignature& operator=(const CallSignature&) = delete;
  CallSignature(CallSignature&&) = default;
  CallSignature& operator=(CallSignature&&) = default;
  // Empties it for a new build, in place (no temporary: a call's frame holds
  // one signature, and recursion through jitted functions stacks frames).
  void Clear() {
    this->~CallSignature();
    new (this) CallSignature();
  }

  uint32_t num_positional = 0;        // positional arguments of the call
  // Inline sizes fit a call of a dozen leaves in a container or two (an
  // optimizer state, a dict of parameters) without a heap allocation.
  SmallVector<uint32_t, 24> tree;     // see NodeKind
  SmallVector<nb::object, 8> aux;     // dict keys, namedtuple types, node keys
  SmallVector<LeafSignature, 12> leaves;
  SmallVector<int64_t, 16> dims;
  SmallVector<nb::object, 2> statics;  // positional statics, then keyword ones
  SmallVector<nb::object, 2> kwnames;  // all keyword names, sorted
  ContextRef context;                  // the compiler's context, canonical (see InternedContext)
  // The arguments' hash without placements; `hash` mixes the placements'
  // and the context's into it. `table_hash` is what the ready table keys
  // on: `hash`, or `args_hash` for a function whose executables check the
  // context and placements (SignatureSpec::context_in_executable).
  size_t args_hash = 0;
  size_t table_hash = 0;
  size_t hash = 0;
  // Built without context or placements (the hit path of such a function:
  // BuildSignature's `partial`): a probe of the ready table only.
  bool partial = false;
  bool jax_style_errors = false;       // from SignatureSpec, see there

  // Exact equality. Runs `__eq__` of statics, dict keys, node keys, dtypes
  // and the context (after the cheap C++ comparisons): may re-enter anything.
  bool Equals(const CallSignature& other) const;

  // Equality decided without running Python code, for a probe made under a
  // lock: by identity, or by C comparison of exact builtin values (int,
  // float, str, bytes, bool, None, tuples of them); kUnknown when only __eq__
  // can decide (the caller then falls back to Equals()). `this` is the
  // stored signature; a partial `probe` matches every stored signature of
  // its arguments, whatever their context and placements.
  enum class FastEq : uint8_t { kEqual, kNotEqual, kUnknown };
  FastEq FastEquals(const CallSignature& probe) const noexcept;

  // Whether every static and every node key (dict keys, namedtuple types,
  // node data) is an exact builtin value (int, float, str, bytes, bool,
  // None, tuples of them) or a class whose metaclass is `type`: values that
  // another cache can compare without running user code.
  bool KeysAreBuiltin() const noexcept;

  // Counts this signature as a user of its interned context (which it may
  // only borrow from its thread's memo until then): call before any Python
  // code can run with it, except on the hit path (see InternedContext).
  // False when that context lost its last user meanwhile: build the
  // signature again.
  [[nodiscard]] bool AdoptContext() { return context.Adopt(); }

  // Readable form, e.g. "f(float32[8,128], int, n=3)": spec.fun_name, and
  // committed placements printed by spec.placement_label. May run __repr__.
  std::string ToString(const SignatureSpec& spec) const;
};

// An exact builtin value (int, float, str, bytes, bool, None), a class
// whose metaclass is `type` (compared by identity), or a tuple of them (4
// levels at most): hashed and compared by any cache without user code.
bool IsBuiltinKey(PyObject* o, int depth = 0) noexcept;

// Whether two signatures of the same arguments (equal but for what a
// partial one leaves out) have equal contexts and placements: the same
// interned context at once, else with __eq__, as other objects (may run
// Python, throw). Two equal contexts can be interned apart (CanonicalContext
// interns concurrent equal ones, or one whose __eq__ raised, as they come).
bool SameContextAndPlacements(const CallSignature& a, const CallSignature& b);

// Thrown by BuildSignature when the call must take the compiler's fallback
// (caught by the call path; should one escape, the boundary raises its what()).
struct NeedsFallback : std::exception {
  const char* what() const noexcept override { return "ftjit: the call needs the compiler's fallback path"; }
};

// CompilerHooks.context, read once per jitted function (SignatureSpec::
// ReadHooks): a plain context() callable, or an ftjit.ContextHooks record
// (whose docstrings document each field), read by field name. Pointers are
// borrowed from SignatureSpec::context_objects, a tuple the spec owns (not
// from the record: a frozen dataclass can still be changed with
// object.__setattr__); fixed afterwards.
struct ContextHook {
  PyObject* context = nullptr;          // context() -> hashable, or null
  PyObject* probe = nullptr;            // probe(probe_arg) is probe_ok, or null
  PyObject* probe_arg = nullptr;
  PyObject* probe_ok = nullptr;
  // ContextHooks.requires: context()[require_index[i]] is require_value[i].
  static constexpr size_t kMaxRequires = 8;
  Py_ssize_t require_index[kMaxRequires] = {};
  PyObject* require_value[kMaxRequires] = {};
  size_t num_requires = 0;
  PyObject* committed_types = nullptr;  // tuple of types, or null (none)
  PyObject* committed_attr = nullptr;   // str, with committed_types
  PyObject* sharding_attr = nullptr;    // str, with committed_types
  // ContextHooks.extras: getter(arg) for each, keyed with context().
  static constexpr size_t kMaxExtras = 8;
  PyObject* extra_getters[kMaxExtras] = {};
  PyObject* extra_args[kMaxExtras] = {};
  size_t num_extras = 0;
  // ContextHooks.spec_types (a tuple), or null.
  PyObject* spec_types = nullptr;
  // ContextHooks.unkeyed: unkeyed[i] when context()[i] is left out of the
  // key (None there); empty when every item is keyed.
  std::vector<bool> unkeyed;
  bool Unkeyed(size_t i) const { return i < unkeyed.size() && unkeyed[i]; }

  // Reads `context` (None, a callable, or a ContextHooks) and puts every
  // object the hook borrows into `objects` (a new tuple). A wrong field is a
  // TypeError naming it. Runs Python.
  static ContextHook Read(nb::handle context, nb::object& objects);
  // Throws NeedsFallback when the probe says the call must not be cached
  // (JAX: a trace is active in this thread). Runs the probe.
  void CheckProbe() const {
    if (!probe) return;
    PyObject* r = PyObject_CallOneArg(probe, probe_arg);
    if (!r) throw nb::python_error();
    bool ok = r == probe_ok;
    Py_DECREF(r);
    if (!ok) throw NeedsFallback{};
  }
  // Throws NeedsFallback when an item of `ctx` named in `requires` is not the
  // required object (JAX: jax_disable_jit is on); TypeError when `ctx` is
  // no tuple.
  void CheckRequires(PyObject* ctx) const;
  // Whether a call now must defer (the probe or `requires` says so), for a
  // call whose arguments failed to build before its context was read. Runs
  // Python.
  bool Defers() const;
  // `type` is one of committed_types or a subclass.
  bool IsCommittedType(PyTypeObject* type) const {
    if (!committed_types) return false;
    // Exact matches first (jax's one array type), without walking any MRO.
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(committed_types); i < n; ++i) {
      if (PyTuple_GET_ITEM(committed_types, i) == reinterpret_cast<PyObject*>(type)) return true;
    }
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(committed_types); i < n; ++i) {
      PyObject* t = PyTuple_GET_ITEM(committed_types, i);
      if (PyType_Check(t) && PyType_IsSubtype(type, reinterpret_cast<PyTypeObject*>(t))) return true;
    }
    return false;
  }
  // `type` is exactly one of spec_types.
  bool IsSpecType(PyTypeObject* type) const {
    if (!spec_types) return false;
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(spec_types); i < n; ++i) {
      if (PyTuple_GET_ITEM(spec_types, i) == reinterpret_cast<PyObject*>(type)) return true;
    }
    return false;
  }
};

// A property of an array type read by calling its getter directly,
// fget(obj), instead of the generic attribute lookup (type MRO walk, then
// property.__get__): the same result, as a property is a data descriptor and
// the type's tp_getattro is the generic one. Valid while the type is
// unmodified: `version` is the type's version tag when the getter was
// resolved, and CPython gives a type a new tag (never reused) whenever it
// or a base changes. On any mismatch Get() takes the generic lookup.
//
// Where the compiler says the getter only returns an object the instance
// stores (CompilerHooks.aval_fields: jaxlib's ArrayImpl.aval, a C++ getter
// over a field), StoredField finds that field, and the core reads it: no
// call (GIL builds), or a comparison with the thread's aval memo first
// (free-threaded builds, see Read). Eight sightings check the field; they
// cannot prove that a getter always returns it (a memoising or conditional
// one may not), which is why the compiler must say so.
struct StoredField {
  // Sightings before the word is trusted: each one a getter call whose
  // result sat in exactly this word of the instance, and in no other.
  static constexpr int32_t kSightings = 8;

  StoredField() = default;
  // Copied while the spec is built only (a resolved getter into its type).
  StoredField(const StoredField& o) : word_(o.word_.load()), seen_(o.seen_.load()), direct_(o.direct_.load()) {}
  StoredField& operator=(const StoredField& o) {
    word_.store(o.word_.load());
    seen_.store(o.seen_.load());
    direct_.store(o.direct_.load());
    return *this;
  }

#ifndef Py_GIL_DISABLED
  // The stored value (a new reference), or null: not learned (yet), or an
  // empty field (the caller then asks the getter). GIL builds only: the GIL
  // keeps another thread from setting the field (and dropping the value)
  // between the load and the increment. A free-threaded build has no such
  // guard (CPython's own slot getters increment conditionally and check the
  // field again, with private API): there only Peek's comparison is used,
  // and the getter gives the reference. Per leaf: inline.
  PyObject* Read(PyObject* obj) const {
    PyObject* v = Peek(obj);
    return v ? Py_NewRef(v) : nullptr;
  }
#endif
  // The stored value, borrowed, or null (not learned, or an empty field).
  // Never dereference it on a free-threaded build: another thread may set
  // the field and free the value at any time. It may be compared with
  // pointers whose objects the caller holds (a match is then that live
  // object). Per leaf: inline.
  PyObject* Peek(PyObject* obj) const {
    // A word once > 0 is a word of this type's instances, whatever a later
    // failed sighting stores: the read stays inside the object.
    const int32_t w = word_.load(std::memory_order_relaxed);
    if (w <= 0 || !direct_.load(std::memory_order_relaxed)) return nullptr;
    return __atomic_load_n(reinterpret_cast<PyObject**>(obj) + w, __ATOMIC_RELAXED);
  }
  // Whether the field is learned: Peek answers (and, on a GIL build, Read).
  bool direct() const { return word_.load() > 0 && direct_.load(); }
  bool learning() const { return !direct_.load(std::memory_order_relaxed) && word_.load(std::memory_order_relaxed) >= 0; }
  // After the getter returned `got` for `obj` (of the resolved exact type):
  // one more sighting, or none ever again.
  void See(PyObject* obj, PyObject* got) const;

 private:
  // The word of the instance (a PyObject* index past the header) that holds
  // the value; 0: none seen yet; -1: no such word (the getter computes, or
  // the instance holds the value twice): the getter for good.
  mutable std::atomic<int32_t> word_{0};
  mutable std::atomic<int32_t> seen_{0};
  mutable std::atomic<bool> direct_{false};
};

struct DirectGetter {
  PyTypeObject* type = nullptr;  // borrowed: the spec's aval_types_owner owns it
  PyObject* name = nullptr;      // interned attribute name, borrowed (owned by the spec/hook)
  unsigned int version = 0;      // 0: no direct getter (always the generic lookup)
  nb::object fget;
  bool stored = false;           // the compiler says the getter returns a stored field: learn it
  StoredField field;

  // Resolves `type.name` to a plain property's getter, if it is one and the
  // type qualifies; otherwise a getter that always takes the generic path.
  // `stored`: the compiler says the getter only returns what the instance
  // stores (CompilerHooks.aval_fields); the field is then learned and read.
  static DirectGetter Resolve(PyTypeObject* type, PyObject* name, bool stored = false);
  // obj.<name> borrowed where the field is read in place now (see
  // StoredField::Peek), else null (Get then). Per leaf: inline.
  PyObject* Peek(PyObject* obj) const {
    if (!stored || version == 0 || __atomic_load_n(&type->tp_version_tag, __ATOMIC_RELAXED) != version) {
      return nullptr;
    }
    return field.Peek(obj);
  }
  // New reference to obj.<name> (obj's exact type is `type`), or nullptr
  // with an error set. Per leaf: inline.
  PyObject* Get(PyObject* obj) const {
    if (version != 0 && __atomic_load_n(&type->tp_version_tag, __ATOMIC_RELAXED) == version) {
      if (stored) {
#ifndef Py_GIL_DISABLED
        if (PyObject* v = field.Read(obj)) return v;
#endif
        if (field.learning()) return GetAndLearn(obj);
      }
      return PyObject_CallOneArg(fget.ptr(), obj);
    }
    return PyObject_GetAttr(obj, name);
  }

 private:
  PyObject* GetAndLearn(PyObject* obj) const;
};

// An exact array type whose dtype/shape/weak_type come from `.aval`.
struct AvalType {
  PyTypeObject* type = nullptr;  // borrowed from SignatureSpec::aval_types_owner
  DirectGetter aval;             // obj.aval
  DirectGetter committed;        // obj.<hook.committed_attr>, if a committed type
  DirectGetter sharding;         // obj.<hook.sharding_attr>, if a committed type
};

// What a jitted function tells the builder; fixed after construction.
struct SignatureSpec {
  std::vector<int> static_argnums;           // as given; negatives allowed
  std::vector<nb::object> static_argnames;   // interned str
  nb::object arg_names;                      // tuple of str (may be empty)
  std::string fun_name;                      // qualname, for messages
  nb::object pytree_flatten;                 // optional hook, see below
  nb::object registry_flatten;               // optional, instead: a registry's flatten_one_level
  nb::object defer_leaf;                     // optional: defer_leaf(leaf) -> the call takes the fallback
  nb::object custom_namedtuple;              // optional hook, see below
  nb::object custom_namedtuple_dict;         // the dict when that hook is a dict's __contains__
  ContextHook hook;                          // CompilerHooks.context, read by ReadHooks
  nb::object context_objects;                // what `hook` borrows (a tuple), or null
  nb::object fallback_types;                 // optional tuple of types, see below
  std::vector<PyTypeObject*> plain_types;    // exact types never in fallback_types
  std::vector<AvalType> aval_types;          // exact types read through .aval
  nb::object plain_types_owner;              // keeps plain_types alive
  nb::object aval_types_owner;               // keeps aval_types alive
  // CompilerHooks.context_in_executable: the hit path builds partial
  // signatures and the ready table keys on the arguments alone.
  bool context_in_executable = false;
  // Errors in jax.jit's words (see RaiseStaticComparisonError); otherwise
  // the original propagates.
  bool jax_style_errors = false;
  nb::object placement_label;  // sharding -> str, or null: str(sharding)

  // Every Python object the spec owns, each once (the GC's traverse, clear).
  template <class F>
  void ForEachObject(F&& f) {
    for (nb::object& o : static_argnames) f(o);
    for (nb::object* o : {&arg_names, &pytree_flatten, &registry_flatten, &defer_leaf, &custom_namedtuple,
                          &custom_namedtuple_dict, &context_objects, &fallback_types, &plain_types_owner,
                          &aval_types_owner, &placement_label}) {
      f(*o);
    }
    for (AvalType& t : aval_types) {
      f(t.aval.fget);
      f(t.committed.fget);
      f(t.sharding.fget);
    }
  }
  // After ForEachObject moved the objects out (the GC's clear): forgets what
  // was borrowed from them.
  void ForgetBorrowed() {
    hook = ContextHook();
    plain_types.clear();
    aval_types.clear();
  }

  // Reads the CompilerHooks fields above by name (the context into `hook`,
  // by ContextHook::Read): each checked, a wrong one a TypeError naming it.
  void ReadHooks(nb::handle hooks);
  // Adds an exact aval type and resolves its getters (after `hook` is read:
  // it names the committed attribute). The caller keeps `type` alive
  // through aval_types_owner.
  void AddAvalType(PyTypeObject* type, bool aval_in_place);

  // Positional argument `i` of a call with `nargs` positional arguments is
  // static if i or i - nargs is listed.
  bool IsStaticPosition(size_t i, size_t nargs) const {
    for (int s : static_argnums) {
      if (s >= 0 ? static_cast<size_t>(s) == i
                 : static_cast<Py_ssize_t>(i) - static_cast<Py_ssize_t>(nargs) == s) {
        return true;
      }
    }
    return false;
  }
  bool IsStaticName(PyObject* name) const {
    for (const nb::object& s : static_argnames) {
      if (s.ptr() == name) return true;
    }
    for (const nb::object& s : static_argnames) {
      if (PyUnicode_Compare(s.ptr(), name) == 0) return true;
    }
    return false;
  }
};

// A call's leaves, for an executable that takes them: borrowed where the
// call's argument array holds them (an argument, an item of a tuple
// argument: they cannot change while the call runs), owned otherwise (an
// item of a list, a dict's value, a node's child: another thread may
// replace it).
class LeafObjects {
 public:
  void PushBorrowed(PyObject* leaf) { ptrs_.push_back(leaf); }
  void PushOwned(nb::object leaf) {
    ptrs_.push_back(leaf.ptr());
    owned_.push_back(std::move(leaf));
  }
  void clear() {
    ptrs_.clear();
    owned_.clear();
  }
  size_t size() const { return ptrs_.size(); }
  PyObject* operator[](size_t i) const { return ptrs_[i]; }
  PyObject* const* data() const { return ptrs_.data(); }

 private:
  SmallVector<PyObject*, 8> ptrs_;
  SmallVector<nb::object, 2> owned_;
};
// Builds the signature of a vectorcall into `out` (which must be empty),
// with the hooks of ftjit.CompilerHooks (whose docstrings give each one's
// protocol) as read into `spec`:
// - The context first: the probe, context() (`requires` checked), the
//   extras. A call that must defer throws NeedsFallback before its
//   arguments are looked at: closed-over tracers must never be compiled
//   into a cached entry. When context()'s items are the very objects of
//   this thread's last context, that context's hash is reused.
// - Nodes: None, tuple, list, dict and namedtuple in C++ (a namedtuple that
//   custom_namedtuple names is the registry's: asked on every node, so a
//   registration is seen at once); exact scalars, numpy arrays and scalars
//   and exact plain_types/aval_types are leaves at once. Anything else is
//   checked against fallback_types (NeedsFallback), then pytree_flatten (a
//   registered node wins over .dtype/.shape), then read as a duck-typed
//   array, then as an int/float/complex subclass (a leaf of the base kind).
// - A committed leaf of committed_types has its placement in its signature,
//   as jax.jit keys it; so has a spec_types leaf whose `sharding` is not
//   None, so that precompile() of a sharded spec makes the entry its arrays
//   hit.
// Invalid leaves raise UnsupportedArgumentError, unhashable statics
// UnhashableStaticArgumentError. `allow_specs`: spec_types leaves stand for
// arrays (precompile, warmup); otherwise such a leaf is a TypeError, as in
// jax.jit. `leaf_objects` receives the leaves themselves in the signature's
// order (the positional arguments, then the keyword ones sorted by name,
// each depth-first; statics left out). `partial`: the context and
// placements left out (the hit path of a function whose executables check
// them); such a signature only probes the ready table.
void BuildSignature(const SignatureSpec& spec, PyObject* const* args,
                    size_t nargs, PyObject* kwnames, CallSignature& out, bool allow_specs = false,
                    LeafObjects* leaf_objects = nullptr, bool partial = false);

// numpy's array and scalar base types: imported at module init, fixed
// afterwards.
struct NumpyTypes {
  PyObject* ndarray = nullptr;  // numpy.ndarray
  PyObject* generic = nullptr;  // numpy.generic
  // An exact ndarray's rank, dimensions and dtype are read from its C
  // struct, as numpy's C API macros (PyArray_NDIM, ...) read them in every
  // compiled extension: no attribute call, no reference count of the shared
  // dtype. Set at module init when a real array's struct agreed with it.
  bool read_fields = false;
};

// The leading fields of numpy's PyArrayObject (PyArrayObject_fields), whose
// layout numpy keeps for the compiled extensions that read them.
struct NumpyArrayFields {
  PyObject_HEAD
  char* data;
  int nd;
  Py_ssize_t* dimensions;
  Py_ssize_t* strides;
  PyObject* base;
  PyObject* descr;
};
// Inline: the builder reads it per leaf. Constant-initialised (no guard).
inline NumpyTypes& Numpy() {
  static NumpyTypes types;
  return types;
}

// The signature as ftjit._signature records (a Signature of Node, Leaf and
// Static trees, and each argument's texts, printed as ToString prints them
// with spec's placement_label). `sig` must own or count its context (a
// stored key, or one adopted). Runs Python.
nb::object ExportSignature(const CallSignature& sig, const SignatureSpec& spec);

// Registers the core's _leaf_kinds (kLeafKindNames).
void RegisterSignatureRecords(nb::module_& m);

// Module init: makes the objects the builder uses (g_names, Numpy()).
void InitSignatures();

// For a forked child's only thread: re-initialises the builder's
// process-wide locks (interned dtypes and contexts).
void ReinitSignatureLocksInChild();
// Tests only: the hot path's Python-free comparison of two static values at
// the recursion limit: "equal", "not equal" or "unknown", and whether it
// left an error set (it must not: it runs under a lock, on the hot path).
const char* DebugFastEqualsAtRecursionLimit(PyObject* a, PyObject* b, bool* error_set);
// Tests only (_core._debug_hold_locks): takes or releases those locks.
void LockSignatureLocksForTest(bool lock);

// Raises `type(message)` with the current exception (if any) as __cause__.
[[noreturn]] void ThrowWithCause(PyObject* type, const std::string& message);


}  // namespace ftjit
