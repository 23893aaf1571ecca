// ftjit: a call's whole signature as a hashable Python object (_SignatureKey):
// what calls of one jitted function are grouped by when they must share a
// compiled program (ftjit.batched batches only calls of one key).
//
// Shared state: none; a key holds an immutable signature (adopted: it owns
// its context). Lock order: takes no lock; __eq__ runs Python (statics).
#pragma once

#include <nanobind/nanobind.h>

#include "signature/signature.h"

namespace ftjit {

// `sig` (built whole, its context adopted) as a _SignatureKey: hash() is its
// hash, == its Equals (static values' __eq__ included).
nanobind::object SignatureKeyOf(CallSignature&& sig);
// Registers _SignatureKey.
void RegisterSignatureKey(nanobind::module_& m);

}  // namespace ftjit
