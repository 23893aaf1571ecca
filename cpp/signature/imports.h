// ftjit: the Python objects the signature floor raises and builds (see
// Imported): ftjit.errors' argument errors, the context hook's
// record type, and the record types of ftjit._signature that
// ExportSignature fills.
#pragma once

#include "pyutil/imported.h"

namespace ftjit {

inline Imported kUnhashableStaticArgumentError{"ftjit.errors", "UnhashableStaticArgumentError"};
inline Imported kUnsupportedArgumentError{"ftjit.errors", "UnsupportedArgumentError"};
inline Imported kContextHooks{"ftjit._hooks", "ContextHooks"};
inline Imported kLeaf{"ftjit._signature", "Leaf"};
inline Imported kNode{"ftjit._signature", "Node"};
inline Imported kStatic{"ftjit._signature", "Static"};
inline Imported kSignature{"ftjit._signature", "Signature"};

}  // namespace ftjit
