// ftjit: _SignatureKey (see signature_key.h).
//
// Shared state: none (each key's signature is immutable once made). Lock
// order: takes no lock.
#include "signature/signature_key.h"

#include <Python.h>

#include <memory>
#include <utility>

namespace ftjit {

namespace nb = nanobind;

namespace {

struct SignatureKey {
  std::shared_ptr<const CallSignature> sig;
};

}  // namespace

nb::object SignatureKeyOf(CallSignature&& sig) {
  return nb::cast(SignatureKey{std::make_shared<const CallSignature>(std::move(sig))});
}

void RegisterSignatureKey(nb::module_& m) {
  nb::class_<SignatureKey>(m, "_SignatureKey",
                           "A call's whole signature (JitFunction._batch_key): hashable, equal to another\n"
                           "exactly when the two calls share a compiled program (static values compared\n"
                           "with __eq__). Immutable.")
      .def("__hash__",
           [](const SignatureKey& k) {
             Py_hash_t h = static_cast<Py_hash_t>(k.sig->hash);
             return h == -1 ? Py_hash_t{-2} : h;
           },
           nb::sig("def __hash__(self, /) -> int"))
      .def("__eq__",
           [](const SignatureKey& a, nb::handle b) -> nb::object {
             if (!nb::isinstance<SignatureKey>(b)) return nb::borrow(Py_NotImplemented);
             const SignatureKey& other = nb::cast<const SignatureKey&>(b);
             return nb::bool_(a.sig == other.sig || a.sig->Equals(*other.sig));
           },
           nb::sig("def __eq__(self, other: object, /) -> bool"))
      .def("__ne__", [](const SignatureKey& a, nb::handle b) -> nb::object {
        if (!nb::isinstance<SignatureKey>(b)) return nb::borrow(Py_NotImplemented);
        const SignatureKey& other = nb::cast<const SignatureKey&>(b);
        return nb::bool_(!(a.sig == other.sig || a.sig->Equals(*other.sig)));
      }, nb::sig("def __ne__(self, other: object, /) -> bool"));
}

}  // namespace ftjit
