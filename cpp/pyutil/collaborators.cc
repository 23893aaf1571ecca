// ftjit: the hand-off of the core's collaborators (the header's preamble).
#include "pyutil/collaborators.h"

#include <Python.h>

#include <atomic>
#include <string>

#include <nanobind/nanobind.h>

namespace ftjit {

namespace nb = nanobind;

namespace {

std::atomic<bool> g_handed{false};  // claimed (exchange) by the one hand-off

}  // namespace

void Collaborator::NotHanded() const {
  PyErr_Format(PyExc_RuntimeError,
               "ftjit's core has not been handed its collaborators (%s is one): `import ftjit` hands them over, "
               "and ftjit._core cannot be used without it",
               name_);
  throw nb::python_error();
}

void HandCollaborators(nb::kwargs given) {
  auto append = [](std::string& list, const std::string& name) { list += (list.empty() ? "" : ", ") + name; };
  std::string unknown, missing;
  for (nb::handle key : given.keys()) {  // keywords are str
    bool known = false;
    for (const Collaborator* c : kCollaborators) {
      known = known || PyUnicode_CompareWithASCIIString(key.ptr(), c->name()) == 0;
    }
    if (!known) append(unknown, nb::borrow<nb::str>(key).c_str());
  }
  for (const Collaborator* c : kCollaborators) {
    if (!given.contains(c->name())) append(missing, c->name());
  }
  if (!unknown.empty()) throw nb::type_error(("_set_collaborators: no collaborator is named " + unknown).c_str());
  if (!missing.empty()) throw nb::type_error(("_set_collaborators: missing " + missing).c_str());
  if (g_handed.exchange(true, std::memory_order_acq_rel)) {
    PyErr_SetString(PyExc_RuntimeError, "_set_collaborators: ftjit's core was handed its collaborators already "
                                        "(by ftjit's import); they are fixed for the process's life");
    throw nb::python_error();
  }
  for (Collaborator* c : kCollaborators) {
    nb::object value = given[c->name()];
    c->obj_.store(value.release().ptr(), std::memory_order_release);  // kept for the process's life
  }
}

void RegisterCollaborators(nb::module_& m) {
  m.def("_set_collaborators", &HandCollaborators, nb::sig("def _set_collaborators(**collaborators: object) -> None"),
        "ftjit's import only: hands the core the Python objects it raises, builds and calls (ftjit's error\n"
        "classes, records and hooks; copy.copy, functools.partial), one keyword each, once per process.");
}

}  // namespace ftjit
