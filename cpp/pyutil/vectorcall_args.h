// ftjit: a nanobind method's *args, **kwargs laid out as a vectorcall's
// (items, positional count, keyword names), which the core's signature
// builder reads.
//
// Stateless beyond each object; takes no locks. Borrowed from `args` and
// `kwargs`, which only the method's call holds.
#pragma once

#include <Python.h>

#include <cstddef>
#include <vector>

#include <nanobind/nanobind.h>

namespace ftjit {

class VectorcallArgs {
 public:
  VectorcallArgs(const nanobind::args& args, const nanobind::kwargs& kwargs) : nargs_(args.size()) {
    items_.reserve(nargs_ + kwargs.size());
    for (nanobind::handle a : args) items_.push_back(a.ptr());
    if (kwargs.size() == 0) return;
    nanobind::list names;
    for (auto [name, value] : kwargs) {
      names.append(name);
      items_.push_back(value.ptr());
    }
    kwnames_ = nanobind::tuple(names);
  }
  PyObject* const* items() const { return items_.data(); }
  size_t nargs() const { return nargs_; }
  PyObject* kwnames() const { return kwnames_.is_valid() ? kwnames_.ptr() : nullptr; }

 private:
  size_t nargs_;
  std::vector<PyObject*> items_;
  nanobind::object kwnames_;
};

}  // namespace ftjit
