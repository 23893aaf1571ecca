// ftjit: the errors bad arguments raise while a signature is built or
// compared, and ThrowWithCause. Messages name the function and the
// argument (in jax.jit's words when the spec asks for them). Off the hot
// path: nothing here runs while a call's signature is built successfully
// (CheckSpecShape checks specs only).
//
// Shared state: none (the error classes are collaborators, handed once,
// then fixed). Lock order: takes no locks. Building a message runs Python
// (repr()/str() of the argument's name, keys and dtype): never under a C++
// lock.
#include <Python.h>

#include <string>

#include <nanobind/nanobind.h>

#include "pyutil/collaborators.h"
#include "pyutil/errors.h"
#include "pyutil/py_compat.h"
#include "signature/signature.h"
#include "signature/signature_builder.h"
#include "signature/signature_internal.h"

namespace ftjit {

// The argument's path, quoted: 'x', 'x['a'][0]', 'args[2]'.
std::string Builder::PathText() const {
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

// The path, then the position for a positional argument: 'x['a']' (positional argument 0).
std::string Builder::Where() const {
  std::string s = PathText();
  if (top_position_ >= 0) s += " (positional argument " + std::to_string(top_position_) + ")";
  return s;
}

// The keys of a dict argument could not be sorted (PyList_Sort failed; its
// error is pending and becomes the __cause__).
void Builder::UnsortableDictKeys() {
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

std::string Builder::ShapeText(const ArrayShape& s) {
  std::string shape = (s.dtype.is_valid() ? Str(s.dtype.ptr()) : std::string()) + "[";
  for (size_t i = 0; i < s.dims.size(); ++i) shape += (i ? "," : "") + std::to_string(s.dims[i]);
  return shape + "]";
}

// jax.jit's TypeError for an argument spec (jax.ShapeDtypeStruct) passed
// in a call, in its words: "Argument 'x['a']' of shape float32[2] of type
// <class 'jax.ShapeDtypeStruct'> is not a valid JAX type."
void Builder::NotAnArgument(PyObject* obj, const ArrayShape& s) {
  std::string msg = "Argument " + PathText() + " of shape " + ShapeText(s) + " of type " +
                    Repr(reinterpret_cast<PyObject*>(Py_TYPE(obj))) +
                    " is not a valid JAX type. (A jax.ShapeDtypeStruct describes an argument: "
                    "pass it to precompile() or warmup(), and call with an array.)";
  PyErr_SetString(PyExc_TypeError, msg.c_str());
  throw nb::python_error();
}

void Builder::CheckSpecShape(const ArrayShape& s) {
  if (s.dims.size() > kMaxSpecRank) {
    PyErr_Format(PyExc_ValueError, "Argument %s has rank %zu, more than the %zu an array of a spec may have "
                 "(numpy's own limit; XLA takes minutes to compile such ranks). Is its shape wrong?",
                 PathText().c_str(), s.dims.size(), kMaxSpecRank);
    throw nb::python_error();
  }
  // XLA multiplies dimensions in whatever order it lays them out: an empty
  // array's zero may come last, after the others overflowed. So the nonzero
  // dimensions' product (in bytes) must fit, as a nonempty array's size does.
  int64_t elements = 1;
  bool overflow = false, empty = false;
  for (int64_t d : s.dims) {
    if (d < 0) {
      PyErr_Format(PyExc_ValueError, "Argument %s has the shape %s, whose dimension %lld is negative: an array's "
                   "dimensions are sizes (>= 0)", PathText().c_str(), ShapeText(s).c_str(),
                   static_cast<long long>(d));
      throw nb::python_error();
    }
    if (d == 0) {
      empty = true;
      continue;
    }
    overflow = overflow || __builtin_mul_overflow(elements, d, &elements);
  }
  int64_t itemsize = 1;
  if (s.dtype.is_valid()) {
    nb::object size = nb::steal(PyObject_GetAttrString(s.dtype.ptr(), "itemsize"));
    if (!size.is_valid()) throw nb::python_error();
    itemsize = PyLong_AsLongLong(size.ptr());
    if (itemsize == -1 && PyErr_Occurred()) throw nb::python_error();
  }
  int64_t bytes = 0;
  if (overflow || __builtin_mul_overflow(elements, itemsize < 1 ? 1 : itemsize, &bytes)) {
    PyErr_Format(PyExc_ValueError, "Argument %s has the shape %s, whose size in bytes%s does not fit in a signed "
                 "64-bit integer: no array can have it (XLA would abort the process compiling it). "
                 "Is a dimension wrong?", PathText().c_str(), ShapeText(s).c_str(),
                 empty ? " counting its nonzero dimensions alone (XLA multiplies them in any order)" : "");
    throw nb::python_error();
  }
}

void Builder::Unsupported(PyObject* obj) {
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
  PyErr_SetString(kUnsupportedArgumentError.Get(), msg.c_str());
  throw nb::python_error();
}

void UnhashableStatic(const SignatureSpec& spec, PyObject* value, const std::string& which) {
  std::string msg = "static argument " + which + " of " + spec.fun_name +
                    "() is not hashable (type " + Py_TYPE(value)->tp_name +
                    "). Non-hashable static arguments are not supported: static "
                    "arguments are cache keys, so they need __hash__ and __eq__. "
                    "Pass a hashable value (e.g. a tuple instead of a list), or make "
                    "the argument dynamic by removing it from static_argnums/"
                    "static_argnames.";
  ThrowWithCause(kUnhashableStaticArgumentError.Get(), msg);
}

// jaxlib's C++ throws std::invalid_argument with this message, whose tail
// is nanobind's rendering of the original error (its stack, then "Type:
// message"), and nanobind turns it into a plain ValueError.
void RaiseStaticComparisonError(nb::python_error& err, PyObject* a, PyObject* b) {
  std::string message =
      "static arguments should be comparable using __eq__.The following error was raised when "
      "comparing two objects of types " +
      Str(reinterpret_cast<PyObject*>(Py_TYPE(a))) + " and " +
      Str(reinterpret_cast<PyObject*>(Py_TYPE(b))) + ". The error was:\n" + err.what();
  PyErr_SetString(PyExc_ValueError, message.c_str());
  throw nb::python_error();
}

void ThrowWithCause(PyObject* type, const std::string& message) {
  nb::object cause = nb::steal(TakeError());
  nb::object exc = nb::steal(PyObject_CallFunction(type, "s", message.c_str()));
  if (!exc.is_valid()) throw nb::python_error();
  if (cause.is_valid()) PyException_SetCause(exc.ptr(), cause.release().ptr());  // steals
  ThrowError(std::move(exc));
}

}  // namespace ftjit
