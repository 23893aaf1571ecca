// ftjit: the Python objects the store floor builds (see Imported).
#pragma once

#include "pyutil/imported.h"

namespace ftjit {

inline Imported kCacheInfo{"ftjit._jit", "CacheInfo"};

}  // namespace ftjit
