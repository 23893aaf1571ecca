// ftjit tests: a file of the primitives floor including its own floor's headers compiles
// against that floor's include root (cpp/tests/CMakeLists.txt, floor_own_headers_compile).
#include "primitives/reentrant_map.h"
#include "primitives/shared_lru.h"
