// ftjit: a jitted function's SignatureSpec, set up once: the CompilerHooks
// fields the builder uses read and checked (SignatureSpec::ReadHooks, the
// context hook by ContextHook::Read, the rest by WrongHook's field readers),
// aval getters resolved (DirectGetter); and the per-call check of the
// hook's `requires`.
//
// Shared state: none of its own (a spec is written while its JitFunction is
// constructed, then fixed: see SignatureSpec). Lock order: takes no locks.
// Setting up runs Python (attribute lookups on the hooks and on types);
// CheckRequires is Python-free.
#include <Python.h>

#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>

#include "pyutil/collaborators.h"
#include "signature/hook_fields.h"
#include "signature/signature.h"
#include "signature/signature_internal.h"

namespace ftjit {

namespace {

// TypeError "CompilerHooks.context.<field> must be <what>, got <repr>".
[[noreturn]] void WrongField(const std::string& field, const char* what, nb::handle got) {
  WrongHook(field.empty() ? "context" : "context." + field, std::string("must be ") + what, got);
}

// Field `name` of an item of a ContextHooks tuple field (a
// ContextRequirement, a ContextExtra): WrongField when the item has none.
nb::object ItemField(nb::handle item, const char* name, const std::string& field, const char* what) {
  nb::object value = nb::steal(PyObject_GetAttrString(item.ptr(), name));
  if (value.is_valid()) return value;
  if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw nb::python_error();
  PyErr_Clear();
  WrongField(field, what, item);
}

// ContextHooks fields, read by name; each object kept in `keep` (the
// objects the hook borrows).
class FieldReader {
 public:
  FieldReader(nb::handle record, std::vector<nb::object>& keep) : record_(record), keep_(keep) {}

  nb::object Get(const char* name) { return nb::object(record_.attr(name)); }
  // A callable field's object, or null for None.
  PyObject* Callable(const char* name) {
    nb::object o = Get(name);
    if (o.is_none()) return nullptr;
    if (!PyCallable_Check(o.ptr())) WrongField(name, "callable or None", o);
    return Keep(std::move(o));
  }
  PyObject* Any(const char* name) { return Keep(Get(name)); }
  // A str field's object, or null for None.
  PyObject* Str(const char* name) {
    nb::object o = Get(name);
    if (o.is_none()) return nullptr;
    if (!PyUnicode_Check(o.ptr())) WrongField(name, "a str or None", o);
    return Keep(std::move(o));
  }
  // A tuple copy of a sequence of types (null when empty).
  PyObject* Types(const char* name) {
    nb::object o = Get(name);
    nb::object copy = nb::steal(PySequence_Tuple(o.ptr()));
    if (!copy.is_valid()) {
      PyErr_Clear();
      WrongField(name, "a tuple of types", o);
    }
    for (nb::handle t : copy) {
      if (!PyType_Check(t.ptr())) WrongField(name, "a tuple of types", o);
    }
    return PyTuple_GET_SIZE(copy.ptr()) == 0 ? nullptr : Keep(std::move(copy));
  }
  // A tuple copy of a sequence of at most `max` items.
  nb::object Items(const char* name, size_t max, const char* what) {
    nb::object o = Get(name);
    nb::object copy = nb::steal(PySequence_Tuple(o.ptr()));
    if (!copy.is_valid()) PyErr_Clear();
    if (!copy.is_valid() || static_cast<size_t>(PyTuple_GET_SIZE(copy.ptr())) > max) WrongField(name, what, o);
    return copy;
  }
  PyObject* Keep(nb::object o) {
    keep_.push_back(std::move(o));
    return keep_.back().ptr();
  }

 private:
  nb::handle record_;
  std::vector<nb::object>& keep_;
};

}  // namespace

ContextHook ContextHook::Read(nb::handle context, nb::object& objects) {
  ContextHook h;
  objects = nb::object();
  if (!context.is_valid() || context.is_none()) return h;
  std::vector<nb::object> keep;
  int is_record = PyObject_IsInstance(context.ptr(), kContextHooks.Get());
  if (is_record < 0) throw nb::python_error();
  if (!is_record) {
    if (!PyCallable_Check(context.ptr())) WrongField("", "a callable () -> hashable or an ftjit.ContextHooks", context);
    keep.push_back(nb::borrow(context));
    h.context = context.ptr();
  } else {
    FieldReader f(context, keep);
    h.context = f.Callable("context");
    h.probe = f.Callable("probe");
    h.probe_arg = f.Any("probe_arg");
    h.probe_ok = f.Any("probe_ok");
    const char* requirements = "a tuple of at most 8 ftjit.ContextRequirement(position, value)";
    nb::object requires = f.Items("requires", kMaxRequires, requirements);
    for (nb::handle r : requires) {
      std::string field = "requires[" + std::to_string(h.num_requires) + "]";
      const char* what = "an ftjit.ContextRequirement(position, value)";
      nb::object index = ItemField(r, "position", field, what);
      nb::object value = ItemField(r, "value", field, what);
      Py_ssize_t i = PyLong_Check(index.ptr()) ? PyLong_AsSsize_t(index.ptr()) : -1;
      if (i == -1 && PyErr_Occurred()) PyErr_Clear();
      if (i < 0) WrongField(field + ".position", "an int >= 0", index);
      h.require_index[h.num_requires] = i;
      h.require_value[h.num_requires] = f.Keep(std::move(value));
      ++h.num_requires;
    }
    h.committed_types = f.Types("committed_types");
    h.committed_attr = f.Str("committed_attr");
    h.sharding_attr = f.Str("sharding_attr");
    if (h.committed_types && !h.committed_attr) {
      WrongField("committed_attr", "a str with committed_types", f.Get("committed_attr"));
    }
    if (h.committed_types && !h.sharding_attr) {
      WrongField("sharding_attr", "a str with committed_types", f.Get("sharding_attr"));
    }
    nb::object extras = f.Items("extras", kMaxExtras, "a tuple of at most 8 ftjit.ContextExtra(getter, arg)");
    for (nb::handle e : extras) {
      std::string field = "extras[" + std::to_string(h.num_extras) + "]";
      const char* what = "an ftjit.ContextExtra(getter, arg)";
      nb::object getter = ItemField(e, "getter", field, what);
      nb::object arg = ItemField(e, "arg", field, what);
      if (!PyCallable_Check(getter.ptr())) WrongField(field + ".getter", "callable", getter);
      h.extra_getters[h.num_extras] = f.Keep(std::move(getter));
      h.extra_args[h.num_extras] = f.Keep(std::move(arg));
      ++h.num_extras;
    }
    if (!h.context && h.num_requires > 0) WrongField("requires", "empty without a context", f.Get("requires"));
    if (!h.context && h.num_extras > 0) WrongField("extras", "empty without a context", f.Get("extras"));
    h.spec_types = f.Types("spec_types");
    const char* positions = "a tuple of positions (ints >= 0) of context()'s items";
    nb::object unkeyed = f.Items("unkeyed", SIZE_MAX, positions);
    for (nb::handle u : unkeyed) {
      Py_ssize_t i = PyLong_Check(u.ptr()) && !PyBool_Check(u.ptr()) ? PyLong_AsSsize_t(u.ptr()) : -1;
      if (i == -1 && PyErr_Occurred()) PyErr_Clear();
      if (i < 0 || i > (1 << 16)) WrongField("unkeyed", positions, unkeyed);
      if (static_cast<size_t>(i) >= h.unkeyed.size()) h.unkeyed.resize(static_cast<size_t>(i) + 1, false);
      h.unkeyed[static_cast<size_t>(i)] = true;
    }
    if (!h.context && !h.unkeyed.empty()) WrongField("unkeyed", "empty without a context", unkeyed);
  }
  nb::object tuple = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(keep.size())));
  if (!tuple.is_valid()) throw nb::python_error();
  for (size_t i = 0; i < keep.size(); ++i) {
    PyTuple_SET_ITEM(tuple.ptr(), static_cast<Py_ssize_t>(i), keep[i].release().ptr());
  }
  objects = std::move(tuple);
  return h;
}

void ContextHook::CheckRequires(PyObject* ctx) const {
  if (num_requires == 0) return;
  if (!PyTuple_Check(ctx)) {
    PyErr_Format(PyExc_TypeError,
                 "CompilerHooks.context.requires needs context() to return a tuple, got a %s",
                 Py_TYPE(ctx)->tp_name);
    throw nb::python_error();
  }
  for (size_t i = 0; i < num_requires; ++i) {
    if (require_index[i] >= PyTuple_GET_SIZE(ctx) || PyTuple_GET_ITEM(ctx, require_index[i]) != require_value[i]) {
      throw NeedsFallback{};
    }
  }
}

// The word of `obj` that holds `got`, counted on kSightings getter calls:
// exactly one word of the instance's fixed part (tp_basicsize, past the
// object header) each time, and the same one. Threads may see at once:
// the word is set by CAS, a disagreement turns learning off for good, and
// only a thread whose sighting is the kSightings-th turns the direct read
// on. Reading the field is then what the getter does (jaxlib's reads it
// with no lock either), without the call; an empty field (null) goes to the
// getter. A type changed since (its version tag) never reaches here.
void StoredField::See(PyObject* obj, PyObject* got) const {
  const auto* words = reinterpret_cast<PyObject* const*>(obj);
  const Py_ssize_t n = Py_TYPE(obj)->tp_basicsize / static_cast<Py_ssize_t>(sizeof(PyObject*));
  const Py_ssize_t first = static_cast<Py_ssize_t>(sizeof(PyObject) / sizeof(PyObject*));
  int32_t found = -1;
  for (Py_ssize_t i = first; i < n; ++i) {
    if (__atomic_load_n(words + i, __ATOMIC_RELAXED) != got) continue;
    if (found >= 0) {
      found = -1;  // held twice: which one the getter reads is unknown
      break;
    }
    found = static_cast<int32_t>(i);
  }
  int32_t expected = 0;
  if (found < 0 || (!word_.compare_exchange_strong(expected, found) && expected != found)) {
    word_.store(-1);
    direct_.store(false);
    return;
  }
  if (seen_.fetch_add(1) + 1 == kSightings && word_.load() == found) direct_.store(true);
}

PyObject* DirectGetter::GetAndLearn(PyObject* obj) const {
  PyObject* got = PyObject_CallOneArg(fget.ptr(), obj);
  if (got) field.See(obj, got);
  return got;
}

DirectGetter DirectGetter::Resolve(PyTypeObject* type, PyObject* name, bool stored) {
  DirectGetter g;
  g.type = type;
  g.name = name;
  g.stored = stored;
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

void SignatureSpec::AddAvalType(PyTypeObject* type, bool aval_in_place) {
  AvalType t;
  t.type = type;
  t.aval = DirectGetter::Resolve(type, N().aval, aval_in_place);
  if (hook.IsCommittedType(type)) {
    t.committed = DirectGetter::Resolve(type, hook.committed_attr);
    t.sharding = DirectGetter::Resolve(type, hook.sharding_attr);
  }
  aval_types.push_back(std::move(t));
}

void WrongHook(const std::string& field, const std::string& what, nb::handle got) {
  std::string message = "CompilerHooks." + field + " " + what + ", got " + Repr(got.ptr());
  PyErr_SetString(PyExc_TypeError, message.c_str());
  throw nb::python_error();
}

nb::object CallableField(nb::handle record, const char* name, const std::string& field, bool none_ok) {
  nb::object o = record.attr(name);
  if (none_ok && o.is_none()) return nb::object();
  if (!PyCallable_Check(o.ptr())) WrongHook(field, none_ok ? "must be callable or None" : "must be callable", o);
  return o;
}

nb::object TypesField(nb::handle hooks, const char* name, bool exceptions) {
  nb::object value = hooks.attr(name);
  nb::object copy = nb::steal(PySequence_Tuple(value.ptr()));
  if (!copy.is_valid()) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw nb::python_error();
    PyErr_Clear();
    WrongHook(name, "must be a sequence of types", value);
  }
  for (nb::handle t : copy) {
    if (exceptions ? !PyExceptionClass_Check(t.ptr()) : !PyType_Check(t.ptr())) {
      WrongHook(name, exceptions ? "must hold exception types" : "must hold types", t);
    }
  }
  return copy;
}

bool BoolField(nb::handle hooks, const char* name) {
  nb::object o = hooks.attr(name);
  if (!PyBool_Check(o.ptr())) WrongHook(name, "must be a bool", o);
  return o.ptr() == Py_True;
}

void SignatureSpec::ReadHooks(nb::handle hooks) {
  // pytree_flatten: a Python hook, or an ftjit.RegistryFlatten read by field name.
  nb::object flatten = hooks.attr("pytree_flatten");
  int is_record = flatten.is_none() ? 0 : PyObject_IsInstance(flatten.ptr(), kRegistryFlatten.Get());
  if (is_record < 0) throw nb::python_error();
  if (is_record) {
    registry_flatten = CallableField(flatten, "flatten_one_level", "pytree_flatten.flatten_one_level", false);
    defer_leaf = CallableField(flatten, "defer_leaf", "pytree_flatten.defer_leaf", false);
  } else if (!flatten.is_none()) {
    if (!PyCallable_Check(flatten.ptr())) {
      WrongHook("pytree_flatten", "must be a callable or an ftjit.RegistryFlatten", flatten);
    }
    pytree_flatten = flatten;
  }
  if (nb::object is_custom = CallableField(hooks, "custom_namedtuple", "custom_namedtuple"); is_custom.is_valid()) {
    if (flatten.is_none()) throw nb::type_error("CompilerHooks.custom_namedtuple needs pytree_flatten");
    custom_namedtuple = is_custom;
    // JAX's registry hook is a dict's bound __contains__: asked in C.
    if (PyCFunction_Check(is_custom.ptr())) {
      PyObject* self = PyCFunction_GetSelf(is_custom.ptr());
      nb::object name = nb::getattr(is_custom, "__name__", nb::none());
      if (self && PyDict_CheckExact(self) && PyUnicode_Check(name.ptr()) &&
          PyUnicode_CompareWithASCIIString(name.ptr(), "__contains__") == 0) {
        custom_namedtuple_dict = nb::borrow(self);
      }
    }
  }
  nb::object context = hooks.attr("context"), objects;
  ContextHook read = ContextHook::Read(context, objects);  // validates; may throw
  context_objects = std::move(objects);
  hook = read;  // borrows from context_objects, which the spec now owns
  if (nb::object types = TypesField(hooks, "fallback_types"); PyTuple_GET_SIZE(types.ptr()) > 0) {
    fallback_types = types;
  }
  plain_types_owner = TypesField(hooks, "plain_types");
  for (nb::handle t : plain_types_owner) plain_types.push_back(reinterpret_cast<PyTypeObject*>(t.ptr()));
  aval_types_owner = TypesField(hooks, "aval_types");  // after `hook`, which names the committed attribute
  const nb::object in_place = TypesField(hooks, "aval_fields");
  for (nb::handle t : in_place) {
    if (PySequence_Contains(aval_types_owner.ptr(), t.ptr()) != 1) {
      PyErr_Clear();
      WrongHook("aval_fields", "must hold only types of aval_types", t);
    }
  }
  for (nb::handle t : aval_types_owner) {
    AddAvalType(reinterpret_cast<PyTypeObject*>(t.ptr()), PySequence_Contains(in_place.ptr(), t.ptr()) == 1);
  }
  placement_label = CallableField(hooks, "placement_label", "placement_label");
  jax_style_errors = BoolField(hooks, "jax_style_errors");
  context_in_executable = BoolField(hooks, "context_in_executable");
}

}  // namespace ftjit
